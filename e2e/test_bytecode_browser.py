"""The bundle's precompiled Python (build_wasm's bytecode step) as a page runs it (headless Chromium).

The build adds unchecked-hash .pyc files to the wheels and to Pyodide's python_stdlib.zip
(docs/BROWSER.md, "A returning visitor's wait"). In the page's worker, the loaders must take them:
asking each loader for a module's code compiles nothing from source for webdrift's modules, jinja2
and the stdlib modules of the build's imports, while a stdlib module outside them still compiles
(the spy sees it), and every shipped .pyc carries its source's hash.
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
