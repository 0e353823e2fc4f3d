"""The browser's bench page and its run-time kernel choice, on SwiftShader (headless Chromium).

- bench.html (bench() of webdrift.js) runs `webdrift bench`'s protocol on a tiny synthetic shape
  and returns a complete report in the desktop's schema: the same top-level, machine and row
  fields as a desktop report made here with wgpu-native (lavapipe), route "browser
  (Pyodide+WebGPU)", and a download link holding the same JSON.
- The async tuner (kernels/autotune.py, autotune "force": SwiftShader is a software adapter,
  which keeps the static rules unless forced): a first load queues its measurements and tunes
  in the background after the engine is ready (progress phase "tune"), the choices are stored
  in IndexedDB; after a page reload they are imported, nothing is left to measure, and the
  choices in use are the stored ones. Greedy ids of the tiny GGUF model equal the desktop
  engine's, before tuning (static choices) and after (tuned choices).
Every evaluation has a timeout (Chromium.eval).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from e2e_util import REPO, make_handler

from webdrift.profile.benchmark import (
    BROWSER_ROUTE,
    MACHINE_FIELDS,
    REPORT_FIELDS,
    ROW_FIELDS,
    missing_fields,
)

PROMPT = [5, 40, 77, 120, 33, 260, 9, 18]      # token ids (the tiny model's tokenizer is bytes + a few merges)
NEW = 8


@pytest.fixture(scope="module")
def desktop_report(tmp_path_factory):
    """`webdrift bench` on the same shape and protocol (wgpu-native, in a subprocess: Playwright
    holds this process's event loop), for the schema comparison."""
    out = tmp_path_factory.mktemp("bench") / "desktop.json"
    r = subprocess.run([sys.executable, "-m", "webdrift", "bench", "--quick", "--synthetic", "tiny", "--quant", "q4",
                        "--protocol", "8/4", "--roofline-mib", "4", "--no-peers", "--kv-cache", "f16,f32",
                        "--json", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    return json.loads(out.read_text())


def test_bench_page_returns_the_desktop_schema(chromium, server, desktop_report, record):
    # quick=1 as the desktop's --quick: the compute roofline's small grid (its full 2048-workgroup
    # grid took most of this test's ~285 s on SwiftShader)
    pg = chromium.page(server["url"] + "/bench.html?synthetic=tiny&quant=q4,f16&protocol=8/4&rooflineMiB=4"
                       "&autotune=false&quick=1")
    t0 = time.time()
    rep = chromium.eval(pg, """async () => {
        await new Promise((r) => { const w = () => window.runBench ? r() : setTimeout(w, 50); w(); });
        document.getElementById("run").click();
        while (!["done", "error"].includes(document.body.dataset.state)) await new Promise((r) => setTimeout(r, 200));
        const b = window.webdriftBench;
        if (b.error) throw new Error(b.error.name + ": " + b.error.message);
        const a = document.getElementById("download");
        return { report: b.report, fromLink: JSON.parse(b.downloadText), href: a.href,
                 download: a.getAttribute("download"), hidden: a.hidden,
                 phases: [...new Set(b.progress.map((p) => p.phase))],
                 partial: b.progress.filter((p) => p.phase === "partial") };
    }""", timeout_s=600)
    record("bench.html tiny q4 + f16 8/4 on SwiftShader: wall s", round(time.time() - t0, 1))
    report = rep["report"]
    assert missing_fields(report) == [], missing_fields(report)
    assert rep["fromLink"] == report and rep["href"].startswith("blob:") and rep["download"].endswith(".json")
    assert not rep["hidden"]
    # the desktop's schema: the same fields at every level (the browser adds its log)
    assert set(REPORT_FIELDS) <= set(report) and set(report) - {"log"} == set(desktop_report) - {"wall_s"}
    assert set(report["machine"]) == set(desktop_report["machine"]) == set(MACHINE_FIELDS)
    for r in report["results"]:
        assert set(r) == set(desktop_report["results"][0]), set(r) ^ set(desktop_report["results"][0])
        assert set(ROW_FIELDS) <= set(r)
        assert r["error"] is None and r["model"] == "tiny"
        assert r["prefill_tps"] > 0 and r["decode_tps"] > 0 and r["load_s"] > 0
        assert r["peak_gpu_bytes"] >= r["weight_bytes"] > 0
        # the same model, protocol and KV cache read the same bytes per token on either route (the
        # desktop ran q4 with both caches; SwiftShader has no shader-f16: f32)
        if r["quant"] != "q4":
            continue
        d = next(x for x in desktop_report["results"] if x["kv_cache"] == r["kv_cache"])
        assert (r["weight_bytes"], r["read_bytes_per_token"], r["params"]) == (
            d["weight_bytes"], d["read_bytes_per_token"], d["params"])
    assert report["machine"]["route"] == BROWSER_ROUTE and desktop_report["machine"]["route"].startswith("desktop")
    assert report["machine"]["adapter"] and report["roofline"]["best_GBps"] > 0
    assert [r["quant"] for r in report["results"]] == ["q4", "f16"]
    assert {"roofline", "load", "run"} <= set(rep["phases"])
    # after the first model, the report so far (a host whose run is cut short keeps it: node_bench
    # writes it to --json), its choices taken out by the worker (stored at once)
    (part,) = rep["partial"]
    assert (part["loaded"], part["total"]) == (1, 2) and "choices" not in part
    assert part["report"]["incomplete"] == "1 of 2 models done" and missing_fields(part["report"]) == []
    assert part["report"]["results"] == report["results"][:1]
    record("bench.html: decode tok/s (tiny q4, SwiftShader)", report["results"][0]["decode_tps"])
    record("bench.html: roofline GB/s (SwiftShader)", report["roofline"]["best_GBps"])


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory, bundle, bad_files):
    """The bundle with the tiny GGUF as the default model, on its own origin (own IndexedDB)."""
    sys.path.insert(0, str(REPO))
    from tests.tiny_model import write_tiny_gguf
    from webdrift.tools.serve import ServedModel, make_server, serve_in_thread
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", eos=False)
    srv = make_server(bundle, ServedModel(path, "tiny", None), "127.0.0.1", 0, handler=make_handler(bad_files))
    serve_in_thread(srv)
    yield {"url": f"http://127.0.0.1:{srv.server_address[1]}", "path": path}
    srv.shutdown()
    srv.server_close()


def desktop_ids(path: str) -> list[int]:
    code = ("import json, sys, webdrift\n"
            "eng = webdrift.load(sys.argv[1], max_context=64, autotune=False)\n"
            f"print('RESULT ' + json.dumps(eng.generate({PROMPT}, max_new_tokens={NEW}, temperature=0, "
            "stop_at_eos=False).token_ids))\n")
    r = subprocess.run([sys.executable, "-c", code, path], cwd=REPO, capture_output=True, text=True, timeout=600,
                       check=False)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stderr[-2000:]
    return json.loads(line[7:])


LOAD_AND_GENERATE = """async ([prompt, n, clear]) => {
    const wd = await import("/webdrift.js");
    if (clear) await wd.clearKernelChoices();
    const progress = [];
    const eng = await wd.createEngine({ maxContext: 64, autotune: "force",
                                       onProgress: (p) => progress.push([p.phase, p.loaded, p.total]) });
    window.eng = eng;
    const out = await eng.generate(prompt, { maxNewTokens: n, temperature: 0, stopAtEos: false });
    const tuned = await eng.tuned();
    const used = JSON.parse(await eng.runPython(`
import json
from webdrift.browser_api import _state
from webdrift.kernels import autotune
dev = _state.engine.dev
json.dumps({"pending": autotune.pending(dev), "keys": sorted(k for k in autotune.cached_keys()
            if k.startswith(dev.info.adapter + "|"))})`));
    const stored = await new Promise((resolve) => {
        const r = indexedDB.open("webdrift-autotune", 1);
        r.onupgradeneeded = () => r.result.createObjectStore("choices");
        r.onsuccess = () => {
            const req = r.result.transaction("choices").objectStore("choices").getAllKeys();
            req.onsuccess = () => { r.result.close(); resolve(req.result); };
        };
    });
    return { info: eng.info, ids: out.tokenIds, tuned, used, stored,
             tunePhases: progress.filter((p) => p[0] === "tune").length };
}"""


def test_async_tuner_choices_made_cached_reused(chromium, tiny_server, record):
    want = desktop_ids(tiny_server["path"])
    pg = chromium.page(tiny_server["url"] + "/e2e/blank.html")
    t0 = time.time()
    first = chromium.eval(pg, LOAD_AND_GENERATE, [PROMPT, NEW, True], timeout_s=600)
    record("tiny model, first visit with forced tuning on SwiftShader: load + generate + tune s", round(time.time() - t0, 1))
    tuning = first["info"]["tuning"]
    assert tuning["tuned"] and tuning["timestamps"] and tuning["imported"] == 0 and tuning["pending"] > 0
    assert tuning["background"]
    assert first["tuned"]["tuned"] == tuning["pending"] and first["tuned"]["stored"] == tuning["pending"]
    assert first["tunePhases"] >= 1
    assert first["used"]["pending"] == [] and set(first["used"]["keys"]) <= set(first["stored"])
    assert len(first["stored"]) >= tuning["pending"]
    assert first["ids"] == want                         # static choices (the tuning ran after the load)
    record("tiny model: kernel choices tuned in the background", first["tuned"]["tuned"])
    record("tiny model: background tuning s (SwiftShader)", round(first["tuned"]["seconds"], 1))

    # reloads: the stored choices are imported and used. A float weight's tuned layout applies
    # from the next load (weights are converted at load), and where it differs from the first
    # load's the GEMV variants of that layout are measured then (the only queued keys); a third
    # load has nothing left to measure.
    loads = []
    for n in range(2):
        pg.reload()
        t0 = time.time()
        again = chromium.eval(pg, LOAD_AND_GENERATE, [PROMPT, NEW, False], timeout_s=600)
        record(f"tiny model, reload {n + 1} with cached choices: load + generate s", round(time.time() - t0, 1))
        loads.append(again)
        t2 = again["info"]["tuning"]
        assert t2["imported"] >= len(first["stored"]) and again["ids"] == want
        assert again["tuned"]["tuned"] == t2["pending"] and again["used"]["pending"] == []
        if n == 0:
            assert all(k.startswith("gemv|") and k.rsplit("|", 1)[-1] == "OI4O4" for k in t2["queued"]), t2["queued"]
        else:
            assert t2["pending"] == 0 and "background" not in t2 and again["tuned"]["tuned"] == 0
            assert set(again["used"]["keys"]) == set(loads[0]["used"]["keys"]) == set(again["stored"])
    record("tiny model: choices measured on reload 1 (GEMVs of a changed layout)", loads[0]["info"]["tuning"]["pending"])
    chromium.eval(pg, "async () => { await window.eng.dispose(); return true; }", timeout_s=60)
