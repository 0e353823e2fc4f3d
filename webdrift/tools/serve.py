"""`webdrift serve`: the browser demo and JS module on a local web server (a desktop tool, stdlib only).

    webdrift serve [--port 8321] [--host 127.0.0.1] [--model smollm2-135m] [--bundle DIR]

Builds the browser bundle if it is missing or stale (build_wasm: from a source checkout, or from
an installed webdrift, whose wheel carries web/ and build_wasm/ as package data of webdrift.tools;
`bundle_builder()` picks the one this file belongs to), then serves it: the demo page at `/`, the module at `/webdrift.js`, and the model at
`/models/<file>.gguf` with `/models/default.json` ({name, url, size, sha256}: what
`createEngine()` loads when given no model) and `/models/<file>.gguf.sha256`.
Nothing is fetched from anywhere else: the pages run Python (Pyodide) and the model on the
visitor's GPU, and a Content-Security-Policy keeps their requests on this origin.
Hostile input gets a short 404 (dotfiles, path segments no file system holds, escapes), never a
traceback or a dropped connection; a connection idle for `idle_timeout` seconds is closed.
Must not: import numpy, wgpu or the GPU stack (it only serves files); bind beyond 127.0.0.1
unless asked with --host; serve a dotfile or list a folder; be imported by the core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import threading
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote, unquote, urlsplit

from ..errors import InvalidArgumentError, ModelNotFoundError
from ..hub import DEFAULT_MODEL, sha256_file

DEFAULT_PORT = 8321
IDLE_TIMEOUT_S = 30.0   # a connection that sends nothing for this long is closed (slow or half-open clients)
NAME_MAX = 255          # bytes in one path segment (POSIX NAME_MAX): no served file has a longer one
REPO = Path(__file__).resolve().parents[2]   # the source checkout, if this file is in one (webdrift/tools/serve.py)

MIME = {
    ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
    ".json": "application/json", ".wasm": "application/wasm", ".zip": "application/zip",
    ".whl": "application/zip", ".gguf": "application/octet-stream", ".sha256": "text/plain; charset=utf-8",
    ".map": "application/json", ".png": "image/png", ".svg": "image/svg+xml", ".ico": "image/x-icon",
}
# The pages talk only to this origin. 'wasm-unsafe-eval' compiles Pyodide; 'unsafe-eval' lets
# Pyodide (and webdrift's small JS helpers, pyodide.code.run_js) evaluate code it generates.
CSP = ("default-src 'self'; script-src 'self' 'wasm-unsafe-eval' 'unsafe-eval'; worker-src 'self'; "
       "connect-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; object-src 'none'; "
       "base-uri 'self'; frame-ancestors 'self'")


class ServedModel:
    """The GGUF served at /models/<file>, with its sha256 (known or computed once)."""

    def __init__(self, path: str | os.PathLike, name: str, sha256: str | None = None):
        self.path = Path(path).resolve()
        self.name = name
        self.size = self.path.stat().st_size
        self.sha256 = sha256 or sha256_file(self.path)

    @property
    def file(self) -> str:
        return self.path.name

    def descriptor(self) -> dict:
        """models/default.json: `url` is relative to it and percent-encoded (a `#` or space in a file
        name would otherwise end or break the URL the page resolves); `file` is the name as it is."""
        return {"name": self.name, "url": quote(self.file), "file": self.file, "size": self.size,
                "sha256": self.sha256}


def resolve_served_model(model: str | None) -> ServedModel | None:
    """A known model name (pulled with webdrift.hub if needed) or a .gguf path -> ServedModel."""
    if not model:
        return None
    from .. import hub
    p = Path(model)
    if p.is_file():
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                raise InvalidArgumentError(f"--model {model}: the browser engine loads GGUF files only")
        return ServedModel(p, p.stem)
    if model not in hub.KNOWN_MODELS:
        raise ModelNotFoundError(f"--model {model!r} is neither a .gguf file nor a known model "
                                 f"({', '.join(sorted(hub.KNOWN_MODELS))})")
    known = hub.KNOWN_MODELS[model]
    path = hub.pull(model)
    if not str(path).endswith(".gguf"):
        raise InvalidArgumentError(f"--model {model}: the browser engine loads GGUF files only")
    return ServedModel(path, model, getattr(known, "sha256", None))


class WebdriftHandler(SimpleHTTPRequestHandler):
    """Static files from the bundle + the served model; correct MIME types; no directory listings."""

    server_version = "webdrift"
    extensions_map: ClassVar[dict] = {**SimpleHTTPRequestHandler.extensions_map, **MIME}
    model: ServedModel | None = None
    quiet = True
    timeout = IDLE_TIMEOUT_S   # seconds a connection may stay silent (make_server sets its own)
    _head_only = False
    _sent = False

    def __init__(self, *args, directory=None, model=None, quiet=True, **kw):
        self.model = model
        self.quiet = quiet
        super().__init__(*args, directory=directory, **kw)

    # -- routing ---------------------------------------------------------------------------------
    def _route(self) -> bool:
        """Serve /models/... ; return False to fall through to the bundle's static files."""
        path = unquote(urlsplit(self.path).path)
        m = self.model
        if path == "/models/default.json":
            if m is None:
                self._send_bytes(HTTPStatus.NOT_FOUND, b'{"error": "no default model"}', "application/json")
            else:
                self._send_bytes(HTTPStatus.OK, json.dumps(m.descriptor()).encode(), "application/json")
            return True
        if m is not None and path == f"/models/{m.file}":
            self._send_file(m.path, "application/octet-stream", cache=True)
            return True
        if m is not None and path == f"/models/{m.file}.sha256":
            self._send_bytes(HTTPStatus.OK, f"{m.sha256}  {m.file}\n".encode(), MIME[".sha256"])
            return True
        return False

    def do_GET(self):
        self._head_only = False
        self._answer()

    def do_HEAD(self):
        self._head_only = True
        self._answer()

    def _answer(self):
        """One request: a route or a static file. An unexpected error answers 500 (if nothing was
        sent yet) and logs one line; it never drops the connection with a traceback."""
        self._sent = False
        try:
            if not self._route():
                self._static()
        except (ConnectionError, TimeoutError):
            self.close_connection = True       # the client went away or stalled mid-answer
        except Exception as e:  # noqa: BLE001 - the one place a request's failure is contained
            self.close_connection = True
            sys.stderr.write(f"webdrift serve: {self.command} {_short(self.path)}: {type(e).__name__}: "
                             f"{_short(str(e))}\n")
            if not self._sent:
                try:
                    self._send_bytes(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", "text/plain")
                except OSError:
                    pass

    def send_response(self, code, message=None):
        self._sent = True     # from here on an error can only close the connection
        super().send_response(code, message)

    def _static(self):
        path = unquote(urlsplit(self.path).path)
        if not servable_path(path):
            self._send_bytes(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
            return
        if path.endswith("/"):
            path += "index.html"
        root = Path(self.directory).resolve()
        try:
            fs = Path(self.translate_path(path)).resolve()
            fs.relative_to(root)
            found = fs.is_file()
        except (OSError, ValueError):       # an escape, or a name the file system refuses
            found = False
        if not found:
            self._send_bytes(HTTPStatus.NOT_FOUND, f"not found: {_short(path)}\n".encode(), "text/plain")
            return
        self._send_file(fs, self.guess_type(str(fs)), cache=fs.suffix == ".gguf")

    # -- responses -------------------------------------------------------------------------------
    def _common_headers(self, ctype: str, length: int, cache: bool):
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        self.send_header("Cache-Control", "public, max-age=3600" if cache else "no-cache")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Referrer-Policy", "no-referrer")
        if ctype.startswith(("text/html", "text/javascript")):
            self.send_header("Content-Security-Policy", CSP)

    def _send_bytes(self, status, body: bytes, ctype: str):
        self.send_response(status)
        self._common_headers(ctype, len(body), cache=False)
        self.end_headers()
        if not self._head_only:
            self.wfile.write(body)

    def _send_file(self, path: Path, ctype: str, cache: bool = False):
        """A file with an ETag: a revalidation answers 304, so browsers reuse their copy (and
        V8's cache of compiled WebAssembly) instead of fetching Pyodide again."""
        try:
            st = path.stat()
            f = open(path, "rb")  # noqa: SIM115 - closed below; a missing file answers 404 first
        except OSError:
            self._send_bytes(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
            return
        etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        with f:
            if etag in (self.headers.get("If-None-Match") or ""):
                self.send_response(HTTPStatus.NOT_MODIFIED)
                self.send_header("ETag", etag)
                self.send_header("Cache-Control", "public, max-age=3600" if cache else "no-cache")
                self.end_headers()
                return
            self.send_response(HTTPStatus.OK)
            self._common_headers(ctype, st.st_size, cache)
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", self.date_time_string(int(st.st_mtime)))
            self.end_headers()
            if self._head_only:
                return
            try:
                shutil.copyfileobj(f, self.wfile, 1 << 20)
            except (ConnectionError, TimeoutError):
                self.close_connection = True   # the page went away (or stopped reading) mid-download

    def guess_type(self, path):
        return MIME.get(Path(path).suffix.lower()) or super().guess_type(path)

    def list_directory(self, path):  # never list folders
        self._send_bytes(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def log_message(self, fmt, *args):
        if not self.quiet:
            super().log_message(fmt, *args)

    def log_error(self, fmt, *args):
        if not self.quiet:
            super().log_error(fmt, *args)


def _short(text: str, limit: int = 200) -> str:
    """A client-supplied string cut to `limit` characters for a log line or an error body."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def servable_path(path: str) -> bool:
    """False for a URL path (percent-decoded) that names nothing a bundle may serve: a segment that
    starts with "." (dotfiles such as .git/ or .env, and "..") or is longer than a file name can be."""
    for seg in path.split("/"):
        if seg.startswith(".") or len(seg.encode("utf-8", "surrogatepass")) > NAME_MAX:
            return False
    return "\0" not in path


class StaticServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that listens on IPv6 addresses too, and logs an error a handler did not
    contain as one line (socketserver prints a traceback per request)."""

    daemon_threads = True

    def __init__(self, address, handler, bind_and_activate: bool = True):
        if ":" in str(address[0]):
            self.address_family = socket.AF_INET6
        super().__init__(address, handler, bind_and_activate)

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        sys.stderr.write(f"webdrift: error answering {client_address[0]}: {type(exc).__name__}: "
                         f"{_short(str(exc))}\n")


def port_number(text: str) -> int:
    """argparse type of --port: an integer in 0..65535 (0 picks a free port)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0..65535; 0 picks a free one)")
    return port


def source_checkout() -> Path | None:
    """The source checkout this webdrift runs from (pyproject.toml, web/ and build_wasm/ beside the
    package), or None for an installed package."""
    if all((REPO / p).exists() for p in ("pyproject.toml", "web/webdrift.js", "build_wasm/build.py")):
        return REPO
    return None


def bundle_builder():
    """The build_wasm.build module of this webdrift: the checkout's build_wasm/, or, installed, the
    copy the wheel carries as webdrift.tools.build_wasm (with the web assets in webdrift/tools/web)."""
    root = source_checkout()
    if root is None:
        from .build_wasm import build
        return build
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from build_wasm import build
    return build


def default_bundle_dir() -> Path:
    """bundle/ in a source checkout; $WEBDRIFT_CACHE/bundle for an installed package."""
    return bundle_builder().default_out()


def ensure_bundle(bundle: Path | None = None, build: bool = True) -> Path:
    """The bundle folder, built with build_wasm when missing or stale."""
    bundle = Path(bundle) if bundle else default_bundle_dir()
    if not build:
        if not (bundle / "manifest.json").is_file():
            raise InvalidArgumentError(f"{bundle} is not a built bundle (no manifest.json): "
                                       "run `webdrift serve` without --no-build, or python -m build_wasm --out DIR")
        return bundle.resolve()
    builder = bundle_builder()
    try:
        return builder.ensure_bundle(bundle, builder.REPO)
    except builder.BuildError as e:
        raise InvalidArgumentError(f"building the browser bundle failed: {e}") from e


def make_server(bundle: Path, model: ServedModel | None, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                quiet: bool = True, handler: type[WebdriftHandler] = WebdriftHandler,
                idle_timeout: float = IDLE_TIMEOUT_S) -> ThreadingHTTPServer:
    """A threading server serving `bundle` and `model` (port 0 picks a free port). Each connection's
    socket times out after `idle_timeout` seconds without progress, which ends its thread."""
    handler = type(handler.__name__, (handler,), {"timeout": idle_timeout})
    h = partial(handler, directory=str(bundle), model=model, quiet=quiet)
    return StaticServer((host, port), h)


def serve_in_thread(srv: ThreadingHTTPServer) -> threading.Thread:
    t = threading.Thread(target=srv.serve_forever, name="webdrift-serve", daemon=True)
    t.start()
    return t


def cmd_serve(args) -> int:
    bundle = ensure_bundle(Path(args.bundle) if args.bundle else None, build=not args.no_build)
    model = resolve_served_model(args.model)
    try:
        srv = make_server(bundle, model, args.host, args.port, quiet=not args.verbose)
    except (OSError, OverflowError) as e:
        raise InvalidArgumentError(f"cannot listen on {args.host}:{args.port}: "
                                   f"{getattr(e, 'strerror', None) or e}") from e
    host, port = srv.server_address[:2]
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(f"webdrift: serving {bundle}\n")
    if model:
        sys.stderr.write(f"webdrift: model {model.name} ({model.file}, {model.size / 1e6:.1f} MB, sha256 {model.sha256[:12]}...)\n")
    print(f"webdrift: open http://{shown}:{port}/   (module: http://{shown}:{port}/webdrift.js; Ctrl-C stops)",
          flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Register `webdrift serve` on the CLI's subparsers."""
    p = subparsers.add_parser("serve", help="serve the browser demo, webdrift.js and a model locally")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                   help="port (default %(default)s; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s: this machine only)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="known model name or .gguf path served as the default model (default %(default)s)")
    p.add_argument("--bundle", default=None,
                   help="bundle folder (default: bundle/ in a source checkout, $WEBDRIFT_CACHE/bundle when installed)")
    p.add_argument("--no-build", action="store_true", help="serve the bundle as it is (do not rebuild)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    p.set_defaults(func=cmd_serve)
    return p
