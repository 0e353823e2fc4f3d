// webdrift.js: run an LLM on this machine's GPU from a web page (WebGPU; nothing leaves the machine).
//
//   import { createEngine } from "./webdrift.js";
//   const engine = await createEngine({ model: "models/smollm2-135m.gguf", onProgress: (p) => ... });
//   const out = await engine.generate("prompt", { maxNewTokens: 64, temperature: 0, onToken: (piece) => ... });
//   // out.text, out.tokenIds (new tokens only), out.stats {prefillTokensPerS, decodeTokensPerS, finishReason, ...}
//   const reply = await engine.chat([{ role: "user", content: "Hi" }], { maxNewTokens: 64 });
//   await engine.dispose();
//
// Each engine runs in its own Web Worker (worker.js: Pyodide + the webdrift Python core + its own
// GPUDevice), so the page never freezes and two engines or two pages never interfere. Requests to
// one engine run one after another. Every failure rejects with a WebdriftError whose `name` says
// what failed (GPUError, DownloadError, ModelFileError, ContextLengthError, InvalidArgumentError, ...).

const MODULE_URL = import.meta.url;

export class WebdriftError extends Error {
  constructor(message, name = "WebdriftError") {
    super(message);
    this.name = name;
  }
}

/** Whether this browser can run webdrift, and if not, why and what to do. */
export function checkWebGPU() {
  if (typeof globalThis.isSecureContext === "boolean" && !globalThis.isSecureContext) {
    return { ok: false, reason: "this page is not a secure context, and WebGPU needs one: open it over https or from http://localhost / 127.0.0.1" };
  }
  if (typeof navigator === "undefined" || !navigator.gpu) {
    return { ok: false, reason: "WebGPU is not available in this browser (navigator.gpu is missing). Use Chrome or Edge 113+ " +
      "(on Linux start Chrome with --enable-unsafe-webgpu, or enable chrome://flags/#enable-unsafe-webgpu), " +
      "Safari 26+ or Firefox 141+ with WebGPU enabled." };
  }
  if (typeof Worker === "undefined") return { ok: false, reason: "this browser has no Web Workers" };
  return { ok: true, reason: "" };
}

function pageBase() {
  if (typeof document !== "undefined" && document.baseURI) return document.baseURI;
  if (typeof location !== "undefined") return location.href;
  return MODULE_URL;
}

// {speculative: "forecast:URL"} with the URL made absolute (relative to the page), as loadLora's
function withForecastUrl(options) {
  const s = options.speculative;
  if (typeof s !== "string" || !s.startsWith("forecast:") || s.length === "forecast:".length) return options;
  return { ...options, speculative: "forecast:" + new URL(s.slice("forecast:".length), pageBase()).href };
}

// {url (absolute), sha256?, size?, name, cache} for createEngine's `model` option
async function resolveModel(options) {
  const cache = options.cache !== false;
  if (options.model) {
    const url = new URL(String(options.model), pageBase()).href;
    return { url, sha256: options.sha256, size: options.size, name: url.split("/").pop(), cache };
  }
  const listUrl = new URL("models/default.json", MODULE_URL);
  let r;
  try { r = await fetch(listUrl, { cache: "no-store" }); } catch (e) { r = null; }
  if (!r || !r.ok) {
    throw new WebdriftError(`createEngine(): no model given, and ${listUrl.href} (the default model that \`webdrift serve\` ` +
      "provides) is not available: pass createEngine({ model: URL })", "InvalidArgumentError");
  }
  const d = await r.json();
  return { url: new URL(d.url, listUrl).href, sha256: d.sha256 ?? undefined, size: d.size, name: d.name, cache };
}

let nextId = 1;

class WorkerClient {
  constructor(onCrash) {
    this.worker = new Worker(new URL("./worker.js", MODULE_URL), { type: "module", name: "webdrift" });
    this.pending = new Map();     // id -> {resolve, reject, onToken, onProgress}
    this.dead = null;
    this.worker.onmessage = (ev) => this._onMessage(ev.data);
    const crash = (what) => {
      this.dead = new WebdriftError(`the webdrift worker stopped: ${what}`, "WebdriftError");
      for (const p of this.pending.values()) p.reject(this.dead);
      this.pending.clear();
      if (onCrash) onCrash(this.dead);
    };
    this.worker.onerror = (ev) => { ev.preventDefault?.(); crash(ev.message || "error while loading worker.js (is the bundle complete?)"); };
    this.worker.onmessageerror = () => crash("a message could not be read");
  }

  request(msg, handlers = {}) {
    if (this.dead) return Promise.reject(this.dead);
    const id = nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, ...handlers });
      this.worker.postMessage({ ...msg, id });
    });
  }

  send(msg) { if (!this.dead) this.worker.postMessage(msg); }

  _onMessage(m) {
    if (m.id === "tune" && m.type === "progress") {   // the engine's background tuning (after createEngine resolved)
      if (this.onTuneProgress) try { this.onTuneProgress(m.progress); } catch (e) { console.error(e); }
      return;
    }
    const p = this.pending.get(m.id);
    if (!p) return;
    if (m.type === "progress") { if (p.onProgress) try { p.onProgress(m.progress); } catch (e) { console.error(e); } return; }
    if (m.type === "token") { if (p.onToken) try { p.onToken(m.piece, m.stream); } catch (e) { console.error(e); } return; }
    this.pending.delete(m.id);
    if (m.type === "result") p.resolve(m.value);
    else p.reject(new WebdriftError(m.error.message, m.error.name));
  }

  terminate(reason) {
    this.worker.terminate();
    this.dead = this.dead || new WebdriftError(reason, "WebdriftError");
    for (const p of this.pending.values()) p.reject(this.dead);
    this.pending.clear();
  }
}

function abortError(signal) {
  const reason = signal && signal.reason;
  if (reason instanceof Error) return reason;
  const e = new WebdriftError("the generation was aborted", "AbortError");
  return e;
}

/** A webdrift engine: one model in one worker. Create with `await createEngine(...)`. */
export class Engine {
  constructor(client, info) {
    this._client = client;
    this._queue = Promise.resolve();
    this._disposed = false;
    /** adapter, model, maxContext, sha256, fromCache, load timings, ... */
    this.info = info;
  }

  _check() {
    if (this._disposed) throw new WebdriftError("this engine was disposed", "InvalidArgumentError");
  }

  // Run requests one after another. A request aborted while it waits rejects at once and never
  // starts; one aborted while it runs stops the worker's generation and rejects with AbortError.
  _enqueue(msg, opts) {
    this._check();
    const signal = opts && opts.signal;
    if (signal && signal.aborted) return Promise.reject(abortError(signal));
    let started = false, rejectEarly = null;
    const early = new Promise((_, reject) => { rejectEarly = reject; });
    const onAbort = () => {
      if (started) this._client.send({ type: "stop" });
      else rejectEarly(abortError(signal));
    };
    if (signal) signal.addEventListener("abort", onAbort, { once: true });
    const run = async () => {
      if (signal && signal.aborted) throw abortError(signal);
      this._check();
      started = true;
      try {
        const out = await this._client.request(msg, { onToken: opts && opts.onToken });
        if (signal && signal.aborted) {
          const e = abortError(signal);
          e.partial = out;
          throw e;
        }
        return out;
      } finally {
        if (signal) signal.removeEventListener("abort", onAbort);
      }
    };
    const p = this._queue.then(run, run);
    this._queue = p.catch(() => {});
    if (!signal) return p;
    early.catch(() => {});
    return Promise.race([p, early]);
  }

  /**
   * Generate a continuation of `prompt` (a string, or an array of token ids).
   * options: maxNewTokens (64), temperature (0 = greedy), topK, topP, seed, stopAtEos (true),
   * speculative ("lookup": prompt-lookup drafts verified as a tree; the same tokens, fewer passes;
   * "forecast:URL": DS2D drafts from a forecast file, docs/FORECAST.md),
   * lora (a name given to loadLora; with numResponses K, an array of K names or nulls gives each
   * response its own adapter), loraScale (1),
   * onToken(piece), signal (AbortSignal: rejects with an AbortError carrying `.partial`),
   * numResponses (1; K > 1: K responses decoded together from one prompt, onToken(piece, stream)),
   * firstTokens ("distinct": the K most likely first tokens, or "sampled").
   * Resolves to {text, tokenIds, stats} (an array of them for numResponses > 1); engine.stop()
   * ends it early with stats.finishReason "stopped".
   */
  generate(prompt, options = {}) {
    const { onToken, signal, ...opts } = withForecastUrl(options || {});
    if (typeof prompt !== "string" && !Array.isArray(prompt)) {
      return Promise.reject(new WebdriftError("generate(prompt): prompt must be a string or an array of token ids", "InvalidArgumentError"));
    }
    return this._enqueue({ type: "generate", prompt, opts }, { onToken, signal });
  }

  /** The assistant's reply to `messages` ([{role, content}]), using the model's chat template. */
  chat(messages, options = {}) {
    const { onToken, signal, ...opts } = withForecastUrl(options || {});
    if (!Array.isArray(messages)) {
      return Promise.reject(new WebdriftError("chat(messages): messages must be an array of {role, content}", "InvalidArgumentError"));
    }
    return this._enqueue({ type: "chat", messages, opts }, { onToken, signal });
  }

  /**
   * Make a LoRA adapter resident under `name`: `url` is a llama.cpp GGUF LoRA file (general.type
   * "adapter"). The engine needs LoRA slots: createEngine({enableLora: true, maxLoraRank}).
   * Then generate(prompt, {lora: name, loraScale}). Resolves to the names of the resident adapters.
   */
  loadLora(name, url) {
    if (typeof name !== "string" || !name) {
      return Promise.reject(new WebdriftError("loadLora(name, url): name must be a non-empty string", "InvalidArgumentError"));
    }
    return this._enqueue({ type: "loadLora", name, url: new URL(String(url), pageBase()).href }, {});
  }

  /** Free a resident LoRA adapter; resolves to the names of those left. */
  removeLora(name) {
    return this._enqueue({ type: "removeLora", name }, {});
  }

  /** Token ids of `text` (as generate() would tokenize it). */
  tokenize(text) {
    return this._enqueue({ type: "tokenize", text }, {});
  }

  /** Stop the running generation after the current token (its promise resolves with the text so far). */
  stop() {
    if (!this._disposed) this._client.send({ type: "stop" });
  }

  /** Run Python in the engine's worker (testing and debugging); resolves to the converted result. */
  runPython(code) {
    return this._enqueue({ type: "python", code }, {});
  }

  /**
   * The background kernel tuning of this engine's first load on this adapter (asynchronous GPU
   * timestamps; progress as onProgress({phase: "tune", loaded, total})): resolves to {tuned,
   * stored, seconds} once the measured choices are stored for the next load (tuned 0: nothing
   * was left to measure). Generation does not wait for it: the tuner pauses while a request runs.
   */
  tuned() {
    this._check();
    return this._client.request({ type: "tuned" });
  }

  /** Free the GPU device and end the worker. */
  async dispose() {
    if (this._disposed) return;
    this.stop();
    this._disposed = true;
    try {
      await Promise.race([this._client.request({ type: "dispose" }), new Promise((r) => setTimeout(r, 2000))]);
    } catch { /* the worker is ended below anyway */ }
    this._client.terminate("this engine was disposed");
  }
}

// The engine options, as webdrift.load takes them on the desktop (webdrift/browser_api.py maps
// these names to Python's in ENGINE_OPTION_NAMES).
const ENGINE_OPTIONS = ["maxContext", "weightFormat", "prefillChunk", "layout", "fuse", "autotune",
                        "prefillKernels", "int8Activations", "maxBindingBytes", "enableLora", "maxLoraRank",
                        "loraPoolRank", "loraFusedShrink", "stepsPerSubmit", "kvCache"];

async function startWorker(options, model) {
  const check = checkWebGPU();
  if (!check.ok) throw new WebdriftError(check.reason, "GPUError");
  let crashed = null;
  const client = new WorkerClient((e) => { crashed = e; });
  const opts = { model };
  for (const k of ENGINE_OPTIONS) opts[k] = options[k];
  client.onTuneProgress = options.onProgress;
  try {
    const info = await client.request({ type: "init", opts }, { onProgress: options.onProgress });
    return { client, info };
  } catch (e) {
    client.terminate(crashed ? crashed.message : e.message);
    throw e;
  }
}

/**
 * Load a model and return an Engine.
 * options: model (URL of a .gguf; default: the model `webdrift serve` provides), sha256 (hex: the
 * download must match; default: from <model>.sha256 or models/default.json when the server has it),
 * maxContext (KV-cache length; default min(model, 2048)), and the desktop's other engine options
 * (webdrift.load's, in camelCase): weightFormat, prefillChunk, layout, fuse, autotune, prefillKernels,
 * int8Activations, maxBindingBytes, enableLora (LoRA slots for loadLora), maxLoraRank, loraPoolRank,
 * loraFusedShrink, stepsPerSubmit (decode steps per GPU submit; default the device's), kvCache ("f16" or
 * "f32"; default f16 where the adapter has shader-f16); cache (false: do not use the browser cache), onProgress({phase, loaded, total, percent, message}).
 */
export async function createEngine(options = {}) {
  const check = checkWebGPU();
  if (!check.ok) throw new WebdriftError(check.reason, "GPUError");
  const model = await resolveModel(options || {});
  const { client, info } = await startWorker(options || {}, model);
  return new Engine(client, info);
}

/** Python + WebGPU in a worker without a model (for tests and custom kernels): {runPython, dispose}. */
export async function createRuntime(options = {}) {
  const { client } = await startWorker(options || {}, null);
  return new Engine(client, { runtime: true });
}

/**
 * Run `webdrift bench`'s protocol in this browser (a worker of its own) and resolve to the same
 * JSON report (webdrift/profile/benchmark.py), machine.route "browser (Pyodide+WebGPU)".
 * options: model (URL of a .gguf: a real model; sha256 as for createEngine), synthetic (shape
 * names, e.g. ["smollm2-135m"] or "tiny,smollm2-135m": random weights made in the page), quant
 * (["f16", "q8", "q4"]; default q4, quick: all), protocol ("1024/256,128/128"; quick: "32/16,16/8"),
 * repeats (1), prefillChunk (the engine's choice), rooflineMiB (1024; quick 16), int8Activations ("auto"|"on"|"off"),
 * autotune (true | false | "force": measure kernel choices on software adapters too), quick,
 * profileTokens (N > 1: each model's last row gets kernel_profile, GPU us per decode step by kernel family),
 * stepsPerSubmit (decode steps per GPU submit, 1-32; default the device's),
 * command (a label for the report), onProgress({phase, loaded, total, model, message}; after each model but
 * the last, phase "partial" with `report`: the report so far, marked `incomplete`).
 * Kernel choices measured here are stored like createEngine's (IndexedDB), after each model, and reused.
 */
export async function bench(options = {}) {
  const o = options || {};
  const check = checkWebGPU();
  if (!check.ok) throw new WebdriftError(check.reason, "GPUError");
  const model = o.model ? await resolveModel(o) : null;
  const opts = {};
  for (const k of ["synthetic", "quant", "protocol", "repeats", "prefillChunk", "rooflineMiB", "int8Activations",
                   "autotune", "quick", "command", "profileTokens", "stepsPerSubmit"]) if (o[k] !== undefined) opts[k] = o[k];
  opts.model = model;
  opts.host = typeof navigator !== "undefined" ? navigator.userAgent : "";
  opts.date = new Date().toISOString().replace(/\.\d+Z$/, "Z");
  if (!opts.command) opts.command = `bench(${JSON.stringify({ ...o, onProgress: undefined })})`;
  let crashed = null;
  const client = new WorkerClient((e) => { crashed = e; });
  try {
    return await client.request({ type: "bench", opts }, { onProgress: o.onProgress });
  } catch (e) {
    if (crashed) throw crashed;
    throw e;
  } finally {
    client.terminate("the benchmark finished");
  }
}

/** Offer a report (or any JSON value) as a file download from the page. */
export function downloadJSON(value, filename = "webdrift-bench.json") {
  const url = URL.createObjectURL(new Blob([JSON.stringify(value, null, 1)], { type: "application/json" }));
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/** Delete cached models (all, or the one at `url`). Resolves to the number of entries removed. */
export async function clearModelCache(url) {
  if (!globalThis.caches) return 0;
  if (!url) return (await caches.delete("webdrift-models-v1")) ? 1 : 0;
  const c = await caches.open("webdrift-models-v1");
  return (await c.delete(new URL(url, pageBase()).href)) ? 1 : 0;
}

/** Forget the Python runtime's snapshot (worker.js: the next start boots Python afresh and stores a new one). */
export async function clearRuntimeCache() {
  if (!globalThis.caches) return false;
  return await caches.delete("webdrift-runtime-v1");
}

/** Forget the kernel choices this browser measured (all adapters). */
export async function clearKernelChoices() {
  if (!globalThis.indexedDB) return false;
  return await new Promise((resolve) => {
    const r = indexedDB.deleteDatabase("webdrift-autotune");
    r.onsuccess = () => resolve(true);
    r.onerror = r.onblocked = () => resolve(false);
  });
}

export default { createEngine, createRuntime, bench, downloadJSON, checkWebGPU, clearModelCache, clearKernelChoices,
                 clearRuntimeCache, WebdriftError, Engine };
