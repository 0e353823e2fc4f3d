// The bench page: runs bench() of webdrift.js (the protocol of `webdrift bench`) and shows the rows;
// the report (the desktop's JSON schema) can be downloaded. Query parameters fill the form
// (synthetic, quant, model, protocol, repeats, rooflineMiB, autotune, int8Activations, quick; and
// profileTokens, stepsPerSubmit, not in the form) and
// autorun=1 starts at once. For tests and scripts: document.body.dataset.state is
// idle|running|done|error, window.webdriftBench = {report, error, progress: [...], downloadText}, and
// window.runBench(options) resolves to a report.

import { bench } from "./webdrift.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const page = (window.webdriftBench = { report: null, error: null, progress: [] });
const FIELDS = ["synthetic", "quant", "model", "protocol", "repeats", "rooflineMiB", "autotune", "int8Activations"];

for (const k of FIELDS) if (params.has(k)) $(k).value = params.get(k);
if (params.get("quick") === "1") {
  if (!params.has("protocol")) $("protocol").value = "32/16,16/8";
  if (!params.has("rooflineMiB")) $("rooflineMiB").value = "16";
}

function options() {
  const o = { quick: params.get("quick") === "1" };
  for (const k of FIELDS) {
    const v = $(k).value.trim();
    if (v === "") continue;
    o[k] = ["repeats", "rooflineMiB"].includes(k) ? Number(v) : v;
  }
  if (o.autotune !== undefined) o.autotune = o.autotune === "force" ? "force" : o.autotune === "true";
  for (const k of ["profileTokens", "stepsPerSubmit"]) if (params.has(k)) o[k] = Number(params.get(k));
  if (o.model) o.synthetic = params.has("synthetic") ? o.synthetic : undefined;
  o.command = "bench.html" + location.search;
  return o;
}

const f1 = (v, d = 1) => (v === null || v === undefined ? "-" : Number(v).toFixed(d));

function show(report) {
  const head = ["model", "quant", "prompt/new", "prefill tok/s", "decode tok/s", "% roofline", "ceiling tok/s",
                "peak GPU MiB", "load s", "ttft s", "error"];
  const rows = report.results.map((r) => [r.model, r.quant, `${r.prompt_tokens}/${r.new_tokens}`, f1(r.prefill_tps),
    f1(r.decode_tps), f1(r.pct_roofline), f1(r.roofline_decode_tps, 0), f1(r.peak_gpu_bytes / 1048576),
    f1(r.load_s, 2), f1(r.ttft_s, 3), r.error || ""]);
  const t = $("table");
  t.replaceChildren();
  for (const [i, row] of [head, ...rows].entries()) {
    const tr = t.insertRow();
    for (const c of row) { const td = document.createElement(i ? "td" : "th"); td.textContent = c; tr.appendChild(td); }
  }
  const m = report.machine;
  $("progress-text").textContent = `${m.adapter} (${m.backend}), ${m.route}; streaming read ${report.roofline.best_GBps} GB/s ` +
    `(${report.roofline.method})`;
  const a = $("download");
  page.downloadText = JSON.stringify(report, null, 1);
  a.href = URL.createObjectURL(new Blob([page.downloadText], { type: "application/json" }));
  a.hidden = false;
}

async function run(o) {
  document.body.dataset.state = "running";
  $("run").disabled = true;
  $("error").hidden = true;
  $("log").textContent = "";
  page.report = page.error = null;
  try {
    const report = await bench({
      ...o,
      onProgress: (p) => {
        page.progress.push(p);
        if (p.phase === "log") { $("log").textContent += p.message + "\n"; return; }
        const pct = p.total ? (100 * p.loaded) / p.total : 0;
        $("progress-bar").style.width = `${pct}%`;
        $("progress-text").textContent = `${p.phase}${p.model ? " " + p.model : ""}${p.total ? ` ${p.loaded}/${p.total}` : ""}` +
          (p.message ? `: ${p.message}` : "");
      },
    });
    page.report = report;
    show(report);
    document.body.dataset.state = "done";
    return report;
  } catch (e) {
    page.error = { name: e.name, message: e.message };
    $("error").textContent = `${e.name}: ${e.message}`;
    $("error").hidden = false;
    document.body.dataset.state = "error";
    throw e;
  } finally {
    $("run").disabled = false;
  }
}

window.runBench = run;
$("form").addEventListener("submit", (ev) => { ev.preventDefault(); run(options()).catch(() => {}); });
if (params.get("autorun") === "1") run(options()).catch(() => {});
