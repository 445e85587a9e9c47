"""The HTML page of `allmende simulate --report`: one file, no network.

ECharts is read from the package (vendored for the pages) and inlined; the runs' data sits in a
`<script type="application/json">` tag (the same document `--json` writes), and the page's own
script draws the charts from it. The report table under the charts is rendered here, from the
same rows as the terminal table. The same runs give the same bytes (no timestamps).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from allmende.domain.simulation.render import report_rows
from allmende.domain.simulation.report import SimulationReport
from allmende.services.web.assets import echarts_source

PALETTE = ["#2f6fb0", "#e07b39", "#3a9d5d", "#b04a8f", "#7a6bd1", "#c9a227", "#5aa9c9", "#8c564b"]


def json_for_html(value: Any) -> str:
    """JSON that is safe inside a <script> element: `<`, `>` and `&` only ever occur in strings,
    where their \\u escapes mean the same, so neither `</script>` nor `<!--` can appear."""
    text = json.dumps(value, indent=1, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def table_rows(reports: Sequence[tuple[str, SimulationReport]]) -> list[list[str]]:
    """[metric, value per run]: the terminal table's rows, every run's in the first one's order."""
    per_run = [dict(report_rows(r)) for _, r in reports]
    names: list[str] = []
    for _, r in reports:
        names += [name for name, _ in report_rows(r) if name not in names]
    return [[name, *(values.get(name, "-") for values in per_run)] for name in names]


_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>What-if simulation · {{ title }} · Allmende</title>
<style>
:root { --ink: #1d2733; --muted: #5f6b7a; --line: #dde3ea; --bg: #f4f6f9; --card: #fff; --accent: #2f6fb0;
  font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", "DejaVu Sans", sans-serif;
  font-size: 14px; color: var(--ink); background: var(--bg); }
* { box-sizing: border-box; }
body { margin: 0; }
header.top { display: flex; align-items: baseline; gap: 1.5rem; padding: 0.55rem 1.25rem;
  background: #1d2733; color: #e8edf3; }
.brand { font-weight: 700; font-size: 1.1rem; letter-spacing: 0.02em; color: #fff; }
main { padding: 0.9rem 1.25rem 2rem; max-width: 1600px; margin: 0 auto; }
h1 { font-size: 1.35rem; margin: 0 0 0.3rem; }
h2 { font-size: 1rem; margin: 0; }
.meta, .hint { margin: 0.2rem 0 0.5rem; color: var(--muted); font-size: 0.85rem; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 0.75rem 0.9rem; margin-bottom: 0.9rem; min-width: 0; }
.grid { display: grid; gap: 0.9rem; margin-bottom: 0.9rem; }
.grid > .card { margin-bottom: 0; }
.grid.two { grid-template-columns: repeat(2, minmax(0, 1fr)); }
@media (max-width: 900px) { .grid.two { grid-template-columns: 1fr; } }
.chart { width: 100%; height: 300px; }
.kpis { display: grid; grid-template-columns: repeat(auto-fit, minmax(15rem, 1fr)); gap: 0.6rem;
  margin-bottom: 0.9rem; }
.kpi { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 0.45rem 0.7rem; }
.kpi .label { font-size: 0.75rem; color: var(--muted); text-transform: uppercase; letter-spacing: 0.04em; }
.kpi dl { display: grid; grid-template-columns: auto auto; gap: 0.1rem 0.8rem; margin: 0.3rem 0 0; }
.kpi dt { color: var(--muted); }
.kpi dd { margin: 0; text-align: right; font-weight: 650; font-variant-numeric: tabular-nums; }
.body { overflow-x: auto; }
table.data { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
table.data th, table.data td { padding: 0.3rem 0.6rem; border-bottom: 1px solid var(--line);
  text-align: left; white-space: nowrap; }
table.data thead th { font-size: 0.78rem; color: var(--muted); font-weight: 600; background: #fafbfc; }
table.data .num { text-align: right; }
table.data tbody tr:hover { background: #f3f7fb; }
.empty { color: var(--muted); }
</style>
</head>
<body>
<header class="top"><span class="brand">Allmende</span><span>what-if simulation</span></header>
<main>
<h1>{{ title }}</h1>
<p class="meta">{{ subtitle }}</p>
<div class="kpis" id="kpis"></div>
<div class="grid two">
  <section class="card"><h2>GPU utilisation</h2>
    <p class="hint">Busy: GPUs held by a job. Useful: busy minus idle placeholders and time stuck on a bad host.</p>
    <div class="chart" id="utilisation"></div></section>
  <section class="card"><h2>Wasted GPU-hours</h2>
    <p class="hint">Work redone after a preemption, GPUs held idle by placeholders, GPUs stuck on a bad host.</p>
    <div class="chart" id="waste"></div></section>
  <section class="card"><h2>Jobs at the top priority class</h2>
    <p class="hint">When everybody asks for the top class, the class means nothing.</p>
    <div class="chart" id="topclass"></div></section>
  <section class="card"><h2>Jobs stuck on a bad host</h2>
    <p class="hint">Runs that held GPUs on a failed host, and for how long the longest did.</p>
    <div class="chart" id="stuck"></div></section>
</div>
<section class="card"><h2>Queueing delay</h2>
  <p class="hint">Submission to first start, hours (p50 / p90 / p99); a job that never started counts until the end.</p>
  <div id="delays"></div></section>
<section class="card" id="budgets-card" hidden><h2>Budget adherence</h2>
  <p class="hint">Charged against allocated per project; above 100 % is over budget.</p>
  <div class="chart" id="budgets"></div></section>
<section class="card"><h2>Stuck runs</h2><div class="body" id="stuck-runs"></div></section>
<section class="card"><h2>Report</h2>
  <div class="body"><table class="data" id="report">
    <thead><tr><th>metric</th>{% for label in labels %}<th class="num">{{ label }}</th>{% endfor %}</tr></thead>
    <tbody>
    {% for row in rows %}<tr><td>{{ row[0] }}</td>{% for value in row[1:] %}<td class="num">{{ value }}</td>{% endfor %}</tr>
    {% endfor %}</tbody>
  </table></div></section>
</main>
<script type="application/json" id="simulation-data">{{ data | safe }}</script>
<script>{{ echarts | safe }}</script>
<script>
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("simulation-data").textContent);
  const runs = data.runs;
  const labels = runs.map((r) => r.label);
  const palette = {{ palette | safe }};
  const hours = (s) => (s === null || s === undefined ? null : s / 3600);
  const one = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1, minimumFractionDigits: 1 });
  const pct = (x) => (x === null || x === undefined ? "–" : `${one.format(100 * x)} %`);
  const hrs = (x) => (x === null || x === undefined ? "–" : `${one.format(x)} h`);
  const charts = (window.allmendeCharts = {});
  const base = {
    animation: false, color: palette, textStyle: { fontFamily: "inherit" },
    grid: { left: 64, right: 24, top: 40, bottom: 56, containLabel: false },
    tooltip: { trigger: "axis", axisPointer: { type: "shadow" } },
    legend: { top: 0 },
  };
  const runAxis = { type: "category", data: labels, axisLabel: { interval: 0, width: 160, overflow: "truncate" } };
  function chart(id, option) {
    const el = document.getElementById(id);
    const c = window.echarts.init(el, null, { renderer: "canvas" });
    c.setOption(Object.assign({}, base, option));
    charts[id] = c;
    return c;
  }
  function bar(name, values, extra) {
    return Object.assign({ name, type: "bar", data: values, barMaxWidth: 48,
      label: { show: values.length <= 8, position: "top", formatter: (p) => (extra && extra.fmt ? extra.fmt(p.value) : p.value) } },
      extra && extra.series);
  }

  // KPI tiles: one per run.
  const kpis = document.getElementById("kpis");
  for (const r of runs) {
    const rep = r.report;
    const box = document.createElement("div");
    box.className = "kpi";
    const title = document.createElement("div");
    title.className = "label";
    title.textContent = r.label;
    const dl = document.createElement("dl");
    for (const [k, v] of [
      ["busy", pct(rep.busy_utilization)], ["useful", pct(rep.useful_utilization)],
      ["queue delay p90", hrs(hours(rep.queue_delay.p90_s))], ["top class", pct(rep.top_class_share)],
      ["preemptions", String(rep.preemptions)],
    ]) {
      const dt = document.createElement("dt"); dt.textContent = k;
      const dd = document.createElement("dd"); dd.textContent = v;
      dl.append(dt, dd);
    }
    box.append(title, dl);
    kpis.appendChild(box);
  }

  chart("utilisation", {
    xAxis: runAxis,
    yAxis: { type: "value", max: 100, axisLabel: { formatter: "{value} %" } },
    tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: (v) => `${one.format(v)} %` },
    series: [
      bar("busy", runs.map((r) => 100 * r.report.busy_utilization), { fmt: (v) => `${one.format(v)} %` }),
      bar("useful", runs.map((r) => 100 * r.report.useful_utilization), { fmt: (v) => `${one.format(v)} %` }),
    ],
  });
  chart("waste", {
    xAxis: runAxis,
    yAxis: { type: "value", name: "GPU-hours" },
    tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: (v) => `${one.format(v)} GPU-h` },
    series: [
      bar("lost to preemption", runs.map((r) => hours(r.report.lost_to_preemption_gpu_seconds)), { fmt: (v) => one.format(v) }),
      bar("idle in placeholders", runs.map((r) => hours(r.report.placeholder_idle_gpu_seconds)), { fmt: (v) => one.format(v) }),
      bar("stuck on a bad host", runs.map((r) => hours(r.report.stuck_gpu_seconds)), { fmt: (v) => one.format(v) }),
    ],
  });
  chart("topclass", {
    xAxis: runAxis,
    yAxis: { type: "value", max: 100, axisLabel: { formatter: "{value} %" } },
    legend: { show: false },
    tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: (v) => `${one.format(v)} %` },
    series: [bar("jobs at the top class", runs.map((r) => 100 * r.report.top_class_share),
      { fmt: (v) => `${one.format(v)} %`, series: { colorBy: "data" } })],
  });
  chart("stuck", {
    xAxis: runAxis,
    yAxis: [{ type: "value", name: "runs", minInterval: 1 }, { type: "value", name: "hours" }],
    grid: { left: 64, right: 64, top: 40, bottom: 56 },
    series: [
      bar("runs stuck", runs.map((r) => r.report.stuck_runs.length)),
      bar("longest stuck (h)", runs.map((r) => hours(r.report.stuck_seconds_max)), { fmt: (v) => one.format(v), series: { yAxisIndex: 1 } }),
    ],
  });

  // Queueing delay: one chart per run, the projects on the axis, p50/p90/p99 grouped.
  const delays = document.getElementById("delays");
  runs.forEach((r, i) => {
    const rep = r.report;
    const groups = [["all", rep.queue_delay], ["interactive", rep.queue_delay_interactive],
      ...Object.entries(rep.queue_delay_by_project)];
    const head = document.createElement("h3");
    head.textContent = r.label;
    head.style.margin = "0.6rem 0 0";
    const el = document.createElement("div");
    el.className = "chart";
    el.id = `delays-${i}`;
    delays.append(head, el);
    chart(el.id, {
      xAxis: { type: "category", data: groups.map(([name, s]) => `${name} (${s.jobs})`), axisLabel: { interval: 0, rotate: groups.length > 8 ? 30 : 0 } },
      yAxis: { type: "value", name: "hours" },
      grid: { left: 64, right: 24, top: 40, bottom: groups.length > 8 ? 90 : 56 },
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: hrs },
      series: ["p50", "p90", "p99"].map((p) => ({
        name: p, type: "bar", barMaxWidth: 24, data: groups.map(([, s]) => hours(s[`${p}_s`])),
      })),
    });
  });

  // Budget adherence, when an adapter filled it in.
  const withBudgets = runs.filter((r) => r.report.budgets);
  if (withBudgets.length) {
    document.getElementById("budgets-card").hidden = false;
    const projects = [...new Set(withBudgets.flatMap((r) => Object.keys(r.report.budgets)))].sort();
    chart("budgets", {
      xAxis: { type: "category", data: projects, axisLabel: { interval: 0 } },
      yAxis: { type: "value", axisLabel: { formatter: "{value} %" } },
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: (v) => (v === null ? "–" : `${one.format(v)} %`) },
      series: withBudgets.map((r, i) => ({
        name: r.label, type: "bar", barMaxWidth: 32,
        data: projects.map((p) => { const b = r.report.budgets[p]; return b && b.ratio !== null ? 100 * b.ratio : null; }),
        markLine: i === 0 ? { silent: true, symbol: "none", data: [{ yAxis: 100 }], lineStyle: { color: "#c0392b" } } : undefined,
      })),
    });
  }

  // Stuck runs, as a table.
  const stuckRows = runs.flatMap((r) => r.report.stuck_runs.map((s) => [r.label, s.job_id, s.hosts.join(" "),
    String(s.gpus), new Date(s.stalled_at * 1000).toISOString().replace("T", " ").slice(0, 16), hrs(hours(s.stuck_s)), s.ended]));
  const box = document.getElementById("stuck-runs");
  if (!stuckRows.length) {
    const p = document.createElement("p"); p.className = "empty"; p.textContent = "No run was stuck on a bad host.";
    box.appendChild(p);
  } else {
    const table = document.createElement("table");
    table.className = "data";
    const head = table.createTHead().insertRow();
    for (const h of ["run", "job", "hosts", "GPUs", "stalled at (UTC)", "stuck for", "ended"]) {
      const th = document.createElement("th"); th.textContent = h; head.appendChild(th);
    }
    const body = table.createTBody();
    for (const row of stuckRows) {
      const tr = body.insertRow();
      for (const v of row) tr.insertCell().textContent = v;
    }
    box.appendChild(table);
  }
  window.addEventListener("resize", () => Object.values(charts).forEach((c) => c.resize()));
  document.body.dataset.ready = "true";
})();
</script>
</body>
</html>
"""  # noqa: E501 (a page: HTML and JavaScript lines)

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def render_html(
    document: dict[str, Any], reports: Sequence[tuple[str, SimulationReport]], echarts: str
) -> str:
    trace = document.get("trace", {})
    plans = document.get("plans", [])
    behaviours = document.get("behaviours", {})
    title = " vs ".join(p["label"] for p in plans) or "simulation"
    subtitle = (
        f"{trace.get('file', '')} ({trace.get('format', '')}): {trace.get('jobs', 0):,} jobs"
        f" and {behaviours.get('placeholder_jobs', 0):,} placeholders, seed {behaviours.get('seed', 0)}"
    )
    return _ENV.from_string(_TEMPLATE).render(
        title=title,
        subtitle=subtitle,
        labels=[label for label, _ in reports],
        rows=table_rows(reports),
        data=json_for_html(document),
        echarts=echarts,
        palette=json.dumps(PALETTE),
    )


def write_report(
    path: Path, document: dict[str, Any], reports: Sequence[tuple[str, SimulationReport]]
) -> None:
    path.write_text(render_html(document, reports, echarts_source()), encoding="utf-8")
