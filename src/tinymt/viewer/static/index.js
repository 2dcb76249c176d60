// tinymt attention viewer: the TensorBoard entry.
//
// TensorBoard's plugin iframe imports this module and calls `render()`. The iframe
// document has <base href="plugin/tinymt_attention/">, so the relative URLs below reach
// the plugin's routes:
//   runs                       -> {"runs": [{run, probes: [{tag, sentence, reference}]}]}
//   steps?run=R&tag=T          -> {"steps": [400, 800, ...]}
//   step?run=R&tag=T&step=S    -> the view document
//   font.otf                   -> the CJK font (Chinese must not fall back to system fonts)

import { mountView } from "./view.js";

const FONT_CSS =
  '@font-face { font-family: "Noto Sans CJK"; src: url("font.otf") format("opentype"); }';

/* ---------- fetching ---------- */

function oneLine(text) {
  const s = String(text).replace(/<[^>]*>/g, " ").replace(/\s+/g, " ").trim();
  return s.length > 300 ? s.slice(0, 299) + "…" : s;
}

// GET a route and parse its JSON; a non-200 answer becomes an Error carrying its text,
// which the view shows in its status line.
async function getJSON(url) {
  const resp = await fetch(url, { credentials: "same-origin" });
  const text = await resp.text();
  if (!resp.ok) {
    throw new Error(`${resp.status} ${resp.statusText}: ${oneLine(text) || url}`.trim());
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Error(`bad JSON from ${url}: ${oneLine(text).slice(0, 120)}`);
  }
}

function query(params) {
  return Object.entries(params)
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`)
    .join("&");
}

// The data source the view reads, backed by the plugin's routes.
const fetchSource = {
  async listRuns() {
    return (await getJSON("runs")).runs || [];
  },
  async listSteps(run, tag) {
    return (await getJSON(`steps?${query({ run, tag })}`)).steps || [];
  },
  getStep(run, tag, step) {
    return getJSON(`step?${query({ run, tag, step })}`);
  },
};

/* ---------- page setup ---------- */

function injectFont() {
  if (document.getElementById("tinymt-font")) return;
  const style = document.createElement("style");
  style.id = "tinymt-font";
  style.textContent = FONT_CSS;
  document.head.appendChild(style);
}

export async function render() {
  injectFont();
  document.body.style.margin = "0";
  let root = document.getElementById("tinymt-attention");
  if (!root) {
    root = document.createElement("div");
    root.id = "tinymt-attention";
    document.body.appendChild(root);
  }
  const view = mountView(root, fetchSource);
  await view.started;
}
