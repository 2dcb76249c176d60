// tinymt server page: type sentences, read their translations, see every head.
//
// It asks this server only (relative URLs, so it also works behind a reverse proxy under a
// path): health (the model, its limits), attention (translations + the view data of every
// sentence) or, where attention maps are off, translate. The view is the same view.js as
// TensorBoard's Attention tab and translate.py's HTML file. Text from the server goes into
// the page as text nodes only.

import { inlineSource, mountView } from "./view.js";

const DEBOUNCE_MS = 400;
const $ = (id) => document.getElementById(id);
let info = null;  // /health
let view = null;  // the mounted view
let asked = 0;    // requests sent; only the newest one's answer is drawn
let timer = null;

function setStatus(text, error = false) {
  $("page-status").textContent = text;
  $("page-status").classList.toggle("error", error);
}

async function post(route, body) {
  const resp = await fetch(route, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  let data = null;
  try { data = await resp.json(); } catch (err) { data = null; }
  if (!resp.ok) throw new Error((data && typeof data.error === "string") ? data.error : `HTTP ${resp.status}`);
  return data;
}

function showTranslations(texts) {
  const items = texts.map((t) => {
    const li = document.createElement("li");
    li.textContent = String(t);
    return li;
  });
  $("out").replaceChildren(...items);
}

// The view's choices that outlive a new translation (typing more keeps what you picked).
const KEPT = ["probe", "kind", "layer", "mode"];

function showView(data) {
  const root = $("tinymt-attention");
  const kept = KEPT.map((id) => [id, root.querySelector(`#${id}`)?.value]);
  if (view) view.destroy();
  view = null;
  root.replaceChildren();
  if (!data) return;
  const mine = view = mountView(root, inlineSource(data));
  mine.started.then(() => {
    if (mine !== view) return;
    for (const [id, value] of kept) {
      const select = root.querySelector(`#${id}`);
      if (value === undefined || select.value === value) continue;
      if (![...select.options].some((o) => o.value === value)) continue;
      select.value = value;
      select.dispatchEvent(new Event("change"));
    }
  });
}

async function translateNow() {
  clearTimeout(timer);
  const limit = info ? (info.attention ? info.attention_items : info.max_items) : 1;
  const lines = $("q").value.split("\n").map((s) => s.trim()).filter((s) => s);
  const mine = ++asked;
  if (!lines.length) {
    showTranslations([]); showView(null); setStatus("");
    return;
  }
  const shown = lines.slice(0, limit);
  setStatus(lines.length > limit ? `translating the first ${limit} lines…` : "translating…");
  const body = { q: shown };
  if (info && info.api_keys) body.api_key = $("key").value;
  try {
    let texts, data = null;
    if (info && info.attention) {
      ({ translatedText: texts, view: data } = await post("attention", body));
    } else {
      Object.assign(body, { source: info.source, target: info.target, format: "text" });
      texts = (await post("translate", body)).translatedText;
    }
    if (mine !== asked) return;  // a newer request is on its way
    showTranslations(texts);
    showView(data);
    setStatus(lines.length > limit ? `the first ${limit} lines (the server's limit)` : "");
  } catch (err) {
    if (mine === asked) setStatus(String(err.message || err), true);
  }
}

async function start() {
  try {
    const resp = await fetch("health");
    info = await resp.json();
  } catch (err) {
    setStatus(`the server does not answer: ${err.message || err}`, true);
    return;
  }
  $("model").textContent = `${info.model}: ${info.source} → ${info.target}, ` +
    `${info.beam === 1 ? "greedy search" : `beam ${info.beam}`} (${info.engine})`;
  $("key-label").hidden = !info.api_keys;
  $("hint").textContent = info.attention
    ? "Below: every head of every layer, for each sentence (pick it as the probe)."
    : "Attention maps are off on this server: translations only.";
  $("q").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(translateNow, DEBOUNCE_MS);
  });
  $("q").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translateNow();
  });
  $("go").addEventListener("click", translateNow);
  document.body.dataset.ready = "true";
}

start();
