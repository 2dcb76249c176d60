// tinymt attention viewer: the whole view, as one plain ES module.
//
// It lives in three homes: the TensorBoard tab (imported by index.js), the
// self-contained HTML file (its source inlined into a <script type="module">, then
// `mountView(root, inlineSource(DATA))`), and Jupyter (that HTML in an iframe). Hence:
// no imports, no reliance on its own URL, everything at top level, and the only
// exports are `mountView` and `inlineSource`. Every piece of data reaches the page as a
// text node, an attribute or a pixel: never as markup.
//
// A data source has three methods, each returning a Promise:
//   listRuns()                -> [{run, probes: [{tag, sentence, reference}]}]
//   listSteps(run, tag)       -> [step, ...] (ascending)
//   getStep(run, tag, step)   -> the view document of one probe sentence at one step
// and may have:
//   getTrend(run, tag)        -> {steps, kinds: {kind: {entropy, gold}}} (each head's trend)
//   loadState() / saveState(state)  -> where the view's state lives (the URL)
//   needGlyphs(text)          -> make sure the page's font covers `text`
//
// Views: "overview" (every layer x head of one kind as small pictures, plus the mean of
// the heads), "matrix" (one layer, one matrix a head, with labels) and "lines" (bertviz's
// head view). Cells are drawn as pixels of a canvas (one pixel a weight, scaled up), so a
// 400-token sentence draws as fast as a short one.

/* ---------- constants ---------- */

// Qualitative head colours: saturated enough that background -> colour reads as intensity.
const PALETTE = [
  "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#17becf",
  "#e377c2", "#8c564b", "#bcbd22", "#393b79", "#7b4173", "#b8860b",
];
// the mean of the heads (overview, colour bar): dark grey, or light grey on a dark page
// (#c8c8c8 on #202124: 10:1, where #555555 was 2:1)
const MEAN_COLOR = { light: "#555555", dark: "#c8c8c8" };
// The attention kinds, in display order: label, and the sentence its rows / columns read.
const KINDS = {
  encoder_self: ["encoder self-attention", "source", "source"],
  decoder_self: ["decoder self-attention (masked)", "target", "target"],
  cross: ["cross-attention", "target", "source"],
};
const BACKGROUND = { light: [255, 255, 255], dark: [32, 33, 36] }; // weight 0's colour
const MAX_TOKENS = 400;    // longer sentences are cut for display (values stay complete)
const LINE_MIN = 0.02;     // lines mode skips weights below this fraction of scale
const PLAY_MS = 500;
const CACHE_SIZE = 64;
const STYLE_ID = "tinymt-view-style";
const FONT_STACK = '"Noto Sans CJK SC", "Noto Sans CJK", "Noto Sans SC", "Noto Sans", ' +
  'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';

const CSS = `
.tmv { --bg: #fff; --fg: #222; --muted: #777; --faint: #999; --panel: #fafafa; --border: #ddd;
  --input: #fff; --button: #f5f5f5; --label: #333; --veil: #fff; --relation: #a33b00;
  font-family: ${FONT_STACK}; font-size: 13px; line-height: 1.45; color: var(--fg); background: var(--bg);
  padding: 12px 16px 24px; width: 100%; min-height: 100vh; box-sizing: border-box; }
.tmv.tmv-dark { --bg: #202124; --fg: #e8eaed; --muted: #9aa0a6; --faint: #80868b; --panel: #2a2b2e;
  --border: #444; --input: #303134; --button: #3c4043; --label: #dadce0; --veil: #202124; --relation: #ffb38a;
  color-scheme: dark; }
.tmv * { box-sizing: border-box; } .tmv select, .tmv button, .tmv input { font: inherit; color: inherit; }
.tmv .tmv-bar { display: flex; flex-wrap: wrap; align-items: center; gap: 6px 16px; margin-bottom: 6px; }
.tmv .tmv-bar label { display: inline-flex; align-items: center; gap: 6px; color: var(--muted); }
.tmv select { padding: 2px 6px; border: 1px solid var(--border); border-radius: 4px; background: var(--input); max-width: 30em; }
.tmv button { padding: 2px 12px; border: 1px solid var(--border); border-radius: 4px; background: var(--button); cursor: pointer; }
.tmv button:hover { filter: brightness(0.96); } .tmv #play { min-width: 5.5em; }
.tmv :focus-visible { outline: 2px solid #1a73e8; outline-offset: 1px; }
.tmv #step { width: min(440px, 50vw); accent-color: var(--muted); }
.tmv #step-label { font-variant-numeric: tabular-nums; min-width: 8em; }
.tmv #status { color: var(--muted); } .tmv #status.error { color: #e53935; }
.tmv .tmv-heads { display: flex; flex-wrap: wrap; align-items: center; gap: 6px; margin: 2px 0 6px; color: var(--muted); }
.tmv .head-toggle { --c: #888; border: 2px solid var(--c); background: var(--c); color: #fff;
  border-radius: 12px; padding: 0 10px; font-size: 12px; }
.tmv .head-toggle[aria-pressed="false"] { background: var(--bg); color: var(--c); opacity: .6; }
.tmv .tmv-text { display: grid; grid-template-columns: max-content 1fr; gap: 0 14px; margin: 0 0 6px;
  padding: 6px 12px; background: var(--panel); border-radius: 6px; }
.tmv .tmv-text dt { color: var(--faint); } .tmv .tmv-text dd { margin: 0; } .tmv #sentence { font-size: 15px; }
.tmv .missing { color: var(--faint); font-style: italic; }
.tmv #relations { display: flex; flex-wrap: wrap; gap: 0 14px; } .tmv #relations .rel { padding: 0; border: 0;
  background: none; text-align: left; font-variant-numeric: tabular-nums; } .tmv #relations .rel b { color: var(--relation); }
.tmv .tmv-caption { display: flex; flex-wrap: wrap; align-items: center; gap: 4px 16px; color: var(--muted); margin: 0 0 6px; }
.tmv .colorbar { display: inline-flex; align-items: center; gap: 6px; font-variant-numeric: tabular-nums; }
.tmv .colorbar canvas { width: 120px; height: 10px; border: 1px solid var(--border); image-rendering: pixelated; }
.tmv .tmv-main { display: flex; gap: 18px; align-items: flex-start; }
.tmv .tmv-views { flex: 1 1 auto; min-width: 0; overflow-x: auto; }
.tmv #matrices { display: flex; flex-wrap: wrap; gap: 16px 26px; }
.tmv .tmv-empty { color: var(--faint); padding: 24px 0; }
.tmv #info { position: sticky; top: 8px; flex: 0 0 290px; min-height: 96px; max-height: calc(100vh - 16px); overflow: auto;
  border: 1px solid var(--border); border-radius: 6px; padding: 8px 10px; background: var(--panel); font-size: 12px; }
.tmv #info .info-title { font-weight: 600; margin-bottom: 4px; }
.tmv #info .info-hint, .tmv #info .muted { color: var(--faint); font-weight: normal; }
.tmv .info-head, .tmv .info-cell { display: flex; gap: 6px; align-items: baseline; padding: 1px 0; }
.tmv .swatch { display: inline-block; width: 9px; height: 9px; border-radius: 2px; flex: none; }
.tmv .info-name { color: var(--muted); flex: none; width: 4.2em; } .tmv .info-gold { color: var(--muted); margin-top: 4px; }
.tmv .head-card { display: flex; flex-direction: column; gap: 4px; }
.tmv .head-box { position: relative; }
.tmv canvas.cells { position: absolute; image-rendering: pixelated; }
.tmv .head-box svg { position: absolute; left: 0; top: 0; }
.tmv svg { display: block; overflow: visible; }
.tmv svg text { font-family: ${FONT_STACK}; font-size: 12px; fill: var(--label); cursor: default; }
.tmv svg text:focus { outline: none; } .tmv svg text:focus-visible { fill: #1a73e8; font-weight: 700; }
.tmv svg .head-title { font-weight: 700; font-size: 13px; } .tmv svg :is(.entropy, .axis-title) { fill: var(--faint); }
.tmv svg text.hl { font-weight: 700; fill: var(--fg); }
.tmv svg text.cjk { writing-mode: vertical-rl; text-orientation: upright; }
.tmv rect.grid { fill: transparent; } .tmv rect.frame { fill: none; stroke: var(--border); pointer-events: none; }
.tmv rect.gold { fill: transparent; stroke: var(--fg); stroke-width: 1.6; }
.tmv line.attn-line { stroke-linecap: round; }
.tmv line.gold-line { stroke: var(--faint); stroke-width: 1.5; stroke-dasharray: 4 3; }
.tmv path.dim { fill: var(--veil); fill-opacity: .82; fill-rule: evenodd; pointer-events: none; }
.tmv path.dim-edge { fill: none; stroke: var(--fg); stroke-width: 1; pointer-events: none; }
.tmv .hl-active line.attn-line:not(.hl) { opacity: .04; }
.tmv .hl-active line.gold-line { opacity: .3; }
.tmv canvas.spark { display: block; cursor: pointer; }
.tmv [hidden] { display: none !important; }
.tmv #overview { display: grid; gap: 6px 8px; align-items: start; justify-content: start; }
.tmv .ov-label { color: var(--muted); font-size: 12px; white-space: nowrap; align-self: center; }
.tmv .ov-head { color: var(--muted); font-size: 12px; text-align: center; }
.tmv .thumb { display: flex; flex-direction: column; gap: 2px; align-items: center; border-radius: 3px; padding: 1px; cursor: pointer; }
.tmv .thumb:hover, .tmv .thumb:focus-visible { background: var(--panel); }
.tmv .thumb canvas.cells { position: static; outline: 1px solid var(--border); }
.tmv .ov-pic { position: relative; line-height: 0; }
.tmv .ov-gold { position: absolute; left: 0; top: 0; pointer-events: none; }
.tmv .ov-gold rect.gold { stroke-width: 1; }
.tmv .ov-tag { color: var(--muted); font-size: 11px; line-height: 14px; height: 14px; white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; text-align: center; }
.tmv .ov-tag.relation { color: var(--relation); font-weight: 700; }
@media (max-width: 800px) {
  .tmv .tmv-main { flex-direction: column; }
  .tmv #info { position: fixed; top: auto; left: 8px; right: 8px; bottom: 8px; width: auto; max-height: 38vh;
    min-height: 0; z-index: 10; box-shadow: 0 2px 10px rgba(0, 0, 0, .25); }
  .tmv { padding-bottom: 40vh; }
}
`;

const RELATIONS_HELP = "Each gold relation of this sentence (a → b: the word a looking at b) and, " +
  "at this step, the head putting the most of a's attention on b, with that share. A head's label " +
  "under its picture is measured on a sample of validation sentences: it may not hold for this " +
  "one. Click a relation to open its head.";
const TEMPLATE = `
<div class="tmv-bar">
  <label>run <select id="run"></select></label> <label>probe <select id="probe"></select></label>
  <label>attention <select id="kind"></select></label> <label>layer <select id="layer"></select></label>
  <label>view <select id="mode"><option value="overview">overview</option><option value="matrix">matrix</option>
  <option value="lines">lines</option></select></label>
  <label title="colour scale: the weight itself, or the weight over its row's largest">colour
  <select id="norm"><option value="weight">weight</option><option value="row">row max</option></select></label>
  <label title="outline gold cells (alignment / relations)"><input type="checkbox" id="gold" checked> gold</label>
</div>
<div class="tmv-bar">
  <button id="play" type="button" aria-pressed="false">Play</button>
  <input id="step" type="range" min="0" max="0" step="1" value="0" aria-label="training step">
  <span id="step-label">–</span> <span id="status" role="status">loading…</span>
</div>
<div class="tmv-heads" id="heads"></div>
<dl class="tmv-text">
  <dt>source</dt><dd id="sentence"></dd> <dt>reference</dt><dd id="reference"></dd>
  <dt id="translation-title">model</dt><dd id="translation"></dd> <dt>decoder reads</dt><dd id="forced"></dd>
  <dt id="relations-title" hidden title="${RELATIONS_HELP}">relations here</dt><dd id="relations" hidden></dd>
</dl>
<div class="tmv-caption"><span id="caption"></span><span class="colorbar" id="colorbar"></span>
  <span id="trend-scale" class="muted"></span></div>
<div class="tmv-main">
  <div class="tmv-views"><div id="overview"></div><div id="matrices"></div><svg id="lines" width="0" height="0"></svg></div>
  <aside id="info" aria-live="polite"></aside>
</div>`;

const INFO_HINT = "Hover (or Tab to) a query token (left / row label) to see " +
  "what it attends to, a key token (right / column label) to see what attends to it, " +
  "or a cell for its value. In the overview, click a head to open it.";
const TREND_HINT = " Under each head: its entropy (solid) and share of attention on gold cells " +
  "(dashed) across steps; click there to jump to a step.";

/* ---------- small helpers ---------- */

// An HTML element from text: attributes set one by one, children strings become text nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  node.append(...children);
  return node;
}

function swatch(color) {
  const node = el("span", { class: "swatch" });
  node.style.background = color;
  return node;
}

// Replace a <select>'s options with [value, text, title?] triples, from text (never markup).
function setOptions(select, options) {
  select.replaceChildren(...options.map(([value, text, title]) => {
    const option = new Option(String(text), String(value));
    if (title !== undefined) option.title = String(title);
    return option;
  }));
}

// The step index under clientX on a trend canvas of n steps (the click's and the hover's).
function sparkIndex(canvas, clientX, n) {
  const r = canvas.getBoundingClientRect(), pad = 3;
  const f = (clientX - r.left - pad) / Math.max(1, r.width - 2 * pad);
  return n ? Math.max(0, Math.min(n - 1, Math.round(f * (n - 1)))) : -1;
}

const headColor = (h, dark = false) => (h < 0 ? MEAN_COLOR[dark ? "dark" : "light"] : PALETTE[h % PALETTE.length]);
const headName = (h) => (h < 0 ? "mean" : `head ${h}`);

function rgbOf(hex) {
  const n = parseInt(hex.slice(1), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

// The colour of intensity t in [0, 1]: background -> the head's colour, channel by channel
// Math.round(bg + (colour - bg) * t) (the tests recompute it from this sentence).
function ramp(rgb, bg, t) {
  return [0, 1, 2].map((c) => Math.round(bg[c] + (rgb[c] - bg[c]) * t));
}

// Long tokens are cut for labels (the full text becomes a tooltip).
function shortTok(tok) {
  const chars = Array.from(String(tok));
  return chars.length > 14 ? chars.slice(0, 13).join("") + "…" : String(tok);
}

// Rough pixel width of labels of 12 px (CJK glyphs are about square), plus padding.
function labelWidth(toks) {
  const width = (tok) => Array.from(shortTok(tok)).reduce((w, ch) => w + (ch.codePointAt(0) >= 0x2e80 ? 12.5 : 7), 0);
  return Math.min(130, Math.max(24, ...toks.map(width))) + 10;
}

// Tokens made only of CJK characters (and punctuation) stand upright in vertical labels.
function isCJK(tok) {
  return /^\u2581?[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]+$/.test(String(tok));
}

// An SVG element, attributes set one by one, children strings as text nodes.
function svgEl(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  node.append(...children);
  return node;
}

// A token's <text> label, reachable by Tab: cut when long, the full token its tooltip.
function tokLabel(attrs, tok) {
  const s = shortTok(tok), focus = { tabindex: 0, ...attrs };
  return s === String(tok) ? svgEl("text", focus, s) : svgEl("text", focus, s, svgEl("title", {}, String(tok)));
}

function oneLine(msg) {
  const s = String(msg).replace(/\s+/g, " ").trim();
  return s.length > 300 ? s.slice(0, 299) + "…" : s;
}

function entropyOf(kind, layer, h) {
  if (h < 0) {
    const row = kind.entropy && kind.entropy[layer];
    return Array.isArray(row) && row.length ? row.reduce((a, b) => a + b, 0) / row.length : null;
  }
  const e = kind.entropy && kind.entropy[layer] && kind.entropy[layer][h];
  return typeof e === "number" ? e : null;
}

function entropyText(kind, layer, h) {
  const e = entropyOf(kind, layer, h);
  return e === null ? "H = –" : `H = ${e.toFixed(2)} nats`;
}

// A head's label at this step, "object ← 0.62 · accuracy 0.62 over 40 instances · ...": the
// label, then what was measured (the trainer's records only): [label, [details], a relation
// or alignment?] or null.
function headLabel(kind, layer, h) {
  const text = h >= 0 && kind.labels && kind.labels[layer] && kind.labels[layer][h];
  if (typeof text !== "string" || !text) return null;
  const [label, ...details] = text.split(" · ");
  return [label, details, /[→←]/.test(label) || label.startsWith("aligned ")];
}

const LABEL_HELP = {
  relation: "Measured at this step on the first validation sentences: how often the word a word " +
    "attends to most (itself aside) is its gold partner (→ the dependent finds its head, ← the head " +
    "its dependent), against the best fixed offset (“always the word k away”) on the same words; " +
    "named when it beats that by 0.10 or more over 20 or more instances.",
  align: "Measured at this step on the first validation sentences, in the rows of target pieces with " +
    "gold-aligned source words: the share of its attention on those source pieces (aligned), on the piece " +
    "just before or after them, on </s>, or anywhere else; named by where most of it goes, then by the " +
    "next of the named places.",
  position: "Measured at this step on the first validation sentences: previous / self / next / " +
    "</s> (<s>) when at least half of its attention is on that position; diffuse when its entropy is " +
    "at least 0.8 of the uniform's; content otherwise: it attends by what the words are, not where they " +
    "are, without beating any relation's fixed offset on the sample (it may still carry a relation on " +
    "the sentence shown: see relations here).",
};

function addPath(svg, cls, d) {
  svg.appendChild(svgEl("path", { class: cls, d }));
}

// The weights of head h (h < 0: the mean of the layer's heads) as rows of numbers.
function headRows(kind, layer, h, nq, nk) {
  const L = kind.weights[layer];
  if (h >= 0) return L[h];
  const out = [];
  for (let i = 0; i < nq; i++) {
    const row = new Float64Array(nk);
    for (const W of L) for (let j = 0; j < nk; j++) row[j] += W[i][j];
    for (let j = 0; j < nk; j++) row[j] /= L.length;
    out.push(row);
  }
  return out;
}

// One pixel a weight: rows 0..nq-1, columns 0..nk-1 of `rows`, coloured by `ramp`, over
// `scale` (or over the row's largest with norm "row").
function paintCells(canvas, rows, nq, nk, scale, color, bg, norm) {
  canvas.width = nk;
  canvas.height = nq;
  const ctx = canvas.getContext("2d"), img = ctx.createImageData(nk, nq), d = img.data;
  const rgb = rgbOf(color);
  for (let i = 0; i < nq; i++) {
    const row = rows[i];
    let top = scale;
    if (norm === "row") {
      top = 0;
      for (let j = 0; j < nk; j++) top = Math.max(top, row[j]);
      if (!(top > 0)) top = scale;
    }
    for (let j = 0; j < nk; j++) {
      const t = Math.min(1, row[j] / top), c = ramp(rgb, bg, t), k = (i * nk + j) * 4;
      d[k] = c[0]; d[k + 1] = c[1]; d[k + 2] = c[2]; d[k + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
}

/* ---------- data source for the self-contained HTML ---------- */

export function inlineSource(data) {
  const key = (...parts) => parts.join("\u0000");
  return {
    listRuns: async () => data.runs || [],
    listSteps: async (run, tag) => (data.steps || {})[key(run, tag)] || [],
    getStep: async (run, tag, step) => {
      const doc = (data.docs || {})[key(run, tag, step)];
      if (!doc) throw new Error(`no document for ${run} / ${tag} / step ${step}`);
      return doc;
    },
    // the state lives in the page's #fragment (a deep link); where the page has no URL of
    // its own (a notebook's srcdoc frame), nowhere
    loadState: async () => {
      try { return Object.fromEntries(new URLSearchParams(location.hash.slice(1))); } catch (e) { return {}; }
    },
    saveState: (state) => {
      const kept = Object.entries(state).filter(([, v]) => v !== ""); // "": the default
      try { history.replaceState(null, "", "#" + new URLSearchParams(kept).toString()); } catch (e) { /* none */ }
    },
  };
}

/* ---------- matrix mode: one canvas a head, labels and gold in an SVG above ---------- */

// Geometry shared by all heads of one kind/layer.
function matrixGeometry(kind) {
  const nq = Math.min(kind.rows.length, MAX_TOKENS), nk = Math.min(kind.cols.length, MAX_TOKENS);
  const cs = Math.max(12, Math.min(22, Math.floor(340 / Math.max(nq, nk, 1))));
  return { nq, nk, cs, lw: labelWidth(kind.rows.slice(0, nq)), lh: labelWidth(kind.cols.slice(0, nk)), top: 26 };
}

function matrixCard(kind, layer, h, o) {
  const g = o.g, color = headColor(h);
  const x0 = g.lw, y0 = g.top + g.lh;
  const width = x0 + g.nk * g.cs + 2, height = y0 + g.nq * g.cs + 2;
  const canvas = el("canvas", { class: "cells", "data-head": h });
  paintCells(canvas, headRows(kind, layer, h, g.nq, g.nk), g.nq, g.nk, o.scale, color, o.bg, o.norm);
  Object.assign(canvas.style, { left: `${x0}px`, top: `${y0}px`, width: `${g.nk * g.cs}px`, height: `${g.nq * g.cs}px` });
  const svg = svgEl("svg", { class: "head-matrix", "data-head": h, "data-geom": [x0, y0, g.cs, g.nq, g.nk],
    width, height, viewBox: `0 0 ${width} ${height}` });
  svg.append(svgEl("text", { class: "head-title", x: 0, y: 14, style: `fill:${color}` }, headName(h)),
    svgEl("text", { class: "entropy", "data-head": h, x: 62, y: 14 }, entropyText(kind, layer, h)));
  for (let j = 0; j < g.nk; j++) {
    const x = x0 + j * g.cs + g.cs / 2;
    const place = isCJK(kind.cols[j]) ? { x, y: y0 - 5, "text-anchor": "end", class: "col-label cjk" }
      : { transform: `translate(${x},${y0 - 5}) rotate(-90)`, "dominant-baseline": "central", class: "col-label" };
    svg.append(tokLabel({ "data-col": j, ...place }, kind.cols[j]));
  }
  for (let i = 0; i < g.nq; i++) {
    svg.append(tokLabel({ class: "row-label", "data-row": i, x: x0 - 5, y: y0 + i * g.cs + g.cs / 2,
      "text-anchor": "end", "dominant-baseline": "central" }, kind.rows[i]));
  }
  svg.append(svgEl("rect", { class: "grid", x: x0, y: y0, width: g.nk * g.cs, height: g.nq * g.cs }),
    svgEl("rect", { class: "frame", x: x0, y: y0, width: g.nk * g.cs, height: g.nq * g.cs }));
  if (o.gold) {
    for (const [i, j, label] of kind.gold || []) {
      if (i >= g.nq || j >= g.nk) continue;
      svg.append(svgEl("rect", { class: "gold", "data-row": i, "data-col": j, x: x0 + j * g.cs + 1,
        y: y0 + i * g.cs + 1, width: g.cs - 2, height: g.cs - 2 }, svgEl("title", {}, label || "gold")));
    }
  }
  const box = el("div", { class: "head-box" }, canvas, svg);
  Object.assign(box.style, { width: `${width}px`, height: `${height}px` });
  const card = el("div", { class: "head-card", "data-head": h }, box);
  const spark = o.spark(h, Math.max(160, g.nk * g.cs), 34);
  if (spark) {
    spark.style.marginLeft = `${x0}px`;
    card.append(spark);
  }
  return card;
}

/* ---------- lines mode: bertviz's head view ---------- */

function linesNodes(kind, layer, heads, scale, showGold) {
  const nq = Math.min(kind.rows.length, MAX_TOKENS), nk = Math.min(kind.cols.length, MAX_TOKENS);
  const rowH = 22, top = 30, gap = 280;
  const xL = labelWidth(kind.rows.slice(0, nq)), xR = xL + gap;
  const width = xR + labelWidth(kind.cols.slice(0, nk)), height = top + Math.max(nq, nk) * rowH + 6;
  const y = (i) => top + i * rowH + rowH / 2;
  const a = xL + 6, b = xR - 6;
  const out = [svgEl("text", { class: "axis-title", x: xL, y: 14, "text-anchor": "end" }, "queries"),
    svgEl("text", { class: "axis-title", x: xR, y: 14 }, "keys")];
  if (showGold) {
    for (const [i, j, label] of kind.gold || []) {
      if (i >= nq || j >= nk) continue;
      out.push(svgEl("line", { class: "gold-line", "data-i": i, "data-j": j, x1: a, y1: y(i), x2: b, y2: y(j) },
        svgEl("title", {}, label || "gold")));
    }
  }
  for (const h of heads) {
    const W = kind.weights[layer][h], group = svgEl("g", { class: "head-lines", "data-head": h, stroke: headColor(h) });
    for (let i = 0; i < nq; i++) {
      for (let j = 0; j < nk; j++) {
        const w = W[i][j] / scale;
        if (w < LINE_MIN) continue;
        group.append(svgEl("line", { class: "attn-line", "data-head": h, "data-i": i, "data-j": j,
          x1: a, y1: y(i), x2: b, y2: y(j), "stroke-opacity": (0.12 + 0.88 * w).toFixed(3),
          "stroke-width": (0.6 + 3.4 * w).toFixed(2) }));
      }
    }
    out.push(group);
  }
  kind.rows.slice(0, nq).forEach((tok, k) => out.push(tokLabel({ class: "tok-left", x: xL,
    "text-anchor": "end", "data-i": k, y: y(k), "dominant-baseline": "central" }, tok)));
  kind.cols.slice(0, nk).forEach((tok, k) => out.push(tokLabel({ class: "tok-right", x: xR,
    "data-j": k, y: y(k), "dominant-baseline": "central" }, tok)));
  return { nodes: out, width, height };
}

// The gold cells of `kind` outlined over an overview picture of nq x nk cells of s px.
function goldOverlay(kind, nq, nk, s) {
  const svg = svgEl("svg", { class: "ov-gold", width: nk * s, height: nq * s });
  for (const [i, j, label] of kind.gold || []) {
    if (i < nq && j < nk) {
      svg.append(svgEl("rect", { class: "gold", "data-row": i, "data-col": j, x: j * s, y: i * s,
        width: s, height: s }, svgEl("title", {}, label || "gold")));
    }
  }
  return svg;
}

/* ---------- trends: a head's entropy and gold share across steps ---------- */

// The series of head h (h < 0: the mean of the heads) of one kind and layer, per step:
// {entropy: [number|null], gold: [number|null]}.
function trendSeries(trend, kindName, layer, h) {
  const kind = trend && trend.kinds && trend.kinds[kindName];
  if (!kind) return null;
  const pick = (perStep) => (perStep || []).map((v) => {
    const row = v && v[layer];
    if (!Array.isArray(row)) return null;
    if (h >= 0) return typeof row[h] === "number" ? row[h] : null;
    const nums = row.filter((x) => typeof x === "number");
    return nums.length ? nums.reduce((a, b) => a + b, 0) / nums.length : null;
  });
  return { entropy: pick(kind.entropy), gold: pick(kind.gold) };
}

function drawSpark(canvas, steps, series, current, color, emax, dark) {
  const w = canvas.width, h = canvas.height, ctx = canvas.getContext("2d"), pad = 3;
  const x = (k) => pad + (steps.length > 1 ? (k * (w - 2 * pad)) / (steps.length - 1) : (w - 2 * pad) / 2);
  ctx.clearRect(0, 0, w, h);
  ctx.fillStyle = dark ? "#2a2b2e" : "#f4f4f4";
  ctx.fillRect(0, 0, w, h);
  const line = (values, top, style, dash) => {
    ctx.beginPath();
    ctx.setLineDash(dash);
    ctx.strokeStyle = style;
    ctx.lineWidth = 1.5;
    let open = false;
    values.forEach((v, k) => {
      if (v === null || !(top > 0)) { open = false; return; }
      const y = h - pad - (Math.min(v, top) / top) * (h - 2 * pad);
      if (open) ctx.lineTo(x(k), y); else ctx.moveTo(x(k), y);
      open = true;
    });
    ctx.stroke();
  };
  line(series.entropy, emax, color, []);
  if (series.gold.some((v) => v !== null)) line(series.gold, 1, dark ? "#e8eaed" : "#222", [3, 2]);
  if (current >= 0) {
    ctx.setLineDash([]);
    ctx.fillStyle = dark ? "#fdd663" : "#e8710a";
    ctx.fillRect(Math.round(x(current)) - 1, 0, 2, h);
  }
}

/* ---------- the view ---------- */

class AttentionView {
  constructor(root, source) {
    Object.assign(this, {
      root, source, runs: [], steps: [], index: 0, doc: null, kind: null, layer: 0,
      goldWanted: true, hidden: new Set(), cache: new Map(), req: 0, timer: null,
      loading: false, hoverKey: "", marked: [], trend: null, state: {}, dark: false,
      follow: true, restoring: true, // no state is written before the URL's is read
    });
    this.buildDom();
    this.wire();
  }

  /* ----- DOM and events ----- */

  buildDom() {
    const doc = this.root.ownerDocument;
    if (!doc.getElementById(STYLE_ID)) {
      const style = doc.createElement("style");
      style.id = STYLE_ID;
      style.textContent = CSS;
      doc.head.appendChild(style);
    }
    this.root.classList.add("tmv");
    this.root.dataset.ready = "false";
    this.root.innerHTML = TEMPLATE; // a constant: no data in it
    // this.ui.stepLabel is #step-label, this.ui.translationTitle is #translation-title, ...
    this.ui = { views: this.root.querySelector(".tmv-views") };
    for (const node of this.root.querySelectorAll("[id]")) {
      this.ui[node.id.replace(/-(\w)/g, (_, c) => c.toUpperCase())] = node;
    }
    this.showHint();
    this.ui.mode.value = "overview";
  }

  wire() {
    const ui = this.ui;
    const on = (node, type, fn) => node.addEventListener(type, fn);
    on(ui.run, "change", () => { this.fillProbes(); this.loadSteps(); });
    on(ui.probe, "change", () => this.loadSteps());
    on(ui.kind, "change", () => { this.kind = ui.kind.value; this.redraw(); });
    on(ui.layer, "change", () => { this.layer = Number(ui.layer.value); this.redraw(); });
    on(ui.mode, "change", () => this.redraw());
    on(ui.norm, "change", () => this.redraw());
    on(ui.gold, "change", () => { this.goldWanted = ui.gold.checked; this.redraw(); });
    on(ui.step, "input", () => this.seek(Number(ui.step.value)));
    on(ui.play, "click", () => (this.timer ? this.pause() : this.play()));
    on(ui.heads, "click", (e) => this.onHeadClick(e));
    on(ui.relations, "click", (e) => this.onViewClick(e));
    on(ui.views, "mousemove", (e) => this.onHover(e.target, e));
    on(ui.views, "mouseleave", () => this.clearHover());
    on(ui.views, "focusin", (e) => this.onHover(e.target, null));
    on(ui.views, "focusout", () => this.clearHover());
    on(ui.views, "click", (e) => this.onViewClick(e));
    on(ui.views, "keydown", (e) => {
      if ((e.key === "Enter" || e.key === " ") && e.target.closest(".thumb")) {
        e.preventDefault();
        this.onViewClick(e);
      }
    });
    const media = typeof matchMedia === "function" ? matchMedia("(prefers-color-scheme: dark)") : null;
    if (media && !this.source.followsHostTheme) {
      this.setDark(media.matches);
      media.addEventListener("change", (e) => this.setDark(e.matches));
    }
  }

  setDark(dark) {
    if (this.dark === !!dark && this.root.classList.contains("tmv-dark") === !!dark) return;
    this.dark = !!dark;
    this.root.classList.toggle("tmv-dark", this.dark);
    this.redraw();
  }

  setStatus(text, isError = false) {
    this.ui.status.textContent = text;
    this.ui.status.classList.toggle("error", isError);
  }

  fail(err) {
    this.loading = false;
    const msg = oneLine((err && err.message) || err || "unknown error");
    this.root.dataset.error = msg;
    this.setStatus(`error: ${msg}`, true);
  }

  /* ----- state in the URL ----- */

  saveState() {
    if (!this.source.saveState || this.restoring) return;
    const heads = [...this.hidden].sort((a, b) => a - b).join(",");
    const state = { run: this.ui.run.value, probe: this.ui.probe.value, kind: this.kind || "",
      layer: String(this.layer), view: this.ui.mode.value, step: this.doc ? String(this.doc.step) : "",
      hide: heads, norm: this.ui.norm.value, gold: this.goldWanted ? "" : "0" };
    const sig = JSON.stringify(state);
    if (sig === this.savedSig) return;
    this.savedSig = sig;
    try { this.source.saveState(state); } catch (e) { /* a state nobody can keep */ }
  }

  // Apply what loadState gave, once, where it fits the data (anything else is ignored).
  applyState() {
    const s = this.state, ui = this.ui;
    if (["overview", "matrix", "lines"].includes(s.view)) ui.mode.value = s.view;
    if (["weight", "row"].includes(s.norm)) ui.norm.value = s.norm;
    if (s.gold === "0") this.goldWanted = false;
    if (s.kind && KINDS[s.kind]) this.kind = s.kind;
    const layer = Number(s.layer);
    if (Number.isInteger(layer) && layer >= 0) this.layer = layer;
    for (const h of String(s.hide || "").split(",")) {
      const n = Number(h);
      if (h !== "" && Number.isInteger(n) && n >= 0 && n < 4096) this.hidden.add(n);
    }
  }

  /* ----- loading: runs -> probes -> steps -> documents ----- */

  // Call the source; null when it failed (the status says why) or a newer call superseded it.
  async ask(call) {
    const token = ++this.req;
    this.loading = true;
    this.root.dataset.ready = "false";
    this.setStatus("loading…");
    try {
      const value = await call();
      return token === this.req ? { value } : null;
    } catch (err) {
      if (token === this.req) this.fail(err);
      return null;
    }
  }

  idle(message) {
    this.loading = false; // nothing to draw, say why
    this.setStatus(message);
    this.root.dataset.idle = message;
  }

  async start() {
    if (this.source.loadState) {
      try { this.state = (await this.source.loadState()) || {}; } catch (e) { this.state = {}; }
      this.applyState();
    }
    this.restoring = false;
    const got = await this.ask(() => this.source.listRuns());
    if (!got) return;
    this.setRuns(got.value);
    if (!this.runs.length) return this.idle("no runs with attention probes yet");
    const run = this.runs.find((r) => r.run === this.state.run);
    if (run) this.ui.run.value = run.run;
    this.fillProbes();
    if (this.state.probe && [...this.ui.probe.options].some((o) => o.value === this.state.probe)) {
      this.ui.probe.value = this.state.probe;
    }
    await this.loadSteps(this.state.step);
  }

  setRuns(runs) {
    this.runs = Array.isArray(runs) ? runs : [];
    const previous = this.ui.run.value;
    this.fillSelect(this.ui.run, this.runs.map((r) => [r.run, r.run]), null);
    if (this.runs.some((r) => r.run === previous)) this.ui.run.value = previous;
    this.needGlyphs(this.runs.flatMap((r) => (r.probes || []).map((p) => `${p.sentence || ""}${p.reference || ""}`)).join(""));
  }

  needGlyphs(text) {
    if (this.source.needGlyphs && text) {
      try { this.source.needGlyphs(text); } catch (e) { /* the fallback font stays */ }
    }
  }

  fillProbes() {
    const run = this.runs.find((r) => r.run === this.ui.run.value) || this.runs[0];
    const probes = (run && run.probes) || [], previous = this.ui.probe.value;
    this.fillSelect(this.ui.probe, probes.map((p) => [p.tag, p.sentence || p.tag, p.tag]), null);
    if (probes.some((p) => p.tag === previous)) this.ui.probe.value = previous;
  }

  // The probe's steps, then the step `wanted` (a step number) or the last one.
  async loadSteps(wanted) {
    this.pause();
    this.trend = null;
    if (!this.ui.probe.value) return this.idle("no probe sentences in this run");
    const run = this.ui.run.value, tag = this.ui.probe.value;
    const got = await this.ask(() => this.source.listSteps(run, tag));
    if (!got) return;
    this.setSteps(got.value);
    if (!this.steps.length) {
      this.ui.stepLabel.textContent = "–";
      return this.idle("no steps recorded for this probe yet");
    }
    delete this.root.dataset.idle;
    this.loadTrend(run, tag);
    const at = this.steps.indexOf(Number(wanted));
    await this.seek(at >= 0 ? at : this.steps.length - 1);
  }

  // The panel's hint (text, not markup); trends only where there are steps to trend.
  showHint() {
    this.ui.info.replaceChildren(el("div", { class: "info-hint" },
      INFO_HINT + (this.steps.length > 1 ? TREND_HINT : "")));
  }

  setSteps(steps) {
    this.steps = Array.isArray(steps) ? steps : [];
    this.ui.step.max = String(Math.max(0, this.steps.length - 1));
    this.root.dataset.steps = String(this.steps.length);
    // one frame (the HTML file of a translation): nothing to play, no trends to hint at
    const one = this.steps.length <= 1;
    this.ui.play.hidden = this.ui.step.hidden = one;
    if (this.ui.info.querySelector(".info-hint")) this.showHint();
  }

  loadTrend(run, tag) {
    if (!this.source.getTrend) return;
    Promise.resolve().then(() => this.source.getTrend(run, tag)).then((trend) => {
      if (run !== this.ui.run.value || tag !== this.ui.probe.value) return;
      this.trend = trend;
      this.drawSparks();
    }, () => { /* no trend: the views stand without it */ });
  }

  // Show step number `index` of the slider (fetching its document unless cached).
  async seek(index) {
    const t0 = performance.now();
    const step = this.steps[index];
    this.index = index;
    this.follow = index === this.steps.length - 1;
    this.ui.step.value = String(index);
    this.ui.stepLabel.textContent = `step ${step} (${index + 1}/${this.steps.length})`;
    const got = await this.ask(() => this.fetchDoc(this.ui.run.value, this.ui.probe.value, step));
    if (!got) return;
    this.doc = got.value;
    this.draw(t0);
  }

  seekStep(step) {
    let best = 0;
    this.steps.forEach((s, k) => { if (Math.abs(s - step) < Math.abs(this.steps[best] - step)) best = k; });
    if (this.steps.length) this.seek(best);
  }

  // Documents are cached as promises, so each is fetched once.
  fetchDoc(run, tag, step) {
    const key = `${run}\u0000${tag}\u0000${step}`;
    if (!this.cache.has(key)) {
      const p = Promise.resolve().then(() => this.source.getStep(run, tag, step));
      p.catch(() => this.cache.delete(key));
      this.cache.set(key, p);
      if (this.cache.size > CACHE_SIZE) this.cache.delete(this.cache.keys().next().value);
    }
    return this.cache.get(key);
  }

  // New runs, probes and steps (TensorBoard's reload): the slider grows; a view at the
  // last step follows to the new last step; nothing else moves.
  async refresh() {
    if (this.refreshing) return;
    this.refreshing = true;
    try {
      const runs = await this.source.listRuns();
      const hadRuns = this.runs.length;
      this.setRuns(runs);
      if (!this.runs.length) return;
      this.fillProbes();
      if (!hadRuns || !this.doc) {
        await this.loadSteps();
        return;
      }
      const run = this.ui.run.value, tag = this.ui.probe.value;
      if (!tag) return;
      const steps = await this.source.listSteps(run, tag);
      if (run !== this.ui.run.value || tag !== this.ui.probe.value || !Array.isArray(steps)) return;
      if (steps.join() === this.steps.join()) return;
      const current = this.steps[this.index], follow = this.follow && !this.timer;
      this.setSteps(steps);
      this.loadTrend(run, tag);
      const at = this.steps.indexOf(current);
      if (follow || at < 0) await this.seek(this.steps.length - 1);
      else {
        this.index = at;
        this.ui.step.value = String(at);
        this.ui.stepLabel.textContent = `step ${current} (${at + 1}/${this.steps.length})`;
      }
    } catch (err) {
      this.fail(err);
    } finally {
      this.refreshing = false;
    }
  }

  /* ----- controls that follow the document ----- */

  syncControls() {
    const kinds = Object.keys(KINDS).filter((k) => this.doc.kinds && this.doc.kinds[k]);
    // cross-attention first (the tutorials' picture: which source word each output reads)
    if (!kinds.includes(this.kind)) this.kind = kinds.includes("cross") ? "cross" : kinds[0] || null;
    this.fillSelect(this.ui.kind, kinds.map((k) => [k, KINDS[k][0]]), this.kind);
    const kind = this.currentKind();
    const layers = kind ? kind.weights.length : 0;
    if (this.layer >= layers) this.layer = 0;
    this.fillSelect(this.ui.layer, [...Array(layers).keys()].map((l) => [String(l), `layer ${l}`]),
      String(this.layer));
    this.ui.layer.disabled = this.ui.mode.value === "overview";
    this.fillHeads(layers ? kind.weights[this.layer].length : 0, kind);
    const hasGold = !!(kind && kind.gold && kind.gold.length);
    this.ui.gold.disabled = !hasGold;
    this.ui.gold.checked = hasGold && this.goldWanted;
  }

  // Refill a <select> only when its options change (keeps focus and scroll).
  fillSelect(select, options, value) {
    const sig = options.map((o) => o.join("\u0001")).join("\u0002");
    if (select.dataset.sig !== sig) {
      select.dataset.sig = sig;
      setOptions(select, options);
    }
    if (value !== null) select.value = value;
  }

  fillHeads(count, kind) {
    const box = this.ui.heads;
    if (Number(box.dataset.count) !== count) {
      box.dataset.count = String(count);
      box.replaceChildren();
      if (count) box.append(el("span", {}, "heads"));
      for (let h = 0; h < count; h++) {
        const btn = el("button", { type: "button", class: "head-toggle", "data-head": h }, String(h));
        btn.style.setProperty("--c", headColor(h));
        box.append(btn);
      }
    }
    for (const btn of box.querySelectorAll(".head-toggle")) {
      const h = Number(btn.dataset.head);
      btn.setAttribute("aria-pressed", String(!this.hidden.has(h)));
      btn.title = `head ${h} · ${entropyText(kind, this.layer, h)} (click to hide / show)`;
    }
  }

  onHeadClick(e) {
    const btn = e.target.closest(".head-toggle");
    if (!btn) return;
    const h = Number(btn.dataset.head);
    if (!this.hidden.delete(h)) this.hidden.add(h);
    this.redraw();
  }

  // A click on an overview picture (or a relation of the sentence) opens that layer in the
  // matrix view (that head alone, or every head for the mean); a click on a trend jumps to
  // the step under the pointer.
  onViewClick(e) {
    const spark = e.target.closest && e.target.closest("canvas.spark");
    if (spark && e.clientX !== undefined && e.type === "click") {
      const steps = (this.trend && this.trend.steps) || [];
      if (steps.length < 1) return;
      this.seekStep(steps[sparkIndex(spark, e.clientX, steps.length)]);
      return;
    }
    const thumb = e.target.closest && e.target.closest(".thumb, button.rel");
    if (!thumb) return;
    const layer = Number(thumb.dataset.layer), h = Number(thumb.dataset.head);
    const kind = this.currentKind();
    const n = kind ? kind.weights[layer].length : 0;
    this.hidden = new Set(h < 0 ? [] : [...Array(n).keys()].filter((k) => k !== h));
    this.layer = layer;
    this.ui.mode.value = "matrix";
    this.redraw();
  }

  /* ----- play: advance the slider every PLAY_MS, looping ----- */

  play() {
    if (this.steps.length < 2) return;
    if (this.index >= this.steps.length - 1) this.seek(0);
    this.timer = setInterval(() => {
      if (!this.loading) this.seek((this.index + 1) % this.steps.length);
    }, PLAY_MS);
    this.ui.play.textContent = "Pause";
    this.ui.play.setAttribute("aria-pressed", "true");
  }

  pause() {
    clearInterval(this.timer);
    this.timer = null;
    this.ui.play.textContent = "Play";
    this.ui.play.setAttribute("aria-pressed", "false");
  }

  /* ----- drawing ----- */

  currentKind() {
    return this.doc && this.doc.kinds && this.kind ? this.doc.kinds[this.kind] : null;
  }

  visibleHeads() {
    const kind = this.currentKind();
    const n = kind ? kind.weights[this.layer].length : 0;
    return [...Array(n).keys()].filter((h) => !this.hidden.has(h));
  }

  redraw() {
    if (this.doc) this.draw(performance.now());
  }

  draw(t0) {
    const doc = this.doc, ui = this.ui, scale = doc.scale || 255;
    const t1 = performance.now();
    this.clearHover();
    this.syncControls();
    this.drawHeader(doc);
    const kind = this.currentKind(), mode = ui.mode.value;
    this.drawRelations(kind);
    const o = { scale, bg: this.dark ? BACKGROUND.dark : BACKGROUND.light, norm: ui.norm.value,
      gold: ui.gold.checked };
    for (const box of [ui.overview, ui.matrices, ui.lines]) box.replaceChildren();
    ui.caption.textContent = "";
    ui.colorbar.replaceChildren();
    ui.lines.style.display = mode === "lines" && kind ? "" : "none";
    ui.overview.style.display = mode === "overview" && kind ? "" : "none";
    if (!kind) ui.matrices.append(el("div", { class: "tmv-empty" }, "No attention in this document."));
    else if (mode === "overview") this.drawOverview(kind, o);
    else if (mode === "matrix") this.drawMatrices(kind, o);
    else this.drawLines(kind, o);
    if (kind && mode !== "lines") this.drawColorbar(o);
    this.drawSparks();
    void this.root.offsetHeight; // lay out before taking the time
    this.loading = false;
    delete this.root.dataset.error;
    this.setStatus(`step ${doc.step}`);
    const t2 = performance.now();
    Object.assign(this.root.dataset, {
      step: String(doc.step), view: mode, renderMs: String(Math.round(t2 - t0)),
      drawMs: (t2 - t1).toFixed(1), ready: "true",
    });
    if (!this.drawn && typeof performance.mark === "function") performance.mark("tinymt-first-draw");
    this.drawn = true;
    this.saveState();
    this.needGlyphs(`${doc.translation || ""}${doc.sentence || ""}${doc.reference || ""}`);
  }

  drawHeader(doc) {
    const ui = this.ui;
    ui.sentence.textContent = doc.sentence || "";
    ui.reference.textContent = doc.reference || "none";
    ui.reference.classList.toggle("missing", !doc.reference);
    ui.translationTitle.textContent = `model @ ${doc.step}`;
    ui.translation.textContent = doc.translation || "";
    ui.forced.textContent = doc.forced === "reference"
      ? "the reference (teacher forcing)" : "the model's own translation";
  }

  // The document's relations of this kind ([query word, partner, label, layer, head, weight]
  // each; from a record, any JSON: shown as text), a button opening the head where it exists.
  drawRelations(kind) {
    const rels = !kind || kind.relations === undefined ? [] : Array.isArray(kind.relations) ? kind.relations : [kind.relations];
    this.ui.relations.hidden = this.ui.relationsTitle.hidden = !rels.length;
    this.ui.relations.replaceChildren(...rels.map((r) => {
      if (!Array.isArray(r) || r.length !== 6) return el("span", { class: "rel" }, oneLine(JSON.stringify(r)));
      const [q, k, label, l, h, w] = r;
      const real = Number.isInteger(l) && l >= 0 && l < kind.weights.length && Number.isInteger(h) && h >= 0 &&
        h < kind.weights[l].length;
      return el(real ? "button" : "span", real ? { type: "button", class: "rel", "data-layer": l, "data-head": h } : { class: "rel" },
        `${q} → ${k} `, el("b", {}, String(label)), ": ", ...(real ? [swatch(headColor(h, this.dark)), " "] : []),
        `layer ${l} head ${h}, ${typeof w === "number" ? w.toFixed(2) : String(w)}`);
    }));
  }

  drawCaption(kind, heads, where) {
    const [label, rs, cs] = KINDS[this.kind];
    const cut = kind.rows.length > MAX_TOKENS || kind.cols.length > MAX_TOKENS;
    this.ui.caption.textContent = `${label}, ${where}: ` +
      `rows / left = ${rs} queries, columns / right = ${cs} keys` +
      (cut ? ` · showing the first ${MAX_TOKENS} tokens` : "") + (heads.length ? "" : " · all heads hidden");
  }

  // The colour scale: 0 -> 1 of the weight (or of the row's largest), in a neutral colour.
  drawColorbar(o) {
    const canvas = el("canvas", { width: 120, height: 1 });
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(120, 1), rgb = rgbOf(headColor(-1, this.dark));
    for (let x = 0; x < 120; x++) {
      const c = ramp(rgb, o.bg, x / 119);
      img.data.set([c[0], c[1], c[2], 255], x * 4);
    }
    ctx.putImageData(img, 0, 0);
    const top = o.norm === "row" ? "row max" : "1";
    this.ui.colorbar.dataset.norm = o.norm;
    this.ui.colorbar.append(el("span", {}, "0"), canvas, el("span", {}, top),
      el("span", { class: "muted" }, o.norm === "row" ? "(each row over its largest weight)" : "(attention weight)"));
  }

  // Every layer x head of the kind, as small pictures sized to fit the window, and the
  // mean of each layer's heads; under each, its trend.
  drawOverview(kind, o) {
    const box = this.ui.overview, layers = kind.weights.length, heads = this.visibleHeads();
    const nq = Math.min(kind.rows.length, MAX_TOKENS), nk = Math.min(kind.cols.length, MAX_TOKENS);
    this.drawCaption(kind, heads, `all ${layers} layers`);
    const cols = heads.length + 1, rows = layers, labelW = 60;
    // a column costs its picture, a gap (8 px) and the picture's frame (padding: 2 px)
    const width = Math.max(240, this.ui.views.clientWidth - labelW - cols * 10);
    const top = box.getBoundingClientRect().top, view = this.root.ownerDocument.defaultView;
    const height = Math.max(200, (view ? view.innerHeight : 900) - Math.max(0, top) - 40 - 18);
    // a trend a fifth of a picture's height (12..28 px) under each, and the head's label
    // (as wide as the longest, about 6.6 px a character, if the window has room)
    const tags = Array.isArray(kind.labels) ? kind.labels.flat().map((t) => String(t).split(" · ")[0]) : null;
    const tagH = tags ? 16 : 0, tagW = tags ? Math.min(width / cols - 2, 4 + 6.6 * Math.max(0, ...tags.map((t) => t.length))) : 0;
    const fit = Math.min(width / cols, (height / rows - 8 - tagH) / 1.2) / Math.max(nq, nk, 1);
    const s = Math.max(1, Math.min(12, fit)), spark = Math.max(12, Math.min(28, Math.round(nq * s / 5)));
    box.style.gridTemplateColumns = `${labelW}px repeat(${cols}, max-content)`;
    const cells = [el("span", {})];
    for (const h of [...heads, -1]) {
      const head = el("span", { class: "ov-head" }, h < 0 ? "mean" : String(h));
      head.style.color = headColor(h, this.dark);
      cells.push(head);
    }
    for (let l = 0; l < layers; l++) {
      cells.push(el("span", { class: "ov-label" }, `layer ${l}`));
      for (const h of [...heads, -1]) {
        const canvas = el("canvas", { class: "cells", "data-layer": l, "data-head": h });
        paintCells(canvas, headRows(kind, l, h, nq, nk), nq, nk, o.scale, headColor(h, this.dark), o.bg, o.norm);
        Object.assign(canvas.style, { width: `${nk * s}px`, height: `${nq * s}px` });
        const e = entropyOf(kind, l, h), pic = el("div", { class: "ov-pic" }, canvas), tag = headLabel(kind, l, h);
        if (o.gold) pic.append(goldOverlay(kind, nq, nk, s));
        const thumb = el("div", { class: "thumb", tabindex: 0, role: "button", "data-layer": l, "data-head": h,
          "data-scale": s, "aria-label": `layer ${l}, ${headName(h)}${e === null ? "" : `, entropy ${e.toFixed(2)}`}` +
          `${tag ? `, ${tag[0]}` : ""}: open` }, pic);
        if (tagH) {
          const label = el("div", { class: tag && tag[2] ? "ov-tag relation" : "ov-tag" }, tag ? tag[0] : "");
          label.style.width = `${Math.max(24, nk * s, tagW)}px`;
          thumb.append(label);
        }
        const sp = this.sparkCanvas(h, Math.max(24, Math.round(nk * s)), spark, l);
        if (sp) thumb.append(sp);
        cells.push(thumb);
      }
    }
    box.replaceChildren(...cells);
  }

  drawMatrices(kind, o) {
    const heads = this.visibleHeads();
    o.g = matrixGeometry(kind);
    o.spark = (h, w, hgt) => this.sparkCanvas(h, w, hgt, this.layer);
    this.drawCaption(kind, heads, `layer ${this.layer}`);
    this.ui.matrices.replaceChildren(...heads.map((h) => matrixCard(kind, this.layer, h, o)));
  }

  drawLines(kind, o) {
    const heads = this.visibleHeads(), svg = this.ui.lines;
    this.drawCaption(kind, heads, `layer ${this.layer}`);
    const { nodes, width, height } = linesNodes(kind, this.layer, heads, o.scale, o.gold);
    for (const [k, v] of Object.entries({ width, height, viewBox: `0 0 ${width} ${height}` })) svg.setAttribute(k, v);
    svg.replaceChildren(...nodes);
  }

  // A trend canvas for head h of `layer` (drawn by drawSparks once the trend is known).
  sparkCanvas(h, width, height, layer) {
    if (!this.source.getTrend) return null;
    return el("canvas", { class: "spark", width, height, "data-head": h, "data-layer": layer,
      title: `${headName(h)}: entropy (solid) and share on gold cells (dashed) across steps; click: go to that step` });
  }

  drawSparks() {
    const trend = this.trend, steps = (trend && trend.steps) || [];
    const series = {};
    let emax = 0;
    const kind = trend && trend.kinds && trend.kinds[this.kind];
    for (const perStep of (kind && kind.entropy) || []) {
      for (const row of perStep || []) for (const v of row || []) if (typeof v === "number") emax = Math.max(emax, v);
    }
    const current = steps.indexOf(this.doc ? this.doc.step : NaN);
    this.trendMax = emax;
    const sparks = this.ui.views.querySelectorAll("canvas.spark");
    this.ui.trendScale.textContent = sparks.length && steps.length ? `strips under each head, steps ` +
      `${steps[0]} to ${steps[steps.length - 1]}: entropy (solid) 0 to ${emax.toFixed(2)} nats, gold share (dashed) 0 to 1` : "";
    for (const canvas of sparks) {
      const h = Number(canvas.dataset.head), l = Number(canvas.dataset.layer);
      const key = `${l},${h}`;
      series[key] = series[key] || trendSeries(trend, this.kind, l, h) || { entropy: [], gold: [] };
      const s = series[key];
      drawSpark(canvas, steps, s, current, headColor(h, this.dark), emax, this.dark);
      Object.assign(canvas.dataset, { steps: String(steps.length), current: String(current),
        entropy: s.entropy.map((v) => (v === null ? "" : v.toFixed(4))).join(","),
        gold: s.gold.map((v) => (v === null ? "" : v.toFixed(4))).join(",") });
    }
  }

  /* ----- hover (and keyboard focus): highlight and #info ----- */

  // What a pointed element stands for: a row, a column, or one cell (of a head, all, or
  // the mean of a layer's heads in the overview).
  hoverTarget(target, e) {
    if (!target.closest) return null;
    const spark = target.closest("canvas.spark"), steps = (this.trend && this.trend.steps) || [];
    if (spark && e && steps.length) {  // a trend: the step under the pointer
      return { axis: "trend", layer: Number(spark.dataset.layer), head: Number(spark.dataset.head),
        k: sparkIndex(spark, e.clientX, steps.length) };
    }
    const thumb = target.closest(".thumb");
    if (thumb) {
      const canvas = thumb.querySelector("canvas.cells"), s = Number(thumb.dataset.scale);
      const base = { axis: "thumb", layer: Number(thumb.dataset.layer), head: Number(thumb.dataset.head) };
      if (!e || target !== canvas) return base;
      const r = canvas.getBoundingClientRect();
      const i = Math.floor((e.clientY - r.top) / s), j = Math.floor((e.clientX - r.left) / s);
      return i >= 0 && j >= 0 && i < canvas.height && j < canvas.width ? { ...base, i, j } : base;
    }
    const node = target.closest("[data-row],[data-col],[data-i],[data-j],rect.grid");
    if (!node) return null;
    const c = node.classList, d = node.dataset, svg = node.closest("svg.head-matrix");
    if (c.contains("row-label") || c.contains("tok-left")) return { axis: "row", index: Number(d.row ?? d.i) };
    if (c.contains("col-label") || c.contains("tok-right")) return { axis: "col", index: Number(d.col ?? d.j) };
    const head = svg ? Number(svg.dataset.head) : d.head !== undefined ? Number(d.head) : null;
    if (c.contains("grid") && svg && e) {
      const [x0, y0, cs, nq, nk] = svg.dataset.geom.split(",").map(Number);
      const r = svg.getBoundingClientRect();
      const i = Math.floor((e.clientY - r.top - y0) / cs), j = Math.floor((e.clientX - r.left - x0) / cs);
      return i >= 0 && j >= 0 && i < nq && j < nk ? { axis: "cell", i, j, head } : null;
    }
    if (c.contains("gold") || c.contains("attn-line") || c.contains("gold-line")) {
      return { axis: "cell", i: Number(d.row ?? d.i), j: Number(d.col ?? d.j), head };
    }
    return null;
  }

  onHover(target, e) {
    const kind = this.currentKind();
    const t = kind ? this.hoverTarget(target, e) : null;
    if (!t) return this.clearHover();
    const key = JSON.stringify(t);
    if (key === this.hoverKey) return;
    this.clearHover();
    this.hoverKey = key;
    if (t.axis === "thumb") return this.showThumb(kind, t);
    if (t.axis === "trend") return this.showTrendPoint(t);
    if (t.axis === "cell") return this.showCell(kind, t);
    this.highlight(t.axis, t.index);
    this.showAxis(kind, t.axis, t.index);
  }

  clearHover() {
    for (const node of this.marked) node.classList.remove("hl");
    for (const node of this.ui.matrices.querySelectorAll("path.dim, path.dim-edge")) node.remove();
    this.marked = [];
    this.hoverKey = "";
    this.ui.views.classList.remove("hl-active");
    delete this.ui.info.dataset.axis;
    delete this.ui.info.dataset.index;
    delete this.ui.info.dataset.thumb;
    delete this.ui.info.dataset.trend;
    this.showHint();
  }

  // Emphasise row / column `idx` in every visible head: matrices get a veil with a
  // hole over it, lines mode dims the other lines by CSS.
  highlight(axis, idx) {
    for (const svg of this.ui.matrices.querySelectorAll("svg.head-matrix")) {
      const [x0, y0, cs, nq, nk] = svg.dataset.geom.split(",").map(Number);
      const [x, y, w, h] = axis === "row" ? [x0, y0 + idx * cs, nk * cs, cs] : [x0 + idx * cs, y0, cs, nq * cs];
      const hole = `M${x},${y}h${w}v${h}h${-w}z`;
      addPath(svg, "dim", `M${x0},${y0}h${nk * cs}v${nq * cs}h${-nk * cs}z ${hole}`);
      addPath(svg, "dim-edge", hole);
    }
    const sel = this.ui.mode.value === "matrix"
      ? (axis === "row" ? `text.row-label[data-row="${idx}"]` : `text.col-label[data-col="${idx}"]`)
      : (axis === "row" ? `[data-i="${idx}"]:is(line.attn-line, text.tok-left)`
        : `[data-j="${idx}"]:is(line.attn-line, text.tok-right)`);
    this.marked = [...this.ui.views.querySelectorAll(sel)];
    for (const node of this.marked) node.classList.add("hl");
    this.ui.views.classList.add("hl-active");
  }

  // #info for a hovered token: per visible head, its row (or column) of weights.
  showAxis(kind, axis, idx) {
    const scale = this.doc.scale || 255, W = kind.weights[this.layer];
    const labels = axis === "row" ? kind.cols : kind.rows;
    const title = axis === "row" ? `query “${kind.rows[idx]}” (row ${idx}) attends to`
      : `key “${kind.cols[idx]}” (column ${idx}) is attended by`;
    const parts = [el("div", { class: "info-title" }, title)];
    for (const h of this.visibleHeads()) {
      const vals = (axis === "row" ? W[h][idx] : W[h].map((r) => r[idx])).map((v) => v / scale);
      const top = vals.map((v, k) => [v, k]).sort((a, b) => b[0] - a[0]).slice(0, 3)
        .map(([v, k]) => `${labels[k]} ${v.toFixed(3)}`).join(" · ");
      parts.push(el("div", { class: "info-head", "data-head": h, "data-values": vals.map((v) => v.toFixed(3)) },
        swatch(headColor(h)), el("span", { class: "info-name" }, `head ${h}`), el("span", { class: "info-top" }, top)));
    }
    Object.assign(this.ui.info.dataset, { axis, index: String(idx) });
    this.ui.info.replaceChildren(...parts);
  }

  // #info for a hovered cell (or line): its value per head and its gold label.
  showCell(kind, t, layer = this.layer) {
    const scale = this.doc.scale || 255, W = kind.weights[layer];
    const gold = (kind.gold || []).find(([i, j]) => i === t.i && j === t.j);
    const parts = [el("div", { class: "info-title" }, `${kind.rows[t.i]} → ${kind.cols[t.j]} `,
      el("span", { class: "muted" }, `(row ${t.i}, column ${t.j})`))];
    const heads = t.head === null || t.head === undefined || t.head < 0 ? this.visibleHeads() : [t.head];
    for (const h of heads) {
      const v = W[h][t.i][t.j], x = (v / scale).toFixed(3);
      parts.push(el("div", { class: "info-cell", "data-head": h, "data-row": t.i, "data-col": t.j, "data-value": x },
        swatch(headColor(h)), el("span", { class: "info-name" }, `head ${h}`),
        el("span", {}, `${x} `, el("span", { class: "muted" }, `(${v}/${scale})`))));
    }
    if (gold) parts.push(el("div", { class: "info-gold" }, `gold: ${gold[2] || "gold"}`));
    Object.assign(this.ui.info.dataset, { axis: "cell", index: `${t.i},${t.j}` });
    this.ui.info.replaceChildren(...parts);
  }

  // #info for an overview picture: which head, its entropy and trend; the cell pointed at.
  showThumb(kind, t) {
    if (t.i !== undefined) this.showCell(kind, t, t.layer);
    else this.ui.info.replaceChildren();
    const s = trendSeries(this.trend, this.kind, t.layer, t.head);
    const gold = s && s.gold.filter((v) => v !== null);
    const tag = headLabel(kind, t.layer, t.head);
    if (tag) {
      const help = LABEL_HELP[this.kind === "cross" && tag[0].includes(", ") ? "align" : tag[2] ? "relation" : "position"];
      this.ui.info.prepend(el("div", { class: "info-label" }, el("b", {}, tag[0]),
        ...tag[1].map((d) => el("div", {}, d)), el("div", { class: "muted" }, help)));
    }
    this.ui.info.prepend(el("div", { class: "info-title" }, `layer ${t.layer}, ${headName(t.head)}: `,
      el("span", { class: "muted" }, entropyText(kind, t.layer, t.head) +
        (gold && gold.length ? ` · gold share ${gold[gold.length - 1].toFixed(2)}` : "") + " · click to open")));
    this.ui.info.dataset.thumb = `${t.layer},${t.head}`;
  }

  // The hovered step of a trend: its values then, and the strips' scale.
  showTrendPoint(t) {
    const step = this.trend.steps[t.k];
    const s = trendSeries(this.trend, this.kind, t.layer, t.head) || { entropy: [], gold: [] };
    const num = (v) => (typeof v === "number" ? v.toFixed(2) : "–");
    this.ui.info.replaceChildren(el("div", { class: "info-title" },
      `layer ${t.layer}, ${headName(t.head)} at step ${step}: `,
      el("span", { class: "muted" }, `entropy ${num(s.entropy[t.k])} nats · gold share ` +
        `${num(s.gold[t.k])} · click: go to step ${step}`)),
    el("div", { class: "muted" }, `The strips' scale: entropy (solid) 0 to ` +
      `${num(this.trendMax)} nats, the largest of this kind; gold share (dashed) 0 to 1.`));
    this.ui.info.dataset.trend = `${t.layer},${t.head},${step}`;
  }

  destroy() {
    this.pause();
    this.req++;
  }
}

/* ---------- entry point ---------- */

// Draw the viewer into `root`, reading from `source` (see the top of this file).
// Returns the view; `view.started` resolves once the first step is drawn (or failed).
// `view.refresh()` picks up new runs and steps; `view.setDark(bool)` follows a host's theme.
export function mountView(root, source) {
  const view = new AttentionView(root, source);
  view.started = view.start().catch((err) => view.fail(err));
  return view;
}
