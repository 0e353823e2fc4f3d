"""Fixtures for the browser end-to-end tests: the bundle, a local server, headless Chromium.

Chromium is Debian's (/usr/bin/chromium, or $WEBDRIFT_CHROMIUM), driven by Playwright's Python
package (never `playwright install`). WebGPU comes from SwiftShader (no shader-f16; slow), so
engines use max_context=256 and generations stay short. Every evaluation in a page has a
timeout; after a timeout the browser is restarted (an endless shader can hang the GPU process).
Timings worth knowing are printed and collected in e2e/artifacts/timings.json; screenshots go
to e2e/artifacts/. Run: python -m pytest e2e -q
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_util import (
    CHROMIUM,
    CHROMIUM_ARGS,
    FALLBACK_GGUF,
    MAX_CONTEXT,
    MODEL_NAME,
    REPO,
    BadFiles,
    Chromium,
    make_handler,
    record,
    timings,
    write_timings,
)


@pytest.fixture(scope="session", name="record")
def record_fixture():
    """record(name, value): print a measurement and keep it for timings.json."""
    return record


def pytest_sessionfinish(session, exitstatus):
    if timings:
        lines = write_timings()
        sys.stderr.write(f"\n[e2e] measurements (also in e2e/artifacts/timings.json):\n{lines}\n")

# -- what the tests need on this machine -------------------------------------------------------------

def _have_playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
        return True
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    reason = None
    if not _have_playwright():
        reason = "the playwright Python package is not installed"
    elif not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        reason = f"no Chromium at {CHROMIUM} (apt-get install chromium, or set WEBDRIFT_CHROMIUM)"
    if reason:
        for it in items:
            if Path(str(it.fspath)).parent.name == "e2e":
                it.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def model_path() -> Path:
    from webdrift.errors import WebdriftError
    try:
        from webdrift import hub
        return Path(hub.pull(MODEL_NAME, progress=False))
    except (ImportError, OSError, WebdriftError) as e:
        if FALLBACK_GGUF.is_file():
            return FALLBACK_GGUF
        pytest.skip(f"the {MODEL_NAME} GGUF is not available ({e})")


@pytest.fixture(scope="session")
def bundle() -> Path:
    from webdrift.tools.serve import ensure_bundle
    t0 = time.time()
    out = ensure_bundle(REPO / "bundle")
    record("bundle_build_or_check_s", round(time.time() - t0, 1))
    return out


@pytest.fixture(scope="session")
def bad_files(model_path) -> BadFiles:
    return BadFiles(model_path)


@pytest.fixture(scope="session")
def server(bundle, model_path, bad_files):
    from webdrift import hub
    from webdrift.tools.serve import ServedModel, make_server, serve_in_thread
    known = hub.KNOWN_MODELS.get(MODEL_NAME)
    sha = known.sha256 if known is not None and model_path.name == known.filename else None
    model = ServedModel(model_path, MODEL_NAME, sha)
    srv = make_server(bundle, model, "127.0.0.1", 0, handler=make_handler(bad_files))
    serve_in_thread(srv)
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield {"url": url, "model": model}
    srv.shutdown()
    srv.server_close()


# -- Chromium and the shared engine -----------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def chromium():
    c = Chromium(CHROMIUM_ARGS)
    yield c
    c.close()
    Chromium.stop_driver()


@pytest.fixture(scope="session")
def engine_page(chromium, server):
    """A page holding one loaded engine (`window.eng`, default model, max_context 256)."""
    pg = chromium.page(server["url"] + "/e2e/blank.html")
    t0 = time.time()
    info = chromium.eval(pg, """async (maxContext) => {
        const wd = await import("/webdrift.js");
        window.wd = wd;
        window.eng = await wd.createEngine({ maxContext });
        return window.eng.info;
    }""", MAX_CONTEXT, timeout_s=600)
    record("cold visit: createEngine() -> ready s (download + Python + weights)", round(time.time() - t0, 1))
    record("adapter", info["adapter"])
    return pg


@pytest.fixture(scope="session")
def desktop_reference(model_path):
    """Greedy token ids from the desktop engine (wgpu-native), computed in a subprocess."""
    def run(prompts: list[str], n: int = 8) -> list[list[int]]:
        code = (
            "import json, sys, webdrift\n"
            f"eng = webdrift.load({str(model_path)!r})\n"
            f"out = [eng.generate(p, max_new_tokens={n}, temperature=0, stop_at_eos=False).token_ids "
            "for p in json.loads(sys.argv[1])]\n"
            "print('RESULT ' + json.dumps(out))\n"
        )
        t0 = time.time()
        r = subprocess.run([sys.executable, "-c", code, json.dumps(prompts)], cwd=REPO, capture_output=True,
                           text=True, timeout=1500, check=False)
        if r.returncode != 0:
            raise AssertionError(f"desktop reference failed:\n{r.stderr[-3000:]}")
        record("desktop_reference_s", round(time.time() - t0, 1))
        line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
        return json.loads(line[len("RESULT "):])
    return run
