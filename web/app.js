// The demo page: load the default model (or ?model=URL), then chat with streamed replies.
// Query parameters: model=URL, sha256=HEX, maxContext=N (KV cache; small values load faster),
// maxTokens=N, temperature=X (initial control values).
// For tests: document.body.dataset.state is starting|loading|ready|generating|error, and
// window.webdriftDemo holds {engine, metrics: {pageToReadyMs, firstTokenMs, ...}, messages}.

import { checkWebGPU, clearModelCache, createEngine } from "./webdrift.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const demo = (window.webdriftDemo = { engine: null, metrics: {}, messages: [], replies: [] });

function setState(s) { document.body.dataset.state = s; }

function showError(message) {
  const el = $("error");
  el.textContent = message;
  el.hidden = false;
  $("load").style.display = "none";
  setState("error");
}

function fmtBytes(n) {
  if (n >= 1 << 30) return (n / (1 << 30)).toFixed(2) + " GB";
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + " MB";
  return (n / 1024).toFixed(0) + " KB";
}

const PHASES = {
  runtime: "Starting Python in the browser",
  download: "Downloading the model",
  cache: "Reading the model from the browser cache",
  verify: "Checking the model's sha256",
  parse: "Reading the model file",
  weights: "Uploading weights to the GPU",
  ready: "Ready",
};

// Python starts while the model downloads, so the two report progress side by side.
const loadState = { python: "starting", main: null };

function onProgress(p) {
  if (p.phase === "runtime") {
    loadState.python = p.done ? "ready" : "starting";
    if (!loadState.main) loadState.main = p;
  } else {
    loadState.main = p;
  }
  const m = loadState.main;
  let pct = m.percent;
  let text = PHASES[m.phase] || m.phase;
  if (m.phase === "download" && m.total) {
    text += ` — ${fmtBytes(m.loaded)} of ${fmtBytes(m.total)} (${pct.toFixed(0)}%)`;
  } else if (m.phase === "download") {
    text += ` — ${fmtBytes(m.loaded)}`;
  } else if (m.phase === "weights" && m.total) {
    text += ` — ${m.loaded} of ${m.total} tensors (${pct.toFixed(0)}%)`;
  }
  if (["download", "cache", "verify"].includes(m.phase)) {
    text += loadState.python === "ready" ? " · Python ready" : " · starting Python in parallel";
  }
  if (m.phase === "runtime") pct = undefined;
  if (pct === undefined) pct = m.phase === "ready" ? 100 : null;
  if (pct !== null) $("progress-bar").style.width = `${pct}%`;
  $("progress-text").textContent = text + (m.phase === "ready" ? "" : "…");
}

function addMessage(role, text) {
  $("hint")?.remove();
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  el.textContent = text;
  $("messages").appendChild(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

function options() {
  const num = (id, d) => { const v = Number($(id).value); return Number.isFinite(v) ? v : d; };
  return {
    temperature: num("temperature", 0.7),
    topK: Math.max(0, Math.round(num("top-k", 40))) || null,
    topP: num("top-p", 0.95),
    maxNewTokens: Math.max(1, Math.round(num("max-tokens", 128))),
    numResponses: Math.min(4, Math.max(1, Math.round(num("responses", 1)))),
  };
}

// K assistant bubbles side by side for one turn; clicking one keeps it as the conversation's reply
function addAlternatives(k) {
  $("hint")?.remove();
  const row = document.createElement("div");
  row.className = "alternatives";
  const bubbles = [];
  for (let i = 0; i < k; i++) {
    const el = document.createElement("div");
    el.className = "msg assistant";
    row.appendChild(el);
    bubbles.push(el);
  }
  $("messages").appendChild(row);
  row.scrollIntoView({ block: "end" });
  return bubbles;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("prompt").disabled = false;
  $("stop").disabled = !busy;
  setState(busy ? "generating" : "ready");
}

async function send(text) {
  const engine = demo.engine;
  if (!engine || !text.trim()) return;
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  demo.messages.push({ role: "user", content: text });
  messages.push(...demo.messages);
  addMessage("user", text);
  const opts = options();
  const k = opts.numResponses;
  const bubbles = k > 1 ? addAlternatives(k) : [addMessage("assistant", "")];
  const bubble = bubbles[0];
  const replies = bubbles.map(() => "");
  for (const b of bubbles) b.classList.add("streaming");
  setBusy(true);
  $("stats").textContent = "Reading the prompt…";
  const t0 = performance.now();
  let first = null, reply = "";
  try {
    let out = await engine.chat(messages, {
      ...opts,
      onToken: (piece, stream = 0) => {
        if (first === null) {
          first = performance.now();
          demo.metrics.firstTokenMs = first - t0;
          if (demo.metrics.pageToFirstTokenMs === undefined) demo.metrics.pageToFirstTokenMs = first;
          $("stats").textContent = "Generating…";
        }
        replies[stream] += piece;
        bubbles[stream].textContent = replies[stream];
        bubbles[stream].scrollIntoView({ block: "end" });
      },
    });
    const outs = Array.isArray(out) ? out : [out];
    outs.forEach((o, i) => { bubbles[i].textContent = o.text || "(no text)"; });
    out = outs[0];
    reply = out.text;
    demo.messages.push({ role: "assistant", content: reply });
    demo.replies.push(out);
    if (outs.length > 1) {   // the first response is kept unless another is clicked (latest turn only)
      const turn = demo.messages.length - 1;
      bubbles[0].classList.add("chosen");
      bubbles.forEach((b, i) => b.addEventListener("click", () => {
        if (demo.messages.length - 1 !== turn) return;
        demo.messages[turn] = { role: "assistant", content: outs[i].text };
        bubbles.forEach((o) => o.classList.toggle("chosen", o === b));
      }));
    }
    const s = out.stats;
    const parts = [
      `prefill ${s.prefillTokensPerS.toFixed(1)} tok/s (${s.promptTokens} tokens)`,
      `decode ${s.decodeTokensPerS.toFixed(2)} tok/s (${s.newTokens} tokens)`,
      `${s.totalS.toFixed(1)} s`,
    ];
    if (outs.length > 1 && s.decodeS > 0) {
      const together = outs.reduce((a, o) => a + Math.max(0, o.stats.newTokens - 1), 0) / s.decodeS;
      parts.splice(2, 0, `${outs.length} responses: ${together.toFixed(2)} tok/s together`);
    }
    if (s.finishReason === "stopped") parts.push("stopped");
    else if (s.finishReason === "length") parts.push("max tokens reached");
    else if (s.finishReason === "context") parts.push("context full");
    $("stats").textContent = parts.join(" · ");
    if (!reply) bubble.textContent = "(no text)";
  } catch (e) {
    bubble.textContent = reply || "(failed)";
    demo.messages.pop();
    $("stats").textContent = "";
    const note = document.createElement("span");
    note.className = "meta";
    note.textContent = `${e.name}: ${e.message}`;
    bubble.appendChild(note);
  } finally {
    for (const b of bubbles) b.classList.remove("streaming");
    setBusy(false);
    $("prompt").focus();
  }
}

function wireControls() {
  for (const id of ["temperature", "top-p"]) {
    const out = $(`${id}-out`);
    const sync = () => { out.textContent = Number($(id).value).toFixed(2); };
    $(id).addEventListener("input", sync);
    sync();
  }
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if ($("send").disabled) return;
    const text = $("prompt").value;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => demo.engine?.stop());
  $("clear").addEventListener("click", () => {
    demo.messages = [];
    $("messages").replaceChildren();
    $("stats").textContent = "";
  });
  $("clear-cache").addEventListener("click", async () => {
    const n = await clearModelCache();
    $("stats").textContent = n ? "The cached model was removed; the next visit downloads it again." : "Nothing was cached.";
  });
}

async function main() {
  wireControls();
  if (params.has("temperature")) $("temperature").value = params.get("temperature");
  if (params.has("maxTokens")) $("max-tokens").value = params.get("maxTokens");
  $("temperature").dispatchEvent(new Event("input"));
  const check = checkWebGPU();
  if (!check.ok) {
    $("adapter").textContent = "none";
    showError(`This page runs the model on your GPU with WebGPU, which is not available here: ${check.reason}`);
    return;
  }
  setState("loading");
  const t0 = performance.now();
  try {
    const engine = await createEngine({
      model: params.get("model") || undefined,
      sha256: params.get("sha256") || undefined,
      maxContext: params.has("maxContext") ? Number(params.get("maxContext")) : undefined,
      onProgress,
    });
    demo.engine = engine;
    const info = engine.info;
    demo.metrics.loadMs = performance.now() - t0;
    demo.metrics.pageToReadyMs = performance.now();
    const file = decodeURIComponent((info.modelUrl || "").split("/").pop() || info.model.name || info.model.arch);
    $("model-name").textContent = `${file} · ${info.model.layers} layers · context ${info.maxContext}`;
    $("model-name").title = info.model.name || "";
    $("adapter").textContent = `${info.adapter}${info.features.includes("shader-f16") ? " · f16" : ""}`;
    $("progress-text").textContent = info.fromCache ? "Loaded from the browser cache" : "Loaded";
    $("prompt").disabled = false;
    $("send").disabled = false;
    setState("ready");
    $("stats").textContent = `Loaded in ${(demo.metrics.loadMs / 1000).toFixed(1)} s` +
      (info.fromCache ? " (model from the browser cache)." : ".");
    $("prompt").focus();
  } catch (e) {
    showError(e.name === "GPUError" ? `This page runs the model on your GPU with WebGPU, and it could not get a GPU.\n${e.message}`
      : `Could not load the model.\n${e.name}: ${e.message}`);
  }
}

main();
