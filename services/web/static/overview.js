// The overview: every readable project, cluster utilisation per day, the fair-share tree.
"use strict";

(function () {
  const A = window.Allmende;

  async function projects() {
    A.expect("table:projects");
    A.setCsv("#projects", "/v1/dashboard/overview");
    try {
      const body = await A.getJSON("/v1/dashboard/overview");
      A.showPeriod(body.period);
      A.$("#meta").textContent =
        `${body.period}: ${body.period_start.slice(0, 10)} to ${body.period_end.slice(0, 10)} · ` +
        `as of ${A.fmt.instant(body.as_of)} UTC · ${A.fmt.percent(body.elapsed_percent)} of the period elapsed` +
        // Admins: GPUs busy with no job on them (the GPUs' own samples): use nobody is charged for.
        (body.unaccounted_nodes ? ` · unaccounted GPU use: ${body.unaccounted_gpu_hours} GPU-h on ` +
          `${body.unaccounted_nodes} node${body.unaccounted_nodes === 1 ? "" : "s"}` : "");
      const link = (row) => A.url(`/ui/projects/${encodeURIComponent(row.project)}`, { period: body.period });
      A.table("#projects .body", body.rows, [
        { key: "project", label: "Project", link },
        { key: "allocated_gpu_hours", label: "Allocated", kind: "hours" },
        { key: "charged_gpu_hours", label: "Charged", kind: "hours" },
        { key: "held_gpu_hours", label: "Held", kind: "hours" },
        { key: "remaining_gpu_hours", label: "Remaining", kind: "hours" },
        { key: "spent_percent", label: "Spent", kind: "percent", bar: (v) => parseFloat(v) },
        { key: "elapsed_percent", label: "Elapsed", kind: "percent" },
        { key: "exhaustion_at", label: "Runs out", kind: "instant" },
        { key: "days_left", label: "Days left", kind: "int" },
        { key: "lasts_period", label: "Lasts", kind: "bool" },
        { key: "over_budget_gpu_hours", label: "Over budget", kind: "hours" },
        { key: "idle_gpu_hours", label: "Idle GPU-h", kind: "hours" },
      ], { sortable: true, empty: "No project to show." });
    } catch (error) {
      A.fail("#projects", error);
    } finally {
      A.done("table:projects");
    }
  }

  async function utilization() {
    A.expect("load:utilization");
    A.setCsv("#utilization", "/v1/dashboard/clusters/utilization");
    try {
      const body = await A.getJSON("/v1/dashboard/clusters/utilization");
      const clusters = [...new Set(body.rows.map((r) => r.cluster))];
      const days = [...new Set(body.rows.map((r) => r.day))].sort();
      const series = [];
      clusters.forEach((cluster, i) => {
        const rows = body.rows.filter((r) => r.cluster === cluster);
        const color = A.palette[i % A.palette.length];
        series.push({
          name: `${cluster} used`, type: "bar", itemStyle: { color }, barGap: "0%",
          data: rows.map((r) => [r.day, A.num(r.used_gpu_hours)]),
        });
        series.push({
          name: `${cluster} capacity`, type: "line", step: "middle", symbol: "none",
          lineStyle: { color, type: "dashed", width: 1.5 }, itemStyle: { color },
          data: rows.map((r) => [r.day, A.num(r.capacity_gpu_hours)]),
        });
      });
      A.chart("utilization", "#utilization-chart", {
        legend: { top: 0, type: "scroll" },
        xAxis: { type: "category", data: days, axisLabel: { formatter: (d) => d.slice(5) } },
        yAxis: { type: "value", name: "GPU-hours", axisLabel: { formatter: A.axisHours } },
        grid: { left: 64, right: 16, top: 48, bottom: 32 },
        series,
      });
    } catch (error) {
      A.fail("#utilization", error);
    } finally {
      A.done("load:utilization");
    }
  }

  async function fairshare() {
    A.expect("table:fairshare");
    A.setCsv("#fairshare", "/v1/dashboard/fairshare", { period: null });
    try {
      const body = await A.getJSON("/v1/dashboard/fairshare", { period: null });
      A.$("#fairshare-meta").textContent = body.as_of
        ? `${body.algorithm} factors at the ledger's ${A.fmt.instant(body.as_of)} UTC; children indented under their parent.`
        : "The fair-share calculator has not published a tree yet.";
      A.table("#fairshare .body", body.rows, [
        { key: "node_id", label: "Node", indent: true },
        { key: "raw_shares", label: "Shares", kind: "text" },
        { key: "norm_shares", label: "Norm. shares", kind: "factor" },
        { key: "effective_usage", label: "Eff. usage", kind: "factor" },
        { key: "factor", label: "Factor", kind: "factor", bar: (v) => 100 * v },
      ], { empty: "No fair-share tree yet." });
    } catch (error) {
      A.fail("#fairshare", error);
    } finally {
      A.done("table:fairshare");
    }
  }

  // Admins only (the cards are not on a lead's page): what was refused, per kind, then the newest.
  const refused = () => A.$("#refused") && A.loading("refused", "#refused", async () => {
    const body = await A.getJSON("/v1/admin/refused", { period: null, limit: 20 });
    const kinds = document.createElement("div");
    const letters = document.createElement("div");
    A.$("#refused .body").replaceChildren(kinds, letters);
    A.table(kinds, body.kinds, [
      { key: "code", label: "Kind", kind: "text" },
      { key: "stage", label: "Refused by", kind: "text" },
      { key: "count", label: "Refused", kind: "int" },
      { key: "redrivable", label: "Re-drivable", kind: "bool" },
    ], { empty: "Nothing refused." });
    if (body.letters.length) {
      A.table(letters, body.letters, [
        { key: "refused_at", label: "When", kind: "instant" },
        { key: "code", label: "Kind", kind: "text" },
        { key: "key", label: "Job", kind: "text" },
        { key: "reason", label: "Reason", kind: "text" },
        { key: "offset", label: "Letter", kind: "int" },
      ], {});
    }
  });

  // Admins only: clusters that ran more GPUs than they have, a line per episode.
  const overCapacity = () => A.$("#over-capacity") && A.loading("over-capacity", "#over-capacity", async () => {
    const body = await A.getJSON("/v1/admin/over-capacity", { period: null });
    const rows = body.episodes.map((e) => ({
      ...e,
      pushers: e.pushed_over.map((r) => `${r.job_id} (${r.project}, ${r.gpus} GPUs)`).join(", "),
    }));
    A.table("#over-capacity .body", rows, [
      { key: "cluster", label: "Cluster", kind: "text" },
      { key: "start", label: "From", kind: "instant" },
      { key: "end", label: "To", kind: "instant" },
      { key: "peak_gpus", label: "GPUs in use", kind: "int" },
      { key: "capacity_gpus", label: "Capacity", kind: "int" },
      { key: "pushers", label: "Pushed over by", kind: "text" },
    ], { empty: "No cluster ran more GPUs than it has." });
  });

  // Admins only: disputed usage and how it was resolved.
  const disputes = () => A.$("#disputes") && A.loading("disputes", "#disputes", async () => {
    const rows = await A.getJSON("/v1/admin/disputes", { period: null });
    A.table("#disputes .body", rows, [
      { key: "job_id", label: "Job", kind: "text" },
      { key: "project", label: "Project", kind: "text" },
      { key: "cluster", label: "Cluster", kind: "text" },
      { key: "episode_start", label: "Over from", kind: "instant" },
      { key: "status", label: "Status", kind: "text" },
      { key: "resolved_by", label: "Resolved by", kind: "text" },
    ], { empty: "No disputed usage." });
  });

  A.periodPicker();
  const requests = () => A.$("#open-requests") && A.openRequests();
  Promise.all([projects(), utilization(), fairshare(), requests(), overCapacity(), disputes(), refused()]).finally(
    A.start,
  );
})();
