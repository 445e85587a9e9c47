// Shared by the dashboard pages: JSON fetching with the session cookie, tables (sortable, with a
// CSV link), charts (ECharts, animation off, kept in window.allmendeCharts), and the readiness
// flag the browser tests and the screenshot script wait on (document.body.dataset.ready).
"use strict";

(function () {
  const A = (window.Allmende = {});
  window.allmendeCharts = {};
  const pending = new Set();
  let started = false;

  A.boot = JSON.parse(document.getElementById("boot").dataset.boot);

  function settle() {
    if (started && pending.size === 0) document.body.dataset.ready = "true";
  }
  A.expect = (name) => pending.add(name);
  A.done = (name) => {
    pending.delete(name);
    settle();
  };
  A.start = () => {
    started = true;
    settle();
  };

  // ---- data -------------------------------------------------------------------------------
  A.params = (extra) => {
    const p = new URLSearchParams();
    if (A.boot.period) p.set("period", A.boot.period);
    for (const [k, v] of Object.entries(extra || {})) {
      if (v === null) p.delete(k); // this route has no such parameter
      else if (v !== undefined) p.set(k, v);
    }
    return p;
  };
  A.url = (path, extra) => {
    const q = A.params(extra).toString();
    return q ? `${path}?${q}` : path;
  };
  A.csvUrl = (path, extra) => {
    const p = new URLSearchParams({ format: "csv" });
    for (const [k, v] of A.params(extra)) p.set(k, v);
    return `${path}?${p.toString()}`;
  };
  A.getJSON = async (path, extra) => {
    const response = await fetch(A.url(path, extra), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (response.status === 401) {
      window.location.assign("/ui/signin");
      throw new Error("signed out");
    }
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.detail || `${response.status} ${response.statusText}`);
    return body;
  };
  A.num = (s) => (s === null || s === undefined || s === "" ? null : parseFloat(s));

  // ---- formatting ---------------------------------------------------------------------------
  const grouped = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1, minimumFractionDigits: 1 });
  const whole = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  A.fmt = {
    hours: (s) => (s === null || s === undefined ? "–" : grouped.format(parseFloat(s))),
    percent: (s) => (s === null || s === undefined ? "–" : `${parseFloat(s).toFixed(1)} %`),
    int: (s) => (s === null || s === undefined ? "–" : whole.format(Number(s))),
    bool: (b) => (b === null || b === undefined ? "–" : b ? "yes" : "no"),
    instant: (s) => (s ? s.replace("T", " ").replace(/(:\d\d)?Z$/, "") : "–"), // UTC, to the minute
    text: (s) => (s === null || s === undefined || s === "" ? "–" : String(s)),
    factor: (x) => (x === null || x === undefined ? "–" : Number(x).toFixed(3)),
  };
  A.axisHours = (v) => whole.format(v);

  // ---- sections -----------------------------------------------------------------------------
  A.$ = (sel, root) => (root || document).querySelector(sel);
  A.fail = (section, error) => {
    const box = typeof section === "string" ? A.$(section) : section;
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = `Could not load: ${error.message}`;
    (box.querySelector(".body") || box).replaceChildren(p);
    document.body.dataset.error = "true";
  };
  // One card's load: the page is ready once every card's work has ended; a failure shows in the card.
  A.loading = async (name, section, work) => {
    A.expect(`table:${name}`);
    try {
      await work();
    } catch (error) {
      A.fail(section, error);
    } finally {
      A.done(`table:${name}`);
    }
  };
    A.setCsv = (section, path, extra) => {
    const link = A.$(`${section} a.csv`);
    if (link) link.href = A.csvUrl(path, extra);
  };

  // ---- tables -------------------------------------------------------------------------------
  // columns: [{key, label, kind: "hours"|"percent"|"int"|"bool"|"instant"|"text"|"factor", link, indent}]
  const NUMERIC = new Set(["hours", "percent", "int", "factor"]);
  A.table = (container, rows, columns, opts = {}) => {
    const box = typeof container === "string" ? A.$(container) : container;
    if (!rows.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = opts.empty || "None.";
      box.replaceChildren(p);
      return;
    }
    const table = document.createElement("table");
    table.className = opts.sortable ? "data sortable" : "data";
    const head = table.createTHead().insertRow();
    const tbody = table.createTBody();
    let order = { key: null, dir: 1 };
    const fill = () => {
      const sorted = order.key === null ? rows : [...rows].sort(compare(order.key, order.dir, columns));
      tbody.replaceChildren(...sorted.map((row) => rowOf(row, columns)));
    };
    for (const col of columns) {
      const th = document.createElement("th");
      th.textContent = col.label;
      th.dataset.key = col.key;
      if (NUMERIC.has(col.kind)) th.className = "num";
      if (opts.sortable) {
        th.tabIndex = 0;
        th.setAttribute("aria-sort", "none");
        const sort = () => {
          order = { key: col.key, dir: order.key === col.key ? -order.dir : NUMERIC.has(col.kind) ? -1 : 1 };
          for (const other of head.cells) other.setAttribute("aria-sort", "none");
          th.setAttribute("aria-sort", order.dir > 0 ? "ascending" : "descending");
          fill();
        };
        th.addEventListener("click", sort);
        th.addEventListener("keydown", (e) => (e.key === "Enter" || e.key === " ") && sort());
      }
      head.appendChild(th);
    }
    fill();
    box.replaceChildren(table);
  };

  function compare(key, dir, columns) {
    const col = columns.find((c) => c.key === key);
    const numeric = NUMERIC.has(col.kind);
    return (a, b) => {
      const x = a[key];
      const y = b[key];
      if (x === null || x === undefined || x === "") return 1; // nulls last, either way
      if (y === null || y === undefined || y === "") return -1;
      if (numeric) return dir * (parseFloat(x) - parseFloat(y));
      if (typeof x === "boolean") return dir * (Number(x) - Number(y));
      return dir * String(x).localeCompare(String(y));
    };
  }

  function rowOf(row, columns) {
    const tr = document.createElement("tr");
    for (const col of columns) {
      const td = document.createElement("td");
      const raw = row[col.key];
      const text = (A.fmt[col.kind || "text"] || A.fmt.text)(raw);
      if (NUMERIC.has(col.kind)) td.className = "num";
      if (col.kind === "hours" && raw !== null && raw !== undefined) td.title = String(raw);
      if (col.indent) td.style.paddingLeft = `${0.6 + 1.2 * (row.depth || 0)}em`;
      if (col.bar && raw !== null && raw !== undefined) {
        const bar = document.createElement("span");
        bar.className = "bar";
        bar.style.width = `${Math.max(0, Math.min(100, col.bar(raw)))}%`;
        td.appendChild(bar);
      }
      if (col.link) {
        const a = document.createElement("a");
        a.href = col.link(row);
        a.textContent = text;
        td.appendChild(a);
      } else {
        td.appendChild(document.createTextNode(text));
      }
      tr.appendChild(td);
    }
    return tr;
  }

  // ---- charts -------------------------------------------------------------------------------
  A.palette = ["#2f6fb0", "#e07b39", "#3a9d5d", "#b04a8f", "#7a6bd1", "#c9a227", "#5aa9c9", "#8c564b"];
  A.chart = (name, element, option) => {
    const el = typeof element === "string" ? A.$(element) : element;
    if (typeof window.echarts === "undefined") throw new Error("ECharts did not load (run make install)");
    const chart = window.echarts.init(el, null, { renderer: "canvas" });
    window.allmendeCharts[name] = chart;
    A.expect(`chart:${name}`);
    chart.on("finished", () => A.done(`chart:${name}`));
    chart.setOption({
      animation: false,
      color: A.palette,
      textStyle: { fontFamily: "inherit" },
      grid: { left: 64, right: 24, top: 40, bottom: 40 },
      tooltip: { trigger: "axis" },
      useUTC: true,
      ...option,
    });
    return chart;
  };
  window.addEventListener("resize", () => {
    for (const chart of Object.values(window.allmendeCharts)) chart.resize();
  });

  // ---- pickers ------------------------------------------------------------------------------
  A.picker = async (id, path, label, current, go) => {
    const select = document.getElementById(id);
    if (!select) return;
    A.expect(`picker:${id}`);
    try {
      const body = await A.getJSON(path, {});
      select.replaceChildren(
        ...body.rows.map((row) => {
          const o = document.createElement("option");
          o.value = row[label];
          o.textContent = row[label];
          return o;
        }),
      );
      A.selectIn(select, typeof current === "function" ? current() : current);
      select.addEventListener("change", () => go(select.value));
    } catch (error) {
      select.replaceChildren(new Option(`(${error.message})`, ""));
      document.body.dataset.error = "true";
    } finally {
      A.done(`picker:${id}`);
    }
  };
  A.selectIn = (select, value) => {
    if (value && [...select.options].some((o) => o.value === value)) select.value = value;
  };
  A.periodPicker = () =>
    A.picker("period", "/v1/dashboard/periods", "period", () => A.boot.period || A.currentPeriod, (period) => {
      const url = new URL(window.location.href);
      url.searchParams.set("period", period);
      window.location.assign(url.toString());
    });
  // Once the page knows which period the API chose by default, show it in the picker.
  A.showPeriod = (period) => {
    A.currentPeriod = period;
    const select = document.getElementById("period");
    if (select && [...select.options].some((o) => o.value === period)) select.value = period;
  };
})();
