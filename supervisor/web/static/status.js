// The ftsup status page. One EventSource carries everything (supervisor/web/server.py): a
// "state" message (fleet, summary, recent records), then "events", "nodes" (state changes),
// "fleet" (a node joined) and "summary" messages. Everything held here is bounded: MAX_EVENTS
// records, MAX_SAMPLES summary samples, one typed array per fleet field.
// The page writes what it shows into <body data-*> attributes so a headless browser can check it.
"use strict";

const STATE_COLOURS = {
  active: "#2e9e44", spare: "#4a7fd6", suspect: "#f0a30a",
  dead: "#d62728", quarantined: "#8e44ad", drained: "#9e9e9e",
};
const MAX_EVENTS = 2000;
const MAX_SAMPLES = 1800;
const MAX_ROWS = 200;
const BUCKETS = ["productive", "detection", "restart", "lost_work", "waiting"];
const BUCKET_COLOURS = ["#2e9e44", "#f0a30a", "#d62728", "#8e44ad", "#9e9e9e"];
const $ = (id) => document.getElementById(id);
const started = performance.now();

const page = {
  states: [], ids: [], domains: [], codes: new Uint8Array(0), index: new Map(),
  cellX: new Float32Array(0), cellY: new Float32Array(0), cell: 6,
  events: [], kinds: new Set(), summary: null,
  samples: { t: [], step: [], loss: [], tps: [], ...Object.fromEntries(BUCKETS.map((b) => [b, []])) },
  charts: {}, dirty: { timeline: false, fleet: false }, painted: false,
};

// -- the fleet heatmap --------------------------------------------------------------------------
function setFleet(fleet) {
  page.states = fleet.states;
  page.ids = fleet.ids;
  page.domains = fleet.domains;
  page.codes = Uint8Array.from(fleet.codes);
  page.index = new Map(fleet.ids.map((id, i) => [id, i]));
  layout();
  page.dirty.fleet = true;
}

// Domains are blocks of near-square cells laid out left to right; a block's label sits above it.
function layout() {
  const canvas = $("fleet");
  const width = canvas.clientWidth || 900;
  const n = page.ids.length;
  const cell = Math.max(3, Math.min(18, Math.floor(Math.sqrt((width * 520) / Math.max(1, n)) * 0.8)));
  const gap = 6, label = cell >= 8 ? 12 : 0;
  page.cell = cell;
  page.cellX = new Float32Array(n);
  page.cellY = new Float32Array(n);
  page.blocks = [];
  let x = 0, y = 0, rowHeight = 0, i = 0;
  while (i < n) {
    let j = i;
    while (j < n && page.domains[j] === page.domains[i]) j++;
    const count = j - i;
    const cols = Math.min(Math.max(1, Math.ceil(Math.sqrt(count * 2))), Math.floor(width / cell));
    const rows = Math.ceil(count / cols);
    const w = cols * cell, h = rows * cell + label;
    if (x > 0 && x + w > width) { x = 0; y += rowHeight + gap; rowHeight = 0; }
    page.blocks.push({ name: page.domains[i] || "(no domain)", x, y, w, label });
    for (let k = 0; k < count; k++) {
      page.cellX[i + k] = x + (k % cols) * cell;
      page.cellY[i + k] = y + label + Math.floor(k / cols) * cell;
    }
    x += w + gap;
    rowHeight = Math.max(rowHeight, h);
    i = j;
  }
  const ratio = window.devicePixelRatio || 1;
  canvas.height = Math.max(40, (y + rowHeight + 2)) * ratio;
  canvas.width = width * ratio;
  canvas.style.height = `${canvas.height / ratio}px`;
  canvas.getContext("2d").setTransform(ratio, 0, 0, ratio, 0, 0);
}

function paintFleet() {
  const ctx = $("fleet").getContext("2d");
  ctx.clearRect(0, 0, ctx.canvas.width, ctx.canvas.height);
  ctx.font = "10px system-ui";
  ctx.fillStyle = "#555";
  for (const b of page.blocks) if (b.label) ctx.fillText(b.name, b.x, b.y + 9, b.w);
  for (let i = 0; i < page.ids.length; i++) paintCell(ctx, i);
}

function paintCell(ctx, i) {
  const s = page.cell;
  ctx.fillStyle = STATE_COLOURS[page.states[page.codes[i]]] || "#000";
  ctx.fillRect(page.cellX[i], page.cellY[i], s - (s > 4 ? 1 : 0), s - (s > 4 ? 1 : 0));
}

function applyNodeChanges(changes) {
  const ctx = $("fleet").getContext("2d");
  for (const [id, code] of Object.entries(changes)) {
    const i = page.index.get(id);
    if (i === undefined) continue;
    page.codes[i] = code;
    paintCell(ctx, i);
  }
  exposeFleet();
}

function nodeAt(event) {
  const rect = $("fleet").getBoundingClientRect();
  const x = event.clientX - rect.left, y = event.clientY - rect.top, s = page.cell;
  for (let i = 0; i < page.ids.length; i++) {
    if (x >= page.cellX[i] && x < page.cellX[i] + s && y >= page.cellY[i] && y < page.cellY[i] + s) return i;
  }
  return -1;
}

function exposeFleet() {
  const counts = Object.fromEntries(page.states.map((s) => [s, 0]));
  const byState = Object.fromEntries(page.states.map((s) => [s, []]));
  for (let i = 0; i < page.codes.length; i++) {
    const name = page.states[page.codes[i]];
    counts[name]++;
    if (name !== "active" && name !== "spare" && byState[name].length < 200) byState[name].push(page.ids[i]);
  }
  const body = document.body.dataset;
  body.nodes = String(page.ids.length);
  body.stateCounts = JSON.stringify(counts);
  for (const name of ["dead", "suspect", "quarantined", "drained"]) body[name] = byState[name].join(",");
  $("counts").textContent = `${page.ids.length} nodes`;
  $("legend").innerHTML = page.states.map((s) =>
    `<span><i style="background:${STATE_COLOURS[s]}"></i>${s} ${counts[s]}</span>`).join("");
}

// -- details on click ---------------------------------------------------------------------------
async function showNode(id) {
  const box = $("details");
  box.hidden = false;
  box.textContent = `loading ${id}…`;
  const reply = await fetch(`/status/api/node?id=${encodeURIComponent(id)}`);
  if (!reply.ok) { box.textContent = await reply.text(); return; }
  const node = await reply.json();
  const events = node.events;
  delete node.events;
  box.innerHTML = `<h3>${esc(id)}</h3><pre>${esc(JSON.stringify(node, null, 1))}</pre><h3>recent events</h3>` +
    `<table>${events.map(rowHtml).join("")}</table>`;
  document.body.dataset.selected = id;
}

async function showRecord(seq) {
  const box = $("details");
  box.hidden = false;
  const reply = await fetch(`/status/api/record?seq=${seq}`);
  box.innerHTML = reply.ok ? `<h3>evidence: record ${seq}</h3><pre>${esc(JSON.stringify(await reply.json(), null, 1))}</pre>`
    : esc(await reply.text());
}

// -- timeline and failures ----------------------------------------------------------------------
function addEvents(records) {
  for (const r of records) {
    page.events.push(r);
    if (!page.kinds.has(r.kind)) {
      page.kinds.add(r.kind);
      const option = document.createElement("option");
      option.value = option.textContent = r.kind;
      $("f-kind").append(option);
    }
  }
  if (page.events.length > MAX_EVENTS) page.events.splice(0, page.events.length - MAX_EVENTS);
  page.dirty.timeline = true;
}

function what(r) {
  const f = r.fields;
  switch (r.kind) {
    case "NodeQuarantined":
      return `${esc(f.reason)} <a data-seq="${f.evidence_seq}">evidence #${f.evidence_seq}</a>`;
    case "GenerationEnded": return `${esc(f.reason)} at step ${f.last_step}: ${esc(f.detail)}`;
    case "GenerationStarted": return `world ${f.world_size}, restore step ${f.restore_step ?? "fresh"}: ${esc(f.reason)}`;
    case "GenerationRunning": return `first step ${f.first_step}`;
    case "NodeDeclaredDead": case "NodeSuspected": return `${esc(f.reason)} (silent ${fmt(f.silent_for_s)} s)`;
    default: return esc(f.reason || f.detail || f.message || f.command || "");
  }
}

function rowHtml(r) {
  return `<tr class="${r.kind}" data-seq-row="${r.seq}"><td>${r.seq}</td><td>${clock(r.t)}</td><td>${r.kind}</td>` +
    `<td>${r.node ? `<a data-node="${esc(r.node)}">${esc(r.node)}</a>` : ""}</td><td>${r.generation ?? ""}</td>` +
    `<td>${what(r)}</td></tr>`;
}

function renderTimeline() {
  const node = $("f-node").value.trim(), kind = $("f-kind").value, gen = $("f-gen").value.trim();
  const shown = [];
  for (let i = page.events.length - 1; i >= 0 && shown.length < MAX_ROWS; i--) {
    const r = page.events[i];
    if (node && !r.node.includes(node)) continue;
    if (kind && r.kind !== kind) continue;
    if (gen && String(r.generation) !== gen) continue;
    shown.push(r);
  }
  $("timeline").tBodies[0].innerHTML = shown.map(rowHtml).join("");
  $("shown").textContent = `${shown.length} shown of ${page.events.length} held`;
  renderFailures();
  renderSdc();
  const body = document.body.dataset;
  body.timelineKinds = [...new Set(page.events.map((r) => r.kind))].sort().join(",");
  body.eventsHeld = String(page.events.length);
}

// A failure: a generation's end (other than completion); detection is the culprit's silence when
// the verdict came, recovery runs from the end to the next generation's first step.
function renderFailures() {
  const rows = [];
  const failures = [];
  for (let i = 0; i < page.events.length; i++) {
    const r = page.events[i];
    if (r.kind !== "GenerationEnded" || r.fields.reason === "completed") continue;
    const running = page.events.slice(i + 1).find((e) => e.kind === "GenerationRunning");
    const recovery = running ? running.t - r.t : null;
    failures.push({ generation: r.generation, reason: r.fields.reason, node: r.node,
      detection: r.fields.silent_for_s, recovery });
    rows.push(`<tr><td>${r.generation}</td><td>${esc(r.fields.reason)}</td><td>${esc(r.node)}</td>` +
      `<td>${clock(r.t)}</td><td>${fmt(r.fields.silent_for_s)} s</td>` +
      `<td>${recovery === null ? "recovering…" : `${fmt(recovery)} s`}</td></tr>`);
  }
  $("failures").tBodies[0].innerHTML = rows.reverse().slice(0, 50).join("");
  document.body.dataset.failures = JSON.stringify(failures.slice(-20));
}

function renderSdc() {
  const checks = page.events.filter((r) => r.kind === "SdcCheckFinished" || r.kind === "SdcSuspected").slice(-10);
  $("sdc").innerHTML = checks.length ? "<tr><th>SDC</th><th>node</th><th>verdict</th></tr>" + checks.map((r) =>
    `<tr><td>${clock(r.t)}</td><td>${esc(r.node || (r.fields.culprit_node_ids || []).join(" "))}</td>` +
    `<td>${esc(r.fields.verdict || `suspected at step ${r.fields.step}`)}</td></tr>`).join("")
    : "<tr><td class='muted'>no SDC checks in the events held</td></tr>";
}

// -- summary: header, goodput, sparklines -------------------------------------------------------
function setSummary(s) {
  page.summary = s;
  $("job").textContent = `ftsup · ${s.job}`;
  $("phase").textContent = s.phase;
  $("progress").textContent = `generation ${s.generation} · step ${s.step} · world ${s.world_size}`;
  $("leader").textContent = s.degraded ? `DEGRADED: ${s.degraded}`
    : s.is_leader ? `leader, term ${s.term}` : `follower (leader ${s.leader || "unknown"})`;
  const g = s.goodput;
  $("ettr").textContent = g.ettr === null ? "ETTR –" : `ETTR ${(100 * g.ettr).toFixed(1)}%`;
  const samples = page.samples;
  samples.t.push(s.t);
  samples.step.push(s.step);
  samples.loss.push(s.loss);
  samples.tps.push(s.tokens_per_s);
  for (const b of BUCKETS) samples[b].push(g[`${b}_s`]);
  if (samples.t.length > MAX_SAMPLES) for (const key of Object.keys(samples)) samples[key].shift();
  $("v-step").textContent = s.step;
  $("v-loss").textContent = s.loss === null ? "–" : s.loss.toPrecision(4);
  $("v-tps").textContent = s.tokens_per_s === null ? "–" : Math.round(s.tokens_per_s);
  $("goodput-line").textContent = `${g.interruptions} interruptions, ${g.lost_steps} steps redone`;
  $("goodput-table").innerHTML = BUCKETS.map((b, i) =>
    `<tr><td><i style="display:inline-block;width:10px;height:10px;background:${BUCKET_COLOURS[i]}"></i> ` +
    `${b.replace("_", " ")}</td><td>${fmt(g[`${b}_s`])} s</td>` +
    `<td>${g.wall_s > 0 ? (100 * g[`${b}_s`] / g.wall_s).toFixed(1) : "0.0"}%</td></tr>`).join("");
  $("causes").innerHTML = Object.keys(g.by_reason).length
    ? Object.entries(g.by_reason).map(([k, v]) => `<tr><td>${esc(k)}</td><td>${v}</td></tr>`).join("")
    : "<tr><td class='muted'>no recoveries</td></tr>";
  $("saved").innerHTML = `<tr><td>RAM snapshot</td><td>${s.snapshot ? `step ${s.snapshot.step}, ${age(s.snapshot.age_s)} ago` : "none"}</td></tr>` +
    `<tr><td>checkpoint</td><td>${s.checkpoint ? `${esc(s.checkpoint.id)}, ${age(s.checkpoint.age_s)} ago` : "none"}</td></tr>`;
  $("stragglers").innerHTML = s.stragglers.length
    ? "<tr><th>straggler</th><th>score (robust z)</th></tr>" + s.stragglers.map((x) =>
      `<tr><td><a data-node="${esc(x.node)}">${esc(x.node)}</a></td><td>${fmt(x.score)}</td></tr>`).join("")
    : "<tr><td class='muted'>no straggler scores</td></tr>";
  const body = document.body.dataset;
  body.step = String(s.step);
  body.generation = String(s.generation);
  for (const b of BUCKETS) body[`goodput_${b}`.replace(/_(.)/g, (_, c) => c.toUpperCase())] = String(g[`${b}_s`]);
  body.headSeq = String(s.head_seq);
  if (performance.memory) body.heapBytes = String(performance.memory.usedJSHeapSize);
  page.dirty.charts = true;
}

function makeCharts() {
  if (typeof uPlot === "undefined") return;
  const width = $("charts").clientWidth - 24;
  // Stacked by hand: the series are running totals, drawn largest first so each smaller band
  // paints over the one below it (uPlot fills each series down to zero).
  const order = BUCKETS.map((b, i) => i).reverse();
  const series = [{}, ...order.map((i) => ({ label: BUCKETS[i].replace("_", " "), stroke: BUCKET_COLOURS[i],
    fill: BUCKET_COLOURS[i], value: (u, v) => (v === null ? "–" : `${fmt(v)} s`) }))];
  page.charts.goodput = new uPlot({ width, height: 200, series, axes: [{}, { label: "seconds, stacked" }],
    legend: { live: false } }, [[]], $("goodput-chart"));
  const spark = (el) => new uPlot({ width: Math.floor(width / 3) - 8, height: 60, legend: { show: false },
    cursor: { show: false }, axes: [{ show: false }, { show: false }], series: [{}, { stroke: "#1565c0" }] },
  [[], []], el);
  page.charts.step = spark($("spark-step"));
  page.charts.loss = spark($("spark-loss"));
  page.charts.tps = spark($("spark-tps"));
}

function renderCharts() {
  const s = page.samples;
  if (!page.charts.goodput) return;
  // Stacked: each band is drawn as the running total up to and including its bucket.
  let running = s.t.map(() => 0);
  const stacked = BUCKETS.map((b) => (running = running.map((v, i) => v + s[b][i])));
  page.charts.goodput.setData([s.t, ...stacked.reverse()]);
  page.charts.step.setData([s.t, s.step]);
  page.charts.loss.setData([s.t, s.loss]);
  page.charts.tps.setData([s.t, s.tps]);
}

// -- plumbing -----------------------------------------------------------------------------------
function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}
function fmt(v) { return v === null || v === undefined ? "–" : Number(v).toFixed(Math.abs(v) < 10 ? 2 : 1); }
function clock(t) { return new Date(t * 1000).toISOString().slice(11, 23); }
function age(s) { return s < 120 ? `${s.toFixed(0)} s` : s < 7200 ? `${(s / 60).toFixed(0)} min` : `${(s / 3600).toFixed(1)} h`; }

function frame() {
  if (page.dirty.fleet) { paintFleet(); exposeFleet(); page.dirty.fleet = false; }
  if (page.dirty.timeline) { renderTimeline(); page.dirty.timeline = false; }
  if (page.dirty.charts) { renderCharts(); page.dirty.charts = false; }
  if (!page.painted && page.ids.length) {
    page.painted = true;
    document.body.dataset.firstPaintMs = String(Math.round(performance.now() - started));
  }
  requestAnimationFrame(frame);
}

function connect() {
  const source = new EventSource("/status/api/stream");
  const on = (name, fn) => source.addEventListener(name, (e) => fn(JSON.parse(e.data)));
  on("state", (s) => {
    page.events = [];
    setFleet(s.fleet);
    addEvents(s.events);
    setSummary(s.summary);
    document.body.dataset.connected = "1";
    $("conn").textContent = "live";
    $("conn").className = "pill on";
  });
  on("events", addEvents);
  on("nodes", applyNodeChanges);
  on("fleet", setFleet);
  on("summary", setSummary);
  source.onerror = () => {
    document.body.dataset.connected = "0";
    $("conn").textContent = "reconnecting…";
    $("conn").className = "pill off";
  };
}

$("fleet").addEventListener("click", (e) => { const i = nodeAt(e); if (i >= 0) showNode(page.ids[i]); });
$("fleet").addEventListener("mousemove", (e) => {
  const i = nodeAt(e);
  $("hover").textContent = i >= 0 ? `${page.ids[i]} · ${page.domains[i] || "no domain"} · ${page.states[page.codes[i]]}`
    : "click a node for its details";
});
document.addEventListener("click", (e) => {
  const link = e.target.closest("a");
  if (!link) return;
  if (link.dataset.node) showNode(link.dataset.node);
  else if (link.dataset.seq) showRecord(link.dataset.seq);
});
$("filters").addEventListener("input", () => { page.dirty.timeline = true; });
$("filters").addEventListener("submit", (e) => e.preventDefault());
window.addEventListener("resize", () => { layout(); page.dirty.fleet = true; });
makeCharts();
connect();
requestAnimationFrame(frame);
