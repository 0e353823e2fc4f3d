"""Bad input in the browser: no WebGPU, a model URL that 404s, a download cut short, a sha256
mismatch, a file that is not a model. Each rejects createEngine() with an Error saying what
failed, and the browser cache never keeps a broken file."""

from __future__ import annotations

import pytest
from e2e_util import ARTIFACTS, NO_WEBGPU_ARGS, Chromium

LOAD = """async (model) => {
    const wd = await import("/webdrift.js");
    const t0 = performance.now();
    try {
        const eng = await wd.createEngine({ model, maxContext: 64 });
        await eng.dispose();
        return { ok: true };
    } catch (e) {
        const c = await caches.open("webdrift-models-v1");
        const keys = (await c.keys()).map((r) => r.url);
        return { ok: false, name: e.name, message: e.message, ms: performance.now() - t0, cached: keys };
    }
}"""


@pytest.fixture(scope="module")
def blank(chromium, server):
    pg = chromium.page(server["url"] + "/e2e/blank.html")
    yield pg
    pg.close()


@pytest.mark.parametrize("path, name, words", [
    ("/bad/missing.gguf", "DownloadError", ["HTTP 404", "missing.gguf"]),
    ("/bad/truncated.gguf", "DownloadError", ["truncated.gguf"]),
    ("/bad/short.gguf", "ModelFileError", ["truncated or corrupt", "short.gguf"]),
    ("/bad/corrupt.gguf", "ModelFileError", ["sha256 mismatch", "corrupt.gguf"]),
    ("/bad/notamodel.gguf", "ModelFileError", ["not a model file", "GGUF", "notamodel.gguf"]),
])
def test_bad_model_is_rejected_and_never_cached(chromium, blank, server, path, name, words):
    r = chromium.eval(blank, LOAD, server["url"] + path, timeout_s=300)
    assert not r["ok"], f"{path} loaded"
    assert r["name"] == name, r
    for w in words:
        assert w in r["message"], r
    if path == "/bad/truncated.gguf":
        assert "truncated" in r["message"] or "interrupted" in r["message"], r
    assert not any("/bad/" in u for u in r["cached"]), r["cached"]


def test_damaged_cache_entry_is_dropped(chromium, blank, server):
    """A cached copy whose bytes do not match its recorded sha256 is deleted, not used."""
    r = chromium.eval(blank, """async (url) => {
        const c = await caches.open("webdrift-models-v1");
        await c.put(url, new Response(new Uint8Array([71, 71, 85, 70, 1, 2, 3, 4]),
                                      { headers: { "x-webdrift-sha256": "00".repeat(32) } }));
        const wd = await import("/webdrift.js");
        let err = null;
        try { await wd.createEngine({ model: url }); } catch (e) { err = { name: e.name, message: e.message }; }
        return { err, still: !!(await c.match(url)) };
    }""", server["url"] + "/bad/missing.gguf", timeout_s=300)
    assert r["err"]["name"] == "DownloadError" and "404" in r["err"]["message"], r
    assert r["still"] is False


def test_no_webgpu_is_explained(server):
    """Without --enable-unsafe-webgpu this Chromium has navigator.gpu but no adapter; with
    navigator.gpu removed there is no WebGPU at all. Page and createEngine say so and what to do."""
    c = Chromium(NO_WEBGPU_ARGS)
    try:
        pg = c.page(server["url"] + "/e2e/blank.html")
        r = c.eval(pg, LOAD, None, timeout_s=300)
        assert r["name"] == "GPUError" and "no GPU adapter" in r["message"] and "Chrome" in r["message"], r
        pg.close()
        # the demo page, in a browser whose pages have no navigator.gpu at all
        c.context.add_init_script("delete Navigator.prototype.gpu;")
        pg = c.page(server["url"] + "/")
        pg.wait_for_function("document.body.dataset.state === 'error'", timeout=60_000)
        text = pg.inner_text("#error")
        assert "WebGPU" in text and "Chrome" in text, text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / "no-webgpu.png"))
        r = c.eval(pg, """async () => {
            const wd = await import("/webdrift.js");
            try { await wd.createEngine(); return null; } catch (e) { return { name: e.name, message: e.message }; }
        }""", timeout_s=60)
        assert r["name"] == "GPUError" and "navigator.gpu is missing" in r["message"], r
    finally:
        c.close()
