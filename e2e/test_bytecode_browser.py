"""How a page's Python starts (headless Chromium): the bundle's precompiled bytecode and the
runtime's snapshot (docs/BROWSER.md, "A returning visitor's wait").

- build_wasm adds unchecked-hash .pyc files to the wheels and to Pyodide's python_stdlib.zip. In
  the page's worker, the loaders must take them: asking each loader for a module's code compiles
  nothing from source for webdrift's modules, jinja2 and the stdlib modules of the build's
  imports, while a stdlib module outside them still compiles (the spy sees it), and every
  shipped .pyc carries its source's hash.
- worker.js keeps the interpreter's memory after its first start (Cache API) and restores it in
  later workers: the first start after clearRuntimeCache() boots, the next ones restore; the
  engine of the first start (which made the snapshot) and of a restore generate the same greedy
  tokens; each runtime imports what the snapshot does not hold (stdlib and webdrift modules,
  from the files installed anew), and Python's random module differs between them (reseeded
  after a restore: unseeded sampling must not repeat across page loads).
Every evaluation has a timeout (Chromium.eval).
"""

from __future__ import annotations

import json
import urllib.request

# Runs in the page's worker (engine.runPython): which modules' code the loaders compile from
# source, for modules that have a .pyc and for one that has none.
LOADERS = r"""
import importlib, importlib.util, json, sys, zipimport
import importlib._bootstrap_external as be
compiled = []
src_to_code, zip_compile = be.SourceLoader.source_to_code, zipimport._compile_source
def spy(self, data, path, **kw):
    compiled.append(path)
    return src_to_code(self, data, path, **kw)
be.SourceLoader.source_to_code = spy
zipimport._compile_source = lambda path, source: (compiled.append(path), zip_compile(path, source))[1]
try:
    def code_of(name):
        spec = importlib.util.find_spec(name)
        return spec.loader.get_code(name)
    shipped = ["webdrift.browser_api", "webdrift.runtime.engine", "webdrift.gpu.browser", "webdrift.tokenizer.bpe",
               "jinja2.environment", "markupsafe", "json", "asyncio.events", "dataclasses", "_pyodide._base"]
    for name in shipped:
        code_of(name)
    from_shipped = list(compiled)
    code_of("difflib")                     # not imported by the page: no .pyc, compiled from source
    control = compiled[len(from_shipped):]
finally:
    be.SourceLoader.source_to_code, zipimport._compile_source = src_to_code, zip_compile
import webdrift.browser_api as api
with open(api.__cached__, "rb") as f:
    head = f.read(16)
with open(api.__file__, "rb") as f:
    source = f.read()
json.dumps({"from_shipped": from_shipped, "control": control, "flags": int.from_bytes(head[4:8], "little"),
            "hash_ok": head[8:16] == importlib.util.source_hash(source), "tag": sys.implementation.cache_tag,
            "json_file": sys.modules["json"].__file__, "dont_write_bytecode": sys.flags.dont_write_bytecode})
"""


def test_manifest_names_the_bytecode(server):
    with urllib.request.urlopen(server["url"] + "/manifest.json", timeout=30) as r:
        m = json.loads(r.read())
    b = m["bytecode"]
    assert b["cache_tag"].startswith("cpython-3")
    assert b["stdlib_modules"] > 50
    assert set(b["wheels"]) == set(m["wheels"]) and all(n > 0 for n in b["wheels"].values())


def test_page_runs_the_shipped_bytecode(chromium, engine_page):
    out = json.loads(chromium.eval(engine_page, "async (code) => await window.eng.runPython(code)", LOADERS,
                                   timeout_s=120))
    assert out["from_shipped"] == [], out          # every one of them from its .pyc
    assert out["control"] and out["control"][0].endswith("difflib.py"), out    # the spy does see a compile
    assert out["flags"] == 1 and out["hash_ok"], out        # unchecked-hash .pyc of this very source
    assert out["json_file"].endswith("json/__init__.pyc"), out
    assert out["tag"].startswith("cpython-3")


RESTARTS = """async () => {
    const wd = await import("/webdrift.js");
    await wd.clearRuntimeCache();
    const runs = [];
    for (let i = 0; i < 3; i++) {
        const messages = [];
        const t0 = performance.now();
        // the first start and the first restore load the model and generate (the snapshot-making
        // runtime goes on to serve its page); the third is a bare runtime
        const onProgress = (p) => { if (p.phase === "runtime") messages.push(p.message || ""); };
        const rt = i < 2 ? await wd.createEngine({ maxContext: 64, onProgress }) : await wd.createRuntime({ onProgress });
        const startS = (performance.now() - t0) / 1000;
        let out, ids = null;
        try {
            if (i < 2) ids = (await rt.generate("The capital of France is", { maxNewTokens: 2, temperature: 0,
                                                                               stopAtEos: false })).tokenIds;
            out = JSON.parse(await rt.runPython(`
import json, random, sys
import difflib, webdrift.weights.synthetic
json.dumps({"draw": str(random.getrandbits(64)), "api": "webdrift.browser_api" in sys.modules,
            "lazy": difflib.SequenceMatcher(None, "abc", "abd").ratio(),
            "synthetic": webdrift.weights.synthetic.__name__})`));
        } finally { await rt.dispose(); }
        runs.push({ messages, startS, ids, ...out });
        for (let k = 0; i === 0 && k < 300; k++) {        // the first start stores its snapshot in the background
            if ((await (await caches.open("webdrift-runtime-v1")).keys()).length) break;
            await new Promise((r) => setTimeout(r, 100));
        }
    }
    return runs;
}"""


def test_runtime_snapshot_restores_with_fresh_randomness(chromium, server, record):
    pg = chromium.page(server["url"] + "/e2e/blank.html")
    try:
        runs = chromium.eval(pg, RESTARTS, timeout_s=300)
    finally:
        chromium.eval(pg, "async () => (await import('/webdrift.js')).clearRuntimeCache()", timeout_s=30)
    first, *later = runs
    assert "Python is ready" in first["messages"] and not any("restor" in m for m in first["messages"]), first
    for r in later:
        assert "Python is ready (restored)" in r["messages"], r
    for r in runs:
        assert r["api"] and r["synthetic"] == "webdrift.weights.synthetic" and r["lazy"] == 2 / 3, r
    assert len({r["draw"] for r in runs}) == 3, runs
    assert runs[0]["ids"] and runs[0]["ids"] == runs[1]["ids"], runs      # greedy: the same tokens either way
    record("python start: createEngine first start / restored, createRuntime restored s",
           [round(r["startS"], 2) for r in runs])
