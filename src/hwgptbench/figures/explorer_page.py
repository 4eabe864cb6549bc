"""The explorer page's own style, body and script (:mod:`hwgptbench.figures.explorer` inlines
them beside Plotly's bundle and the data, one JSON element ``explorer-data``).

The script draws with Plotly from the data alone (no request leaves the page): the scatter of
perplexity against the chosen metric of one (device, condition), measured and predicted archs
as two traces, the Pareto front of the points shown (lowest perplexity for the metric), the
archs on one front and not the other's when a second column is compared, the Kendall τ heatmap
of the scale's columns, and the front as a table sorted by a click on its header."""

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 1.2em 2em;
       color: #222; }
h1 { font-size: 1.35em; margin: 0.6em 0 0.2em; }
p.lead { margin: 0 0 0.6em; color: #555; max-width: 70em; }
.controls { display: flex; flex-wrap: wrap; gap: 0.5em 1.2em; align-items: center;
            padding: 0.5em 0; border-bottom: 1px solid #ddd; }
.controls label { font-size: 0.92em; }
.controls select { max-width: 28em; }
#status, #compare-info { font-size: 0.92em; margin: 0.4em 0; }
#compare-info { background: #f6f6f6; padding: 0.4em 0.6em; border-radius: 4px; }
#compare-info:empty { display: none; }
.row { display: flex; flex-wrap: wrap; gap: 1em; }
#scatter { flex: 3 1 640px; min-height: 520px; }
#heatmap { flex: 2 1 420px; min-height: 520px; }
h2 { font-size: 1.1em; margin: 1em 0 0.3em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; text-align: right; }
td:first-child, th:first-child { text-align: left; font-family: ui-monospace, monospace; }
th { background: #f2f2f2; cursor: pointer; user-select: none; }
th.sorted-asc::after { content: " \\25B2"; }
th.sorted-desc::after { content: " \\25BC"; }
tr.predicted td { color: #666; font-style: italic; }
button { font-size: 0.9em; }
.note { color: #666; font-size: 0.85em; }
.ids { white-space: pre; font-family: ui-monospace, monospace; font-size: 0.85em;
       max-height: 12em; overflow: auto; user-select: all; }
summary { cursor: pointer; }
"""

BODY = """
<h1>hwgptbench explorer</h1>
<p class="lead">Perplexity against a hardware metric of the benchmark's architectures, per
scale, device and condition. Filled markers are measured on the device; open markers with
error bars are predicted by the device's surrogate (interval shown on hover). The line is the
Pareto front of the points shown (lower is better on both axes).</p>
<div class="controls">
  <label>scale <select id="scale"></select></label>
  <label>device <select id="device"></select></label>
  <label>condition <select id="condition"></select></label>
  <label>metric <select id="metric"></select></label>
  <label><input type="checkbox" id="predicted" checked> predicted archs</label>
  <label><input type="checkbox" id="logx" checked> log x</label>
  <label>compare with <select id="compare"></select></label>
</div>
<div id="status"></div>
<div id="compare-info"></div>
<div class="row"><div id="scatter"></div><div id="heatmap"></div></div>
<h2>Pareto front <button id="copy" type="button">copy arch ids</button>
  <span id="copied" class="note"></span></h2>
<p class="note">Click a column to sort. The arch ids are what <code>hwgptbench query
--arch</code> and <code>hwgptbench export</code> take.</p>
<table id="front"><thead></thead><tbody></tbody></table>
"""

SCRIPT = r"""
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("explorer-data").textContent);
  const METRICS = DATA.metrics;
  const $ = (id) => document.getElementById(id);
  const state = { sortKey: "x", sortDir: 1, front: [] };

  function fmt(v) {
    if (v === null || v === undefined) return "–";
    const a = Math.abs(v);
    if (a >= 1000) return v.toFixed(0);
    if (a >= 100) return v.toFixed(1);
    if (a >= 10) return v.toFixed(2);
    return v.toPrecision(3);
  }
  function name(metric) { return METRICS[metric].label.replace(/ \(.*\)$/, ""); }
  function option(select, value, text) {
    const o = document.createElement("option");
    o.value = value; o.textContent = text; select.appendChild(o);
  }
  function fill(select, items, keep) {
    const old = keep ? select.value : null;
    select.innerHTML = "";
    for (const [value, text] of items) option(select, value, text);
    if (old !== null && items.some(([v]) => v === old)) select.value = old;
  }
  function scale() { return DATA.scales[$("scale").value]; }
  function column(sc, label) { return sc.columns.find((c) => c.label === label); }
  function current() {
    const sc = scale();
    return sc.columns.find((c) => c.device === $("device").value &&
                                  c.condition === $("condition").value);
  }

  // the points of a column for a metric: arch index, x, its interval, measured flag
  function points(sc, col, metric, withPredicted) {
    const out = [];
    const values = metric === "params" ? null : col.metrics[metric];
    col.ids.forEach((arch, k) => {
      const y = sc.perplexity.v[arch];
      if (y === null) return;
      let x, lo = null, hi = null, measured;
      if (metric === "params") {
        x = sc.params[arch] / 1e6; measured = k < col.rows;
      } else {
        if (!values) return;
        x = values.v[k]; lo = values.lo[k]; hi = values.hi[k]; measured = values.m[k] === 1;
      }
      if (x === null) return;
      if (!measured && !withPredicted) return;
      out.push({ arch: arch, k: k, x: x, y: y, lo: lo, hi: hi, measured: measured });
    });
    return out;
  }

  // the Pareto front (lowest x and lowest perplexity), sorted by x
  function front(pts) {
    const sorted = pts.slice().sort((a, b) => a.x - b.x || a.y - b.y);
    const kept = [];
    let best = Infinity;
    for (const p of sorted) if (p.y < best) { kept.push(p); best = p.y; }
    return kept;
  }

  function kendall(a, b) {  // tau-b
    let c = 0, d = 0, ta = 0, tb = 0;
    for (let i = 0; i < a.length; i++) for (let j = i + 1; j < a.length; j++) {
      const s = Math.sign(a[i] - a[j]) * Math.sign(b[i] - b[j]);
      if (s > 0) c++; else if (s < 0) d++;
      else { if (a[i] === a[j] && b[i] !== b[j]) ta++; if (b[i] === b[j] && a[i] !== a[j]) tb++; }
    }
    const den = Math.sqrt((c + d + ta) * (c + d + tb));
    return den > 0 ? (c - d) / den : null;
  }

  function hover(sc, col, arch, k) {
    const cfg = sc.config[arch];
    const ppl = sc.perplexity;
    const lines = ["<b>" + sc.archs[arch] + "</b>",
      "layers " + cfg[0] + " · embedding " + cfg[1] + " · bias " + (cfg[4] ? "yes" : "no"),
      "heads " + cfg[2].join(","), "MLP ratios " + cfg[3].join(","),
      "perplexity " + fmt(ppl.v[arch]) + (ppl.m[arch] ? " (measured)" :
        " (predicted, interval " + fmt(ppl.lo[arch]) + "–" + fmt(ppl.hi[arch]) + ")")];
    for (const metric of Object.keys(col.metrics)) {
      const m = col.metrics[metric];
      if (m.v[k] === null) continue;
      lines.push(name(metric) + " " + fmt(m.v[k]) + " " + METRICS[metric].unit +
        (m.m[k] ? " (measured)" : " (predicted, interval " + fmt(m.lo[k]) + "–" +
         fmt(m.hi[k]) + " " + METRICS[metric].unit + ")"));
    }
    lines.push("parameters " + fmt(sc.params[arch] / 1e6) + " M (exact)");
    lines.push(col.device + " · " + col.condition);
    return lines.join("<br>");
  }

  function fillDevices() {
    const sc = scale();
    const seen = new Map();
    for (const c of sc.columns) if (!seen.has(c.device)) seen.set(c.device, c.source);
    fill($("device"), [...seen].map(([d, s]) => [d, s ? d + " (" + s + ")" : d]), true);
    fillConditions();
  }
  function fillConditions() {
    const sc = scale();
    const cols = sc.columns.filter((c) => c.device === $("device").value);
    const before = $("condition").value;
    fill($("condition"), cols.map((c) => [c.condition, c.condition +
      (c.default ? " (default)" : "") + " · " + c.rows + " measured"]), false);
    const keep = cols.find((c) => c.condition === before);
    const dflt = cols.find((c) => c.default);
    $("condition").value = (keep || dflt || cols[0]).condition;
    fillMetrics();
  }
  function fillMetrics() {
    const col = current();
    const items = Object.keys(col.metrics).map((m) => [m, METRICS[m].label]);
    items.push(["params", METRICS.params.label]);
    fill($("metric"), items, true);
    const sc = scale();
    fill($("compare"), [["", "none"]].concat(sc.columns.filter((c) => c !== col)
      .map((c) => [c.label, c.label])), true);
    draw();
  }

  function draw() {
    const sc = scale(), col = current(), metric = $("metric").value;
    const withPredicted = $("predicted").checked;
    const pts = points(sc, col, metric, withPredicted);
    const measured = pts.filter((p) => p.measured), predicted = pts.filter((p) => !p.measured);
    const fr = front(pts);
    state.front = fr;
    const trace = (ps, extra) => Object.assign({
      x: ps.map((p) => p.x), y: ps.map((p) => p.y),
      text: ps.map((p) => hover(sc, col, p.arch, p.k)),
      customdata: ps.map((p) => sc.archs[p.arch]),
      hovertemplate: "%{text}<extra></extra>", type: "scatter", mode: "markers" }, extra);
    const traces = [
      trace(measured, { name: "measured (" + measured.length + ")",
        marker: { color: "#1f77b4", size: 6, opacity: 0.75 } }),
      trace(predicted, { name: "predicted (" + predicted.length + ")",
        marker: { color: "#ff7f0e", size: 6, symbol: "circle-open" },
        error_x: { type: "data", symmetric: false, color: "rgba(255,127,14,0.25)", thickness: 1,
          array: predicted.map((p) => p.hi === null ? 0 : Math.max(p.hi - p.x, 0)),
          arrayminus: predicted.map((p) => p.lo === null ? 0 : Math.max(p.x - p.lo, 0)) } }),
      { x: fr.map((p) => p.x), y: fr.map((p) => p.y), name: "Pareto front (" + fr.length + ")",
        type: "scatter", mode: "lines", line: { shape: "hv", color: "#d62728", width: 2 },
        hoverinfo: "skip" },
    ];
    const info = $("compare-info");
    info.textContent = "";
    const other = $("compare").value ? column(sc, $("compare").value) : null;
    if (other && metric === "params") {
      info.textContent = "Parameters do not depend on the device: choose a hardware metric to " +
        "compare " + col.label + " with " + other.label + ".";
    } else if (other && !other.metrics[metric]) {
      info.textContent = other.label + " has no " + name(metric) + ".";
    } else if (other) {
      compare(sc, col, other, metric, withPredicted, traces, info);
    }
    const label = METRICS[metric].label;
    const layout = {
      margin: { l: 60, r: 10, t: 30, b: 50 }, hovermode: "closest",
      hoverlabel: { align: "left" },
      title: { text: col.label, font: { size: 13 } },
      xaxis: { title: { text: label },
               type: $("logx").checked && metric !== "params" ? "log" : "linear" },
      yaxis: { title: { text: "perplexity" } }, legend: { orientation: "h", y: -0.15 } };
    Plotly.react("scatter", traces, layout, { displaylogo: false, responsive: true });
    $("status").textContent = pts.length + " points: " + measured.length + " measured" +
      (withPredicted ? ", " + predicted.length + " predicted" : "") + " (the device's table has " +
      col.rows + " rows at " + col.condition + "; source: " + (col.source || "–") + "); " +
      fr.length + " on the front.";
    $("status").dataset.points = String(pts.length);
    $("status").dataset.rows = String(col.rows);
    heatmap(sc, metric, col, other);
    table(sc, col, metric);
  }

  function compare(sc, col, other, metric, withPredicted, traces, info) {
    const a = new Map(points(sc, col, metric, withPredicted).map((p) => [p.arch, p]));
    const b = new Map(points(sc, other, metric, withPredicted).map((p) => [p.arch, p]));
    const shared = [...a.keys()].filter((k) => b.has(k));
    const fa = new Set(front(shared.map((k) => a.get(k))).map((p) => p.arch));
    const fb = new Set(front(shared.map((k) => b.get(k))).map((p) => p.arch));
    const onlyA = shared.filter((k) => fa.has(k) && !fb.has(k)).map((k) => a.get(k));
    const onlyB = shared.filter((k) => fb.has(k) && !fa.has(k)).map((k) => a.get(k));
    const ring = (ps, label, color) => ({ x: ps.map((p) => p.x), y: ps.map((p) => p.y),
      name: label + " (" + ps.length + ")", type: "scatter", mode: "markers",
      text: ps.map((p) => hover(sc, col, p.arch, p.k)), hovertemplate: "%{text}<extra></extra>",
      marker: { size: 13, color: "rgba(0,0,0,0)", line: { color: color, width: 2.5 } } });
    traces.push(ring(onlyA, "on this front only", "#2ca02c"));
    traces.push(ring(onlyB, "on " + other.device + "'s front only", "#9467bd"));
    const bothMeasured = shared.filter((k) => a.get(k).measured && b.get(k).measured);
    const tm = kendall(bothMeasured.map((k) => a.get(k).x), bothMeasured.map((k) => b.get(k).x));
    const ts = kendall(shared.map((k) => a.get(k).x), shared.map((k) => b.get(k).x));
    const tauText = (t, n) => n >= DATA.min_shared && t !== null ?
      "τ = " + t.toFixed(3) + " (n = " + n + ")" : "τ: too few archs (n = " + n + ")";
    info.innerHTML = "";
    const add = (text) => { const d = document.createElement("div"); d.textContent = text;
                            info.appendChild(d); };
    const list = (title, ps, id) => {
      const d = document.createElement("details"); d.id = id;
      const s = document.createElement("summary"); s.textContent = title + ": " + ps.length +
        " archs (arch ids)";
      const t = document.createElement("div"); t.className = "ids";
      t.textContent = ps.map((p) => sc.archs[p.arch]).join("\n") || "none";
      d.appendChild(s); d.appendChild(t); info.appendChild(d); };
    add("Kendall τ of " + name(metric) + ", " + col.label + " vs " + other.label + ": archs " +
        "measured on both " + tauText(tm, bothMeasured.length) + "; all shared points shown " +
        "(predictions included) " + tauText(ts, shared.length) + ". Fronts over the " +
        shared.length + " shared archs: " + fa.size + " and " + fb.size + " archs.");
    list("on this front only (green rings)", onlyA, "only-this");
    list("on " + other.label + "'s front only (purple rings)", onlyB, "only-other");
    info.dataset.tau = tm === null ? "" : String(tm);
    info.dataset.n = String(bothMeasured.length);
  }

  function heatmap(sc, metric, col, other) {
    const m = sc.tau[metric === "params" ? "latency_ms" : metric] || sc.tau.latency_ms;
    if (!m) {
      Plotly.purge("heatmap"); $("heatmap").textContent = "no τ: no measured values"; return;
    }
    const shown = metric === "params" ? "latency_ms" : metric;
    const text = m.tau.map((row, i) => row.map((t, j) =>
      (t === null ? "–" : t.toFixed(2)) + "<br>n=" + m.n[i][j]));
    const z = m.tau.map((row) => row.map((t) => t === null ? null : t));
    const short = m.labels.map((l) => l.replace(/^cuda-|^cpu-/, "").replace(" ", "<br>"));
    Plotly.react("heatmap", [{ type: "heatmap", z: z, x: short, y: short, text: text,
      texttemplate: "%{text}", hovertemplate: "%{x} vs %{y}<br>τ %{z:.3f}<extra></extra>",
      colorscale: "RdBu", zmin: -1, zmax: 1, colorbar: { title: { text: "τ" } } }],
      { margin: { l: 150, r: 10, t: 30, b: 150 }, xaxis: { tickangle: -35 },
        title: { text: "Kendall τ of measured " + name(shown) + " (n archs both measured)",
                 font: { size: 13 } },
        yaxis: { autorange: "reversed" } }, { displaylogo: false, responsive: true });
  }

  function table(sc, col, metric) {
    const unit = METRICS[metric].unit;
    const heads = [["arch", "arch id"], ["y", "perplexity"],
                   ["x", name(metric) + (unit ? " (" + unit + ")" : "")],
                   ["measured", "measured"], ["params", "parameters (M)"], ["layers", "layers"],
                   ["embed", "embedding"]];
    const rows = state.front.map((p) => ({ arch: sc.archs[p.arch], y: p.y, x: p.x,
      measured: p.measured ? "measured" : "predicted", params: sc.params[p.arch] / 1e6,
      layers: sc.config[p.arch][0], embed: sc.config[p.arch][1] }));
    const key = state.sortKey, dir = state.sortDir;
    rows.sort((a, b) => (a[key] < b[key] ? -1 : a[key] > b[key] ? 1 : 0) * dir);
    const thead = $("front").tHead, tbody = $("front").tBodies[0];
    thead.innerHTML = ""; tbody.innerHTML = "";
    const tr = thead.insertRow();
    for (const [k, text] of heads) {
      const th = document.createElement("th");
      th.textContent = text; th.dataset.key = k;
      if (k === key) th.className = dir > 0 ? "sorted-asc" : "sorted-desc";
      th.addEventListener("click", () => {
        state.sortDir = state.sortKey === k ? -state.sortDir : 1; state.sortKey = k;
        table(sc, col, metric); });
      tr.appendChild(th);
    }
    for (const r of rows) {
      const row = tbody.insertRow();
      if (r.measured !== "measured") row.className = "predicted";
      for (const [k] of heads) {
        const v = r[k];
        const exact = k === "layers" || k === "embed";
        row.insertCell().textContent = typeof v === "number" && !exact ? fmt(v) : v;
      }
    }
  }

  function copyIds() {
    const ids = [...$("front").tBodies[0].rows].map((r) => r.cells[0].textContent).join("\n");
    const done = () => { $("copied").textContent = "copied " +
      $("front").tBodies[0].rows.length + " arch ids"; };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(ids).then(done, () => fallback(ids, done));
    } else { fallback(ids, done); }
  }
  function fallback(text, done) {
    const area = document.createElement("textarea");
    area.value = text; document.body.appendChild(area); area.select();
    try { document.execCommand("copy"); done(); } catch (e) {
      $("copied").textContent = "select the ids in the table to copy them"; }
    document.body.removeChild(area);
  }

  fill($("scale"), Object.keys(DATA.scales).map((s) => [s, s]), false);
  $("scale").addEventListener("change", fillDevices);
  $("device").addEventListener("change", fillConditions);
  $("condition").addEventListener("change", fillMetrics);
  for (const id of ["metric", "predicted", "logx", "compare"]) {
    $(id).addEventListener("change", draw);
  }
  $("copy").addEventListener("click", copyIds);
  fillDevices();
})();
"""
