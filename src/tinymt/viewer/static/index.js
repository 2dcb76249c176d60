// tinymt attention viewer: the TensorBoard entry.
//
// TensorBoard's plugin iframe imports this module and calls `render()`. The iframe
// document has <base href="plugin/tinymt_attention/">, so the relative URLs below reach
// the plugin's routes:
//   runs                       -> {"runs": [{run, probes: [{tag, sentence, reference}]}]}
//   steps?run=R&tag=T          -> {"steps": [400, 800, ...]}
//   step?run=R&tag=T&step=S    -> the view document
//   trend?run=R&tag=T          -> each head's entropy and gold share across the steps (at most 512)
//   font.otf?text=C            -> Noto Sans CJK SC cut to the characters C
//
// With TensorBoard's page (the iframe's parent) it speaks TensorBoard's plugin protocol
// (a MessagePort, "experimental.*" messages): DataReloaded (the reload button, auto-reload)
// refreshes runs, probes and steps, as the tab's own look every 5-10 s does (keepLive); GetURLPluginData reads the view's state from the
// page's URL (#...&p.tinymt_attention.run=...), which the view writes back there, so a
// link or a reload restores what was shown. Dark mode follows TensorBoard's.

import { mountView } from "./view.js";

const PLUGIN = "tinymt_attention";
const FAMILY = "Noto Sans CJK SC";
const MAX_FONT_CHARS = 4096; // the font route's limit, per request

/* ---------- fetching ---------- */

function oneLine(text) {
  const s = String(text).replace(/<[^>]*>/g, " ").replace(/\s+/g, " ").trim();
  return s.length > 300 ? s.slice(0, 299) + "…" : s;
}

// GET a route and parse its JSON; a non-200 answer becomes an Error carrying its text,
// which the view shows in its status line.
async function getJSON(url) {
  const resp = await fetch(url, { credentials: "same-origin", cache: "no-store" });
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

/* ---------- TensorBoard's page ---------- */

// The plugin side of TensorBoard's iframe protocol: JSON messages {type, id, payload,
// error, isReply} over a MessagePort handed to the parent with "experimental.bootstrap".
function connectHost(listeners) {
  if (window.parent === window) return null;
  const channel = new MessageChannel(), waits = new Map();
  let next = 0;
  const port = channel.port1;
  port.onmessage = async (event) => {
    let msg;
    try { msg = JSON.parse(event.data); } catch (e) { return; }
    if (msg.isReply) {
      const wait = waits.get(msg.id);
      waits.delete(msg.id);
      if (wait) (msg.error ? wait.reject(new Error(String(msg.error))) : wait.resolve(msg.payload));
      return;
    }
    let error = null;
    try { if (listeners[msg.type]) await listeners[msg.type](msg.payload); } catch (e) { error = String(e); }
    port.postMessage(JSON.stringify({ type: msg.type, id: msg.id, payload: null, error, isReply: true }));
  };
  window.parent.postMessage("experimental.bootstrap", window.location.origin, [channel.port2]);
  return {
    send(type, payload, timeoutMs = 2000) {
      const id = next++;
      port.postMessage(JSON.stringify({ type, id, payload, error: null, isReply: false }));
      return new Promise((resolve, reject) => {
        waits.set(id, { resolve, reject });
        setTimeout(() => { if (waits.delete(id)) reject(new Error(`${type}: no answer`)); }, timeoutMs);
      });
    },
  };
}

// TensorBoard's URL storage on the parent page (same origin), or null.
function hostStorage() {
  try {
    const storage = window.parent !== window && window.parent.tensorboard && window.parent.tensorboard.tf_storage;
    return storage && typeof storage.setString === "function" ? storage : null;
  } catch (e) {
    return null;
  }
}

// The view's state in TensorBoard's URL (#...&p.tinymt_attention.<key>=<value>), read
// from the parent page (same origin); null where it cannot be read. (TensorBoard 2.21's
// GetURLPluginData answers from a copy of the hash taken at start-up, which misses them.)
function stateInHostUrl() {
  let hash;
  try { hash = window.parent !== window ? window.parent.location.hash : null; } catch (e) { return null; }
  if (typeof hash !== "string") return null;
  const prefix = `p.${PLUGIN}.`, state = {};
  for (const part of hash.replace(/^#/, "").split("&")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    try {
      const key = decodeURIComponent(part.slice(0, eq)), value = decodeURIComponent(part.slice(eq + 1));
      if (key.startsWith(prefix)) state[key.slice(prefix.length)] = value;
    } catch (e) { /* a malformed part: skipped */ }
  }
  return state;
}

// Follow TensorBoard's dark mode (a class on its <body>), as it changes.
function followTheme(view) {
  let body = null;
  try { body = window.parent !== window ? window.parent.document.body : null; } catch (e) { body = null; }
  const media = matchMedia("(prefers-color-scheme: dark)");
  if (!body) {
    view.setDark(media.matches);
    return;
  }
  const apply = () => view.setDark(body.classList.contains("dark-mode"));
  apply();
  new MutationObserver(apply).observe(body, { attributes: true, attributeFilter: ["class"] });
}

/* ---------- the font: cut to what is shown, never an empty box meanwhile ---------- */

const covered = new Set();

// Load the SC face for the characters of `text` not loaded yet (one small request each
// time new ones appear). Until it arrives those characters are blank, not the empty boxes
// of a fallback font without them (display: block, for their unicode range only: the rest
// of the text shows at once in a fallback font); the first face, with no such characters
// yet, swaps.
function needGlyphs(text) {
  const fresh = [];
  for (const ch of String(text)) {
    if (ch.codePointAt(0) > 0x7e && !covered.has(ch) && fresh.length < MAX_FONT_CHARS) fresh.push(ch);
  }
  const first = !covered.size;
  if (!fresh.length && !first) return;
  for (const ch of fresh) covered.add(ch);
  const chars = fresh.join("");
  const ranges = fresh.map((ch) => `U+${ch.codePointAt(0).toString(16)}`).join(",");
  const face = new FontFace(FAMILY, `url("font.otf?${query({ text: chars })}") format("opentype")`,
    fresh.length ? { display: "block", unicodeRange: ranges } : { display: "swap" });
  document.fonts.add(face);
  face.load().catch(() => { for (const ch of fresh) covered.delete(ch); });
}

/* ---------- live without a click ---------- */

// TensorBoard 2.21 starts with its auto-reload off: a run written while the tab is open
// would wait for a click on its reload button. So while the page is visible the tab asks
// its own routes itself (what the reload button makes it do): every 5 s, every 10 s once
// a look found nothing new; hidden, not at all. TensorBoard reads new event files from
// disk every 5 s (--reload_interval), so a new run or step shows within about 15 s.
function keepLive(view) {
  let seen = "";
  const look = async () => {
    let wait = 5000;
    if (document.visibilityState === "visible") {
      await view.refresh();
      const runs = [...document.querySelectorAll("#run option")].map((o) => o.value);
      const now = `${runs}|${view.steps}`;
      if (now === seen) wait = 10000;
      seen = now;
    }
    setTimeout(look, wait);
  };
  setTimeout(look, 5000);
}

/* ---------- page setup ---------- */

export async function render() {
  document.body.style.margin = "0";
  let root = document.getElementById("tinymt-attention");
  if (!root) {
    root = document.createElement("div");
    root.id = "tinymt-attention";
    document.body.appendChild(root);
  }
  let view = null;
  const host = connectHost({ "experimental.DataReloaded": () => view && view.refresh() });
  const storage = hostStorage();
  const source = {
    followsHostTheme: true,
    async listRuns() {
      return (await getJSON("runs")).runs || [];
    },
    async listSteps(run, tag) {
      return (await getJSON(`steps?${query({ run, tag })}`)).steps || [];
    },
    getStep(run, tag, step) {
      return getJSON(`step?${query({ run, tag, step })}`);
    },
    getTrend(run, tag) {
      return getJSON(`trend?${query({ run, tag })}`);
    },
    async loadState() {
      const own = stateInHostUrl();
      if (own) return own;
      if (!host) return {};
      try {
        return (await host.send("experimental.GetURLPluginData", { pluginName: PLUGIN })) || {};
      } catch (e) {
        return {};
      }
    },
    saveState(state) {
      if (!storage) return;
      for (const [k, v] of Object.entries(state)) {
        // the default "" takes the key out of the URL
        storage.setString(`p.${PLUGIN}.${k}`, String(v), { defaultValue: "", useLocationReplace: true });
      }
    },
    needGlyphs,
  };
  view = mountView(root, source);
  followTheme(view);
  keepLive(view);
  await view.started;
}
