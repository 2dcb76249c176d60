// tinymt attention viewer: the whole view, as one plain ES module.
//
// It lives in three homes: the TensorBoard tab (imported by index.js), the
// self-contained HTML file (its source inlined into a <script type="module">, then
// `mountView(root, inlineSource(DATA))`), and Jupyter (that HTML in an iframe). Hence:
// no imports, no reliance on its own URL, everything at top level, and the only
// exports are `mountView` and `inlineSource`.
//
// A data source has three methods, each returning a Promise:
//   listRuns()                -> [{run, probes: [{tag, sentence, reference}]}]
//   listSteps(run, tag)       -> [step, ...] (ascending)
//   getStep(run, tag, step)   -> the view document of one probe sentence at one step

/* ---------- constants ---------- */

// Qualitative head colours: saturated enough that white -> colour reads as intensity.
const PALETTE = [
  "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#17becf",
  "#e377c2", "#8c564b", "#bcbd22", "#393b79", "#7b4173", "#b8860b",
];
// The attention kinds, in display order: label, and the sentence its rows / columns read.
const KINDS = {
  encoder_self: ["encoder self-attention", "source", "source"],
  decoder_self: ["decoder self-attention (masked)", "target", "target"],
  cross: ["cross-attention", "target", "source"],
};
const MAX_TOKENS = 60;     // longer sentences are cut for display (values stay complete)
const LINE_MIN = 0.02;     // lines mode skips weights below this fraction of scale
const PLAY_MS = 800;
const CACHE_SIZE = 64;
const STYLE_ID = "tinymt-view-style";
const FONT_STACK = '"Noto Sans CJK", "Noto Sans CJK SC", "Noto Sans SC", "Noto Sans", ' +
  'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';

const CSS = `
.tmv { font-family: ${FONT_STACK}; font-size: 13px; line-height: 1.45; color: #222; background: #fff;
  padding: 12px 16px 24px; width: 100%; box-sizing: border-box; }
.tmv * { box-sizing: border-box; } .tmv select, .tmv button, .tmv input { font: inherit; color: inherit; }
.tmv .tmv-bar { display: flex; flex-wrap: wrap; align-items: center; gap: 8px 18px; margin-bottom: 8px; }
.tmv .tmv-bar label { display: inline-flex; align-items: center; gap: 6px; color: #666; }
.tmv select { padding: 3px 6px; border: 1px solid #ccc; border-radius: 4px; background: #fff; max-width: 30em; }
.tmv button { padding: 3px 12px; border: 1px solid #bbb; border-radius: 4px; background: #f5f5f5; cursor: pointer; }
.tmv button:hover { background: #ececec; } .tmv #play { min-width: 5.5em; }
.tmv #step { width: min(440px, 50vw); accent-color: #555; }
.tmv #step-label { font-variant-numeric: tabular-nums; min-width: 8em; }
.tmv #status { color: #777; } .tmv #status.error { color: #c62828; }
.tmv .tmv-heads { display: flex; flex-wrap: wrap; align-items: center; gap: 6px; margin: 4px 0 10px; color: #666; }
.tmv .head-toggle { --c: #888; border: 2px solid var(--c); background: var(--c); color: #fff;
  border-radius: 12px; padding: 0 10px; font-size: 12px; }
.tmv .head-toggle:hover { background: var(--c); filter: brightness(1.08); }
.tmv .head-toggle[aria-pressed="false"] { background: #fff; color: var(--c); opacity: .6; }
.tmv .tmv-text { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0 0 12px;
  padding: 8px 12px; background: #fafafa; border-radius: 6px; }
.tmv .tmv-text dt { color: #888; } .tmv .tmv-text dd { margin: 0; } .tmv #sentence { font-size: 16px; }
.tmv .missing { color: #aaa; font-style: italic; } .tmv .tmv-caption { color: #777; margin: 0 0 8px; }
.tmv .tmv-main { display: flex; gap: 18px; align-items: flex-start; }
.tmv .tmv-views { flex: 1 1 auto; min-width: 0; overflow-x: auto; }
.tmv #matrices { display: flex; flex-wrap: wrap; gap: 18px 28px; }
.tmv .tmv-empty { color: #999; padding: 24px 0; }
.tmv #info { position: sticky; top: 8px; flex: 0 0 290px; min-height: 96px; border: 1px solid #e4e4e4;
  border-radius: 6px; padding: 8px 10px; background: #fcfcfc; font-size: 12px; }
.tmv #info .info-title { font-weight: 600; margin-bottom: 4px; }
.tmv #info .info-hint, .tmv #info .muted { color: #999; font-weight: normal; }
.tmv .info-head, .tmv .info-cell { display: flex; gap: 6px; align-items: baseline; padding: 1px 0; }
.tmv .swatch { display: inline-block; width: 9px; height: 9px; border-radius: 2px; flex: none; }
.tmv .info-name { color: #666; flex: none; width: 4.2em; } .tmv .info-gold { color: #555; margin-top: 4px; }
.tmv svg { display: block; overflow: visible; }
.tmv svg text { font-family: ${FONT_STACK}; font-size: 12px; fill: #333; cursor: default; }
.tmv svg .head-title { font-weight: 700; font-size: 13px; } .tmv svg :is(.entropy, .axis-title) { fill: #888; }
.tmv svg text.hl { font-weight: 700; fill: #000; }
.tmv svg text.cjk { writing-mode: vertical-rl; text-orientation: upright; }
.tmv rect.cell { stroke: #efefef; stroke-width: 0.5; } .tmv rect.cell:hover { stroke: #000; stroke-width: 1.5; }
.tmv rect.frame { fill: none; stroke: #d0d0d0; pointer-events: none; }
.tmv rect.gold { fill: transparent; stroke: #111; stroke-width: 1.6; }
.tmv line.attn-line { stroke-linecap: round; }
.tmv line.gold-line { stroke: #9a9a9a; stroke-width: 1.5; stroke-dasharray: 4 3; }
.tmv path.dim { fill: #fff; fill-opacity: .82; fill-rule: evenodd; pointer-events: none; }
.tmv path.dim-edge { fill: none; stroke: #555; stroke-width: 1; pointer-events: none; }
.tmv .hl-active line.attn-line:not(.hl) { opacity: .04; }
.tmv .hl-active line.gold-line { opacity: .3; }
@media (max-width: 800px) {
  .tmv .tmv-main { flex-direction: column; }
  .tmv #info { position: static; width: 100%; flex: none; }
}
`;

const TEMPLATE = `
<div class="tmv-bar">
  <label>run <select id="run"></select></label> <label>probe <select id="probe"></select></label>
  <label>attention <select id="kind"></select></label> <label>layer <select id="layer"></select></label>
  <label>view <select id="mode"><option value="matrix">matrix</option><option value="lines">lines</option>
  </select></label>
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
</dl>
<div class="tmv-caption" id="caption"></div>
<div class="tmv-main">
  <div class="tmv-views"><div id="matrices"></div><svg id="lines" width="0" height="0"></svg></div>
  <aside id="info" aria-live="polite"></aside>
</div>`;

const INFO_HINT = '<div class="info-hint">Hover a query token (left / row label) to see ' +
  "what it attends to, a key token (right / column label) to see what attends to it, " +
  "or a cell for its value.</div>";

/* ---------- small helpers ---------- */

// An HTML element from text: attributes set one by one, children strings become text nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  node.append(...children);
  return node;
}

function swatch(h) {
  const node = el("span", { class: "swatch" });
  node.style.background = headColor(h);
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

const headColor = (h) => PALETTE[h % PALETTE.length];

// White -> colour at intensity t in [0, 1].
function mix(hex, t) {
  const n = parseInt(hex.slice(1), 16);
  const ch = (shift) => Math.round(255 + (((n >> shift) & 255) - 255) * t);
  return `rgb(${ch(16)},${ch(8)},${ch(0)})`;
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

// A token's <text> label: cut when long, the full token its tooltip.
function tokLabel(attrs, tok) {
  const s = shortTok(tok);
  return s === String(tok) ? svgEl("text", attrs, s) : svgEl("text", attrs, s, svgEl("title", {}, String(tok)));
}

function oneLine(msg) {
  const s = String(msg).replace(/\s+/g, " ").trim();
  return s.length > 300 ? s.slice(0, 299) + "…" : s;
}

function entropyText(kind, layer, h) {
  const e = kind.entropy && kind.entropy[layer] && kind.entropy[layer][h];
  return typeof e === "number" ? `H = ${e.toFixed(2)} nats` : "H = –";
}

function addPath(svg, cls, d) {
  const path = svg.ownerDocument.createElementNS("http://www.w3.org/2000/svg", "path");
  path.setAttribute("class", cls);
  path.setAttribute("d", d);
  svg.appendChild(path);
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
  };
}

/* ---------- matrix mode: one SVG per head ---------- */

// Geometry shared by all heads of one kind/layer.
function matrixGeometry(kind) {
  const nq = Math.min(kind.rows.length, MAX_TOKENS), nk = Math.min(kind.cols.length, MAX_TOKENS);
  const cs = Math.max(14, Math.min(22, Math.floor(340 / Math.max(nq, nk, 1))));
  return { nq, nk, cs, lw: labelWidth(kind.rows.slice(0, nq)), lh: labelWidth(kind.cols.slice(0, nk)), top: 26 };
}

function matrixSvg(kind, layer, h, scale, g, showGold) {
  const W = kind.weights[layer][h], color = headColor(h);
  const x0 = g.lw, y0 = g.top + g.lh;
  const width = x0 + g.nk * g.cs + 2, height = y0 + g.nq * g.cs + 2;
  const svg = svgEl("svg", { class: "head-matrix", "data-head": h, "data-geom": [x0, y0, g.cs, g.nq, g.nk],
    width, height, viewBox: `0 0 ${width} ${height}` });
  svg.append(svgEl("text", { class: "head-title", x: 0, y: 14, style: `fill:${color}` }, `head ${h}`),
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
    for (let j = 0; j < g.nk; j++) {
      const v = W[i][j];
      svg.append(svgEl("rect", { class: "cell", "data-row": i, "data-col": j, "data-v": v,
        x: x0 + j * g.cs, y: y0 + i * g.cs, width: g.cs, height: g.cs, fill: mix(color, Math.min(1, v / scale)) }));
    }
  }
  svg.append(svgEl("rect", { class: "frame", x: x0, y: y0, width: g.nk * g.cs, height: g.nq * g.cs }));
  if (showGold) {
    for (const [i, j, label] of kind.gold || []) {
      if (i >= g.nq || j >= g.nk) continue;
      svg.append(svgEl("rect", { class: "gold", "data-row": i, "data-col": j, x: x0 + j * g.cs + 1,
        y: y0 + i * g.cs + 1, width: g.cs - 2, height: g.cs - 2 }, svgEl("title", {}, label || "gold")));
    }
  }
  return svg;
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

/* ---------- the view ---------- */

class AttentionView {
  constructor(root, source) {
    Object.assign(this, {
      root, source, runs: [], steps: [], index: 0, doc: null, kind: null, layer: 0,
      goldWanted: true, hidden: new Set(), cache: new Map(), req: 0, timer: null,
      loading: false, hoverKey: "", marked: [],
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
    this.root.innerHTML = TEMPLATE;
    // this.ui.stepLabel is #step-label, this.ui.translationTitle is #translation-title, ...
    this.ui = { views: this.root.querySelector(".tmv-views") };
    for (const el of this.root.querySelectorAll("[id]")) {
      this.ui[el.id.replace(/-(\w)/g, (_, c) => c.toUpperCase())] = el;
    }
    this.ui.info.innerHTML = INFO_HINT;
  }

  wire() {
    const ui = this.ui;
    const on = (el, type, fn) => el.addEventListener(type, fn);
    on(ui.run, "change", () => { this.fillProbes(); this.loadSteps(); });
    on(ui.probe, "change", () => this.loadSteps());
    on(ui.kind, "change", () => { this.kind = ui.kind.value; this.redraw(); });
    on(ui.layer, "change", () => { this.layer = Number(ui.layer.value); this.redraw(); });
    on(ui.mode, "change", () => this.redraw());
    on(ui.gold, "change", () => { this.goldWanted = ui.gold.checked; this.redraw(); });
    on(ui.step, "input", () => this.seek(Number(ui.step.value)));
    on(ui.play, "click", () => (this.timer ? this.pause() : this.play()));
    on(ui.heads, "click", (e) => this.onHeadClick(e));
    on(ui.views, "mouseover", (e) => this.onHover(e));
    on(ui.views, "mouseleave", () => this.clearHover());
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
  }

  async start() {
    const got = await this.ask(() => this.source.listRuns());
    if (!got) return;
    this.runs = Array.isArray(got.value) ? got.value : [];
    if (!this.runs.length) return this.idle("no runs with attention probes yet");
    setOptions(this.ui.run, this.runs.map((r) => [r.run, r.run]));
    this.fillProbes();
    await this.loadSteps();
  }

  fillProbes() {
    const run = this.runs.find((r) => r.run === this.ui.run.value) || this.runs[0];
    const probes = run.probes || [], previous = this.ui.probe.value;
    setOptions(this.ui.probe, probes.map((p) => [p.tag, p.sentence || p.tag, p.tag]));
    if (probes.some((p) => p.tag === previous)) this.ui.probe.value = previous;
  }

  async loadSteps() {
    this.pause();
    if (!this.ui.probe.value) return this.idle("no probe sentences in this run");
    const got = await this.ask(() => this.source.listSteps(this.ui.run.value, this.ui.probe.value));
    if (!got) return;
    this.steps = Array.isArray(got.value) ? got.value : [];
    this.ui.step.max = String(Math.max(0, this.steps.length - 1));
    if (!this.steps.length) {
      this.ui.stepLabel.textContent = "–";
      return this.idle("no steps recorded for this probe yet");
    }
    await this.seek(this.steps.length - 1);
  }

  // Show step number `index` of the slider (fetching its document unless cached).
  async seek(index) {
    const t0 = performance.now();
    const step = this.steps[index];
    this.index = index;
    this.ui.step.value = String(index);
    this.ui.stepLabel.textContent = `step ${step} (${index + 1}/${this.steps.length})`;
    const got = await this.ask(() => this.fetchDoc(this.ui.run.value, this.ui.probe.value, step));
    if (!got) return;
    this.doc = got.value;
    this.draw(t0);
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

  /* ----- controls that follow the document ----- */

  syncControls() {
    const kinds = Object.keys(KINDS).filter((k) => this.doc.kinds && this.doc.kinds[k]);
    if (!kinds.includes(this.kind)) this.kind = kinds[0] || null;
    this.fillSelect(this.ui.kind, kinds.map((k) => [k, KINDS[k][0]]), this.kind);
    const kind = this.currentKind();
    const layers = kind ? kind.weights.length : 0;
    if (this.layer >= layers) this.layer = 0;
    this.fillSelect(this.ui.layer, [...Array(layers).keys()].map((l) => [String(l), `layer ${l}`]),
      String(this.layer));
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
      const doc = box.ownerDocument;
      box.replaceChildren();
      if (count) box.append(Object.assign(doc.createElement("span"), { textContent: "heads" }));
      for (let h = 0; h < count; h++) {
        const btn = Object.assign(doc.createElement("button"), { type: "button", textContent: String(h) });
        btn.className = "head-toggle";
        btn.dataset.head = String(h);
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
    this.clearHover();
    this.syncControls();
    this.drawHeader(doc);
    const kind = this.currentKind(), mode = ui.mode.value, gold = ui.gold.checked;
    ui.matrices.replaceChildren();
    ui.lines.replaceChildren();
    ui.caption.textContent = "";
    ui.lines.style.display = mode === "lines" && kind ? "" : "none";
    if (!kind) ui.matrices.append(el("div", { class: "tmv-empty" }, "No attention in this document."));
    else if (mode === "matrix") this.drawMatrices(kind, scale, gold);
    else this.drawLines(kind, scale, gold);
    void this.root.offsetHeight; // lay out before taking the time
    this.loading = false;
    delete this.root.dataset.error;
    this.setStatus(`step ${doc.step}`);
    Object.assign(this.root.dataset, {
      step: String(doc.step), renderMs: String(Math.round(performance.now() - t0)), ready: "true",
    });
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

  drawCaption(kind, heads) {
    const [label, rs, cs] = KINDS[this.kind];
    const cut = kind.rows.length > MAX_TOKENS || kind.cols.length > MAX_TOKENS;
    this.ui.caption.textContent = `${label}, layer ${this.layer}: ` +
      `rows / left = ${rs} queries, columns / right = ${cs} keys` +
      (cut ? ` · showing the first ${MAX_TOKENS} tokens` : "") + (heads.length ? "" : " · all heads hidden");
  }

  drawMatrices(kind, scale, gold) {
    const heads = this.visibleHeads(), g = matrixGeometry(kind);
    this.drawCaption(kind, heads);
    this.ui.matrices.replaceChildren(...heads.map((h) => matrixSvg(kind, this.layer, h, scale, g, gold)));
  }

  drawLines(kind, scale, gold) {
    const heads = this.visibleHeads(), svg = this.ui.lines;
    this.drawCaption(kind, heads);
    const { nodes, width, height } = linesNodes(kind, this.layer, heads, scale, gold);
    for (const [k, v] of Object.entries({ width, height, viewBox: `0 0 ${width} ${height}` })) svg.setAttribute(k, v);
    svg.replaceChildren(...nodes);
  }

  /* ----- hover: highlight and #info ----- */

  // What a hovered element stands for: a row, a column, or one cell (of a head, or all).
  hoverTarget(target) {
    const el = target.closest && target.closest("[data-row],[data-col],[data-i],[data-j]");
    if (!el) return null;
    const c = el.classList, d = el.dataset, svg = el.closest("svg.head-matrix");
    if (c.contains("row-label") || c.contains("tok-left")) return { axis: "row", index: Number(d.row ?? d.i) };
    if (c.contains("col-label") || c.contains("tok-right")) return { axis: "col", index: Number(d.col ?? d.j) };
    const head = svg ? Number(svg.dataset.head) : d.head !== undefined ? Number(d.head) : null;
    if (c.contains("cell") || c.contains("gold") || c.contains("attn-line") || c.contains("gold-line")) {
      return { axis: "cell", i: Number(d.row ?? d.i), j: Number(d.col ?? d.j), head };
    }
    return null;
  }

  onHover(e) {
    const kind = this.currentKind();
    const t = kind ? this.hoverTarget(e.target) : null;
    if (!t) return this.clearHover();
    const key = JSON.stringify(t);
    if (key === this.hoverKey) return;
    this.clearHover();
    this.hoverKey = key;
    if (t.axis === "cell") return this.showCell(kind, t);
    this.highlight(t.axis, t.index);
    this.showAxis(kind, t.axis, t.index);
  }

  clearHover() {
    for (const el of this.marked) el.classList.remove("hl");
    for (const el of this.ui.matrices.querySelectorAll("path.dim, path.dim-edge")) el.remove();
    this.marked = [];
    this.hoverKey = "";
    this.ui.views.classList.remove("hl-active");
    delete this.ui.info.dataset.axis;
    delete this.ui.info.dataset.index;
    this.ui.info.innerHTML = INFO_HINT;
  }

  // Emphasise row / column `idx` in every visible head: matrices get a white veil with a
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
      ? (axis === "row" ? `[data-row="${idx}"]:is(rect.cell, text.row-label)`
        : `[data-col="${idx}"]:is(rect.cell, text.col-label)`)
      : (axis === "row" ? `[data-i="${idx}"]:is(line.attn-line, text.tok-left)`
        : `[data-j="${idx}"]:is(line.attn-line, text.tok-right)`);
    this.marked = [...this.ui.views.querySelectorAll(sel)];
    for (const el of this.marked) el.classList.add("hl");
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
        swatch(h), el("span", { class: "info-name" }, `head ${h}`), el("span", { class: "info-top" }, top)));
    }
    Object.assign(this.ui.info.dataset, { axis, index: String(idx) });
    this.ui.info.replaceChildren(...parts);
  }

  // #info for a hovered cell (or line): its value per head and its gold label.
  showCell(kind, t) {
    const scale = this.doc.scale || 255, W = kind.weights[this.layer];
    const gold = (kind.gold || []).find(([i, j]) => i === t.i && j === t.j);
    const parts = [el("div", { class: "info-title" }, `${kind.rows[t.i]} → ${kind.cols[t.j]} `,
      el("span", { class: "muted" }, `(row ${t.i}, column ${t.j})`))];
    for (const h of t.head === null ? this.visibleHeads() : [t.head]) {
      const v = W[h][t.i][t.j], x = (v / scale).toFixed(3);
      parts.push(el("div", { class: "info-cell", "data-head": h, "data-row": t.i, "data-col": t.j, "data-value": x },
        swatch(h), el("span", { class: "info-name" }, `head ${h}`),
        el("span", {}, `${x} `, el("span", { class: "muted" }, `(${v}/${scale})`))));
    }
    if (gold) parts.push(el("div", { class: "info-gold" }, `gold: ${gold[2] || "gold"}`));
    Object.assign(this.ui.info.dataset, { axis: "cell", index: `${t.i},${t.j}` });
    this.ui.info.replaceChildren(...parts);
  }

  destroy() {
    this.pause();
    this.req++;
  }
}

/* ---------- entry point ---------- */

// Draw the viewer into `root`, reading from `source` (see the top of this file).
// Returns the view; `view.started` resolves once the first step is drawn (or failed).
export function mountView(root, source) {
  const view = new AttentionView(root, source);
  view.started = view.start().catch((err) => view.fail(err));
  return view;
}
