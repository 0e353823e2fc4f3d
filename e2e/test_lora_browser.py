"""LoRA in the browser: a tiny model served as the default model, a GGUF LoRA adapter loaded with
engine.loadLora(name, url), and generate(prompt, {lora, loraScale}) giving the desktop engine's
greedy tokens (with the adapter, at half scale, and without it again); DS2D speculative decoding
from a served forecast file ({speculative: "forecast:URL"}), with and without the adapter, gives
the same greedy tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from http import HTTPStatus
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from e2e_util import REPO

sys.path.insert(0, str(REPO / "tests"))
from tiny_model import write_tiny_gguf, write_tiny_lora

PROMPT = "the cat sat"
N_NEW = 6


@pytest.fixture(scope="module")
def lora_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_e2e")
    model = write_tiny_gguf(d / "tiny.gguf")
    return {"model": model, "lora": write_tiny_lora(d / "tiny_lora.gguf", rank=4),
            "forecast": write_tiny_forecast(model, d / "tiny_forecast.safetensors")}


def write_tiny_forecast(model: str, path) -> str:
    """Seeded random forecast vectors (branching 3, 2) for the tiny model: drafts that are rarely
    right, so passes verify trees, accept some and reject most."""
    import random

    from webdrift.runtime.loading import open_source
    from webdrift.weights.forecast import model_meta, write_forecast
    cfg = open_source(model).config
    rng = random.Random(4)
    write_forecast(path, [rng.gauss(0.0, 1.0) for _ in range(2 * cfg.dim)], (3, 2), model_meta(cfg), "tiny")
    return str(path)


@pytest.fixture(scope="module")
def lora_server(bundle, lora_files):
    from webdrift.tools.serve import ServedModel, WebdriftHandler, make_server, serve_in_thread
    lora_bytes = Path(lora_files["lora"]).read_bytes()
    forecast_bytes = Path(lora_files["forecast"]).read_bytes()

    class Handler(WebdriftHandler):
        def _route(self) -> bool:
            path = unquote(urlsplit(self.path).path)
            if path == "/e2e/blank.html":
                self._send_bytes(HTTPStatus.OK, b"<!doctype html><html><body></body></html>", "text/html; charset=utf-8")
            elif path == "/lora/tiny_lora.gguf":
                self._send_bytes(HTTPStatus.OK, lora_bytes, "application/octet-stream")
            elif path == "/lora/tiny_forecast.safetensors":
                self._send_bytes(HTTPStatus.OK, forecast_bytes, "application/octet-stream")
            else:
                return super()._route()
            return True

    srv = make_server(bundle, ServedModel(lora_files["model"], "tiny"), "127.0.0.1", 0, handler=Handler)
    serve_in_thread(srv)
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def desktop_tokens(model: str, lora: str) -> dict:
    """The desktop engine's greedy ids (in a subprocess: Playwright's loop runs in this one)."""
    code = (
        "import json, sys, webdrift\n"
        "eng = webdrift.load(sys.argv[1], loras={'x': sys.argv[2]}, max_lora_rank=8, max_context=128)\n"
        f"kw = dict(max_new_tokens={N_NEW}, stop_at_eos=False)\n"
        f"p = {PROMPT!r}\n"
        "print('RESULT ' + json.dumps({'lora': eng.generate(p, lora='x', **kw).token_ids,\n"
        "    'half': eng.generate(p, lora='x', lora_scale=0.5, **kw).token_ids,\n"
        "    'base': eng.generate(p, **kw).token_ids}))\n")
    r = subprocess.run([sys.executable, "-c", code, model, lora], cwd=REPO, capture_output=True, text=True,
                       timeout=900, check=False)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    return json.loads(line[-1][len("RESULT "):])


def test_load_lora_and_generate_match_desktop(chromium, lora_server, lora_files):
    want = desktop_tokens(lora_files["model"], lora_files["lora"])
    assert want["lora"] != want["base"]
    pg = chromium.page(lora_server + "/e2e/blank.html")
    got = chromium.eval(pg, """async ([prompt, n]) => {
        const wd = await import("/webdrift.js");
        const eng = await wd.createEngine({ maxContext: 128, enableLora: true, maxLoraRank: 8, cache: false });
        const opts = { maxNewTokens: n, temperature: 0, stopAtEos: false };
        const names = await eng.loadLora("x", "/lora/tiny_lora.gguf");
        let missing = null;
        try { await eng.generate(prompt, { ...opts, lora: "nope" }); } catch (e) { missing = e.name + ": " + e.message; }
        const out = {
            names, missing,
            lora: (await eng.generate(prompt, { ...opts, lora: "x" })).tokenIds,
            half: (await eng.generate(prompt, { ...opts, lora: "x", loraScale: 0.5 })).tokenIds,
            base: (await eng.generate(prompt, opts)).tokenIds,
        };
        const fc = { ...opts, speculative: "forecast:../lora/tiny_forecast.safetensors" };   // relative to the page
        const spec = await eng.generate(prompt, fc);
        out.forecast = spec.tokenIds;
        out.passes = spec.stats.specPasses;
        out.forecastLora = (await eng.generate(prompt, { ...fc, lora: "x" })).tokenIds;
        out.left = await eng.removeLora("x");
        await eng.dispose();
        return out;
    }""", [PROMPT, N_NEW], timeout_s=900)
    assert got["names"] == ["x"] and got["left"] == []
    assert got["missing"] and got["missing"].startswith("InvalidArgumentError") and "nope" in got["missing"]
    assert {k: got[k] for k in want} == want
    assert got["forecast"] == want["base"] and got["passes"] > 0
    assert got["forecastLora"] == want["lora"]
