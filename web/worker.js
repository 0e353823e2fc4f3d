// webdrift's Web Worker: Pyodide + the webdrift wheel + one engine, so the page never freezes.
//
// Started by webdrift.js (`new Worker(url, {type: "module"})`); one worker holds one engine and
// one WebGPU device, so two engines (or two pages) never share state. Messages in:
//   {type: "init", id, opts}            boot Python; with opts.model also fetch + load the model
//   {type: "generate"|"chat", id, prompt|messages, opts}
//   {type: "stop"}                      stop the running generation after the current token
//   {type: "tokenize", id, text} | {type: "python", id, code} | {type: "dispose", id}
//   {type: "bench", id, opts}           run the benchmark protocol (browser_api.api_bench), resolve to its report
//   {type: "tuned", id}                 wait for the background kernel tuning of the load (progress id "tune")
// Messages out: {type: "progress", id, progress}, {type: "token", id, piece},
//   {type: "result", id, value} or {type: "error", id, error: {name, message}}.
// Model delivery: streamed download with progress, sha256 checked (crypto.subtle), then parsed by
// Python, and only then stored in the Cache API; a cached copy is re-hashed before use and dropped
// if it does not match, so the cache never serves a broken file.
// Must not: touch the DOM (there is none here) or keep Python objects across messages.

import { loadPyodide } from "./pyodide/pyodide.mjs";

const BASE = new URL("./", import.meta.url);
const CACHE_NAME = "webdrift-models-v1";
const SHA_HEADER = "x-webdrift-sha256";

let py = null;        // the Pyodide instance
let api = null;       // the webdrift.browser_api module (PyProxy)

class WorkerError extends Error {
  constructor(name, message) { super(message); this.name = name; }
}

const post = (msg) => self.postMessage(msg);

function progress(id, phase, fields = {}) {
  const p = { phase, ...fields };
  if (p.total > 0 && p.loaded !== undefined) p.percent = Math.min(100, (100 * p.loaded) / p.total);
  post({ type: "progress", id, progress: p });
}

function fmtMB(n) { return (n / 1048576).toFixed(1) + " MB"; }

async function fetchBytes(url, what) {
  let r;
  try { r = await fetch(url); } catch (e) { throw new WorkerError("DownloadError", `${what}: cannot fetch ${url} (${e.message})`); }
  if (!r.ok) throw new WorkerError("DownloadError", `${what}: ${url} answered HTTP ${r.status} ${r.statusText}`);
  return new Uint8Array(await r.arrayBuffer());
}

// {speculative: "forecast:URL"}: the forecast file (docs/FORECAST.md) is fetched once per URL into
// Pyodide's file system, and Python is given "forecast:PATH" (runtime/speculative.py reads it)
const forecastFiles = new Map();   // URL -> path in Pyodide's file system
async function withForecastFile(opts) {
  const s = opts.speculative;
  if (typeof s !== "string" || !s.startsWith("forecast:") || s.length === "forecast:".length) return opts;
  const url = s.slice("forecast:".length);
  let path = forecastFiles.get(url);
  if (!path) {
    const bytes = await fetchBytes(url, "loading the forecast file");
    path = `/tmp/webdrift_forecast_${forecastFiles.size}.safetensors`;
    py.FS.writeFile(path, bytes);
    forecastFiles.set(url, path);
  }
  return { ...opts, speculative: "forecast:" + path };
}

// -- Python ---------------------------------------------------------------------------------------

const NO_WEBGPU = "Use Chrome or Edge 113+ (on Linux start it with --enable-unsafe-webgpu), Safari 26+ or " +
  "Firefox 141+ with WebGPU enabled, and serve the page over https or from localhost.";

// Fail fast (before any download) when this browser cannot give us a GPU adapter.
async function checkAdapter() {
  if (!self.navigator.gpu) {
    throw new WorkerError("GPUError", "WebGPU is not available in this browser's workers (navigator.gpu is missing). " + NO_WEBGPU);
  }
  let adapter = null;
  try { adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" }); } catch (e) { adapter = null; }
  if (!adapter) {
    throw new WorkerError("GPUError", "WebGPU is enabled but no GPU adapter is available (navigator.gpu.requestAdapter() " +
      "returned nothing: the GPU may be blocklisted or WebGPU disabled for it). " + NO_WEBGPU);
  }
}

let booting = null;
function boot(id) {
  if (!booting) booting = bootPython(id);
  return booting;
}

// -- the Python runtime's snapshot: a returning visitor's Python starts from memory ------------------
// The first start of a bundle in this browser boots Pyodide, imports webdrift.browser_api and keeps
// a copy of the interpreter's memory (Pyodide's makeMemorySnapshot, about 30 MB) in the Cache API
// (RUNTIME_CACHE, keyed by the bundle's fingerprint); later starts restore it instead of booting
// and importing again. The files (stdlib zip, wheels) are not in it: they are installed as always.
// Python's random module is reseeded after a restore (the snapshot froze its state; unseeded
// sampling must differ between page loads); str hashing keeps the first start's seed.
// Another host (node_bench.mjs) may provide its own store: self.webdriftSnapshotStore {load(key), store(key, bytes)}.
const RUNTIME_CACHE = "webdrift-runtime-v1";

function snapshotUrl(key) { return new URL(`webdrift-python-snapshot/${key}`, BASE).href; }

async function loadSnapshot(key) {
  try {
    if (self.webdriftSnapshotStore) return await self.webdriftSnapshotStore.load(key);
    if (!self.caches) return null;
    const hit = await (await caches.open(RUNTIME_CACHE)).match(snapshotUrl(key));
    return hit ? new Uint8Array(await hit.arrayBuffer()) : null;
  } catch (e) { console.warn("[webdrift] could not read the Python snapshot:", e); return null; }
}

async function storeSnapshot(key, bytes) {
  try {
    if (self.webdriftSnapshotStore) return await self.webdriftSnapshotStore.store(key, bytes);
    if (!self.caches) return false;
    const c = await caches.open(RUNTIME_CACHE);
    for (const old of await c.keys()) await c.delete(old);          // one bundle's snapshot at a time
    await c.put(snapshotUrl(key), new Response(bytes, { headers: { "content-type": "application/octet-stream" } }));
    return true;
  } catch (e) { console.warn("[webdrift] could not store the Python snapshot:", e); return false; }
}

async function dropSnapshot(key) {
  try {
    if (self.webdriftSnapshotStore) { await self.webdriftSnapshotStore.store(key, null); return; }
    if (self.caches) await (await caches.open(RUNTIME_CACHE)).delete(snapshotUrl(key));
  } catch { /* nothing to drop */ }
}

async function bootPython(id) {
  progress(id, "runtime", { message: "starting Python (Pyodide)" });
  const manifest = JSON.parse(new TextDecoder().decode(await fetchBytes(new URL("manifest.json", BASE), "the bundle's manifest")));
  const index = new URL("pyodide/", BASE);
  const base = {
    indexURL: index.protocol === "file:" ? decodeURIComponent(index.pathname) : index.href,   // Node: a path
    stdout: (s) => console.log("[webdrift py]", s),
    stderr: (s) => console.warn("[webdrift py]", s),
  };
  const key = manifest.fingerprint ? `${manifest.pyodide}-${manifest.fingerprint}` : null;
  let pyodide = null, restored = false;
  const snap = key ? await loadSnapshot(key) : null;
  if (snap) {
    progress(id, "runtime", { message: "restoring Python from its snapshot" });
    try {
      pyodide = await loadPyodide({ ...base, _loadSnapshot: snap });
      restored = true;
    } catch (e) {
      console.warn("[webdrift] the Python snapshot did not restore, starting afresh:", e);
      await dropSnapshot(key);
      pyodide = null;
    }
  }
  if (!pyodide) pyodide = await loadPyodide({ ...base, _makeSnapshot: !!key });
  const site = pyodide.runPython("import site; site.getsitepackages()[0]");
  let n = 0;
  for (const w of manifest.wheels) {
    progress(id, "runtime", { message: `installing ${w.split("/").pop()}`, loaded: n++, total: manifest.wheels.length });
    pyodide.unpackArchive(await fetchBytes(new URL(w, BASE), "installing webdrift"), "wheel", { extractDir: site });
  }
  if (restored) {
    pyodide.runPython("import importlib, random; importlib.invalidate_caches(); random.seed()");
  } else {
    pyodide.runPython("import importlib; importlib.invalidate_caches(); import webdrift.browser_api");
    if (key) {
      let bytes = null;
      try { bytes = pyodide.makeMemorySnapshot(); } catch (e) { console.warn("[webdrift] no Python snapshot:", e); }
      if (bytes) storeSnapshot(key, bytes);         // in the background
      // _makeSnapshot gave Python's `js` module a recording proxy of globalThis, whose getters run
      // with the proxy as `this` (a browser's navigator getter refuses that: "Illegal invocation");
      // from here on `js` is globalThis itself (the restored runtimes get it so too)
      pyodide.registerJsModule("js", globalThis);
      pyodide.runPython("import sys; sys.modules.pop('js', None)");
    }
  }
  api = pyodide.pyimport("webdrift.browser_api");
  py = pyodide;
  progress(id, "runtime", { message: restored ? "Python is ready (restored)" : "Python is ready", done: true });
}

// Call an api_* function of webdrift.browser_api; it answers JSON ({ok, ...} or {error}).
async function callApi(name, ...args) {
  const fn = api[name];
  let out;
  try { out = await fn(...args); } finally { fn.destroy(); }
  const r = JSON.parse(out);
  if (r.error) {
    if (r.error.detail) console.error("[webdrift]", r.error.detail);
    throw new WorkerError(r.error.name, r.error.message);
  }
  return r;
}

// -- model delivery ---------------------------------------------------------------------------------

async function sha256Hex(bytes) {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

async function openCache() {
  try { return self.caches ? await caches.open(CACHE_NAME) : null; } catch { return null; }
}

async function expectedSha(spec) {
  if (spec.sha256) return String(spec.sha256).toLowerCase();
  if (spec.sha256 === null) return null;             // explicitly: no check against a known hash
  try {                                              // a "<url>.sha256" file next to the model, if any
    const r = await fetch(spec.url + ".sha256", { cache: "no-store" });
    if (!r.ok) return null;
    const m = (await r.text()).match(/\b[0-9a-fA-F]{64}\b/);
    return m ? m[0].toLowerCase() : null;
  } catch { return null; }
}

async function download(id, spec) {
  const url = spec.url;
  let r;
  try { r = await fetch(url, { cache: "no-store" }); } catch (e) {
    throw new WorkerError("DownloadError", `downloading the model from ${url} failed: ${e.message}`);
  }
  if (!r.ok) {
    throw new WorkerError("DownloadError", `downloading the model from ${url} failed: HTTP ${r.status} ${r.statusText || ""}`.trim() +
      (r.status === 404 ? " (no such file on the server: check the model URL)" : ""));
  }
  const encoded = r.headers.get("content-encoding");
  const declared = Number(r.headers.get("content-length")) || 0;
  const total = (!encoded || encoded === "identity") ? declared : 0;
  const expect = total || spec.size || 0;
  let buf = new Uint8Array(expect || 16 << 20);
  let loaded = 0, lastPost = 0;
  const reader = r.body.getReader();
  progress(id, "download", { loaded: 0, total: expect, url });
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (loaded + value.length > buf.length) {
        const bigger = new Uint8Array(Math.max(buf.length * 2, loaded + value.length));
        bigger.set(buf.subarray(0, loaded));
        buf = bigger;
      }
      buf.set(value, loaded);
      loaded += value.length;
      const now = performance.now();
      if (now - lastPost > 100) { lastPost = now; progress(id, "download", { loaded, total: expect, url }); }
    }
  } catch (e) {
    throw new WorkerError("DownloadError", `downloading the model from ${url} was interrupted after ${fmtMB(loaded)}: ${e.message}`);
  }
  progress(id, "download", { loaded, total: expect || loaded, url });
  if (total && loaded !== total) {
    throw new WorkerError("DownloadError", `the model download from ${url} is truncated: got ${loaded} of ${total} bytes`);
  }
  return buf.length === loaded ? buf : buf.slice(0, loaded);
}

// -> {bytes, sha256, cached: bool (came from the cache)}
async function fetchModel(id, spec) {
  const want = await expectedSha(spec);
  const cache = spec.cache === false ? null : await openCache();
  if (cache) {
    let hit = null;
    try { hit = await cache.match(spec.url); } catch { hit = null; }
    if (hit) {
      progress(id, "cache", { message: "reading the model from the browser cache" });
      const bytes = new Uint8Array(await hit.arrayBuffer());
      progress(id, "verify", { message: "checking sha256" });
      const got = await sha256Hex(bytes);
      if (got === hit.headers.get(SHA_HEADER) && (!want || got === want)) return { bytes, sha256: got, cached: true };
      await cache.delete(spec.url);     // stale or damaged: drop it and download again
    }
  }
  const bytes = await download(id, spec);
  progress(id, "verify", { message: "checking sha256" });
  const got = await sha256Hex(bytes);
  if (want && got !== want) {
    throw new WorkerError("ModelFileError", `sha256 mismatch for ${spec.url}: expected ${want}, got ${got} ` +
      `(${bytes.length} bytes): the download is corrupted or the file changed; nothing was cached`);
  }
  return { bytes, sha256: got, cached: false, cache };
}

async function storeInCache(cache, url, bytes, sha) {
  if (!cache) return false;
  try {
    await cache.put(url, new Response(bytes, { headers: {
      "content-type": "application/octet-stream", "content-length": String(bytes.length), [SHA_HEADER]: sha } }));
    return true;
  } catch (e) {
    console.warn("[webdrift] could not cache the model:", e);
    try { await cache.delete(url); } catch { /* nothing to drop */ }
    return false;
  }
}

const GGUF_MAGIC = [0x47, 0x47, 0x55, 0x46];    // "GGUF"

function checkMagic(bytes, url) {
  if (bytes.length < 4 || GGUF_MAGIC.some((b, i) => bytes[i] !== b)) {
    const head = new TextDecoder().decode(bytes.subarray(0, 16)).replace(/[^\x20-\x7e]/g, "?");
    throw new WorkerError("ModelFileError", `${url} is not a model file: a GGUF file starts with "GGUF", this one ` +
      (bytes.length ? `starts with "${head}" (${bytes.length} bytes)` : "is empty") + "; nothing was cached");
  }
}

// the file name in a model URL, percent-decoding undone ("my%20model%20%231.gguf" -> "my model #1.gguf")
function fileName(url) {
  const last = url.split("#")[0].split("?")[0].split("/").pop();
  try { return decodeURIComponent(last); } catch { return last; }
}

// -- kernel choices (kernels/autotune.py), kept per browser like the desktop's cache file ----------
// IndexedDB "webdrift-autotune", store "choices": the tuner's key ("adapter|backend|kind|shape...")
// -> its choice, so each adapter finds its own.

const TUNE_DB = "webdrift-autotune";

function openTuneDB() {
  return new Promise((resolve) => {
    if (!self.indexedDB) { resolve(null); return; }
    const r = indexedDB.open(TUNE_DB, 1);
    r.onupgradeneeded = () => r.result.createObjectStore("choices");
    r.onsuccess = () => resolve(r.result);
    r.onerror = r.onblocked = () => resolve(null);
  });
}

// Another host (the Node entry, node_bench.mjs) may provide its own store: {load(), store(choices)}.
async function loadChoices() {
  if (self.webdriftChoiceStore) return await self.webdriftChoiceStore.load();
  const db = await openTuneDB();
  if (!db) return {};
  try {
    return await new Promise((resolve) => {
      const st = db.transaction("choices", "readonly").objectStore("choices");
      const keys = st.getAllKeys(), vals = st.getAll();
      vals.onsuccess = () => {
        const out = {};
        keys.result.forEach((k, i) => { out[k] = vals.result[i]; });
        resolve(out);
      };
      vals.onerror = () => resolve({});
    });
  } finally { db.close(); }
}

async function storeChoices(choices) {
  const entries = Object.entries(choices || {});
  if (!entries.length) return 0;
  if (self.webdriftChoiceStore) return await self.webdriftChoiceStore.store(choices);
  const db = await openTuneDB();
  if (!db) return 0;
  try {
    return await new Promise((resolve) => {
      const tx = db.transaction("choices", "readwrite");
      for (const [k, v] of entries) tx.objectStore("choices").put(v, k);
      tx.oncomplete = () => resolve(entries.length);
      tx.onerror = tx.onabort = () => resolve(0);
    });
  } finally { db.close(); }
}

// The background tuning of a first load (api_tune): one timing per await in Python, paused while
// a generation runs; progress goes to the engine's onProgress; the choices are stored when done.
let tuning = null;
function startTuning() {
  const t0 = performance.now();
  const onStep = (done, total, key) => post({ type: "progress", id: "tune",
    progress: { phase: "tune", loaded: done, total, percent: (100 * done) / total, message: `tuned ${key}` } });
  tuning = callApi("api_tune", onStep).then(async (r) => {
    const stored = await storeChoices(r.choices);
    return { tuned: r.tuned, stored, seconds: (performance.now() - t0) / 1000 };
  });
  tuning.catch((e) => console.warn("[webdrift] kernel tuning failed:", e));
}

// -- the model -------------------------------------------------------------------------------------

// download (or read from the cache), check and parse the model; cache it once Python accepted it
async function fetchAndOpen(id, spec) {
  const python = boot(id);              // start Python while the model downloads
  python.catch(() => {});
  const m = await fetchModel(id, spec);
  const tFetch = performance.now();
  try { checkMagic(m.bytes, spec.url); } catch (e) {
    if (m.cached) { const c = await openCache(); if (c) await c.delete(spec.url); }
    throw e;
  }
  await python;
  progress(id, "parse", { message: "reading the model file" });
  const name = fileName(spec.url);
  let opened;
  try {
    opened = await callApi("api_open", m.bytes, name);
  } catch (e) {
    if (m.cached) { const c = await openCache(); if (c) await c.delete(spec.url); }
    throw e;
  }
  let cachedNow = false;
  if (!m.cached) cachedNow = await storeInCache(m.cache, spec.url, m.bytes, m.sha256);
  m.bytes = null;
  return { m, opened, cachedNow, tFetch };
}

async function loadModel(id, opts) {
  const spec = opts.model;
  const t0 = performance.now();
  await checkAdapter();
  const choices = loadChoices();
  const { m, opened, cachedNow, tFetch } = await fetchAndOpen(id, spec);
  opts = { ...opts, kernelChoices: await choices };
  progress(id, "weights", { loaded: 0, total: opened.tensors, message: "uploading weights to the GPU" });
  let last = 0;
  const onTensor = (done, total) => {
    const now = performance.now();
    if (now - last > 50 || done === total) { last = now; progress(id, "weights", { loaded: done, total }); }
  };
  const loaded = await callApi("api_load", JSON.stringify(opts), onTensor);
  const info = loaded.info;
  info.modelUrl = spec.url;
  info.sha256 = m.sha256;
  info.fromCache = m.cached;
  info.cached = m.cached || cachedNow;
  info.fetchS = (tFetch - t0) / 1000;
  info.totalLoadS = (performance.now() - t0) / 1000;
  if (info.tuning.pending > 0) { info.tuning.background = true; startTuning(); }
  progress(id, "ready", { message: `ready on ${info.adapter}` });
  return info;
}

async function runBench(id, opts) {
  await checkAdapter();
  const choices = loadChoices();
  if (opts.model) await fetchAndOpen(id, opts.model);
  else await boot(id);
  // "partial" (after each model but the last): the choices measured so far are stored, then the
  // report so far goes on to the host (so a "partial" received means both are kept: a run cut
  // short, a closed tab or a time limit, loses only the model it was on)
  let stored = Promise.resolve();
  const onProgress = (text) => {
    const p = JSON.parse(text);
    if (p.phase !== "partial") return post({ type: "progress", id, progress: p });
    const c = p.choices;
    delete p.choices;
    stored = stored.then(() => storeChoices(c)).catch(() => {}).then(() => post({ type: "progress", id, progress: p }));
  };
  const r = await callApi("api_bench", JSON.stringify({ ...opts, model: undefined, kernelChoices: await choices }), onProgress);
  await stored;
  await storeChoices(r.choices);
  return r.report;
}

// -- messages -------------------------------------------------------------------------------------

const handlers = {
  async init(m) {
    if (!m.opts.model) { await checkAdapter(); await boot(m.id); return { runtime: true }; }
    return await loadModel(m.id, m.opts);
  },
  async generate(m) {
    const onToken = (piece, stream) => post({ type: "token", id: m.id, piece, stream });
    const opts = JSON.stringify(await withForecastFile(m.opts || {}));
    return (await callApi("api_generate", JSON.stringify(m.prompt), opts, onToken)).result;
  },
  async chat(m) {
    const onToken = (piece, stream) => post({ type: "token", id: m.id, piece, stream });
    const opts = JSON.stringify(await withForecastFile(m.opts || {}));
    return (await callApi("api_chat", JSON.stringify(m.messages), opts, onToken)).result;
  },
  async bench(m) {
    return await runBench(m.id, m.opts);
  },
  async tuned() {
    return tuning ? await tuning : { tuned: 0, stored: 0, seconds: 0 };
  },
  async loadLora(m) {
    const bytes = await fetchBytes(m.url, `loading LoRA adapter ${m.name}`);
    return (await callApi("api_add_lora", m.name, bytes, fileName(m.url))).loras;
  },
  async removeLora(m) {
    return (await callApi("api_remove_lora", m.name)).loras;
  },
  async tokenize(m) {
    return (await callApi("api_tokenize", JSON.stringify(m.text))).ids;
  },
  async python(m) {
    if (!py) throw new WorkerError("InvalidArgumentError", "Python is not started");
    let r = await py.runPythonAsync(m.code);
    if (r && typeof r.toJs === "function") {
      const v = r.toJs({ dict_converter: Object.fromEntries });
      r.destroy();
      r = v;
    }
    return r === undefined ? null : r;
  },
  async dispose() {
    if (api) { const f = api.api_dispose; try { f(); } finally { f.destroy(); } }
    return true;
  },
};

self.onmessage = async (ev) => {
  const m = ev.data;
  if (m.type === "stop") {
    if (api) { const f = api.api_stop; try { f(); } finally { f.destroy(); } }
    return;
  }
  const h = handlers[m.type];
  if (!h) { post({ type: "error", id: m.id, error: { name: "InvalidArgumentError", message: `unknown request ${m.type}` } }); return; }
  try {
    post({ type: "result", id: m.id, value: await h(m) });
  } catch (e) {
    const name = e && e.name && e.name !== "Error" ? e.name : "WebdriftError";
    let message = (e && e.message) || String(e);
    if (e && e.type && e.constructor && e.constructor.name === "PythonError") message = `${e.type}: ${message.split("\n").slice(-2).join(" ")}`;
    post({ type: "error", id: m.id, error: { name, message } });
  }
};
