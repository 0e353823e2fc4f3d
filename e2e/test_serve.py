"""`webdrift serve` and the bundle without a browser: MIME types, headers, the default model's
descriptor, revalidation, no folder listings or path escapes; the bundle's wheels."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
import zipfile

import pytest


def _get(url: str, method: str = "GET", headers: dict | None = None):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.mark.parametrize("path, ctype", [
    ("/", "text/html"), ("/index.html", "text/html"), ("/webdrift.js", "text/javascript"),
    ("/worker.js", "text/javascript"), ("/app.js", "text/javascript"), ("/style.css", "text/css"),
    ("/pyodide/pyodide.mjs", "text/javascript"), ("/pyodide/pyodide.asm.mjs", "text/javascript"),
    ("/pyodide/pyodide.asm.wasm", "application/wasm"), ("/manifest.json", "application/json"),
    ("/models/default.json", "application/json"),
])
def test_mime_types_and_headers(server, path, ctype):
    status, headers, _ = _get(server["url"] + path, "HEAD")
    assert status == 200, path
    assert headers["Content-Type"].startswith(ctype), (path, headers["Content-Type"])
    assert headers["X-Content-Type-Options"] == "nosniff"
    if ctype in ("text/html", "text/javascript"):
        assert "connect-src 'self'" in headers["Content-Security-Policy"]


def test_default_model_descriptor_and_file(server):
    m = server["model"]
    status, _, body = _get(server["url"] + "/models/default.json")
    d = json.loads(body)
    assert status == 200 and d["url"] == m.file and d["size"] == m.size and len(d["sha256"]) == 64
    status, headers, _ = _get(server["url"] + f"/models/{m.file}", "HEAD")
    assert status == 200 and int(headers["Content-Length"]) == m.size
    status, _, body = _get(server["url"] + f"/models/{m.file}.sha256")
    assert body.decode().split()[0] == d["sha256"]
    h = hashlib.sha256(m.path.read_bytes()).hexdigest()
    assert d["sha256"] == h


def test_revalidation_answers_304(server):
    _, headers, _ = _get(server["url"] + "/pyodide/pyodide.asm.wasm", "HEAD")
    status2, _, body = _get(server["url"] + "/pyodide/pyodide.asm.wasm", headers={"If-None-Match": headers["ETag"]})
    assert status2 == 304 and body == b""


@pytest.mark.parametrize("path", ["/wheels/", "/pyodide/", "/../pyproject.toml", "/%2e%2e/pyproject.toml",
                                  "/models/other.gguf", "/nope.js"])
def test_no_listings_or_escapes(server, path):
    req = urllib.request.Request(server["url"] + path)
    req.selector = path   # keep "..": urllib would normalise it away
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    assert status == 404, path


def test_cli_registers_serve():
    from webdrift.tools.cli import build_parser
    args = build_parser().parse_args(["serve", "--port", "0", "--host", "127.0.0.1", "--model", "x.gguf"])
    assert args.cmd == "serve" and args.port == 0 and args.host == "127.0.0.1" and args.model == "x.gguf"
    assert args.func.__name__ == "cmd_serve"


def test_bundle_wheels(bundle):
    from build_wasm.build import PYODIDE_VERSION, REPO, check_webdrift_wheel
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["pyodide"] == PYODIDE_VERSION
    names = [w.split("/")[-1] for w in manifest["wheels"]]
    assert [n.split("-")[0] for n in names] == ["markupsafe", "jinja2", "webdrift"]
    assert all(n.endswith("-py3-none-any.whl") for n in names)
    check_webdrift_wheel(bundle / "wheels" / names[2], REPO)         # every WGSL template is inside
    ms = zipfile.ZipFile(bundle / "wheels" / names[0]).namelist()
    assert "markupsafe/_native.py" in ms and not any(n.endswith((".c", ".so")) for n in ms)
