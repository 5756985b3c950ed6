// streameval dashboard: polls api/feed (streameval.commands.dashboard) and draws each metric's panes with uPlot.
// A window's point is its latest pane: final (filled point, solid line, interval band) or early / not yet final
// (hollow point, dashed line), replaced when a later pane of the window comes. window.streamevalDashboard is
// what the page's tests read.
"use strict";
(function () {
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];
  const state = {run: null, seq: 0, rows: new Map(), feed: null, polls: 0, charts: new Map(), slice: null,
                 interval: 1000};
  const $ = (id) => document.getElementById(id);

  function rowKey(r) { return [r.window_start, r.window_end, r.slice, r.system, r.metric].join("\u0001"); }

  function iso(us) {
    return us == null ? "all" : new Date(us / 1000).toISOString().replace(".000Z", "Z");
  }

  function fmt(x) {
    if (x == null) return "";
    if (typeof x !== "number") return String(x);
    return Number.isInteger(x) ? x.toLocaleString("en") : x.toPrecision(4);
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
  }

  function slices() {
    const s = new Set();
    for (const r of state.rows.values()) s.add(r.slice);
    return Array.from(s).sort((a, b) => (a === "all" ? -1 : b === "all" ? 1 : a < b ? -1 : a > b ? 1 : 0));
  }

  function renderSlices() {
    const sel = $("slice");
    const all = slices();
    if (state.slice == null || !all.includes(state.slice)) state.slice = all.length ? all[0] : null;
    const have = Array.from(sel.options).map((o) => o.value);
    if (have.join("\u0001") !== all.join("\u0001")) {
      sel.replaceChildren(...all.map((s) => new Option(s, s)));
    }
    if (state.slice != null) sel.value = state.slice;
  }

  // the chart data of one metric in the chosen slice: [xs, then per system: final, early, ci high, ci low]
  function chartData(metric) {
    const rows = Array.from(state.rows.values()).filter((r) => r.metric === metric && r.slice === state.slice);
    const systems = Array.from(new Set(rows.map((r) => r.system))).sort();
    const windowed = rows.some((r) => r.window_start != null);
    const xs = Array.from(new Set(rows.map((r) => (r.window_start == null ? 0 : r.window_start / 1e6)))).sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const series = systems.map(() => [0, 1, 2, 3].map(() => xs.map(() => null)));
    for (const r of rows) {
      const s = series[systems.indexOf(r.system)];
      const i = at.get(r.window_start == null ? 0 : r.window_start / 1e6);
      s[r.is_final ? 0 : 1][i] = r.value;
      s[2][i] = r.ci_high;
      s[3][i] = r.ci_low;
    }
    return {systems, windowed, data: [xs, ...series.flat()]};
  }

  function makeChart(metric, cd, box) {
    const series = [{}];
    const bands = [];
    cd.systems.forEach((sys, k) => {
      const color = COLORS[k % COLORS.length];
      const base = 1 + 4 * k;
      series.push({label: sys, stroke: color, width: 2, spanGaps: true, points: {show: true, size: 7, fill: color}});
      series.push({label: sys + " (early)", stroke: color, width: 1.5, dash: [6, 4], spanGaps: true,
                   points: {show: true, size: 8, fill: "#fff", stroke: color, width: 2}});
      series.push({label: "ci high", stroke: "transparent", spanGaps: true, points: {show: false}});
      series.push({label: "ci low", stroke: "transparent", spanGaps: true, points: {show: false}});
      bands.push({series: [base + 2, base + 3], fill: color + "26"});
    });
    const width = Math.max(320, box.clientWidth || 640);
    // one window alone: half a day each side (uPlot would give an axis of one instant 1,000 days)
    const pad = cd.windowed ? 43200 : 1;
    const range = (u, min, max) => (u.data[0].length === 1 ? [u.data[0][0] - pad, u.data[0][0] + pad] : [min, max]);
    // windows are UTC (the rows' window_start / window_end), whatever the browser's time zone
    const u = new uPlot({width, height: 240, series, bands, scales: {x: {time: cd.windowed, range}},
                         tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
                         legend: {live: true}, cursor: {points: {show: false}}}, cd.data, box);
    // the band's two edges are not legend entries
    u.root.querySelectorAll(".u-legend .u-series").forEach((tr, i) => {
      if (i > 0 && (i - 1) % 4 >= 2) tr.style.display = "none";
    });
    return u;
  }

  function renderCharts() {
    const metrics = Array.from(new Set(Array.from(state.rows.values()).map((r) => r.metric))).sort();
    $("waiting").hidden = metrics.length > 0;
    const charts = $("charts");
    for (const [metric, c] of state.charts) {
      if (!metrics.includes(metric)) { c.u.destroy(); c.el.remove(); state.charts.delete(metric); }
    }
    for (const metric of metrics) {
      const cd = chartData(metric);
      let c = state.charts.get(metric);
      const shape = cd.systems.join("\u0001") + "|" + cd.windowed;
      if (c && c.shape !== shape) { c.u.destroy(); c.box.replaceChildren(); c.u = null; }
      if (!c) {
        const el = document.createElement("div");
        el.className = "chart";
        el.dataset.metric = metric;
        const h = document.createElement("h2");
        h.textContent = metric;
        const box = document.createElement("div");
        el.append(h, box);
        charts.appendChild(el);
        c = {el, box, u: null, shape};
        state.charts.set(metric, c);
      }
      c.shape = shape;
      c.data = cd.data;
      if (c.u) c.u.setData(cd.data); else c.u = makeChart(metric, cd, c.box);
    }
  }

  function renderAccounting(feed) {
    $("summary").textContent = (feed.state ? "job " + feed.state + (feed.published ? ", published" : "") + "\n" : "") +
      (feed.summary || "") +
      (feed.accounting_problems && feed.accounting_problems.length ? "\naccounting problems: " + feed.accounting_problems.join("; ") : "");
    const t = $("accounting-table");
    t.replaceChildren();
    for (const k of Object.keys(feed.accounting).sort()) {
      const tr = document.createElement("tr");
      tr.dataset.counter = k;
      cell(tr, k.replace(/_/g, " "));
      cell(tr, fmt(feed.accounting[k]), "n");
      t.appendChild(tr);
    }
  }

  function renderAlerts(feed) {
    const t = $("alerts-table");
    $("no-alerts").hidden = feed.alerts.length > 0;
    t.replaceChildren();
    if (!feed.alerts.length) return;
    const head = document.createElement("tr");
    for (const h of ["rule", "window", "metric", "slice", "system", "value", "condition"]) {
      const th = document.createElement("th");
      th.textContent = h;
      head.appendChild(th);
    }
    t.appendChild(head);
    for (const a of feed.alerts) {
      const tr = document.createElement("tr");
      tr.className = "alert";
      cell(tr, a.rule);
      cell(tr, iso(a.window_start).replace("T00:00:00Z", "") + (a.pane ? " " + a.pane : ""));
      cell(tr, a.metric);
      cell(tr, a.slice);
      cell(tr, a.system);
      cell(tr, fmt(a.value), "n");
      cell(tr, a.condition, "condition");
      t.appendChild(tr);
    }
  }

  function render() {
    const feed = state.feed;
    $("output").textContent = feed.folder || feed.output;
    renderSlices();
    renderCharts();
    renderAccounting(feed);
    renderAlerts(feed);
    const err = $("error");
    err.hidden = !feed.error && feed.folder != null;
    err.textContent = feed.error ? "cannot read the output: " + feed.error
      : feed.folder == null ? "no output at " + feed.output + " yet: waiting for the job" : "";
    $("status").textContent = "run " + feed.run + " \u00b7 " + state.rows.size + " rows \u00b7 updated " +
      new Date().toLocaleTimeString();
  }

  async function poll() {
    try {
      const q = state.run == null ? "" : "?since=" + state.seq + "&run=" + state.run;
      const res = await fetch("api/feed" + q, {cache: "no-store"});
      const feed = await res.json();
      if (feed.run !== state.run) state.rows.clear();
      state.run = feed.run;
      state.seq = feed.seq;
      state.feed = feed;
      state.interval = Math.max(50, 1000 * (feed.poll || 1));
      for (const r of feed.rows) state.rows.set(rowKey(r), r);
      state.polls += 1;
      render();
    } catch (e) {
      $("status").textContent = "cannot reach the dashboard's server (" + e + "); retrying";
    }
    setTimeout(poll, state.interval);
  }

  function count(which) {
    let n = 0;
    for (const c of state.charts.values()) {
      for (let j = 1; j < c.data.length; j++) {
        if ((j - 1) % 4 !== which) continue;
        for (const v of c.data[j]) if (v != null) n += 1;
      }
    }
    return n;
  }

  window.streamevalDashboard = {
    polls: () => state.polls,
    finalPoints: () => count(0),
    earlyPoints: () => count(1),
    points: () => count(0) + count(1),
    rows: () => Array.from(state.rows.values()),
    slice: () => state.slice,
    charts: () => Array.from(state.charts.keys()),
  };

  $("slice").addEventListener("change", (e) => { state.slice = e.target.value; renderCharts(); });
  poll();
})();
