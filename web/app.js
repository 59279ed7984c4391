// tau's dashboard: a hash-routed single page over the public REST API (/api/v1) and its live event
// stream (/api/v1/events). No framework: each view is a function that renders into #view and may
// return a cleanup (to stop a log stream or a chart) for when the route changes.
"use strict";

const STATES = ["Queued", "Admitted", "Running", "Succeeded", "Failed", "Cancelled"];
const TERMINAL = new Set(["Succeeded", "Failed", "Cancelled"]);
const PAGE = 50;

const $view = document.getElementById("view");
let cleanup = null;       // the current view's cleanup
let onLive = null;        // the current view's handler of live events: (type, data) => void

// ---- helpers ----------------------------------------------------------------------------------

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function html(strings, ...values) {
  // Tagged template: values are escaped unless wrapped with raw().
  return strings.reduce((out, s, i) => {
    const v = values[i - 1];
    return out + (v && v.__raw !== undefined ? v.__raw : Array.isArray(v) ? v.map((x) => (x && x.__raw !== undefined ? x.__raw : esc(x))).join("") : esc(v)) + s;
  });
}
function raw(s) { return { __raw: s }; }
async function api(path) {
  const res = await fetch(path, { headers: { Accept: "application/json" } });
  let body = null;
  try { body = await res.json(); } catch (_) { /* not JSON */ }
  if (!res.ok) {
    const err = new Error((body && body.error && body.error.message) || `${res.status} ${res.statusText}`);
    err.status = res.status;
    throw err;
  }
  return body;
}
function time(t) { return t ? new Date(t).toLocaleString() : ""; }
function state(s) { return raw(`<span class="state ${esc(s)}" data-state="${esc(s)}">${esc(s)}</span>`); }
function query() {
  const q = location.hash.split("?")[1] || "";
  return new URLSearchParams(q);
}
function debounce(fn, ms) {
  let t = null;
  return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };
}
function pendingText(p) {
  if (!p) return "";
  const pos = p.position ? `#${p.position} ` : "";
  return `${pos}${p.code ? p.code + ": " : ""}${p.reason || ""}`;
}
function humanQuantity(text) {
  // A binary-suffixed quantity in its largest unit, one decimal at most ("24683584Ki" is "23.5Gi"),
  // as the CLI shows it (HumanQuantity); anything else as it is.
  const units = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
  const m = /^([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei)$/.exec(String(text ?? ""));
  if (!m) return text;
  let value = Number(m[1]), unit = units.indexOf(m[2]);
  if (value < 1024) return text;
  while (value >= 1024 && unit + 1 < units.length) { value /= 1024; unit++; }
  return value.toFixed(1).replace(/\.0$/, "") + units[unit];
}
function quantity(text) {
  // Kubernetes quantities as numbers (enough for usage bars): 500m, 2, 4Gi, 1G.
  const m = /^([0-9.]+)([a-zA-Z]*)$/.exec(String(text || "0"));
  if (!m) return 0;
  const mult = { "": 1, m: 1e-3, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4 }[m[2]];
  return parseFloat(m[1]) * (mult ?? 1);
}

// ---- live updates ------------------------------------------------------------------------------

function connectLive() {
  const badge = document.getElementById("live");
  const es = new EventSource("/api/v1/events");
  // A change between a view's fetch and the stream's start (or during a reconnect) is in no event:
  // `hello` tells the view to look again.
  es.addEventListener("hello", () => {
    badge.textContent = "live"; badge.className = "live on";
    if (onLive) onLive("hello", null);
  });
  es.onerror = () => { badge.textContent = "reconnecting"; badge.className = "live off"; };
  for (const type of ["run", "queues"]) {
    es.addEventListener(type, (e) => {
      let data = null;
      try { data = JSON.parse(e.data); } catch (_) { return; }
      if (onLive) onLive(type, data);
    });
  }
}

// ---- runs --------------------------------------------------------------------------------------

// The runs ticked for comparison; kept across the list's live reloads and its pages.
const selected = new Set();
const FILTERS = ["state", "workspace", "queue", "project", "group"];

async function viewRuns() {
  const q = query();
  const f = { page: parseInt(q.get("page") || "0", 10) };
  for (const k of FILTERS) f[k] = q.get(k) || "";
  $view.innerHTML = html`<h1>Runs</h1>
    <form class="filters" id="filters">
      <label>State<select name="state"><option value="">any</option>${STATES.map((s) => raw(`<option ${s === f.state ? "selected" : ""}>${s}</option>`))}</select></label>
      <label>Workspace<input name="workspace" value="${f.workspace}" placeholder="any"></label>
      <label>Queue<input name="queue" value="${f.queue}" placeholder="any"></label>
      <label>Project<input name="project" value="${f.project}" placeholder="any"></label>
      <label>Group<input name="group" value="${f.group}" placeholder="any"></label>
      <button type="submit">Filter</button>
      <button type="button" id="compare-selected" disabled>Compare selected</button>
    </form>
    <div id="runs-table"><p class="muted">Loading…</p></div>`;
  document.getElementById("filters").addEventListener("submit", (e) => {
    e.preventDefault();
    const d = new FormData(e.target);
    const p = new URLSearchParams();
    for (const k of FILTERS) if (d.get(k)) p.set(k, d.get(k));
    location.hash = "#/runs" + (p.toString() ? "?" + p : "");
  });
  const button = document.getElementById("compare-selected");
  const showSelection = () => {
    button.disabled = selected.size < 2;
    button.textContent = `Compare selected (${selected.size})`;
  };
  showSelection();
  button.addEventListener("click", () => { location.hash = "#/compare?runs=" + [...selected].join(","); });
  document.getElementById("runs-table").addEventListener("change", (e) => {
    const box = e.target.closest("input.pick");
    if (!box) return;
    if (box.checked) selected.add(box.value); else selected.delete(box.value);
    showSelection();
  });
  const load = async () => {
    const p = new URLSearchParams({ limit: PAGE, offset: f.page * PAGE });
    if (f.state) p.set("state", f.state);
    if (f.workspace) p.set("workspace", f.workspace);
    if (f.queue) p.set("queue", f.queue);
    if (f.project) p.set("project", f.project);
    if (f.group) p.set("group", f.group);
    let body;
    try { body = await api("/api/v1/runs?" + p); } catch (e) {
      const table = document.getElementById("runs-table");
      if (table) table.innerHTML = html`<p class="error">${e.message}</p>`;
      return;
    }
    // The view may have been left while the page loaded.
    if (!document.getElementById("runs-table")) return;
    const runs = body.runs;  // the API filters by state, workspace, queue, project and group
    const pages = Math.max(1, Math.ceil(body.total / PAGE));
    const link = (page) => { const x = query(); x.set("page", page); return "#/runs?" + x; };
    document.getElementById("runs-table").innerHTML = html`<table id="runs">
      <thead><tr><th title="tick two or more to compare"></th><th>Name</th><th>State</th><th>Queue</th><th>Workspace</th><th>Project</th><th>Group</th><th>Attempts</th><th>Created</th><th>Reason</th></tr></thead>
      <tbody>${runs.map((r) => raw(html`<tr data-run="${r.name}">
        <td><input type="checkbox" class="pick" value="${r.name}" aria-label="compare ${r.name}" ${raw(selected.has(r.name) ? "checked" : "")}></td>
        <td><a href="#/runs/${r.name}">${r.name}</a></td><td>${state(r.state)}</td><td>${r.queue}</td><td>${r.workspace}</td>
        <td>${r.project || ""}</td><td>${r.group || ""}</td>
        <td>${r.attempts}</td><td>${time(r.created)}</td>
        <td class="${r.pending ? "reason" : ""}">${r.pending ? pendingText(r.pending) : r.reason}</td></tr>`))}</tbody></table>
      ${runs.length === 0 ? raw('<p class="muted">No runs.</p>') : ""}
      <div class="pager">
        ${f.page > 0 ? raw(html`<a href="${link(f.page - 1)}">← newer</a>`) : ""}
        <span class="muted">page ${f.page + 1} of ${pages} · ${body.total} runs</span>
        ${f.page + 1 < pages ? raw(html`<a href="${link(f.page + 1)}">older →</a>`) : ""}
      </div>`;
  };
  await load();
  // Live: reload the page of runs (one paged request) at most twice a second.
  const reload = debounce(load, 300);
  onLive = (type) => { if (type === "run" || type === "hello") reload(); };
}

// ---- one run -----------------------------------------------------------------------------------

async function viewRun(name) {
  $view.innerHTML = html`<h1>Run ${name}</h1><div id="run-body"><p class="muted">Loading…</p></div>
    <h2>Metrics</h2><div id="metrics" class="charts"><p class="muted">Loading…</p></div>
    <h2>GPU samples</h2><div id="gpu-samples"><p class="muted">Loading…</p></div>
    <h2>Evidence</h2><div id="evidence"><p class="muted">Loading…</p></div>
    <h2>Artifacts</h2><div id="artifacts"><p class="muted">Loading…</p></div>
    <h2>Log <span class="muted">(rank 0, live tail)</span></h2><pre class="log" id="log"></pre>`;
  const stops = [];
  let lastState = null;
  const renderDetail = async () => {
    let d;
    try { d = await api(`/api/v1/runs/${encodeURIComponent(name)}`); } catch (e) {
      document.getElementById("run-body").innerHTML = html`<p class="error">${e.message}</p>`;
      return null;
    }
    const r = d.run;
    // The event log is the lifecycle; the timestamps stand in for it only when it is empty.
    const milestones = [["created", r.created], ["admitted", r.admitted], ["started", r.started], ["finished", r.finished]].filter((x) => x[1]);
    document.getElementById("run-body").innerHTML = html`
      <div class="cards">
        <div class="card"><div class="k">State</div><div id="run-state">${state(r.state)}</div></div>
        <div class="card"><div class="k">Queue</div>${r.queue}</div>
        <div class="card"><div class="k">Workspace</div>${r.workspace}</div>
        <div class="card"><div class="k">Priority</div>${r.priority}</div>
        <div class="card"><div class="k">Attempts</div>${r.attempts}</div>
        <div class="card"><div class="k">Exit</div>${r.exit_code ?? (r.signal ? "signal " + r.signal : "—")}</div>
        ${r.service && r.service.name ? raw(html`<div class="card"><div class="k">Replica of service</div><a id="run-service" href="#/services/${r.service.name}">${r.service.name}</a> <span class="muted">revision ${r.service.revision}, port ${r.service.port}</span></div>`) : ""}
      </div>
      ${r.pending ? raw(html`<p class="reason" id="pending-reason">Waiting: ${pendingText(r.pending)}</p>`) : ""}
      ${r.reason || r.message ? raw(html`<p id="run-reason">${r.reason}${r.message ? " — " + r.message : ""}</p>`) : ""}
      <h2>Lifecycle</h2>
      <ul class="timeline" id="timeline">
        ${d.events.length ? "" : milestones.map(([k, t]) => raw(html`<li><time>${time(t)}</time><b>${k}</b></li>`))}
        ${d.events.map((e) => raw(html`<li><time>${time(e.time)}</time>${e.type}${e.message ? ": " + e.message : ""}</li>`))}
      </ul>
      <h2>Attempts</h2>
      ${d.attempts.length === 0 ? raw('<p class="muted">No attempts yet.</p>') : raw(html`<table id="attempts">
        <thead><tr><th>#</th><th>State</th><th>Outcome</th><th>Failure class</th><th>Exit</th><th>Started</th><th>Ended</th><th>Diagnosis</th></tr></thead>
        <tbody>${d.attempts.map((a) => raw(html`<tr><td>${a.number}</td><td>${a.state}</td><td>${a.outcome}</td><td>${a.reason}</td>
          <td>${a.exit_code ?? (a.signal ? "signal " + a.signal : "")}</td><td>${time(a.started)}</td><td>${time(a.ended)}</td>
          <td>${a.message}${raw(diagnosisHtml(a.diagnosis))}</td></tr>`))}</tbody></table>`)}`;
    return r;
  };
  const r = await renderDetail();
  if (!r) return;
  lastState = r.state;
  const refresh = debounce(async () => {
    const now = await renderDetail();
    if (now && now.state !== lastState) {
      lastState = now.state;
      if (TERMINAL.has(now.state)) { loadMetrics(name, stops); loadEvidence(name); loadArtifacts(name); }
    }
  }, 200);
  onLive = (type, data) => { if (type === "hello" || (type === "run" && data.name === name)) refresh(); };
  stops.push(tailLog(name));
  loadMetrics(name, stops);
  loadEvidence(name);
  loadArtifacts(name);
  return () => stops.forEach((s) => s && s());
}

function tailLog(name) {
  // The log endpoint streams (chunked) until the run ends; keep the last lines only.
  const ctrl = new AbortController();
  const pre = document.getElementById("log");
  let text = "";
  (async () => {
    try {
      const res = await fetch(`/api/v1/runs/${encodeURIComponent(name)}/logs?follow=1`, { signal: ctrl.signal });
      if (!res.ok) { pre.textContent = "(no log yet)"; return; }
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        text += dec.decode(value, { stream: true });
        const lines = text.split("\n");
        if (lines.length > 400) text = lines.slice(-400).join("\n");
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.textContent = text;
        if (atBottom) pre.scrollTop = pre.scrollHeight;
      }
    } catch (_) { /* aborted or the server went away */ }
    if (!text) pre.textContent = "(empty log)";
  })();
  return () => ctrl.abort();
}

// Points in any of the shapes the metrics API may answer with: a flat list of MetricPoint JSON
// ({name, step, value, split?}) under "points" or "history", or "series" each with "points".
function metricSeries(body) {
  const groups = new Map();
  const add = (p, name, split) => {
    const n = p.name ?? name, s = p.split ?? split ?? "";
    const v = typeof p.value === "number" ? p.value : parseFloat(p.value);
    if (n === undefined || p.step === undefined) return;
    const key = s ? `${n} (${s})` : n;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push([Number(p.step), Number.isFinite(v) ? v : null]);
  };
  for (const p of body.points || body.history || []) add(p);
  for (const s of body.series || []) for (const p of s.points || []) add(p, s.name, s.split);
  for (const pts of groups.values()) pts.sort((a, b) => a[0] - b[0]);
  return groups;
}

async function loadMetrics(name, stops) {
  // GET .../metrics lists one summary per series (name, split); ?name=N adds that metric's points.
  const box = document.getElementById("metrics");
  if (!box) return;
  const base = `/api/v1/runs/${encodeURIComponent(name)}/metrics`;
  let body;
  try { body = await api(base); } catch (e) {
    box.innerHTML = e.status === 404 ? '<p class="muted" id="no-metrics">No metrics recorded.</p>' : html`<p class="error">${e.message}</p>`;
    return;
  }
  const groups = metricSeries(body);
  // Loss first: it is the curve people look for. At most 8 metrics, to keep the page light.
  const names = [...new Set((body.summaries || []).map((x) => x.name))]
    .sort((a, b) => (b.startsWith("loss") - a.startsWith("loss")) || a.localeCompare(b)).slice(0, 8);
  for (const n of names) {
    try { for (const [k, v] of metricSeries(await api(`${base}?name=${encodeURIComponent(n)}`))) groups.set(k, v); } catch (_) { /* shown as missing */ }
  }
  if (groups.size === 0) { box.innerHTML = '<p class="muted" id="no-metrics">No metrics recorded.</p>'; return; }
  box.innerHTML = "";
  const keys = [...groups.keys()].sort((a, b) => (b.startsWith("loss") - a.startsWith("loss")) || a.localeCompare(b));
  for (const key of keys) {
    const pts = groups.get(key);
    const div = document.createElement("div");
    div.className = "chart";
    div.dataset.metric = key;
    div.innerHTML = html`<h3>${key} <span class="muted">${pts.length} points, last ${pts[pts.length - 1][1]}</span></h3>`;
    box.appendChild(div);
    const plot = new uPlot({ width: 420, height: 220, scales: { x: { time: false } },
      series: [{ label: "step" }, { label: key, stroke: "#2563eb", width: 2 }],
      axes: [{ label: "step" }, {}] }, [pts.map((p) => p[0]), pts.map((p) => p[1])], div);
    stops.push(() => plot.destroy());
  }
}

async function loadEvidence(name) {
  // The run's evidence record (docs/evidence.md): a summary here, the bundle for export.
  const box = document.getElementById("evidence"), gpus = document.getElementById("gpu-samples");
  if (!box) return;
  let rec;
  try { rec = await api(`/api/v1/runs/${encodeURIComponent(name)}/evidence`); } catch (e) {
    box.innerHTML = e.status === 404 ? '<p class="muted">No evidence record (yet).</p>' : html`<p class="error">${e.message}</p>`;
    gpus.innerHTML = '<p class="muted">No GPU samples.</p>';
    return;
  }
  const m = rec.metrics || {};
  const summary = [
    ["record format", rec.format], ["updated", rec.updated_ms ? new Date(rec.updated_ms).toLocaleString() : ""],
    ["events", (rec.events || []).length], ["chain head", (rec.chain_head || "").slice(0, 16)],
    ["attempts", (rec.attempts || []).length], ["metric series", (m.series || []).length],
    ["malformed metric lines", m.malformed ?? 0], ["artifacts", (rec.artifacts || []).length],
    ["config hash", ((rec.config || {}).config_hash || (rec.run || {}).config_hash || "").slice(0, 16)],
  ];
  box.innerHTML = html`<div class="cards">${summary.map(([k, v]) => raw(html`<div class="card"><div class="k">${k}</div>${v}</div>`))}</div>
    <p><a id="evidence-export" href="/api/v1/runs/${name}/evidence/bundle" download="${name}-evidence.tar.gz">Export evidence bundle (tar.gz)</a> ·
    <a href="/api/v1/runs/${name}/evidence" target="_blank">record JSON</a></p>`;
  const samples = rec.gpu_samples || [];
  gpus.innerHTML = samples.length
    ? html`<table id="gpu-samples-table"><thead><tr><th>GPU</th><th>Samples</th><th>Mean util %</th><th>Max util %</th><th>Max temp °C</th><th>Max power W</th><th>Max memory</th></tr></thead>
      <tbody>${samples.map((s) => raw(html`<tr><td>${s.gpu} <span class="muted">${s.uuid || ""}</span></td><td>${s.count}</td><td>${s.mean_util_pct != null ? s.mean_util_pct.toFixed(1) : ""}</td><td>${s.max_util_pct ?? ""}</td><td>${s.max_temperature_c ?? ""}</td><td>${s.max_power_w ?? ""}</td><td>${s.max_memory_used_bytes ? (s.max_memory_used_bytes / 2 ** 20).toFixed(0) + " MiB" : ""}</td></tr>`))}</tbody></table>`
    : '<p class="muted">No GPU samples.</p>';
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

async function loadArtifacts(name) {
  // The run's checkpoints and outputs (GET .../artifacts): digests only where the server knows
  // them already, so that opening the page never makes it read a large checkpoint.
  const box = document.getElementById("artifacts");
  if (!box) return;
  let list;
  try { list = await api(`/api/v1/runs/${encodeURIComponent(name)}/artifacts?limit=200`); } catch (e) {
    box.innerHTML = html`<p class="muted">${e.message}</p>`;
    return;
  }
  const files = list.artifacts || [];
  if (!files.length) { box.innerHTML = '<p class="muted">No checkpoints or outputs.</p>'; return; }
  const more = list.total > files.length ? html`<p class="muted">${files.length} of ${list.total} files shown; \`tau artifacts ${name} --offset ${files.length}\` lists the rest.</p>` : "";
  const cut = list.truncated ? html`<p class="muted">A directory holds more than ${list.max_listed} files: the list is not complete.</p>` : "";
  box.innerHTML = html`<table id="artifacts-table"><thead><tr><th>Path</th><th>Size</th><th>SHA-256</th><th>Modified</th></tr></thead>
    <tbody>${files.map((a) => raw(html`<tr data-path="${a.path}"><td><a class="artifact-download" href="/api/v1/runs/${encodeURIComponent(name)}/artifacts/file?path=${encodeURIComponent(a.path)}" download="${a.path.split("/").pop()}">${a.path}</a></td>
      <td title="${a.size} bytes">${bytes(a.size)}</td><td><code>${a.sha256 ? a.sha256.slice(0, 16) + "…" : "—"}</code></td><td>${time(a.modified)}</td></tr>`))}</tbody></table>${raw(more)}${raw(cut)}`;
}

// ---- compare -----------------------------------------------------------------------------------

// Train and validation series share a chart: a metric's chart is its name without a leading
// train/training/val/valid/validation/eval/test and one of "/", "_", "." ("val/loss", "val_loss" and
// "loss" with split "val" all go to "loss"); the prefix, or the split, is the series' phase.
const PHASE = /^(train|training|val|valid|validation|eval|test)[/_.](.+)$/;
function chartOf(name, split) {
  const m = PHASE.exec(name);
  if (m) return { chart: m[2], phase: split ? `${m[1]} ${split}` : m[1] };
  return { chart: name, phase: split || "" };
}
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"];
const DASHES = [[], [6, 4], [2, 3], [10, 3, 2, 3]];  // by phase: train (or none) solid, then val, ...

// Exponential moving average: each value is w * the previous smoothed one + (1 - w) * its own.
function smooth(values, w) {
  if (!(w > 0)) return values;
  let last = null;
  return values.map((v) => (v == null ? null : (last = last == null ? v : w * last + (1 - w) * v)));
}

// The steps where a later attempt's points begin in one series: [{step, attempt}].
function attemptStarts(points) {
  const first = new Map();
  for (const p of points) if (!first.has(p.attempt) || p.step < first.get(p.attempt)) first.set(p.attempt, p.step);
  const attempts = [...first.keys()].sort((a, b) => a - b);
  return attempts.slice(1).map((a) => ({ attempt: a, step: first.get(a) }));
}

// The attempt boundaries of one chart: one per run and later attempt, at the attempt's first step
// over all the run's series in it (a train and a validation split of one attempt begin at
// different steps, and one label each would repeat): [{run, attempt, step}].
function attemptBounds(series, runs) {
  return runs.flatMap((run) => attemptStarts(series.filter((s) => s.run === run).flatMap((s) => s.points)).map((b) => ({ ...b, run })));
}

// A run's config as compare sees it (`tau compare`, docs/experiments.md): its canonical spec
// flattened to dotted paths, the resolution's values and sources over it, no overrides list.
function flatten(v, prefix, out) {
  if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) {
    for (const k of Object.keys(v)) flatten(v[k], prefix ? `${prefix}.${k}` : k, out);
  } else if (Array.isArray(v) && v.length) {
    v.forEach((x, i) => flatten(x, `${prefix}[${i}]`, out));
  } else {
    out.set(prefix, typeof v === "string" ? v : JSON.stringify(v));
  }
}
function configOf(record) {
  const config = (record && record.config) || {};
  const text = (v) => (typeof v === "string" ? v : JSON.stringify(v ?? ""));
  const prov = new Map();
  for (const p of config.provenance || []) if (p && typeof p.field === "string") prov.set(p.field, { value: text(p.value), source: text(p.source) });
  const sourceFor = (field) => {
    for (let f = field; ;) {
      if (prov.has(f)) return prov.get(f).source;
      const cut = Math.max(f.lastIndexOf("."), f.lastIndexOf("["));
      if (cut <= 0) return "";
      f = f.slice(0, cut);
    }
  };
  const spec = { ...(config.spec || {}) };
  delete spec.overrides;
  const leaves = new Map();
  if (Object.keys(spec).length) flatten(spec, "", leaves);
  const out = new Map();
  for (const [field, value] of leaves) out.set(field, { value, source: sourceFor(field) });
  for (const [field, s] of prov) out.set(field, s);
  return out;
}
function configDiffs(configs) {
  const fields = [...new Set(configs.flatMap((c) => [...c.keys()]))].sort();
  return fields.filter((f) => new Set(configs.map((c) => (c.has(f) ? c.get(f).value : undefined))).size > 1)
    .map((f) => ({ field: f, cells: configs.map((c) => c.get(f)) }));
}

// Each run's series of every metric: [{run, name, split, points: [{step, value, attempt}]}].
async function compareSeries(run) {
  const base = `/api/v1/runs/${encodeURIComponent(run)}/metrics`;
  let body;
  try { body = await api(base); } catch (e) { if (e.status === 404) return []; throw e; }
  const names = [...new Set((body.summaries || []).map((s) => s.name))].slice(0, 24);
  const out = [];
  for (const n of names) {
    const one = await api(`${base}?name=${encodeURIComponent(n)}`);
    for (const s of one.series || []) {
      const points = (s.points || []).map((p) => ({ step: Number(p.step), value: typeof p.value === "number" ? p.value : null, attempt: p.attempt ?? 0 }));
      points.sort((a, b) => a.step - b.step);
      out.push({ run, name: s.name, split: s.split || "", points });
    }
  }
  return out;
}

function drawCompareChart(div, series, runs, opts) {
  // One x array for the chart (every step any series has), each series null where it has none.
  const steps = [...new Set(series.flatMap((s) => s.points.map((p) => p.step)))].sort((a, b) => a - b);
  const at = new Map(steps.map((x, i) => [x, i]));
  const phases = [...new Set(series.map((s) => s.phase))].sort((a, b) => (a !== "" && !/^train/.test(a)) - (b !== "" && !/^train/.test(b)) || a.localeCompare(b));
  const data = [steps];
  const config = [{ label: "step" }];
  const bounds = [];
  for (const s of series) {
    const ys = new Array(steps.length).fill(null);
    const vals = smooth(s.points.map((p) => (opts.log && !(p.value > 0) ? null : p.value)), opts.smoothing);
    s.points.forEach((p, i) => { ys[at.get(p.step)] = vals[i]; });
    data.push(ys);
    const color = PALETTE[runs.indexOf(s.run) % PALETTE.length];
    config.push({ label: s.phase ? `${s.run} · ${s.phase}` : s.run, stroke: color, width: 2, spanGaps: true,
      dash: DASHES[phases.indexOf(s.phase) % DASHES.length] });
  }
  for (const b of attemptBounds(series, runs)) bounds.push({ ...b, color: PALETTE[runs.indexOf(b.run) % PALETTE.length] });
  div.dataset.series = String(series.length);
  div.dataset.scale = opts.log ? "log" : "linear";
  div.dataset.boundaries = String(bounds.length);
  // Attempt boundaries: a dashed vertical line, in the run's colour, where a later attempt's
  // points begin.
  const marks = (u) => {
    const ctx = u.ctx;
    ctx.save();
    ctx.setLineDash([4, 4]);
    ctx.lineWidth = 1;
    ctx.font = `${10 * devicePixelRatio}px system-ui`;
    for (const b of bounds) {
      const x = Math.round(u.valToPos(b.step, "x", true));
      ctx.strokeStyle = b.color;
      ctx.fillStyle = b.color;
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      ctx.fillText(`attempt ${b.attempt}`, x + 3, u.bbox.top + 12 * devicePixelRatio);
    }
    ctx.restore();
  };
  return new uPlot({ width: 560, height: 260, scales: { x: { time: false }, y: opts.log ? { distr: 3 } : {} },
    series: config, axes: [{ label: "step" }, {}], hooks: { draw: [marks] } }, data, div);
}

async function viewCompare() {
  const runs = [...new Set((query().get("runs") || "").split(",").filter((r) => /^[a-z0-9-]+$/.test(r)))];
  $view.innerHTML = html`<h1>Compare ${runs.length} runs</h1>
    <p id="cmp-runs">${runs.map((r, i) => raw(html`<a href="#/runs/${r}" class="cmp-run"><span class="swatch" style="background:${PALETTE[i % PALETTE.length]}"></span>${r}</a> `))}</p>
    <form class="filters" id="cmp-controls">
      <label class="inline"><input type="checkbox" id="cmp-log"> log scale</label>
      <label>Smoothing (EMA) <input type="range" id="cmp-smooth" min="0" max="0.99" step="0.01" value="0"></label>
      <output id="cmp-smooth-value">0</output>
    </form>
    <h2>Metrics <span class="muted">(one chart per metric; train and validation together, validation dashed; dashed verticals: a later attempt's first step)</span></h2>
    <div id="cmp-charts" class="charts"><p class="muted">Loading…</p></div>
    <h2>Config differences</h2><div id="cmp-config"><p class="muted">Loading…</p></div>`;
  if (runs.length < 2) {
    document.getElementById("cmp-charts").innerHTML = '<p class="error">Pick two runs or more in the runs list.</p>';
    document.getElementById("cmp-config").innerHTML = "";
    return;
  }
  const plots = [];
  const stop = () => { while (plots.length) plots.pop().destroy(); };
  const charts = new Map();
  const box = document.getElementById("cmp-charts");
  try {
    for (const s of (await Promise.all(runs.map(compareSeries))).flat()) {
      const { chart, phase } = chartOf(s.name, s.split);
      if (!charts.has(chart)) charts.set(chart, []);
      charts.get(chart).push({ ...s, phase });
    }
  } catch (e) { box.innerHTML = html`<p class="error">${e.message}</p>`; }
  const opts = { log: false, smoothing: 0 };
  const draw = () => {
    stop();
    if (charts.size === 0) { if (!box.querySelector(".error")) box.innerHTML = '<p class="muted" id="cmp-none">No metrics recorded.</p>'; return; }
    box.innerHTML = "";
    const names = [...charts.keys()].sort((a, b) => (b.startsWith("loss") - a.startsWith("loss")) || a.localeCompare(b));
    for (const name of names) {
      const div = document.createElement("div");
      div.className = "chart";
      div.dataset.metric = name;
      div.innerHTML = html`<h3>${name}</h3>`;
      box.appendChild(div);
      plots.push(drawCompareChart(div, charts.get(name), runs, opts));
    }
  };
  draw();
  document.getElementById("cmp-log").addEventListener("change", (e) => { opts.log = e.target.checked; draw(); });
  const redraw = debounce(draw, 100);
  document.getElementById("cmp-smooth").addEventListener("input", (e) => {
    opts.smoothing = parseFloat(e.target.value);
    document.getElementById("cmp-smooth-value").textContent = e.target.value;
    redraw();
  });

  const cfg = document.getElementById("cmp-config");
  try {
    const records = await Promise.all(runs.map((r) => api(`/api/v1/runs/${encodeURIComponent(r)}/evidence`)));
    const diffs = configDiffs(records.map(configOf));
    cfg.innerHTML = diffs.length === 0 ? '<p class="muted" id="cmp-config-same">The same in every run.</p>'
      : html`<table id="cmp-config-table"><thead><tr><th>Field</th>${runs.map((r) => raw(html`<th>${r}</th>`))}</tr></thead>
        <tbody>${diffs.map((d) => raw(html`<tr data-field="${d.field}"><td><code>${d.field}</code></td>${d.cells.map((c) => raw(c
          ? html`<td>${c.value}${c.source ? raw(html` <span class="muted">(${c.source})</span>`) : ""}</td>` : '<td class="muted">—</td>'))}</tr>`))}</tbody></table>`;
  } catch (e) { cfg.innerHTML = html`<p class="error">${e.message}</p>`; }
  return stop;
}

// ---- queues ------------------------------------------------------------------------------------

// Three significant digits (a decayed usage is often far below 1); 0 as it is.
const sig = (v) => (v === 0 ? "0" : v.toPrecision(3));

function renderQueues(body) {
  const queues = body.queues || [];
  return html`${queues.map((q) => raw(html`<section class="queue" data-queue="${q.name}">
    <h2>${q.name} <span class="muted">${q.cohort ? "cohort " + q.cohort + " · " : ""}${q.queueing_strategy} · ${q.admitted} admitted · ${q.pending} pending</span></h2>
    <table><thead><tr><th>Flavor</th><th>Resource</th><th>Usage / quota</th><th>Borrowed</th></tr></thead><tbody>
    ${(q.usage || []).map((u) => {
      const used = quantity(u.usage), nominal = quantity(u.nominal);
      const pct = nominal > 0 ? Math.min(100, (100 * used) / nominal) : used > 0 ? 100 : 0;
      return raw(html`<tr><td>${u.flavor}</td><td>${u.resource}</td>
        <td><div class="bar"><span class="${used > nominal ? "over" : ""}" style="width:${pct.toFixed(1)}%"></span><em>${humanQuantity(u.usage)} / ${humanQuantity(u.nominal)}</em></div></td>
        <td>${u.borrowed}</td></tr>`);
    })}</tbody></table>
    ${(q.fair_usage || []).length === 0 ? "" : raw(html`<h3>Fair sharing <span class="muted">admission by usage over time, lowest first</span></h3>
      <table class="fair-usage"><thead><tr><th>Workspace</th><th>Usage</th><th>Weight</th><th>Decayed use</th><th>Held now</th></tr></thead><tbody>
      ${q.fair_usage.map((f) => raw(html`<tr data-workspace="${f.workspace}"><td>${f.workspace}</td><td>${f.usage === null ? "last (weight 0)" : sig(f.usage)}</td><td>${f.weight}</td>
        <td>${Object.entries(f.consumed || {}).map(([r, v]) => `${r} ${sig(Number(v))}`).join(", ") || "—"}</td>
        <td>${Object.entries(f.held || {}).map(([r, v]) => `${r} ${v}`).join(", ") || "—"}</td></tr>`))}</tbody></table>`)}
    <h3>Pending</h3>
    ${(q.pending_runs || []).length === 0 ? raw('<p class="muted">None.</p>') : raw(html`<table class="pending"><thead><tr><th>Position</th><th>Run</th><th>Priority</th><th>Reason</th></tr></thead><tbody>
      ${q.pending_runs.map((p) => raw(html`<tr data-run="${p.name}"><td>${p.position ?? "—"}</td><td><a href="#/runs/${p.name}">${p.name}</a></td><td>${p.priority}</td>
        <td class="reason">${p.code ? p.code + ": " : ""}${p.reason}${p.detail ? " (" + p.detail + ")" : ""}</td></tr>`))}</tbody></table>`)}
    ${q.pending > (q.pending_runs || []).length ? raw(html`<p class="muted more">and ${q.pending - (q.pending_runs || []).length} more behind them</p>`) : ""}
    <h3>Admitted</h3>
    ${(q.admitted_runs || []).length === 0 ? raw('<p class="muted">None.</p>') : raw(html`<table><thead><tr><th>Run</th><th>State</th><th>Priority</th></tr></thead><tbody>
      ${q.admitted_runs.map((a) => raw(html`<tr><td><a href="#/runs/${a.name}">${a.name}</a></td><td>${state(a.state)}</td><td>${a.priority}</td></tr>`))}</tbody></table>`)}
  </section>`))}`;
}

async function viewQueues() {
  $view.innerHTML = '<h1>Queues</h1><div id="queues"><p class="muted">Loading…</p></div>';
  const box = document.getElementById("queues");
  try { box.innerHTML = renderQueues(await api("/api/v1/queues?limit=100")); } catch (e) { box.innerHTML = html`<p class="error">${e.message}</p>`; }
  // The stream sends the queue view (each queue's first 100 pending runs) whenever it changes.
  onLive = (type, data) => { if (type === "queues") box.innerHTML = renderQueues(data); };
}

// An attempt's diagnosis as a reader wants it: the phase, the summary, and the log lines that
// gave it away (rank and line), never the JSON it travels in.
function diagnosisHtml(d) {
  if (!d || typeof d !== "object" || !Object.keys(d).length) return "";
  const lines = (d.evidence || []).map((e) => html`<li><span class="muted">rank ${e.rank}, ${e.signature}:</span> <code>${e.line}</code></li>`);
  return html`<div class="diagnosis"><b>${d.phase || ""}</b>${d.summary ? ": " + d.summary : ""}${lines.length ? raw(html`<ul>${lines.map((l) => raw(l))}</ul>`) : ""}</div>`;
}

// The latest sample of one GPU, in the units `tau gpus` uses.
function sampleText(s) {
  if (!s || typeof s !== "object") return "";
  const parts = [];
  if (s.lost) parts.push("lost");
  if (s.error) parts.push(s.error);
  if (s.gpu_util_pct != null) parts.push(`util ${s.gpu_util_pct}%`);
  if (s.memory_used_bytes != null) parts.push(`mem ${(s.memory_used_bytes / 2 ** 30).toFixed(1)} GiB${s.memory_total_bytes ? " of " + (s.memory_total_bytes / 2 ** 30).toFixed(0) : ""}`);
  if (s.temperature_c != null) parts.push(`${s.temperature_c} °C`);
  if (s.power_mw != null) parts.push(`${Math.round(s.power_mw / 1000)} W`);
  if (s.at) parts.push(`at ${time(s.at)}`);
  return parts.join(", ");
}

// ---- GPUs --------------------------------------------------------------------------------------

async function viewGpus() {
  $view.innerHTML = '<h1>GPUs</h1><div id="gpus"><p class="muted">Loading…</p></div>';
  const box = document.getElementById("gpus");
  const load = async () => {
    let body;
    try { body = await api("/api/v1/gpus"); } catch (e) { box.innerHTML = html`<p class="error">${e.message}</p>`; return; }
    const devices = body.devices || [];
    // The monitor's snapshot has one entry per GPU: {device, sample, health}.
    const latest = ((body.snapshot && body.snapshot.gpus) || []).map((g) => g.sample);
    box.innerHTML = devices.length === 0
      ? html`<p class="muted">No GPUs on this machine${body.note ? ": " + body.note : body.error ? ": " + body.error : ""}.</p>`
      : html`<table id="gpu-table"><thead><tr><th>#</th><th>Name</th><th>UUID</th><th>Memory</th><th>Health</th><th>Reasons</th><th>Latest sample</th></tr></thead><tbody>
        ${devices.map((d, i) => {
          const h = d.health || {};
          const sample = sampleText(latest[i]);
          return raw(html`<tr><td>${d.index ?? i}</td><td>${d.name}</td><td class="muted">${d.uuid}</td><td>${d.memory_total_bytes ? (d.memory_total_bytes / 2 ** 30).toFixed(0) + " GiB" : ""}</td>
            <td>${state(h.verdict || h.state || "unknown")}</td><td>${(h.reasons || []).map((r) => (typeof r === "string" ? r : r.message || JSON.stringify(r))).join("; ")}</td><td class="muted gpu-sample">${sample}</td></tr>`);
        })}</tbody></table>`;
  };
  await load();
  const t = setInterval(load, 5000);  // samples are not in the event stream; poll slowly
  return () => clearInterval(t);
}

// ---- services ----------------------------------------------------------------------------------

// A service (docs/serving.md) is polled, not streamed: the event stream carries runs and queues,
// and a replica's readiness is the service manager's, not a run's state.
const SERVICE_POLL_MS = 2000;

function readyText(s) {
  const n = s.replicas ?? 0, ready = s.ready ?? 0;
  return raw(html`<span class="ready ${ready >= n && n > 0 ? "all" : "short"}">${ready}/${n}</span>`);
}
function requestsText(q) {
  q = q || {};
  return `${q.total ?? 0}${q.failed ? ` · ${q.failed} failed` : ""}${q.retried ? ` · ${q.retried} retried` : ""}`;
}
function badge(kind, text) { return raw(html`<span class="state ${kind}" data-state="${kind}">${text}</span>`); }
function digest(d) { return d ? raw(html`<code title="${d}">${String(d).replace(/^sha256:/, "").slice(0, 16)}…</code>`) : "—"; }

async function viewServices() {
  $view.innerHTML = '<h1>Services</h1><div id="services-table"><p class="muted">Loading…</p></div>';
  const box = document.getElementById("services-table");
  const load = async () => {
    let body;
    try { body = await api("/api/v1/services"); } catch (e) { box.innerHTML = html`<p class="error">${e.message}</p>`; return; }
    const services = (body.services || []).slice().sort((a, b) => a.name.localeCompare(b.name));
    box.innerHTML = services.length === 0
      ? '<p class="muted">No services. Deploy one with <code>tau serve deploy FILE</code> (docs/serving.md).</p>'
      : html`<table id="services"><thead><tr><th>Name</th><th>Workspace</th><th>State</th><th>Ready</th><th>Revision</th><th>Restarts</th><th>Requests</th><th>Endpoint</th></tr></thead>
        <tbody>${services.map((s) => raw(html`<tr data-service="${s.name}"><td><a href="#/services/${s.name}">${s.name}</a></td><td>${s.workspace}</td>
          <td>${state(s.state)}</td><td class="svc-ready">${readyText(s)}</td><td>${s.revision}</td><td>${s.restarts}</td>
          <td class="svc-requests">${requestsText(s.requests)}</td><td><code>${s.endpoint}</code></td></tr>`))}</tbody></table>`;
  };
  await load();
  const t = setInterval(load, SERVICE_POLL_MS);
  return () => clearInterval(t);
}

// The mean request latency of one service from the Prometheus text of /metrics: the histogram
// tau_serve_request_duration_seconds{service} as {sum, count}, or null when it has no series.
function serveLatency(text, name) {
  const out = { sum: null, count: null };
  const re = /^tau_serve_request_duration_seconds_(sum|count)\{([^}]*)\}\s+(\S+)/;
  // Service names are [a-z0-9-]: a label value that needs no escaping.
  const label = new RegExp(`(^|,)service="${name}"(,|$)`);
  for (const line of text.split("\n")) {
    const m = re.exec(line);
    if (m && label.test(m[2])) out[m[1]] = parseFloat(m[3]);
  }
  return out.sum === null || out.count === null ? null : out;
}

// A live chart of one value over time (the x axis is wall-clock seconds): the run page's uPlot
// chart, redrawn with setData as points come.
function liveChart(box, key, title, label, color) {
  const div = document.createElement("div");
  div.className = "chart";
  div.dataset.metric = key;
  div.dataset.points = "0";
  div.innerHTML = html`<h3>${title} <span class="muted"></span></h3>`;
  box.appendChild(div);
  const xs = [], ys = [];
  const plot = new uPlot({ width: 420, height: 220, scales: { y: { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } },
    series: [{}, { label, stroke: color, width: 2, spanGaps: false, points: { show: true, size: 4 } }],
    axes: [{}, {}] }, [xs, ys], div);
  return {
    add(t, v) {
      xs.push(t); ys.push(v);
      if (xs.length > 150) { xs.shift(); ys.shift(); }  // the last five minutes
      const n = ys.filter((y) => y != null).length;
      div.dataset.points = String(n);
      div.querySelector("h3 .muted").textContent = v == null ? `${n} points` : `${n} points, last ${v.toFixed(v >= 10 ? 1 : 3)}`;
      plot.setData([xs, ys]);
    },
    destroy() { plot.destroy(); },
  };
}

async function viewService(name) {
  $view.innerHTML = html`<h1>Service ${name}</h1><div id="svc-body"><p class="muted">Loading…</p></div>
    <h2>Requests <span class="muted" id="svc-chart-note">(through the endpoint, sampled every ${SERVICE_POLL_MS / 1000} s while this page is open)</span></h2>
    <div id="svc-charts" class="charts"></div>
    <h2>Replicas</h2><div id="svc-replicas"><p class="muted">Loading…</p></div>
    <h2>Model and spec</h2><div id="svc-spec"></div>
    <h2>History <span class="muted">(newest first)</span></h2><ul class="timeline" id="svc-history"></ul>`;
  const charts = document.getElementById("svc-charts");
  const rate = liveChart(charts, "requests", "requests / s", "requests/s", "#2563eb");
  // The latency comes from /metrics, which needs a platform viewer or admin (docs/security.md);
  // the service's own reply counts requests but keeps no durations. For anyone else /metrics is a
  // 403 and only the request rate is drawn.
  let latency = liveChart(charts, "latency", "mean latency (ms)", "ms", "#dc2626");
  let metricsAllowed = true;
  let last = null;  // the previous poll: {t, total, sum, count}
  let timer = null, stopped = false;
  const render = (s) => {
    const m = s.model;
    document.getElementById("svc-body").innerHTML = html`
      <div class="cards">
        <div class="card"><div class="k">State</div>${state(s.state)}</div>
        <div class="card"><div class="k">Ready / wanted</div><div id="svc-ready">${readyText(s)}</div></div>
        <div class="card"><div class="k">Revision</div>${s.revision}</div>
        <div class="card"><div class="k">Restarts</div>${s.restarts}</div>
        <div class="card"><div class="k">Requests</div><span id="svc-requests">${requestsText(s.requests)}</span></div>
        <div class="card"><div class="k">Workspace</div>${s.workspace}</div>
        <div class="card"><div class="k">Owner</div>${s.owner}</div>
        <div class="card"><div class="k">Endpoint</div><code>${s.endpoint}</code></div>
      </div>`;
    document.getElementById("svc-spec").innerHTML = html`<table id="svc-spec-table" class="kv"><tbody>
      ${m && m.run ? raw(html`<tr><th>Model run</th><td><a href="#/runs/${m.run}">${m.run}</a></td></tr>
        <tr><th>${m.kind === "output" ? "Output directory" : "Checkpoint"}</th><td><code>${m.path || "(resolved by each replica when the run ends)"}</code></td></tr>
        <tr><th>Model SHA-256</th><td class="svc-sha">${digest(m.sha256)}</td></tr>`) : raw('<tr><th>Model</th><td class="muted">none: the spec has no <code>serve.from</code></td></tr>')}
      <tr><th>Spec file</th><td><code>${s.spec_file}</code></td></tr>
      <tr><th>Config hash</th><td>${digest(s.config_hash)}</td></tr>
      <tr><th>Code digest</th><td>${digest(s.snapshot_digest)}</td></tr>
      <tr><th>Created</th><td>${time(s.created)}</td></tr>
      <tr><th>Updated</th><td>${time(s.updated)}</td></tr></tbody></table>`;
    const reps = s.replica_list || [];
    document.getElementById("svc-replicas").innerHTML = reps.length === 0 ? '<p class="muted">No replicas.</p>'
      : html`<table id="replicas"><thead><tr><th>Run</th><th>Revision</th><th>Port</th><th>State</th><th>Ready</th><th>Restarts</th><th>Last probe failure</th></tr></thead>
        <tbody>${reps.map((r) => raw(html`<tr data-run="${r.run}"><td><a href="#/runs/${r.run}">${r.run}</a></td><td>${r.revision}</td><td>${r.port}</td>
          <td>${state(r.state)}</td><td>${r.draining ? badge("Draining", "draining") : r.ready ? badge("Ready", "ready") : badge("NotReady", "not ready")}</td><td>${r.restarts}</td>
          <td class="${r.probe ? "reason" : "muted"}">${r.probe || "—"}${r.reason ? raw(html` <span class="muted">(${r.reason})</span>`) : ""}</td></tr>`))}</tbody></table>`;
    const history = (s.history || []).slice().reverse();
    document.getElementById("svc-history").innerHTML = history.length === 0 ? '<li class="muted">No history.</li>'
      : html`${history.map((h) => raw(html`<li data-time="${h.time}"><time>${time(h.time)}</time><b>${h.type}</b>${h.message ? ": " + h.message : ""}</li>`))}`;
  };
  const poll = async () => {
    let s, text = null;
    try {
      [s, text] = await Promise.all([api(`/api/v1/services/${encodeURIComponent(name)}`),
        metricsAllowed ? fetch("/metrics").then((r) => (r.ok ? r.text() : (metricsAllowed = false, null))).catch(() => null) : null]);
    } catch (e) {
      if (!stopped && charts.isConnected) document.getElementById("svc-body").innerHTML = html`<p class="error">${e.message}</p>`;
      return;
    }
    // The page was left while the poll was out (its elements may be another view's now).
    if (stopped || !charts.isConnected) return;
    render(s);
    if (!metricsAllowed && latency) {
      latency.destroy();
      charts.querySelector('.chart[data-metric="latency"]').remove();
      latency = null;
      document.getElementById("svc-chart-note").textContent =
        "(requests per second; the mean latency needs /metrics, which this user may not read)";
    }
    const now = { t: Date.now() / 1000, total: (s.requests || {}).total ?? 0, ...(text ? serveLatency(text, name) || {} : {}) };
    if (last && now.t > last.t) {
      const dt = now.t - last.t;
      // The counters start from zero when the server restarts: a drop is not a negative rate.
      rate.add(now.t, now.total >= last.total ? (now.total - last.total) / dt : null);
      if (latency) {
        const dc = now.count - last.count, ds = now.sum - last.sum;
        latency.add(now.t, now.count != null && last.count != null && dc > 0 && ds >= 0 ? (1000 * ds) / dc : null);
      }
    }
    last = now;
  };
  // One poll at a time: the next is due SERVICE_POLL_MS after this one began (or at once when it
  // took longer), so that a slow answer never interleaves with the next.
  const loop = async () => {
    const began = Date.now();
    await poll();
    if (!stopped) timer = setTimeout(loop, Math.max(0, SERVICE_POLL_MS - (Date.now() - began)));
  };
  await loop();
  return () => { stopped = true; clearTimeout(timer); rate.destroy(); if (latency) latency.destroy(); };
}

// ---- usage -------------------------------------------------------------------------------------

const USAGE_BY = ["workspace", "user", "queue", "flavor", "run"];
const USAGE_SINCE = { "7d": 7, "30d": 30, "90d": 90 };

// What was held (GET /api/v1/usage with bucket=day): a chart of each key's hours a day, the table
// of the period (with the idle share and the cost where the platform prices flavors), and the
// budgets.
async function viewUsage() {
  const q = query();
  const by = USAGE_BY.includes(q.get("by")) ? q.get("by") : "workspace";
  const period = USAGE_SINCE[q.get("since")] ? q.get("since") : "30d";
  const since = new Date(Date.now() - USAGE_SINCE[period] * 86400000);
  since.setUTCHours(0, 0, 0, 0);
  $view.innerHTML = html`<h1>Usage</h1>
    <form class="filters" id="usage-filters">
      <label>By<select name="by">${USAGE_BY.map((b) => raw(`<option ${b === by ? "selected" : ""}>${b}</option>`))}</select></label>
      <label>Since<select name="since">${Object.keys(USAGE_SINCE).map((s) => raw(`<option ${s === period ? "selected" : ""}>${s}</option>`))}</select></label>
    </form>
    <div id="usage-chart"></div><div id="usage-body"><p class="muted">Loading…</p></div><div id="usage-budgets"></div>`;
  document.getElementById("usage-filters").addEventListener("change", (e) => {
    const d = new FormData(e.currentTarget);
    location.hash = `#/usage?by=${d.get("by")}&since=${d.get("since")}`;
  });
  let plot = null;
  try {
    const u = await api(`/api/v1/usage?by=${by}&since=${encodeURIComponent(since.toISOString())}&bucket=day`);
    const priced = u.currency != null;
    const body = document.getElementById("usage-body");
    body.innerHTML = u.rows.length === 0 ? html`<p class="muted">Nothing was held since ${time(u.since)}.</p>` : html`
      <table id="usage-table"><thead><tr><th>${by}</th><th>GPU-hours</th><th>CPU-hours</th><th>GPU idle</th>${priced ? raw(html`<th>Cost (${u.currency})</th>`) : ""}<th>Runs</th></tr></thead>
      <tbody>${u.rows.map((r) => raw(html`<tr data-key="${r.key}"><td>${r.key}</td><td>${r.gpu_hours.toFixed(2)}</td><td>${r.cpu_hours.toFixed(2)}</td>
        <td>${r.idle_share == null ? "—" : Math.round(r.idle_share * 100) + "%"}</td>${priced ? raw(html`<td>${r.cost.toFixed(2)}</td>`) : ""}<td>${r.runs}</td></tr>`))}</tbody></table>`;
    // The chart: GPU-hours a day per key, or CPU-hours where nothing held a GPU.
    const gpu = u.series.some((s) => s.gpu_hours.some((v) => v > 0));
    const field = gpu ? "gpu_hours" : "cpu_hours";
    const box = document.getElementById("usage-chart");
    if (u.series.length > 0) {
      const div = document.createElement("div");
      div.className = "chart";
      div.dataset.metric = field;
      div.dataset.series = String(u.series.length);
      div.innerHTML = html`<h3>${gpu ? "GPU" : "CPU"}-hours a day, by ${by}</h3>`;
      box.appendChild(div);
      const xs = u.buckets.map((b) => Date.parse(b) / 1000);
      const series = u.series.slice(0, PALETTE.length * 2);
      plot = new uPlot({ width: 720, height: 260, scales: { y: { range: (p, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } },
        series: [{}, ...series.map((s, i) => ({ label: s.key, stroke: PALETTE[i % PALETTE.length], width: 2, points: { show: true, size: 5 } }))],
        axes: [{}, {}] }, [xs, ...series.map((s) => s[field])], div);
    }
  } catch (e) {
    document.getElementById("usage-body").innerHTML = html`<p class="error">${e.message}</p>`;
  }
  try {
    const budgets = await api("/api/v1/budgets");
    const list = budgets.budgets || budgets;
    if (Array.isArray(list) && list.length > 0)
      document.getElementById("usage-budgets").innerHTML = html`<h2>Budgets</h2>
        <table id="budgets-table"><thead><tr><th>Budget</th><th>Used</th><th>Period</th><th>State</th></tr></thead>
        <tbody>${list.map((b) => raw(html`<tr><td>${b.name}${b.user ? ` (${b.user})` : ""}</td><td>${b.message}</td><td>${b.period || (b.window_ms ? `last ${b.window_ms / 3600000}h` : "")}</td><td>${b.spent ? "spent" : b.warn ? "warning" : "ok"}</td></tr>`))}</tbody></table>`;
  } catch (_) { /* budgets are optional on this page */ }
  return () => { if (plot) plot.destroy(); };
}

// ---- router ------------------------------------------------------------------------------------

let routed = 0;            // counts route changes: a view that loads past the next one is stopped

async function route() {
  if (cleanup) { try { cleanup(); } catch (_) { /* ignore */ } }
  cleanup = null;
  onLive = null;
  const turn = ++routed;
  const path = (location.hash.replace(/^#/, "").split("?")[0]) || "/runs";
  const m = /^\/runs\/([a-z0-9-]+)$/.exec(path);
  const svc = /^\/services\/([a-z0-9-]+)$/.exec(path);
  const section = m || path === "/compare" ? "runs" : path.split("/")[1];
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === section);
  let stop;
  if (m) stop = await viewRun(m[1]);
  else if (path === "/compare") stop = await viewCompare();
  else if (path === "/queues") stop = await viewQueues();
  else if (path === "/gpus") stop = await viewGpus();
  else if (path === "/services") stop = await viewServices();
  else if (path === "/usage") stop = await viewUsage();
  else if (svc) stop = await viewService(svc[1]);
  else stop = await viewRuns();
  // The hash changed while this view loaded: the next view is up, so this one's polls and
  // streams stop now rather than never.
  if (turn === routed) cleanup = stop;
  else if (stop) { try { stop(); } catch (_) { /* ignore */ } }
}

// ---- sign-in -----------------------------------------------------------------------------------

// Over TCP every API call needs a token. The page hands it to the server once (POST
// /api/v1/session); the server sets an HttpOnly cookie that later calls and the event stream send.
function viewSignIn(message) {
  $view.innerHTML = html`<h1>Sign in</h1>
    <form id="signin" class="filters">
      <label>API token<input name="token" type="password" autocomplete="off" placeholder="tau_…"></label>
      <button type="submit">Sign in</button>
    </form>
    <p class="muted">Create one with <code>tau admin token create</code>.</p>
    <p id="signin-error" class="error">${message || ""}</p>`;
  document.getElementById("signin").addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = String(new FormData(e.target).get("token") || "").trim();
    const res = await fetch("/api/v1/session", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }),
    });
    if (res.ok) { location.reload(); return; }
    let msg = `${res.status} ${res.statusText}`;
    try { msg = (await res.json()).error.message; } catch (_) { /* not JSON */ }
    document.getElementById("signin-error").textContent = msg;
  });
}

async function start() {
  let me = null;
  try { me = await api("/api/v1/whoami"); } catch (e) {
    if (e.status === 401) { viewSignIn(); return; }
  }
  if (me) document.getElementById("who").textContent = me.user;
  window.addEventListener("hashchange", route);
  connectLive();
  route();
}

start();
