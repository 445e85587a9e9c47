// One project's page: allocation against cumulative charge with the even-burn line and both
// forecasts, daily burn, breakdowns, running jobs, holds, time slices, preemptions, squatting.
"use strict";

(function () {
  const A = window.Allmende;
  const project = A.boot.project;
  const base = `/v1/dashboard/projects/${encodeURIComponent(project)}`;
  const DAY_MS = 86400000;
  const ms = (iso) => Date.parse(iso);
  const dayEnd = (day) => Date.parse(day) + DAY_MS; // a day's figures are reached at its end
  const round4 = (x) => Math.round(x * 10000) / 10000;
  const BASIS = { period_to_date: "Period-to-date rate", trailing_7d: "Trailing 7 days' rate" };

  function kpis(body) {
    const tiles = [
      ["Allocated", A.fmt.hours(body.allocated_gpu_hours), "weighted GPU-hours"],
      ["Charged", A.fmt.hours(body.charged_gpu_hours), "weighted GPU-hours"],
      ["Held", A.fmt.hours(body.held_gpu_hours), "promised to admitted jobs"],
      ["Remaining", A.fmt.hours(body.remaining_gpu_hours), "weighted GPU-hours"],
      ["Spent", A.fmt.percent(body.spent_percent), "charged + held"],
      ["Elapsed", A.fmt.percent(body.elapsed_percent), "of the period"],
      ["Over budget", A.fmt.hours(body.over_budget_gpu_hours), "charged beyond allocations"],
    ];
    A.$("#kpis").replaceChildren(
      ...tiles.map(([label, value, hint]) => {
        const div = document.createElement("div");
        div.className = "kpi";
        if (label === "Over budget" && parseFloat(body.over_budget_gpu_hours) > 0) div.classList.add("alarm");
        div.innerHTML = "<span class=label></span><span class=value></span><span class=hint></span>";
        div.children[0].textContent = label;
        div.children[1].textContent = value;
        div.children[2].textContent = hint;
        return div;
      }),
    );
  }

  function forecastTable(body) {
    const blocks = body.forecasts.map((f) => {
      const div = document.createElement("div");
      div.className = f.lasts_period ? "forecast" : "forecast short";
      div.dataset.basis = f.basis;
      const h = document.createElement("h3");
      h.textContent = BASIS[f.basis] || f.basis;
      const dl = document.createElement("dl");
      const lines = [
        ["Charge per day", A.fmt.hours(f.charged_gpu_hours_per_day)],
        ["Runs out", f.exhaustion_at ? A.fmt.instant(f.exhaustion_at) : "lasts the period"],
        ["Days left", f.days_left === null ? "–" : A.fmt.int(f.days_left)],
        ["Projected at the end", A.fmt.hours(f.projected_charged_gpu_hours_at_end)],
      ];
      for (const [label, value] of lines) {
        const dt = document.createElement("dt");
        dt.textContent = label;
        const dd = document.createElement("dd");
        dd.textContent = value;
        if (label === "Runs out" && !f.lasts_period) dd.className = "alarm";
        dl.append(dt, dd);
      }
      div.append(h, dl);
      return div;
    });
    A.$("#forecast .body").replaceChildren(...blocks);
  }

  function burnChart(body) {
    const start = ms(body.period_start);
    const end = ms(body.period_end);
    const asOf = ms(body.as_of);
    const allocated = A.num(body.allocated_gpu_hours);
    const spent = round4(A.num(body.charged_gpu_hours) + A.num(body.held_gpu_hours));
    const forecastColors = { period_to_date: "#b04a8f", trailing_7d: "#e07b39" };
    const series = [
      {
        name: "Cumulative charge", type: "line", symbol: "none", lineStyle: { width: 2.5 },
        itemStyle: { color: "#2f6fb0" }, areaStyle: { opacity: 0.08 },
        data: body.rows.map((r) => [dayEnd(r.day), A.num(r.cumulative_charged_gpu_hours)]),
        markLine: {
          symbol: "none", silent: true, label: { formatter: "as of", position: "insideEndTop" },
          lineStyle: { color: "#888", type: "dotted" }, data: [{ xAxis: asOf }],
        },
      },
      {
        name: "Even burn", type: "line", symbol: "none", itemStyle: { color: "#3a9d5d" },
        lineStyle: { type: "dashed", width: 1.5 },
        data: body.rows.map((r) => [dayEnd(r.day), A.num(r.even_burn_gpu_hours)]),
      },
      {
        name: "Allocation", type: "line", symbol: "none", itemStyle: { color: "#c0392b" },
        lineStyle: { width: 1.5 },
        data: [[start, allocated], [end, allocated]],
      },
    ];
    for (const f of body.forecasts) {
      const color = forecastColors[f.basis] || "#7a6bd1";
      series.push({
        name: `Forecast: ${BASIS[f.basis] || f.basis}`, type: "line", symbol: "circle", symbolSize: 5,
        itemStyle: { color }, lineStyle: { type: [6, 4], width: 2 },
        data: [[asOf, spent], [end, A.num(f.projected_charged_gpu_hours_at_end)]],
        markPoint: f.exhaustion_at
          ? {
              symbol: "pin", symbolSize: 34, itemStyle: { color },
              label: { formatter: "out", fontSize: 9 },
              data: [{ coord: [ms(f.exhaustion_at), allocated], name: "runs out" }],
            }
          : undefined,
      });
    }
    A.chart("burn", "#burn-chart", {
      legend: { top: 0 },
      grid: { left: 70, right: 28, top: 52, bottom: 36 },
      xAxis: { type: "time", min: start, max: end },
      // A steep forecast would flatten everything else: past 1.6 x the allocation it runs off the
      // top (its figures are in the panel beside the chart).
      yAxis: {
        type: "value", name: "weighted GPU-hours", axisLabel: { formatter: A.axisHours },
        max: (extent) => (extent.max > 1.6 * Math.max(allocated, spent) ? Math.ceil(1.6 * Math.max(allocated, spent) / 500) * 500 : null),
      },
      tooltip: { trigger: "axis", valueFormatter: (v) => (v === undefined ? "–" : A.fmt.hours(v)) },
      series,
    });
  }

  function dailyChart(body) {
    A.chart("daily", "#daily-chart", {
      xAxis: { type: "category", data: body.rows.map((r) => r.day), axisLabel: { formatter: (d) => d.slice(5) } },
      yAxis: { type: "value", name: "weighted GPU-hours", axisLabel: { formatter: A.axisHours } },
      grid: { left: 64, right: 16, top: 36, bottom: 32 },
      tooltip: { trigger: "axis", valueFormatter: (v) => A.fmt.hours(v) },
      series: [
        {
          name: "Charged", type: "bar", itemStyle: { color: "#2f6fb0" },
          data: body.rows.map((r) => [r.day, A.num(r.charged_gpu_hours)]),
        },
      ],
    });
  }

  async function burn() {
    A.expect("load:burn");
    A.setCsv("#burn", `${base}/burn`);
    A.setCsv("#daily", `${base}/burn`);
    try {
      const body = await A.getJSON(`${base}/burn`);
      A.showPeriod(body.period);
      A.$("#meta").textContent =
        `${body.period}: ${body.period_start.slice(0, 10)} to ${body.period_end.slice(0, 10)} · ` +
        `as of ${A.fmt.instant(body.as_of)} UTC · all times UTC`;
      kpis(body);
      forecastTable(body);
      burnChart(body);
      dailyChart(body);
    } catch (error) {
      A.fail("#burn", error);
      A.fail("#forecast", error);
      A.fail("#daily", error);
    } finally {
      A.done("load:burn");
    }
  }

  async function breakdown(by) {
    const id = `#by-${by}`;
    A.expect(`load:${by}`);
    A.setCsv(id, `${base}/breakdown`, { by });
    try {
      const body = await A.getJSON(`${base}/breakdown`, { by });
      A.chart(`by_${by}`, `${id}-chart`, {
        legend: { show: false },
        grid: { left: 110, right: 16, top: 8, bottom: 24 },
        tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: (v) => A.fmt.hours(v) },
        xAxis: { type: "value", axisLabel: { formatter: A.axisHours } },
        yAxis: {
          type: "category", inverse: true, data: body.rows.map((r) => r.key),
          axisLabel: { width: 100, overflow: "truncate" },
        },
        series: [
          {
            name: "Charged", type: "bar", itemStyle: { color: "#2f6fb0" }, barMaxWidth: 14,
            data: body.rows.map((r) => A.num(r.charged_gpu_hours)),
          },
          {
            name: "Idle GPU-hours", type: "bar", itemStyle: { color: "#c9a227" }, barMaxWidth: 14,
            data: body.rows.map((r) => A.num(r.idle_gpu_hours)),
          },
        ],
      });
    } catch (error) {
      A.fail(id, error);
    } finally {
      A.done(`load:${by}`);
    }
  }

  function table(name, path, columns, opts = {}) {
    const id = `#${name}`;
    A.setCsv(id, path, opts.params);
    return A.loading(name, id, async () => {
      const body = await A.getJSON(path, opts.params);
      if (opts.meta) opts.meta(body);
      A.table(`${id} .body`, body.rows, columns, { sortable: true, empty: opts.empty });
    });
  }

  const NO_PERIOD = { params: { period: null } };
  A.periodPicker();
  A.picker("project", "/v1/dashboard/projects", "project", project, (p) =>
    window.location.assign(A.url(`/ui/projects/${encodeURIComponent(p)}`, { period: A.boot.period || A.currentPeriod })),
  );
  Promise.all([
    burn(),
    A.projectRequests(project),
    ...["cluster", "gpu_type", "user", "priority_class"].map(breakdown),
    table("running", `${base}/running`, [
      { key: "job_id", label: "Job" },
      { key: "user", label: "User" },
      { key: "cluster", label: "Cluster" },
      { key: "gpus", label: "GPUs", kind: "int" },
      { key: "priority_class", label: "Class" },
      { key: "lane", label: "Lane" },
      { key: "since", label: "Since", kind: "instant" },
      { key: "hosts", label: "Hosts" },
      { key: "overran", label: "Overran", kind: "bool" },
    ], { ...NO_PERIOD, empty: "No job of this project holds GPUs now." }),
    table("holds", `${base}/holds`, [
      { key: "job_id", label: "Job" },
      { key: "held_charged_gpu_hours", label: "Held", kind: "hours" },
      { key: "expires_at", label: "Expires", kind: "instant" },
    ], { ...NO_PERIOD, empty: "No active holds." }),
    table("timeslices", `${base}/timeslices`, [
      { key: "agreement_id", label: "Agreement" },
      { key: "cluster", label: "Cluster" },
      { key: "gpus", label: "GPUs", kind: "int" },
      { key: "window_start", label: "From", kind: "instant" },
      { key: "window_end", label: "To", kind: "instant" },
      { key: "guaranteed_gpu_hours", label: "Guaranteed", kind: "hours" },
      { key: "used_gpu_hours", label: "Used", kind: "hours" },
      { key: "used_percent", label: "% of guarantee", kind: "percent", bar: (v) => parseFloat(v) },
    ], { empty: "No time-slice window began in this period." }),
    table("preemptions", `${base}/preemptions`, [
      { key: "job_id", label: "Job" },
      { key: "user", label: "User" },
      { key: "cluster", label: "Cluster" },
      { key: "at", label: "At", kind: "instant" },
      { key: "reason", label: "Reason" },
    ], { empty: "No job of this project was preempted in this period." }),
    table("squatting", `${base}/squatting`, [
      { key: "job_id", label: "Job" },
      { key: "user", label: "User" },
      { key: "cluster", label: "Cluster" },
      { key: "idle_since", label: "Idle since", kind: "instant" },
      { key: "idle_until", label: "Until", kind: "instant" },
      { key: "idle_hours", label: "Idle h", kind: "hours" },
      { key: "idle_gpu_hours", label: "Idle GPU-h", kind: "hours" },
      { key: "idle_charged_gpu_hours", label: "Cost of idling", kind: "hours" },
      { key: "gpu_hours", label: "Job GPU-h", kind: "hours" },
      { key: "charged_gpu_hours", label: "Job charge", kind: "hours" },
      { key: "ongoing", label: "Ongoing", kind: "bool" },
    ], {
      empty: "No job squatted on its GPUs in this period.",
      meta: (body) => {
        A.$("#squatting-meta").textContent =
          `Jobs under ${A.fmt.percent(body.max_utilization_percent)} GPU utilisation for more than ` +
          `${A.fmt.int(body.grace_minutes)} minutes; the cost is the weighted charge of the idle time.`;
      },
    }),
  ]).finally(A.start);
})();
