"""`webdrift serve` as a hostile client would try it (issue 15, item 9), without a browser: an
over-long path segment, an idle half-open connection, dotfiles in the bundle folder, a model
file whose name holds `#` and spaces. The bundle here is a folder of a few small files; the
real bundle's MIME types and headers are tested in e2e/test_serve.py."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import quote, urldefrag, urljoin

import pytest

from webdrift.tools.serve import ServedModel, make_server, serve_in_thread

MODEL_NAME = "my model #1.gguf"


@pytest.fixture()
def site(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "sub").mkdir(parents=True)
    (bundle / "index.html").write_text("<p>webdrift</p>\n")
    (bundle / "manifest.json").write_text("{}")
    (bundle / ".secret").write_text("token=s3cret\n")
    (bundle / ".git").mkdir()
    (bundle / ".git" / "config").write_text("[remote]\n")
    (bundle / "sub" / ".env").write_text("KEY=1\n")
    (bundle / "sub" / "page.html").write_text("<p>sub</p>\n")
    model = tmp_path / MODEL_NAME
    model.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    served = ServedModel(model, "odd-name")
    srv = make_server(bundle, served, "127.0.0.1", 0, idle_timeout=1.0)
    serve_in_thread(srv)
    yield {"url": f"http://127.0.0.1:{srv.server_address[1]}", "port": srv.server_address[1], "model": served,
           "server": srv}
    srv.shutdown()
    srv.server_close()


def _get(url: str, raw_path: str | None = None):
    req = urllib.request.Request(url)
    if raw_path is not None:
        req.selector = raw_path          # sent as written (urllib would normalise "..", "%2e")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_long_path_segment_answers_404_without_traceback(site, capfd):
    for path in ("/" + "a" * 300, "/sub/" + "b" * 256 + "/x.html", "/models/" + "c" * 400 + ".gguf",
                 "/" + "%41" * 300):
        status, body = _get(site["url"] + path, raw_path=path)
        assert status in (404, 414), path
        assert len(body) < 1024
    # the server still answers normally, and nothing was logged per request
    assert _get(site["url"] + "/index.html") == (200, b"<p>webdrift</p>\n")
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Errno 36" not in err, err[:2000]


def test_idle_half_open_connection_times_out(site):
    threads_before = threading.active_count()
    t0 = time.monotonic()
    conns = []
    for opening in (b"", b"GET / HTTP/1.1\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n"):   # silent, half a request
        s = socket.create_connection(("127.0.0.1", site["port"]))
        s.sendall(opening)
        s.settimeout(8)
        conns.append(s)
    for s in conns:
        try:
            data = s.recv(4096)        # the server closes (b"") or answers 408 and closes
            while data and s.recv(4096):
                pass
        except TimeoutError:
            pytest.fail("the server kept an idle connection open for 8 s (its idle timeout is 1 s)")
        finally:
            s.close()
    assert time.monotonic() - t0 < 6
    deadline = time.monotonic() + 5
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads_before


@pytest.mark.parametrize("path", ["/.secret", "/.git/config", "/sub/.env", "/%2esecret", "/sub/%2Eenv",
                                  "/.git/", "/sub/../.secret"])
def test_dotfiles_are_never_served(site, path):
    status, body = _get(site["url"] + path, raw_path=path)
    assert status == 404, (path, body)
    assert b"s3cret" not in body and b"KEY=1" not in body and b"[remote]" not in body


def test_ordinary_files_in_subfolders_still_served(site):
    assert _get(site["url"] + "/sub/page.html") == (200, b"<p>sub</p>\n")
    assert _get(site["url"] + "/") == (200, b"<p>webdrift</p>\n")


def _browser_resolve(ref: str, base: str) -> str:
    """`new URL(ref, base).href` as the page computes it (node's WHATWG URL where installed; the same
    steps in Python otherwise: resolve, drop the fragment, percent-encode what a path cannot hold)."""
    node = shutil.which("node")
    if node:
        return subprocess.run([node, "-e", "console.log(new URL(process.argv[1], process.argv[2]).href)", ref, base],
                              capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    url, _fragment = urldefrag(urljoin(base, ref))
    return quote(url, safe=":/%?=&")


def test_model_file_name_with_hash_and_spaces_loads_from_the_descriptor(site):
    m = site["model"]
    listing = site["url"] + "/models/default.json"
    status, body = _get(listing)
    d = json.loads(body)
    assert status == 200 and d["file"] == MODEL_NAME and d["size"] == m.size
    url = _browser_resolve(d["url"], listing)          # what webdrift.js fetches
    status, data = _get(url)
    assert status == 200 and data == m.path.read_bytes(), url
    status, sha = _get(_browser_resolve(d["url"], listing) + ".sha256")   # worker.js: spec.url + ".sha256"
    assert status == 200 and sha.decode().split()[0] == d["sha256"]


def test_bundle_model_descriptor_quotes_the_file_name(tmp_path):
    from build_wasm.build import model_entry
    p = tmp_path / MODEL_NAME
    p.write_bytes(b"GGUF" + b"\0" * 60)
    e = model_entry(p, "odd")
    assert e["file"] == MODEL_NAME and e["url"] == "my%20model%20%231.gguf" and e["size"] == 64
