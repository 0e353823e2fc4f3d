// webdrift's browser build outside a browser: `webdrift bench`'s protocol through Pyodide in Node.js,
// the bundle's worker code (worker.js) and the webdrift wheel, with navigator.gpu from Dawn's node
// binding (npm `webgpu`: the WebGPU implementation and WGSL compiler inside Chrome). It measures
// what a page would get from the same Dawn, on GPUs that Chromium's own WebGPU does not offer.
//
//   node bundle/node_bench.mjs --webgpu node_modules/webgpu --synthetic smollm2-135m --quant q4,f16 --json out.json
//
// Options (as `webdrift bench`): --synthetic NAMES, --quant f16,q8,q4, --model FILE.gguf, --protocol P/N,...,
// --repeats N, --prefill-chunk N, --roofline-mib N, --int8-activations auto|on|off,
// --autotune on|off|force, --profile-tokens N, --steps-per-submit N, --trace-calls (host time per WebGPU method), --quick; and --webgpu PATH (the `webgpu` package folder or its index.js;
// default: resolved as "webgpu"), --dawn FLAG (repeatable: Dawn's create() flags, e.g.
// enable-dawn-features=allow_unsafe_apis), --choices FILE (kernel choices kept between runs, like
// the browser's IndexedDB; default $WEBDRIFT_CACHE/autotune/node_dawn_choices.json), --snapshot on|off (the Python
// runtime's snapshot, kept like a page's in $WEBDRIFT_CACHE/node_dawn/python_snapshot; default on), --json FILE.
// --python FILE: run FILE in the worker's Pyodide (navigator.gpu from Dawn), then `await main()`, and print
// its value (kernel checks on adapters only Dawn offers, e.g. scripts/dawn_mma_check.py: matrix units).
// --ready --model FILE.gguf: instead of the protocol, what a page's createEngine() waits for, timed
// from this script's start (Pyodide, the wheels, the model read and its sha256 checked, weights
// uploaded, kernels built with the stored choices) to "ready", then one short greedy generation and
// the background tuning a first visit starts (its choices stored: run twice for a returning visitor);
// --ready-tokens N: that generation's length (default 16; 0: none).
// The report is the desktop's schema (webdrift/profile/benchmark.py), machine.route "node (Pyodide+Dawn)".
// Needs: Node >= 18 and a bundle (python -m build_wasm --out bundle/); this file lies in the bundle.

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL, fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
  const o = { dawn: [] };
  const bools = new Set(["quick", "ready", "traceCalls"]);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith("--")) throw new Error(`unexpected argument ${a}`);
    const k = a.slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (bools.has(k)) { o[k] = true; continue; }
    const v = argv[++i];
    if (v === undefined) throw new Error(`${a} needs a value`);
    if (k === "dawn") o.dawn.push(v); else o[k] = v;
  }
  return o;
}

const args = parseArgs(process.argv.slice(2));
// a folder and its missing parents, one level at a time (Node's recursive mkdir spun forever on
// /proc/x: an error there must end the run)
function makeDirs(d) {
  if (fs.existsSync(d)) return;
  makeDirs(path.dirname(d));
  fs.mkdirSync(d);
}
if (args.json) {         // a path that cannot be written: refused now, not after the run
  const file = path.resolve(args.json);
  try {
    makeDirs(path.dirname(file));
    const existed = fs.existsSync(file);
    fs.closeSync(fs.openSync(file, "a"));
    if (!existed) fs.unlinkSync(file);
  } catch (e) {
    console.error(`webdrift: error: --json ${args.json}: cannot write it (${e.code || e.message})`);
    process.exit(2);
  }
}
const autotune = args.autotune === undefined ? true : args.autotune === "force" ? "force" : args.autotune === "on";   // --autotune on|off|force
// --ready: what a returning visitor waits for; the model's sha256 is known beforehand (a page has it
// from the cache entry or the server), so its hashing here is not part of the wait, the check is
let readySha = null;
if (args.ready) {
  if (!args.model) throw new Error("--ready needs --model FILE.gguf");
  readySha = (await import("node:crypto")).createHash("sha256").update(fs.readFileSync(args.model)).digest("hex");
}
const T0 = performance.now();

// -- navigator.gpu from Dawn -----------------------------------------------------------------------
let spec = args.webgpu || "webgpu";
if (args.webgpu) {
  const p = path.resolve(args.webgpu);
  spec = pathToFileURL(fs.statSync(p).isDirectory() ? path.join(p, "index.js") : p).href;
}
const { create, globals } = await import(spec);
Object.assign(globalThis, globals);
const gpu = create(args.dawn);
// --trace-calls: time every call of these WebGPU methods (host time in Dawn, per method), to see
// where a decode step's encode + submit goes; printed (and in the JSON) at the end
const traced = {};
if (args.traceCalls) {
  const methods = { GPUQueue: ["submit", "writeBuffer"],
    GPUDevice: ["createCommandEncoder", "createBuffer", "createShaderModule", "createBindGroupLayout", "createPipelineLayout",
      "createComputePipeline", "createComputePipelineAsync", "createBindGroup"],
    GPUCommandEncoder: ["beginComputePass", "copyBufferToBuffer", "finish"],
    GPUComputePassEncoder: ["setPipeline", "setBindGroup", "dispatchWorkgroups", "end"], GPUBuffer: ["mapAsync"] };
  for (const [cls, names] of Object.entries(methods)) {
    const proto = globalThis[cls] && globalThis[cls].prototype;
    for (const name of names) {
      const f = proto && proto[name];
      if (typeof f !== "function") continue;
      const rec = (traced[`${cls}.${name}`] = { calls: 0, ms: 0 });
      proto[name] = function (...a) {
        const t = performance.now();
        try { return f.apply(this, a); } finally { rec.calls++; rec.ms += performance.now() - t; }
      };
    }
  }
}
// calls, total and mean host time per traced method (an async method: the call itself, not its promise)
function tracedCalls() {
  return Object.fromEntries(Object.entries(traced).filter(([, r]) => r.calls).map(([k, r]) =>
    [k, { calls: r.calls, total_ms: Math.round(r.ms * 10) / 10, mean_us: Math.round(1000 * r.ms / r.calls * 10) / 10 }]));
}
Object.defineProperty(globalThis, "navigator", {
  value: { gpu, userAgent: `Node.js ${process.version} + Dawn (npm webgpu) ${os.platform()} ${os.arch()}`,
           hardwareConcurrency: os.cpus().length },
  configurable: true, writable: true });

// -- what worker.js expects of a Web Worker ------------------------------------------------------
globalThis.self = globalThis;
const realFetch = globalThis.fetch;
globalThis.fetch = async (url, init) => {          // the bundle's files and local models: file: URLs
  const u = new URL(String(url));
  if (u.protocol !== "file:") return realFetch(url, init);
  try {
    const data = fs.readFileSync(fileURLToPath(u));
    return new Response(data, { status: 200, headers: { "content-length": String(data.length) } });
  } catch (e) {
    return new Response(`not found: ${e.message}`, { status: 404, statusText: "Not Found" });
  }
};
const cacheRoot = process.env.WEBDRIFT_CACHE || path.join(os.homedir(), ".cache", "webdrift");
const choicesFile = path.resolve(args.choices || path.join(cacheRoot, "autotune", "node_dawn_choices.json"));
self.webdriftChoiceStore = {
  async load() {
    try { return JSON.parse(fs.readFileSync(choicesFile, "utf8")); } catch { return {}; }
  },
  async store(choices) {
    const all = { ...(await this.load()), ...choices };
    makeDirs(path.dirname(choicesFile));
    fs.writeFileSync(choicesFile + ".tmp", JSON.stringify(all, null, 1));
    fs.renameSync(choicesFile + ".tmp", choicesFile);
    return Object.keys(choices).length;
  },
};
// the Python runtime's snapshot (worker.js: a page keeps it in the Cache API), one file per bundle;
// --snapshot off: never restored nor stored (every run boots Python afresh)
const snapshotDir = path.join(cacheRoot, "node_dawn", "python_snapshot");
self.webdriftSnapshotStore = args.snapshot === "off" ? { async load() { return null; }, async store() { return false; } } : {
  async load(key) {
    try { return new Uint8Array(fs.readFileSync(path.join(snapshotDir, key + ".bin"))); } catch { return null; }
  },
  async store(key, bytes) {
    makeDirs(snapshotDir);
    for (const f of fs.readdirSync(snapshotDir)) fs.rmSync(path.join(snapshotDir, f), { force: true });
    if (!bytes) return false;
    fs.writeFileSync(path.join(snapshotDir, key + ".tmp"), bytes);
    fs.renameSync(path.join(snapshotDir, key + ".tmp"), path.join(snapshotDir, key + ".bin"));
    return true;
  },
};
// --json FILE, whole at every step: after each model but the last the report so far (marked
// "incomplete"), so a run cut short (a time limit) keeps what it measured
function writeJson(rep) {
  const file = path.resolve(args.json);
  makeDirs(path.dirname(file));
  fs.writeFileSync(file + ".tmp", JSON.stringify(rep, null, 1));
  fs.renameSync(file + ".tmp", file);
}
const waiting = new Map();
const phases = {};            // progress phase -> [first, last] seconds since T0 (--ready's timeline)
const timeline = [];          // [seconds since T0, phase, message] of each progress message with a message
self.postMessage = (m) => {
  if (m.type === "progress") {
    const p = m.progress;
    const t = Math.round(performance.now() - T0) / 1000;
    phases[p.phase] = [phases[p.phase] ? phases[p.phase][0] : t, t];
    if (p.message && p.phase !== "log" && p.phase !== "tune") timeline.push([t, p.phase, p.message]);
    if (p.phase === "partial") { if (args.json) writeJson(p.report); }
    else if (p.phase === "log") console.error(p.message);
    else if (p.phase !== "download") console.error(`[${p.phase}]${p.model ? " " + p.model : ""}` +
      `${p.total ? ` ${p.loaded}/${p.total}` : ""}${p.message ? " " + p.message : ""}`);
  } else if (m.type === "result" || m.type === "error") waiting.get(m.id)?.(m);
};
let nextId = 1;
function request(msg) {                    // a message to worker.js, answered by its result (or error)
  const id = nextId++;
  return new Promise((resolve) => {
    waiting.set(id, resolve);
    self.onmessage({ data: { ...msg, id } });
  }).then((m) => {
    waiting.delete(id);
    if (m.type === "error") {
      console.error(`webdrift: error: ${m.error.name}: ${m.error.message}`);
      process.exit(2);
    }
    return m.value;
  });
}
await import(pathToFileURL(path.join(HERE, "worker.js")).href);

// -- --python FILE: a Python file run in the worker's Pyodide (webdrift importable, navigator.gpu from
// Dawn), then its `async def main()` awaited and the value printed (and written to --json)
if (args.python) {
  await request({ type: "init", opts: {} });
  await request({ type: "python", code: fs.readFileSync(args.python, "utf8") });
  const value = await request({ type: "python", code: "await main()" });
  const text = typeof value === "string" ? value : JSON.stringify(value);
  console.log(text);
  if (args.json) fs.writeFileSync(args.json, text);
  await request({ type: "dispose" });
  process.exit(0);
}

// -- --ready: createEngine() as a page calls it, timed from this script's start ---------------------
if (args.ready) {
  const file = path.resolve(args.model);
  const info = await request({ type: "init", opts: { autotune, model: { url: pathToFileURL(file).href,
    name: path.basename(file), sha256: readySha, cache: false } } });
  const readyS = (performance.now() - T0) / 1000;
  const callsAtReady = args.traceCalls ? tracedCalls() : undefined;
  const t1 = performance.now();
  const tokens = args.readyTokens === undefined ? 16 : Number(args.readyTokens);   // --ready-tokens 0: no generation
  const gen = tokens > 0 ? await request({ type: "generate", prompt: "The capital of France is",
    opts: { maxNewTokens: tokens, temperature: 0 } }) : { text: null, stats: null };
  const firstS = (performance.now() - t1) / 1000;
  const tuned = await request({ type: "tuned" });      // background tuning (a first visit): stored for the next
  const out = { route: "node (Pyodide+Dawn)", adapter: info.adapter, model: path.basename(file),
    ready_s: Math.round(readyS * 1000) / 1000, engine_load_s: info.totalLoadS, fetch_s: info.fetchS,
    load_steps_s: info.loadStepsS,
    tuning_at_ready: info.tuning, phases_s: phases, timeline_s: timeline, traced_calls_at_ready: callsAtReady,
    first_generate_s: Math.round(firstS * 1000) / 1000,
    first_generate: { text: gen.text, stats: gen.stats }, background_tuning: tuned,
    command: "node node_bench.mjs " + process.argv.slice(2).join(" "), date: new Date().toISOString() };
  console.log(JSON.stringify(out, null, 1));
  if (args.json) fs.writeFileSync(args.json, JSON.stringify(out, null, 1));
  await request({ type: "dispose" });   // the device destroyed before exiting (exiting under its work crashed Dawn)
  process.exit(0);
}

// -- the run -------------------------------------------------------------------------------------
const opts = {
  synthetic: args.synthetic, quant: args.quant, protocol: args.protocol, quick: !!args.quick,
  repeats: args.repeats ? Number(args.repeats) : undefined, prefillChunk: args.prefillChunk ? Number(args.prefillChunk) : undefined,
  rooflineMiB: args.rooflineMib ? Number(args.rooflineMib) : undefined, int8Activations: args.int8Activations,
  profileTokens: args.profileTokens ? Number(args.profileTokens) : undefined,
  stepsPerSubmit: args.stepsPerSubmit ? Number(args.stepsPerSubmit) : undefined,
  autotune,
  host: navigator.userAgent, route: "node (Pyodide+Dawn)", date: new Date().toISOString().replace(/\.\d+Z$/, "Z"),
  command: "node node_bench.mjs " + process.argv.slice(2).join(" "),
};
if (args.model) {
  const file = path.resolve(args.model);
  opts.model = { url: pathToFileURL(file).href, name: path.basename(file), sha256: null, cache: false };
}
const t0 = performance.now();
const report = await request({ type: "bench", opts });
report.wall_s = Math.round((performance.now() - t0) / 10) / 100;
const f = (v, d = 1) => (v === null || v === undefined ? "-" : Number(v).toFixed(d));
console.log(`${report.machine.adapter} (${report.machine.backend}), ${report.machine.route}; streaming read ` +
  `${report.roofline.best_GBps} GB/s (${report.roofline.method})`);
for (const r of report.results) {
  console.log(r.error ? `${r.model} ${r.quant} ${r.prompt_tokens}/${r.new_tokens}: error: ${r.error}` :
    `${r.model} ${r.quant} ${r.prompt_tokens}/${r.new_tokens}: prefill ${f(r.prefill_tps)} tok/s, decode ` +
    `${f(r.decode_tps)} tok/s (${f(r.pct_roofline)}% of roofline), load ${f(r.load_s, 2)} s, peak ` +
    `${f(r.peak_gpu_bytes / 1048576)} MiB`);
}
if (args.traceCalls) {
  report.traced_calls = tracedCalls();
  console.log(JSON.stringify(report.traced_calls, null, 1));
}
if (args.json) {
  writeJson(report);
  console.log(`report written to ${args.json}`);
}
process.exit(report.results.some((r) => r.error) ? 1 : 0);
