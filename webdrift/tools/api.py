"""`webdrift api`: the desktop engine behind an OpenAI-compatible HTTP API (a desktop tool, stdlib only).

    webdrift api [--model smollm2-135m] [--host 127.0.0.1] [--port 8322] [--api-key KEY]
                 [--max-context N] [--queue 8] [--idle-timeout 30]

Endpoints: GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions (messages with system,
user and assistant roles through the model's chat template) and POST /v1/completions (a text or
token-id prompt); each answers one JSON object, or with `"stream": true` server-sent events
(`data: {chunk}` per text piece, then `data: [DONE]`). The fields, their checks and the answers'
JSON are api_protocol.py's; this module runs them: the engine's worker, HTTP, the command.

Concurrency: one engine, one generation at a time. Requests queue for `GenerationService`'s
worker thread, the only thread that touches the engine; the queue is bounded (full: 503 with
Retry-After). A client that disconnects while its request waits is dropped from the queue; while
its text streams, its generation is stopped (Engine.stop), and the next request starts at once.
A connection silent for `idle_timeout` seconds is closed, and at most `max_connections` are
served at once (more: 503), so no client can hold a thread for ever.

Errors are OpenAI's JSON shape, {"error": {"message", "type", "param", "code"}}: 400 for bad
JSON, types and values (InvalidArgumentError, TokenizerError) and for a prompt plus max_tokens
beyond the context (ContextLengthError, code "context_length_exceeded"), 401 for a missing or
wrong API key, 404 for an unknown model or path, 405, 411, 413 (body over 4 MiB), 503 busy,
500 for anything else (one log line, no traceback to the client).
Must not: import wgpu or numpy; let two generations share the engine, or touch it from any thread
but the worker's; bind beyond loopback without a warning; be imported by the core.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hmac
import ipaddress
import json
import math
import os
import queue
import re
import secrets
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlsplit

from .. import __version__
from ..errors import InvalidArgumentError, WebdriftError
from ..hub import DEFAULT_MODEL
from ..runtime.options import WEIGHT_FORMATS
from .api_protocol import ApiError, Envelope, GenerationRequest, StopStrings, model_card, parse_request, short
from .serve import port_number

DEFAULT_PORT = 8322
QUEUE_SIZE = 8              # requests waiting behind the running one
IDLE_TIMEOUT_S = 30.0       # a connection silent this long (between or inside requests) is closed
MAX_CONNECTIONS = 64        # connections served at once; more are answered 503 and closed
MAX_BODY = 4 << 20          # bytes of request JSON
POLL_S = 0.1                # how often a waiting handler checks that its client is still there
LINGER_S = 0.25             # at most this long reading a refused connection's request before closing it


# -- the engine's one worker -----------------------------------------------------------------------

class Busy(Exception):
    """The queue is full (the handler answers 503 with Retry-After)."""

    def __init__(self, retry_after: int, queued: int):
        super().__init__(f"the server is busy ({queued} requests are waiting for the model); retry after "
                         f"{retry_after} s")
        self.retry_after = retry_after


@dataclass
class Job:
    """A queued generation and the events its handler reads: ("start", prompt_tokens),
    ("text", piece)..., then ("done", (completion_tokens, finish_reason)) or ("error", ApiError)."""

    request: GenerationRequest
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, model_id: str) -> Envelope:
        return Envelope.make(self.request.kind, self.id, self.created, model_id)


@dataclass
class JobRecord:
    """What became of a job (GenerationService.history, newest last)."""

    id: str
    outcome: str               # "stop", "length", "cancelled" (client gone), "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


class GenerationService:
    """The one thread that runs an engine: requests in arrival order, one at a time, from a bounded queue."""

    def __init__(self, engine, queue_size: int = QUEUE_SIZE):
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise InvalidArgumentError(f"queue_size={queue_size!r}: must be an integer >= 1")
        self.engine = engine
        self.queue_size = queue_size
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()           # guards _current against cancel()
        self._engine_lock = threading.Lock()    # held while the engine generates (see exclusive())
        self._current: Job | None = None
        self._mean_s = 1.0                       # running mean of a job's duration, for Retry-After
        self.history: collections.deque[JobRecord] = collections.deque(maxlen=256)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="webdrift-api-engine", daemon=True)
        self._thread.start()

    # -- for the handlers
    def submit(self, request: GenerationRequest) -> Job:
        job = Job(request)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise Busy(self.retry_after(), self._queue.qsize()) from None
        return job

    def cancel(self, job: Job) -> None:
        """The client is gone: drop the job if it waits, stop its generation if it runs."""
        job.cancelled.set()
        with self._lock:
            if self._current is job:
                self.engine.stop()

    def retry_after(self) -> int:
        return max(1, min(60, math.ceil(self._mean_s * (self._queue.qsize() + 1))))

    def exclusive(self):
        """A lock held while the worker generates: hold it to use the engine from another thread."""
        return self._engine_lock

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        with self._lock:
            if self._current is not None:
                self._current.cancelled.set()
                self.engine.stop()
        while True:                               # wake the worker; drop what still waits
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            job.events.put(("error", ApiError(503, "the server is shutting down", type="server_error",
                                              code="shutting_down")))
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout)

    # -- the worker
    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            while not self._closed:
                job = self._queue.get()
                if job is None:
                    break
                if job.cancelled.is_set():
                    self.history.append(JobRecord(job.id, "cancelled"))
                    continue
                with self._lock:
                    self._current = job
                t0 = time.perf_counter()
                rec = JobRecord(job.id, "error")
                try:
                    with self._engine_lock:
                        loop.run_until_complete(self._generate(job, rec))
                except ApiError as e:
                    job.events.put(("error", e))
                except WebdriftError as e:
                    job.events.put(("error", ApiError.from_webdrift(e, job.request.param)))
                except Exception as e:  # noqa: BLE001 - one request's failure must not end the worker
                    sys.stderr.write(f"webdrift api: request {job.id} failed: {type(e).__name__}: {short(e)}\n")
                    job.events.put(("error", ApiError(500, f"internal error ({type(e).__name__})", type="server_error",
                                                      code="internal_error")))
                finally:
                    with self._lock:
                        self._current = None
                    rec.seconds = time.perf_counter() - t0
                    self._mean_s = 0.8 * self._mean_s + 0.2 * rec.seconds
                    self.history.append(rec)
        finally:
            loop.close()

    def _prompt_ids(self, r: GenerationRequest) -> list[int]:
        eng = self.engine
        if r.kind == "chat":
            if not hasattr(eng.tokenizer, "apply_chat_template"):
                raise ApiError(400, "this model has no chat template: use /v1/completions", param="messages",
                               code="invalid_value")
            return eng.chat_prompt(r.prompt)
        return eng.encode_prompt(r.prompt)

    async def _generate(self, job: Job, rec: JobRecord) -> None:
        from ..runtime.engine import SamplingParams
        eng, r = self.engine, job.request
        ids = self._prompt_ids(r)
        n, limit = len(ids), eng.max_context
        if n == 0:
            raise ApiError(400, f"{r.param}: the prompt is empty: give at least one token", param=r.param,
                           code="invalid_value")
        if n >= limit or (r.max_tokens is not None and n + r.max_tokens > limit):
            asked = f" and max_tokens asks for {r.max_tokens} more" if r.max_tokens is not None else ""
            raise ApiError(400, f"This model's maximum context length is {limit} tokens; the prompt has {n}{asked}",
                           param=r.param, code="context_length_exceeded")
        max_new = r.max_tokens if r.max_tokens is not None else limit - n
        sp = SamplingParams.make(**r.sampling(max_new, eng.config.vocab_size))
        rec.prompt_tokens = n
        job.events.put(("start", n))
        stops = [StopStrings(r.stops) for _ in range(r.n)]   # per choice; a choice past its stop string
        results = None                                      # is cut (the others go on)
        if job.cancelled.is_set():
            rec.outcome = "cancelled"
            job.events.put(("error", ApiError(503, "the request was cancelled", type="server_error",
                                              code="cancelled")))
            return
        async for kind, value in eng.aevents(ids, sp):
            if kind == "text":
                i, piece = value if r.n > 1 else (0, value)
                out = stops[i].push(piece)
                if out:
                    job.events.put(("text", (i, out)))
                if all(s.hit for s in stops):
                    eng.stop()
            elif kind == "done":
                results = value if r.n > 1 else [value]
            if job.cancelled.is_set():
                eng.stop()
        for i, s in enumerate(stops):
            tail = s.flush()
            if tail:
                job.events.put(("text", (i, tail)))
        rec.completion_tokens = sum(res.stats.new_tokens for res in results)
        if job.cancelled.is_set():       # the client is gone, or the server is closing (someone may listen)
            rec.outcome = "cancelled"
            job.events.put(("error", ApiError(503, "the generation was stopped: the server is shutting down",
                                              type="server_error", code="shutting_down")))
            return
        finishes = ["stop" if s.hit or res.stats.finish_reason == "eos" else "length"
                    for s, res in zip(stops, results)]
        rec.outcome = finishes[0] if len(set(finishes)) == 1 else ",".join(finishes)
        job.events.put(("done", (rec.completion_tokens, finishes)))


# -- HTTP ------------------------------------------------------------------------------------------

class ClientGone(Exception):
    """The client closed its connection (or stopped reading) before its answer was complete."""


class ApiHandler(BaseHTTPRequestHandler):
    """One connection: requests in OpenAI's protocol, answered from the server's GenerationService."""

    protocol_version = "HTTP/1.1"
    server_version = f"webdrift/{__version__}"
    server: ApiServer

    # -- plumbing
    def setup(self):
        self.timeout = self.server.idle_timeout
        super().setup()

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)

    def send_error(self, code, message=None, explain=None):
        """Errors the http.server machinery raises itself (a bad request line, 414, 431, 501) in
        OpenAI's shape too."""
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        self.close_connection = True
        if self.request_version == "HTTP/0.9":   # not parsed yet: answer with a status line all the same
            self.request_version = "HTTP/1.0"
        self._send_error(ApiError(code, message or phrase, code="_".join(re.findall(r"[a-z0-9]+", phrase.lower()))))

    def _send_json(self, status: int, obj: dict, headers: dict | None = None) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_error(self, e: ApiError) -> None:
        try:
            self._send_json(e.status, e.body(), e.headers)
        except OSError:
            self.close_connection = True

    def _client_gone(self) -> bool:
        """True when the client closed its side (a readable socket with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- routing
    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_OPTIONS(self):
        self._dispatch("OPTIONS")

    ROUTES: ClassVar[dict] = {"/v1/models": ("GET", "HEAD"), "/v1/chat/completions": ("POST",),
                              "/v1/completions": ("POST",)}

    def _dispatch(self, method: str) -> None:
        try:
            self._route(method)
        except ApiError as e:
            self._send_error(e)
        except (ClientGone, ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - contained: one log line, a 500, never a traceback
            sys.stderr.write(f"webdrift api: {method} {short(self.path)}: {type(e).__name__}: {short(e)}\n")
            self.close_connection = True
            if not getattr(self, "_answered", False):
                self._send_error(ApiError(500, f"internal error ({type(e).__name__})", type="server_error",
                                          code="internal_error"))

    def _route(self, method: str) -> None:
        self._answered = False
        srv = self.server
        self._check_host()
        path = unquote(urlsplit(self.path).path)
        models_prefix = "/v1/models/"
        known = self.ROUTES.get(path) or (("GET", "HEAD") if path.startswith(models_prefix) else None)
        if known is None:
            self._drain_body()
            raise ApiError(404, f"Unknown request URL: {method} {short(path, 100)}", code="unknown_url")
        self._check_key()
        if method not in known:
            self._drain_body()
            raise ApiError(405, f"{method} is not allowed on {short(path, 100)} (use {', '.join(known)})",
                           code="method_not_allowed", headers={"Allow": ", ".join(known)})
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [model_card(srv.model_id, srv.created)]})
        elif path.startswith(models_prefix):
            name = path[len(models_prefix):]
            if name != srv.model_id:
                raise ApiError(404, f"The model '{short(name, 80)}' does not exist", param="model",
                               code="model_not_found")
            self._send_json(200, model_card(srv.model_id, srv.created))
        else:
            body = self._read_json()
            kind = "chat" if path == "/v1/chat/completions" else "text"
            self._generate(parse_request(kind, body, srv.model_id))

    def _check_host(self) -> None:
        """On a loopback address, answer only requests addressed to one (a web page that rebinds its
        own name to 127.0.0.1 sends its own name as Host)."""
        if not self.server.loopback:
            return
        host = (self.headers.get("Host") or "").strip().lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]")
        if name in ("localhost", "") or _is_loopback(name):
            return
        self.close_connection = True
        raise ApiError(403, f"Host {short(host, 80)!r} is not a loopback name: this server answers requests to "
                            "localhost only (start it with --host to serve other names)", code="forbidden_host")

    def _check_key(self) -> None:
        key = self.server.api_key
        if key is None:
            return
        auth = self.headers.get("Authorization") or ""
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            self._drain_body()
            raise ApiError(401, "Incorrect or missing API key: send `Authorization: Bearer <key>` with the key this "
                                "server was started with (--api-key)", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    def _drain_body(self) -> None:
        """Read (and drop) a small request body so the connection can carry the next request."""
        n = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") or (n is not None and (not n.isdigit() or int(n) > 1 << 16)):
            self.close_connection = True      # not worth reading: the connection ends after the answer
        elif n:
            self.rfile.read(int(n))

    def _read_json(self):
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ApiError(411, "send the request body with a Content-Length (chunked uploads are not supported)",
                           code="length_required")
        n = self.headers.get("Content-Length")
        if n is None or not n.strip().isdigit():
            self.close_connection = True
            raise ApiError(411, "a Content-Length header is required", code="length_required")
        n = int(n)
        if n > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"the request body has {n} bytes; the limit is {MAX_BODY}", code="body_too_large")
        raw = self.rfile.read(n)
        if len(raw) < n:
            raise ClientGone()
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, ValueError) as e:
            raise ApiError(400, f"We could not parse the JSON body of your request ({short(e, 120)})",
                           code="invalid_json") from None

    # -- generation
    def _next_event(self, job: Job):
        """The job's next event; every POLL_S seconds (also while events keep coming) first checks
        that the client is still there."""
        while True:
            now = time.monotonic()
            if now - self._checked >= POLL_S:
                self._checked = now
                if self._client_gone():
                    raise ClientGone()
            try:
                return job.events.get(timeout=POLL_S)
            except queue.Empty:
                pass

    def _generate(self, r: GenerationRequest) -> None:
        svc = self.server.service
        self._checked = 0.0
        try:
            job = svc.submit(r)
        except Busy as e:
            self.close_connection = True         # the client will come back later: free the thread now
            raise ApiError(503, str(e), type="server_error", code="server_busy",
                           headers={"Retry-After": str(e.retry_after)}) from None
        try:
            kind, value = self._next_event(job)
            if kind == "error":
                raise value
            prompt_tokens = value
            if r.stream:
                self._stream(job, r, prompt_tokens)
            else:
                self._complete(job, r, prompt_tokens)
        except (ClientGone, ConnectionError, TimeoutError):
            svc.cancel(job)
            raise

    def _complete(self, job: Job, r: GenerationRequest, prompt_tokens: int) -> None:
        pieces: list[list[str]] = [[] for _ in range(r.n)]
        while True:
            kind, value = self._next_event(job)
            if kind == "text":
                pieces[value[0]].append(value[1])
            elif kind == "error":
                raise value
            else:
                break
        completion_tokens, finishes = value
        self._answered = True
        self._send_json(200, job.envelope(self.server.model_id).completion(["".join(p) for p in pieces], finishes,
                                                                           prompt_tokens, completion_tokens))

    def _write(self, data: bytes) -> None:
        """Part of a streamed body: an HTTP/1.1 chunk, or (HTTP/1.0 clients) the bytes as they are."""
        if self._chunked:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        elif data:
            self.wfile.write(data)

    def _event(self, obj) -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()
        self._write(b"data: " + data + b"\n\n")

    def _stream(self, job: Job, r: GenerationRequest, prompt_tokens: int) -> None:
        """Server-sent events: the chat's role delta, a chunk per text piece, the finish, the usage
        (if asked), `data: [DONE]`. An error after the headers is the stream's last event."""
        self._answered = True
        self._chunked = self.request_version == "HTTP/1.1"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if self._chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        env = job.envelope(self.server.model_id)
        if r.kind == "chat":
            for i in range(r.n):
                self._event(env.chunk(first=True, with_usage=r.include_usage, index=i))
        while True:
            kind, value = self._next_event(job)
            if kind == "text":
                self._event(env.chunk(value[1], with_usage=r.include_usage, index=value[0]))
            elif kind == "error":
                self._event(value.body())
                break
            else:
                completion_tokens, finishes = value
                for i, finish in enumerate(finishes):
                    self._event(env.chunk(finish=finish, with_usage=r.include_usage, index=i))
                if r.include_usage:
                    self._event(env.usage_chunk(prompt_tokens, completion_tokens))
                break
        self._event(b"[DONE]")
        self._write(b"")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ApiServer(ThreadingHTTPServer):
    """The HTTP server: a GenerationService for one engine, the API key, the connection limit."""

    daemon_threads = True
    request_queue_size = 128      # the listen backlog: bursts of clients wait to be accepted, not reset

    def __init__(self, service: GenerationService, model_id: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 api_key: str | None = None, idle_timeout: float = IDLE_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, verbose: bool = False):
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.service, self.model_id, self.api_key = service, model_id, api_key or None
        self.idle_timeout, self.max_connections, self.verbose = idle_timeout, max_connections, verbose
        self.loopback = _is_loopback(host)
        self.created = int(time.time())
        self._active = 0            # connections being served (each on its thread)
        self.refused = 0            # connections answered 503 for the limit
        self._active_lock = threading.Lock()
        super().__init__((host, port), ApiHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def process_request(self, request, client_address):
        with self._active_lock:
            full = self._active >= self.max_connections
            if not full:
                self._active += 1
        if full:
            self._refuse(request)
            return
        super().process_request(request, client_address)

    def _refuse(self, request) -> None:
        """Over the connection limit: a 503 from the accepting thread (no thread for it), then a
        lingering close: what the client sent is read and dropped for at most LINGER_S, so it gets
        the answer rather than a reset (closing a socket with unread data resets the connection)."""
        self.refused += 1
        body = json.dumps(ApiError(503, f"too many connections (the limit is {self.max_connections}); retry later",
                                   type="server_error", code="server_busy").body()).encode()
        try:
            request.settimeout(LINGER_S)
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            request.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + LINGER_S
            while time.monotonic() < deadline and request.recv(65536):
                pass
        except OSError:
            pass
        self.close_request(request)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._active_lock:
                self._active -= 1

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            sys.stderr.write(f"webdrift api: error answering {client_address[0]}: {type(exc).__name__}: "
                             f"{short(exc)}\n")

    def server_close(self):
        super().server_close()
        self.service.close()


def make_api_server(engine, model_id: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                    api_key: str | None = None, queue_size: int = QUEUE_SIZE, idle_timeout: float = IDLE_TIMEOUT_S,
                    max_connections: int = MAX_CONNECTIONS, verbose: bool = False) -> ApiServer:
    """An ApiServer for a loaded engine (port 0 picks a free port); run it with serve_forever()
    (serve.serve_in_thread runs it in a thread); server_close() also ends the worker."""
    service = GenerationService(engine, queue_size)
    try:
        return ApiServer(service, model_id, host, port, api_key, idle_timeout, max_connections, verbose)
    except BaseException:
        service.close()
        raise


# -- the command -----------------------------------------------------------------------------------

def model_id_for(model: str) -> str:
    """The id /v1/models lists: a known model's name, or a path's file name."""
    from .. import hub
    if model in hub.KNOWN_MODELS:
        return model
    p = Path(model)
    return p.name or model


def host_warning(host: str, api_key: str | None) -> str | None:
    """What `webdrift api` warns about when it listens beyond loopback (None on loopback)."""
    if _is_loopback(host):
        return None
    if api_key:
        return (f"listening on {host}, beyond this machine: anyone who can reach it and has the API key can use "
                "the model; the key and all text travel unencrypted (plain HTTP)")
    return (f"listening on {host}, beyond this machine, with no authentication: anyone who can reach it can use "
            "the model (pass --api-key, or keep the default --host 127.0.0.1)")


def cmd_api(args) -> int:
    import webdrift

    from .cli import _progress_printer
    warning = host_warning(args.host, args.api_key)
    if warning:
        sys.stderr.write(f"webdrift: warning: {warning}\n")
    eng = webdrift.load(args.model, max_context=args.max_context, weight_format=args.weight_format,
                        progress=_progress_printer("loading"))
    model_id = args.model_id or model_id_for(args.model)
    try:
        srv = make_api_server(eng, model_id, args.host, args.port, args.api_key, args.queue, args.idle_timeout,
                              verbose=args.verbose)
    except (OSError, OverflowError) as e:
        raise InvalidArgumentError(f"cannot listen on {args.host}:{args.port}: "
                                   f"{getattr(e, 'strerror', None) or e}") from e
    sys.stderr.write(f"webdrift: model {model_id} on {eng.dev.info.adapter} (context {eng.max_context} tokens); "
                     f"one generation at a time, {args.queue} more may wait\n")
    print(f"webdrift: OpenAI-compatible API at {srv.url}/v1   (Ctrl-C stops)", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (v > 0 and math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"{text} must be > 0")
        return v
    return parse


def add_api_parser(subparsers) -> argparse.ArgumentParser:
    """Register `webdrift api` on the CLI's subparsers."""
    p = subparsers.add_parser("api", help="serve the desktop engine over an OpenAI-compatible HTTP API")
    p.add_argument("--model", default=DEFAULT_MODEL, help="known name, .gguf path or HF folder (default %(default)s)")
    p.add_argument("--model-id", default=None, help="the id /v1/models lists (default: the model's name or file name)")
    p.add_argument("--max-context", type=int, default=None, help="KV cache length (default min(model, 2048))")
    p.add_argument("--weight-format", choices=WEIGHT_FORMATS, default=None,
                   help="runtime weight format (default follows the file)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default %(default)s: this machine only; others print a warning)")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="port (default %(default)s; 0 picks one)")
    p.add_argument("--api-key", default=os.environ.get("WEBDRIFT_API_KEY") or None,
                   help="require `Authorization: Bearer KEY` (default: $WEBDRIFT_API_KEY, else none)")
    p.add_argument("--queue", type=_positive(int), default=QUEUE_SIZE,
                   help="requests that may wait behind the running one; more get 503 (default %(default)s)")
    p.add_argument("--idle-timeout", type=_positive(float), default=IDLE_TIMEOUT_S,
                   help="seconds a silent connection is kept (default %(default)s)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    p.set_defaults(func=cmd_api)
    return p
