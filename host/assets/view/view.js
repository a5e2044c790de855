// railtrace view: draws what `railtrace view` serves, live over a websocket or a
// recording through /range. Plain canvas, no library.
'use strict';

const COLOURS = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#ff9da7', '#9c755f'];
const TOTAL = '#202020', LOGGER = '#8e3ba0', GAP = 'rgba(144,144,144,0.35)', EXEC = '#f28e2b';
const EDGE_COLOURS = ['#1f3a93', '#c01c7a', '#008060', '#a05000'];
const KEEP_S = 120;          // live data kept in the page, s
const LIVE_WINDOW_S = 5;     // the live window's default width, s

// Everything the page knows, and what it last drew (read by the browser test).
const S = window.railtraceView = {
  mode: null, source: '', rails: [], names: [], shown: [], bucket_s: 1e-3,
  buckets: [], edges: [], gaps: [], logger: [], executions: [],
  status: null, messages: 0, follow: true, width_s: LIVE_WINDOW_S, view: null,
  extent: null, file: null, drawn: null, error: '',
};

const canvas = document.getElementById('plot');
const ctx = canvas.getContext('2d');
const $ = (id) => document.getElementById(id);

function fmt(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(2) + ' G';
  if (n >= 1e6) return (n / 1e6).toFixed(2) + ' M';
  if (n >= 1e3) return (n / 1e3).toFixed(1) + ' k';
  return String(Math.round(n));
}

function colour(i) { return i === S.rails.length ? TOTAL : COLOURS[i % COLOURS.length]; }

function legend() {
  const el = $('legend');
  el.textContent = '';
  S.names.forEach((name, i) => {
    const l = document.createElement('label');
    const c = document.createElement('input');
    c.type = 'checkbox'; c.checked = S.shown[i];
    c.onchange = () => { S.shown[i] = c.checked; draw(); };
    const sw = document.createElement('i');
    sw.style.background = colour(i);
    l.append(c, sw, name + (i === S.rails.length ? '' : ' W'));
    el.append(l);
  });
}

function hello(m) {
  S.mode = m.mode; S.source = m.source; S.rails = m.rails || [];
  S.names = S.rails.concat(['total']);
  S.shown = S.names.map(() => true);
  S.bucket_s = m.bucket_s || S.bucket_s;
  $('source').textContent = (m.mode === 'live' ? 'live: ' : 'recording: ') + m.source;
  $('recording').textContent = m.mode === 'live'
    ? (m.recording ? 'recording to ' + m.recording : 'not recording (--output keeps it)') : '';
  if (m.error) { $('error').textContent = m.error; S.error = m.error; }
  if (m.mode === 'file') {
    $('follow').style.display = 'none';
    document.querySelectorAll('#status > span').forEach((e) => { if (e.id !== 'recording') e.style.display = 'none'; });
    if (m.extent) { S.extent = m.extent; S.view = m.extent.slice(); fetchRange(); }
  }
  legend();
}

function data(m) {
  for (const k of ['buckets', 'edges', 'gaps', 'logger', 'executions']) {
    for (const x of m[k]) S[k].push(x);
  }
  const newest = latest();
  for (const k of ['buckets', 'edges', 'logger', 'executions']) {
    const a = S[k];
    let i = 0;
    while (i < a.length && a[i][0] < newest - KEEP_S) i++;
    if (i > 0) a.splice(0, i);
  }
}

function status(m) {
  S.status = m;
  const p = m.progress;
  $('rate').textContent = fmt(m.rate_hz) + 'S/s';
  $('samples').textContent = fmt(p.samples);
  $('frames_lost').textContent = p.frames_lost;
  const drops = p.device_drops + p.host_drops;
  $('drops').textContent = drops;
  $('drops').className = drops ? 'bad' : '';
  $('gaps').textContent = p.gaps;
  $('gaps').className = p.gaps ? 'bad' : '';
  $('link').textContent = p.connected ? 'connected' : 'waiting for the device';
  $('link').className = p.connected ? '' : 'bad';
}

function latest() {
  const b = S.buckets;
  return b.length ? b[b.length - 1][0] : 0;
}

function connect() {
  const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws');
  ws.onmessage = (e) => {
    const m = JSON.parse(e.data);
    S.messages++;
    if (m.type === 'hello') hello(m);
    else if (m.type === 'data') data(m);
    else if (m.type === 'status') status(m);
    dirty = true;
  };
  ws.onclose = () => {
    if (S.mode !== 'file') { $('link').textContent = 'disconnected: retrying'; $('link').className = 'bad'; }
    setTimeout(connect, 2000);
  };
}

// ---- the window ------------------------------------------------------------------------

function windowNow() {
  if (S.mode === 'file') return S.view || [0, 1];
  if (S.follow || !S.view) { const t1 = latest(); return [t1 - S.width_s, t1]; }
  return S.view;
}

let fetching = null, fetchTimer = null;
function fetchRange() {
  clearTimeout(fetchTimer);
  fetchTimer = setTimeout(async () => {
    const [t0, t1] = S.view;
    const columns = Math.max(10, Math.round(plotArea().w));
    const q = `t0=${t0}&t1=${t1}&columns=${columns}`;
    fetching = q;
    const r = await fetch('range?' + q);
    if (fetching !== q) return;
    if (!r.ok) { $('error').textContent = await r.text(); return; }
    $('error').textContent = '';
    S.file = await r.json();
    dirty = true;
  }, 120);
}

// ---- drawing -----------------------------------------------------------------------------

function plotArea() {
  const r = canvas.getBoundingClientRect();
  return { x: 70, y: 20, w: Math.max(10, r.width - 90), h: Math.max(10, r.height - 70), W: r.width, H: r.height };
}

// Per-column min/max/mean of the live buckets of series `s` over [t0, t1]; runs break at gaps.
function liveRuns(s, t0, t1, cols) {
  const runs = [];
  let run = [], prev = null, col = null, acc = null;
  const flush = () => { if (acc) run.push([t0 + (col + 0.5) * (t1 - t0) / cols, acc[0], acc[1], acc[2] / acc[3]]); acc = null; };
  for (const b of S.buckets) {
    const t = b[0];
    if (t < t0 || t > t1) { prev = t; continue; }
    const lo = b[1 + 3 * s], hi = b[2 + 3 * s], mean = b[3 + 3 * s];
    if (lo === null) continue;
    if (prev !== null && t - prev > 1.5 * S.bucket_s) { flush(); if (run.length) runs.push(run); run = []; }
    prev = t;
    const c = Math.min(cols - 1, Math.floor((t - t0) / (t1 - t0) * cols));
    if (c !== col) { flush(); col = c; }
    if (!acc) acc = [lo, hi, 0, 0];
    acc[0] = Math.min(acc[0], lo); acc[1] = Math.max(acc[1], hi); acc[2] += mean; acc[3]++;
  }
  flush();
  if (run.length) runs.push(run);
  return runs;
}

function niceStep(span, n) {
  const raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (raw <= m * p) return m * p;
  return 10 * p;
}

let dirty = true;
function draw() {
  const dpr = window.devicePixelRatio || 1;
  const A = plotArea();
  if (canvas.width !== Math.round(A.W * dpr) || canvas.height !== Math.round(A.H * dpr)) {
    canvas.width = Math.round(A.W * dpr); canvas.height = Math.round(A.H * dpr);
  }
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, A.W, A.H);
  const [t0, t1] = windowNow();
  const cols = Math.max(10, Math.round(A.w));
  const drawn = { series: 0, points: 0, edges: 0, gaps: 0, logger: 0, executions: 0, t0, t1 };

  // The series, as runs of [t, min, max, mean].
  let series = [];
  let gaps = [], edges = [], logger = [], executions = [];
  if (S.mode === 'file' && S.file) {
    series = S.file.series.map((s) => ({ i: Math.max(0, S.names.indexOf(s.name)), runs: s.runs }));
    gaps = S.file.gaps; edges = S.file.edges; logger = S.file.logger;
  } else if (S.mode === 'live') {
    series = S.names.map((_, i) => ({ i, runs: liveRuns(i, t0, t1, cols) }));
    gaps = S.gaps.map((g) => [g[0], g[0] + g[1]]);
    edges = S.edges; logger = S.logger; executions = S.executions;
  }
  series = series.filter((s) => S.shown[s.i]);
  let lo = Infinity, hi = -Infinity;
  for (const s of series) for (const run of s.runs) for (const p of run) { lo = Math.min(lo, p[1]); hi = Math.max(hi, p[2]); }
  for (const l of logger) if (l[0] >= t0 && l[0] <= t1) { lo = Math.min(lo, l[1]); hi = Math.max(hi, l[1]); }
  if (!(hi >= lo)) { lo = 0; hi = 1; }
  if (hi - lo < 1e-6) { hi += 1; lo -= 1; }
  const pad = 0.05 * (hi - lo); lo -= pad; hi += pad;
  const X = (t) => A.x + (t - t0) / (t1 - t0) * A.w;
  const Y = (w) => A.y + (hi - w) / (hi - lo) * A.h;

  // Axes and grid.
  ctx.font = '12px system-ui, sans-serif'; ctx.fillStyle = '#444'; ctx.strokeStyle = '#eee'; ctx.lineWidth = 1;
  const ws = niceStep(hi - lo, 6);
  for (let w = Math.ceil(lo / ws) * ws; w <= hi; w += ws) {
    ctx.beginPath(); ctx.moveTo(A.x, Y(w)); ctx.lineTo(A.x + A.w, Y(w)); ctx.stroke();
    ctx.fillText(w.toFixed(ws < 1 ? 1 : 0) + ' W', 4, Y(w) + 4);
  }
  const ts = niceStep(t1 - t0, 8);
  const digits = Math.max(0, -Math.floor(Math.log10(ts)));
  for (let t = Math.ceil(t0 / ts) * ts; t <= t1; t += ts) {
    ctx.beginPath(); ctx.moveTo(X(t), A.y); ctx.lineTo(X(t), A.y + A.h); ctx.stroke();
    ctx.fillText(t.toFixed(digits) + ' s', X(t) - 16, A.y + A.h + 16);
  }
  ctx.strokeStyle = '#999'; ctx.strokeRect(A.x, A.y, A.w, A.h);
  ctx.save(); ctx.beginPath(); ctx.rect(A.x, A.y, A.w, A.h); ctx.clip();

  // Gaps, as grey bands.
  ctx.fillStyle = GAP;
  for (const [a, b] of gaps) {
    if (b < t0 || a > t1) continue;
    ctx.fillRect(X(a), A.y, Math.max(2, X(b) - X(a)), A.h); drawn.gaps++;
  }
  // Envelopes, then mean lines.
  for (const s of series) {
    const c = colour(s.i);
    ctx.fillStyle = c; ctx.globalAlpha = 0.22;
    for (const run of s.runs) {
      ctx.beginPath();
      run.forEach((p, k) => (k ? ctx.lineTo : ctx.moveTo).call(ctx, X(p[0]), Y(p[2])));
      for (let k = run.length - 1; k >= 0; k--) ctx.lineTo(X(run[k][0]), Y(run[k][1]));
      ctx.closePath(); ctx.fill();
    }
    ctx.globalAlpha = 1; ctx.strokeStyle = c; ctx.lineWidth = s.i === S.rails.length ? 1.6 : 1.2;
    for (const run of s.runs) {
      ctx.beginPath();
      run.forEach((p, k) => (k ? ctx.lineTo : ctx.moveTo).call(ctx, X(p[0]), Y(p[3])));
      ctx.stroke();
      drawn.points += run.length;
    }
    if (s.runs.length) drawn.series++;
  }
  // Kernel executions, as bars under the plot's floor.
  ctx.fillStyle = EXEC;
  for (const [a, b] of executions) {
    if (b < t0 || a > t1) continue;
    ctx.fillRect(X(a), A.y + A.h - 8, Math.max(1, X(b) - X(a)), 6); drawn.executions++;
  }
  // The GPU logger's readings: a step line with a dot at each.
  const inside = logger.filter((l) => l[0] >= t0 && l[0] <= t1);
  if (inside.length) {
    ctx.strokeStyle = LOGGER; ctx.fillStyle = LOGGER; ctx.lineWidth = 1.2; ctx.globalAlpha = 0.85;
    ctx.beginPath();
    inside.forEach((l, k) => {
      if (k) ctx.lineTo(X(l[0]), Y(inside[k - 1][1]));
      (k ? ctx.lineTo : ctx.moveTo).call(ctx, X(l[0]), Y(l[1]));
    });
    ctx.stroke();
    // A dot at each reading where they are a few pixels apart.
    if (inside.length < A.w / 4) for (const l of inside) { ctx.beginPath(); ctx.arc(X(l[0]), Y(l[1]), 2.5, 0, 7); ctx.fill(); }
    ctx.globalAlpha = 1;
    drawn.logger = inside.length;
  }
  // Trigger edges: ▲ rising or ▼ falling at the top, and a line down where they are few.
  const visible = edges.filter((e) => e[0] >= t0 && e[0] <= t1);
  for (const [t, line, rising] of visible) {
    const c = EDGE_COLOURS[(line & 0x7f) % EDGE_COLOURS.length], x = X(t);
    if (visible.length < 40) {
      ctx.strokeStyle = c; ctx.globalAlpha = 0.5; ctx.lineWidth = 1;
      ctx.beginPath(); ctx.moveTo(x, A.y); ctx.lineTo(x, A.y + A.h); ctx.stroke();
    }
    ctx.globalAlpha = 1; ctx.fillStyle = c; ctx.beginPath();
    if (rising) { ctx.moveTo(x, A.y + 2); ctx.lineTo(x - 5, A.y + 11); ctx.lineTo(x + 5, A.y + 11); }
    else { ctx.moveTo(x, A.y + 11); ctx.lineTo(x - 5, A.y + 2); ctx.lineTo(x + 5, A.y + 2); }
    ctx.fill(); drawn.edges++;
  }
  ctx.restore();
  if (S.mode === 'file' && S.file && S.file.summaries) {
    ctx.fillStyle = '#777';
    ctx.fillText('from the recording\u2019s summaries (zoom in for edges and logger readings)', A.x + 8, A.y + A.h - 12);
  }
  $('follow').textContent = S.follow ? 'Live \u25CF' : 'Live';
  S.drawn = drawn;
}

function frame() {
  if (dirty) { dirty = false; draw(); }
  requestAnimationFrame(frame);
}

// ---- zoom and pan ----------------------------------------------------------------------

function setView(v) {
  S.view = v;
  if (S.mode === 'file') fetchRange();
  dirty = true;
}

canvas.addEventListener('wheel', (e) => {
  e.preventDefault();
  const A = plotArea(), [t0, t1] = windowNow();
  const k = e.deltaY > 0 ? 1.25 : 0.8;
  if (S.mode === 'live' && S.follow) { S.width_s = Math.min(KEEP_S, Math.max(0.01, S.width_s * k)); dirty = true; return; }
  const tm = t0 + (e.offsetX - A.x) / A.w * (t1 - t0);
  setView([tm - (tm - t0) * k, tm + (t1 - tm) * k]);
}, { passive: false });

let drag = null;
canvas.addEventListener('mousedown', (e) => { drag = { x: e.offsetX, v: windowNow() }; canvas.style.cursor = 'grabbing'; });
window.addEventListener('mouseup', () => { drag = null; canvas.style.cursor = 'grab'; });
canvas.addEventListener('mousemove', (e) => {
  if (!drag) return;
  const A = plotArea(), [t0, t1] = drag.v, dt = (e.offsetX - drag.x) / A.w * (t1 - t0);
  if (Math.abs(e.offsetX - drag.x) < 2) return;
  if (S.mode === 'live') S.follow = false;
  setView([t0 - dt, t1 - dt]);
});
function reset() {
  if (S.mode === 'file' && S.extent) setView(S.extent.slice());
  else { S.width_s = LIVE_WINDOW_S; S.follow = true; dirty = true; }
}
canvas.addEventListener('dblclick', reset);
$('reset').onclick = reset;
$('follow').onclick = () => { S.follow = true; dirty = true; };
window.addEventListener('resize', () => { dirty = true; if (S.mode === 'file' && S.view) fetchRange(); });

connect();
requestAnimationFrame(frame);
