"""`webdrift api` (webdrift/tools/api.py), the OpenAI-compatible server, as its clients use it:
the real `openai` client (streaming and not), raw HTTP and curl for the errors, the concurrency
policy (a bounded queue answering 503, a disconnect stopping its generation, idle connections
closed, a connection limit), and a load test: 16 clients x 10 requests, each answer equal to the
same request run alone on the engine, host RSS and device bytes flat after warm-up.

The model is the synthetic "tiny" one (random weights: fast on lavapipe) with WordTokenizer as its
stand-in tokenizer: its text (`w<id> ` per token) names every token, so a text equal to the
engine's own `generate` for the same arguments is the same token sequence (the engine is tested
against transformers elsewhere); usage counts are checked against this tokenizer's counts.
"""

from __future__ import annotations

import gc
import http.client
import json
import random
import shutil
import socket
import subprocess
import threading
import time
import zlib
from typing import ClassVar

import openai
import pytest

from webdrift.tools.api import host_warning, make_api_server
from webdrift.tools.api_protocol import StopStrings
from webdrift.tools.serve import serve_in_thread

MODEL_ID = "tiny"
MAX_CONTEXT = 512
LONG = 480            # tokens of a generation that runs for seconds on the tiny model (lavapipe)


class WordTokenizer:
    """A word is one token (crc32 into ids 1..511); token t reads "w<t> "; the chat template writes
    "<role> content" per message and opens the assistant's turn."""

    eos_token_ids: ClassVar[list[int]] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [zlib.crc32(w.encode()) % 511 + 1 for w in text.split()]

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        text = " ".join(f"<{m['role']}> {m['content']}" for m in messages)
        return text + (" <assistant>" if add_generation_prompt else "")

    def stream_decoder(self, skip_special_tokens: bool = False):
        return _WordDecoder()


class _WordDecoder:
    def push(self, token: int) -> str:
        return f"w{token} "

    def flush(self) -> str:
        return ""


TOK = WordTokenizer()


def chat_ids(messages) -> list[int]:
    return TOK.encode(TOK.apply_chat_template(messages))


@pytest.fixture(scope="module")
def engine():
    from webdrift.gpu.native import get_device
    from webdrift.runtime.loading import EngineOptions, assemble
    from webdrift.weights.synthetic import synthetic_source
    eng = assemble(synthetic_source("tiny", "q4"), EngineOptions(max_context=MAX_CONTEXT, autotune=False), get_device(),
                   tokenizer=TOK)
    eng.generate([1, 2, 3], max_new_tokens=2)     # first-use pipeline creation, outside any timing
    return eng


def _start(engine, **kw):
    srv = make_api_server(engine, MODEL_ID, port=0, **kw)
    serve_in_thread(srv)
    return srv


def _stop(srv):
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def api(engine):
    srv = _start(engine, queue_size=8, idle_timeout=10)
    yield srv
    _stop(srv)


@pytest.fixture()
def client(api):
    return openai.OpenAI(base_url=api.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)


def reference(api, engine, ids, **kw):
    """The same generation run alone on the engine (the server's worker holds this lock)."""
    with api.service.exclusive():
        return engine.generate(ids, **kw)


def request(srv, method: str, path: str, body=None, headers=None, raw: bytes | None = None):
    """(status, headers, body bytes) of one request over a fresh connection."""
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def assert_error(resp, status: int, code: str | None = None, param: str | None = None) -> dict:
    got, headers, body = resp
    assert got == status, body[:300]
    assert headers["content-type"] == "application/json"
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and 0 < len(err["message"]) < 1024 and "Traceback" not in err["message"]
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


# -- the openai client ---------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Why is the sky blue?"},
            {"role": "assistant", "content": "Scattering."}, {"role": "user", "content": "Say more."}]


def test_models(client):
    assert [m.id for m in client.models.list().data] == [MODEL_ID]
    m = client.models.retrieve(MODEL_ID)
    assert m.id == MODEL_ID and m.owned_by == "webdrift"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_chat_completion(api, engine, client):
    t0 = int(time.time())
    r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=8, temperature=0)
    ids = chat_ids(MESSAGES)
    ref = reference(api, engine, ids, max_new_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == ref.text
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length" and len(ref.token_ids) == 8
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 8, len(ids) + 8)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL_ID
    assert t0 - 1 <= r.created <= time.time() + 1


def test_chat_completion_streaming(api, engine, client):
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=6, temperature=0.9,
                                                 seed=7, stream=True, stream_options={"include_usage": True}))
    ids = chat_ids(MESSAGES)
    ref = reference(api, engine, ids, max_new_tokens=6, temperature=0.9, seed=7)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text and text.count("w") == 6
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(ids)
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.total_tokens == len(ids) + 6
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_text_and_token_prompts(api, engine, client, stream):
    for prompt, ids in (("The sky is blue because", TOK.encode("The sky is blue because")), ([5, 9, 300], [5, 9, 300])):
        r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=5, temperature=1.3, top_p=0.9,
                                      seed=123, stream=stream)
        ref = reference(api, engine, ids, max_new_tokens=5, temperature=1.3, top_p=0.9, seed=123)
        if stream:
            chunks = list(r)
            assert "".join(c.choices[0].text for c in chunks) == ref.text
            assert chunks[-1].choices[0].finish_reason == "length"
        else:
            assert r.choices[0].text == ref.text and r.choices[0].finish_reason == "length"
            assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 5
            assert r.object == "text_completion" and r.id.startswith("cmpl-")


def test_completion_default_max_tokens_is_16(api, engine, client):
    r = client.completions.create(model=MODEL_ID, prompt=[7, 8], temperature=0)
    assert r.usage.completion_tokens == 16 and r.choices[0].text == reference(api, engine, [7, 8], max_new_tokens=16).text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_end_the_text(api, engine, client, stream):
    ids = TOK.encode("tell me a story")
    full = reference(api, engine, ids, max_new_tokens=24, temperature=1.0, seed=99)
    pieces = [f"w{t} " for t in full.token_ids]
    k = next(i for i in range(6, 24) if pieces[i] not in pieces[:i])     # a piece that first appears at k
    spanning = pieces[3][2:] + pieces[4][:3]                             # across a token boundary
    for stop, want_tokens in ((pieces[k], k + 1), ([spanning, "zzz"], None)):
        r = client.completions.create(model=MODEL_ID, prompt="tell me a story", max_tokens=24, temperature=1.0,
                                      seed=99, stop=stop, stream=stream)
        first = min(full.text.find(s) for s in ([stop] if isinstance(stop, str) else stop) if s in full.text)
        if stream:
            chunks = list(r)
            text = "".join(c.choices[0].text for c in chunks)
            finish = chunks[-1].choices[0].finish_reason
        else:
            text, finish = r.choices[0].text, r.choices[0].finish_reason
            if want_tokens is not None:   # the generation stopped at the token that completed the stop string
                assert r.usage.completion_tokens == want_tokens
        assert text == full.text[:first] and finish == "stop"


# -- errors, in OpenAI's shape, over raw HTTP ----------------------------------------------------

CHAT = "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, param, code", [
    ({"messages": "hi"}, "messages", "invalid_type"),
    ({"messages": []}, "messages", "invalid_value"),
    ({}, "messages", "missing_required_parameter"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content[0]",
     "invalid_value"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": 1}]}]}, "messages[0].tool_calls",
     "invalid_value"),
    ({"messages": OK_MSG, "temperature": "hot"}, "temperature", "invalid_type"),
    ({"messages": OK_MSG, "temperature": 2.5}, "temperature", "invalid_value"),
    ({"messages": OK_MSG, "top_p": 1.5}, "top_p", "invalid_value"),
    ({"messages": OK_MSG, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"messages": OK_MSG, "max_tokens": 2.5}, "max_tokens", "invalid_type"),
    ({"messages": OK_MSG, "max_tokens": True}, "max_tokens", "invalid_type"),
    ({"messages": OK_MSG, "top_k": -1}, "top_k", "invalid_value"),
    ({"messages": OK_MSG, "seed": "7"}, "seed", "invalid_type"),
    ({"messages": OK_MSG, "stop": 7}, "stop", "invalid_type"),
    ({"messages": OK_MSG, "stop": [""]}, "stop", "invalid_value"),
    ({"messages": OK_MSG, "stop": ["x"] * 17}, "stop", "invalid_value"),
    ({"messages": OK_MSG, "stream": "yes"}, "stream", "invalid_type"),
    ({"messages": OK_MSG, "n": 17}, "n", "invalid_value"),
    ({"messages": OK_MSG, "n": 0}, "n", "invalid_value"),
    ({"messages": OK_MSG, "logprobs": True}, "logprobs", "unsupported_value"),
    ({"messages": OK_MSG, "frequency_penalty": 0.5}, "frequency_penalty", "unsupported_value"),
    ({"messages": OK_MSG, "temprature": 0.5}, "temprature", "unknown_parameter"),
    ({"messages": OK_MSG, "x" * 5000: 1}, "x" * 60 + "... (5000 chars)", "unknown_parameter"),
])
def test_bad_chat_requests_answer_400(api, body, param, code):
    err = assert_error(request(api, "POST", CHAT, body), 400, code, param)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_are_streams_decoded_together(api, engine, client, stream):
    """n=3: three choices from one request, equal to the engine's n=3 generation (independently
    sampled first tokens, runtime/streams.py); streamed chunks carry each choice's index."""
    ids = chat_ids(MESSAGES)
    r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=5, temperature=1.1, seed=3, n=3,
                                       stream=stream)
    ref = reference(api, engine, ids, max_new_tokens=5, temperature=1.1, seed=3, n=3, first_tokens="sampled")
    if stream:
        chunks = list(r)
        texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                 for i in range(3)]
        finals = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason)
        assert finals == [0, 1, 2]
    else:
        texts = [c.message.content for c in sorted(r.choices, key=lambda c: c.index)]
        assert [c.finish_reason for c in r.choices] == ["length"] * 3
        assert r.usage.completion_tokens == 15
    assert texts == [x.text for x in ref]


def test_n_above_the_stream_limit_says_why(api):
    err = assert_error(request(api, "POST", CHAT, {"messages": OK_MSG, "n": 17}), 400, "invalid_value", "n")
    assert "at most 16 choices" in err["message"]


@pytest.mark.parametrize("raw", [b"{bad", b"", b"\xff\xfe{}", b"[1, 2]", b"null", b'"text"'])
def test_bad_json_answers_400(api, raw):
    assert_error(request(api, "POST", CHAT, raw=raw), 400)


def test_lone_surrogate_answers_400(api):
    raw = b'{"messages": [{"role": "user", "content": "caf\\udcff"}]}'     # valid JSON, not valid Unicode
    err = assert_error(request(api, "POST", CHAT, raw=raw), 400, "invalid_value", "messages[0].content")
    assert "surrogate" in err["message"]


def test_unknown_model_path_and_method(api):
    assert_error(request(api, "POST", CHAT, {"model": "gpt-4o", "messages": OK_MSG}), 404, "model_not_found", "model")
    assert_error(request(api, "GET", "/v1/models/gpt-4o"), 404, "model_not_found")
    assert_error(request(api, "GET", "/v1/embeddings"), 404, "unknown_url")
    assert_error(request(api, "POST", "/v2/chat/completions", {"messages": OK_MSG}), 404, "unknown_url")
    r = request(api, "GET", CHAT)
    headers = r[1]
    assert_error(r, 405, "method_not_allowed")
    assert headers["allow"] == "POST"


def test_context_too_long_answers_400(api):
    long_text = " ".join(f"word{i}" for i in range(MAX_CONTEXT + 10))
    err = assert_error(request(api, "POST", "/v1/completions", {"prompt": long_text}), 400, "context_length_exceeded",
                       "prompt")
    assert str(MAX_CONTEXT) in err["message"]
    err = assert_error(request(api, "POST", CHAT, {"messages": OK_MSG, "max_tokens": MAX_CONTEXT}), 400,
                       "context_length_exceeded", "messages")
    assert f"max_tokens asks for {MAX_CONTEXT}" in err["message"]
    assert_error(request(api, "POST", "/v1/completions", {"prompt": [1, 2, 512]}), 400, "invalid_value", "prompt")
    assert_error(request(api, "POST", "/v1/completions", {"prompt": ""}), 400, "invalid_value", "prompt")
    assert_error(request(api, "POST", "/v1/completions", {"prompt": ["a", "b"]}), 400, "invalid_value", "prompt")


def test_body_limits(api):
    host, port = api.server_address[:2]
    with socket.create_connection((host, port), timeout=10) as s:   # announce 5 MiB, send nothing
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % (5 << 20))
        answer = _read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"code":"body_too_large"' in answer
    with socket.create_connection((host, port), timeout=10) as s:    # a chunked upload, sent in one piece
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"10\r\n{\"messages\": []}\r\n0\r\n\r\n")
        answer = _read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 411 ") and b'"code":"length_required"' in answer


def test_http_machinery_errors_are_json_too(api):
    host, port = api.server_address[:2]
    for line, status, code in ((b"GET /v1/models HTTX/1.1", 400, "bad_request"),
                               (b"GET /v1/models HTTP/2.0", 505, "http_version_not_supported"),
                               (b"GET /" + b"x" * 70000 + b" HTTP/1.1", 414, "request_uri_too_long")):
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(line + b"\r\nHost: 127.0.0.1\r\n\r\n")
            data = _read_until_closed(s)
        head, body = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 %d " % status) and b"Content-Type: application/json" in head, data[:300]
        assert json.loads(body)["error"]["code"] == code


def test_foreign_host_header_is_refused_on_loopback(api):
    assert_error(request(api, "GET", "/v1/models", headers={"Host": "evil.example:8322"}), 403, "forbidden_host")
    for host in ("localhost:1", "127.0.0.1", "[::1]:8322"):
        assert request(api, "GET", "/v1/models", headers={"Host": host})[0] == 200, host


def test_curl(api, engine):
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed (apt-get install curl); the API is documented with curl examples")
    body = json.dumps({"model": MODEL_ID, "prompt": [4, 5, 6], "max_tokens": 3, "temperature": 0, "stream": True})
    out = subprocess.run([curl, "-sS", "-N", api.url + "/v1/completions", "-H", "Content-Type: application/json",
                          "-d", body], capture_output=True, text=True, timeout=60, check=True).stdout
    events = [e[len("data: "):] for e in out.split("\n\n") if e.strip()]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == reference(
        api, engine, [4, 5, 6], max_new_tokens=3).text
    r = subprocess.run([curl, "-sS", "-w", "\n%{http_code}", api.url + CHAT, "-d", '{"messages": [], "n": 1}'],
                       capture_output=True, text=True, timeout=60, check=True).stdout
    body, status = r.rsplit("\n", 1)
    assert status == "400" and json.loads(body)["error"]["param"] == "messages"


def test_no_tracebacks_were_logged(api, capfd):
    request(api, "POST", CHAT, raw=b"{bad")
    request(api, "GET", "/" + "x" * 5000)
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[:2000]


# -- API key and hosts ---------------------------------------------------------------------------

def test_api_key(engine):
    srv = _start(engine, api_key="s3cret-key")
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"},
                        {"Authorization": "Basic s3cret-key"}):
            err = assert_error(request(srv, "GET", "/v1/models", headers=headers), 401, "invalid_api_key")
            assert "s3cret" not in err["message"]
        assert_error(request(srv, "POST", CHAT, {"messages": OK_MSG}), 401, "invalid_api_key")
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret-key", max_retries=0, timeout=60)
        assert good.completions.create(model=MODEL_ID, prompt=[1], max_tokens=1).usage.completion_tokens == 1
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    finally:
        _stop(srv)


def test_non_loopback_host_warns():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert host_warning(host, None) is None
    assert "no authentication" in host_warning("0.0.0.0", None)
    w = host_warning("192.168.1.5", "k")
    assert "API key" in w and "plain HTTP" in w


def test_cli_warns_then_fails_cleanly(capsys):
    from webdrift.tools.cli import main
    assert main(["api", "--host", "0.0.0.0", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "warning: listening on 0.0.0.0" in err and "no authentication" in err
    assert "webdrift: error:" in err and "no-such-model" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        main(["api", "--port", "99999"])
    assert e.value.code == 2 and "not a port number" in capsys.readouterr().err


# -- concurrency ---------------------------------------------------------------------------------

def _stream_first_event(srv, body) -> socket.socket:
    """Open a streaming request and return its socket once the first event arrived (it is running)."""
    host, port = srv.server_address[:2]
    s = socket.create_connection((host, port), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    got = b""
    while b"data: " not in got:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200 ")
    return s


def _read_until_closed(s: socket.socket, timeout: float = 8.0) -> bytes:
    """Everything the server sends until it closes the connection (fails after `timeout` s)."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {timeout} s")
    return data


def _wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_full_queue_answers_503_and_a_disconnect_frees_the_engine(engine):
    srv = _start(engine, queue_size=1)
    try:
        svc = srv.service
        running = _stream_first_event(srv, {"prompt": [1, 2], "max_tokens": LONG, "temperature": 0, "stream": True})
        queued = {}
        t = threading.Thread(target=lambda: queued.setdefault("r", request(
            srv, "POST", "/v1/completions", {"prompt": [3], "max_tokens": 2, "temperature": 0})))
        t.start()
        _wait_for(lambda: svc._queue.qsize() == 1)
        status, headers, _ = r = request(srv, "POST", "/v1/completions", {"prompt": [4], "max_tokens": 2})
        err = assert_error(r, 503, "server_busy")
        assert err["type"] == "server_error" and 1 <= int(headers["retry-after"]) <= 60
        t0 = time.monotonic()
        running.close()                                  # the client goes away mid-stream
        t.join(30)
        waited = time.monotonic() - t0
        status, _, body = queued["r"]
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
        assert waited < 2.5, waited           # the LONG generation (seconds) was stopped, not finished
        rec = [h for h in svc.history if h.outcome == "cancelled"]
        assert len(rec) == 1 and 1 <= rec[0].completion_tokens < LONG // 2
    finally:
        _stop(srv)


def test_disconnect_while_waiting_for_a_whole_answer_stops_it(api):
    api.service.history.clear()
    host, port = api.server_address[:2]
    s = socket.create_connection((host, port), timeout=30)
    data = json.dumps({"prompt": [9, 9], "max_tokens": LONG, "temperature": 0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
    # close as soon as the generation runs (a fixed sleep let a fast machine generate most of LONG
    # before the disconnect: 354 tokens in 0.5 s on lavapipe, 2026-11-24)
    _wait_for(lambda: api.service._current is not None)
    s.close()
    t0 = time.monotonic()
    assert request(api, "POST", "/v1/completions", {"prompt": [3], "max_tokens": 1})[0] == 200
    assert time.monotonic() - t0 < 2.5
    _wait_for(lambda: len(api.service.history) == 2)     # the record is written just after the answer
    (rec, nxt) = list(api.service.history)
    assert rec.outcome == "cancelled" and rec.completion_tokens < LONG // 2 and nxt.outcome == "length"


def test_idle_connections_time_out_and_connections_are_limited(engine):
    threads = threading.active_count()
    srv = _start(engine, idle_timeout=1.0, max_connections=3)
    try:
        host, port = srv.server_address[:2]
        t0 = time.monotonic()
        idle = [socket.create_connection((host, port), timeout=10) for _ in range(3)]
        idle[1].sendall(b"GET /v1/models HTTP/1.1\r\n")                   # half a request
        idle[2].sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")   # keep-alive, then silence
        _wait_for(lambda: srv._active == 3)
        with socket.create_connection((host, port), timeout=10) as extra:   # a fourth: refused at once
            head = extra.recv(4096)
        assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in head and b'"server_busy"' in head
        answers = [_read_until_closed(s) for s in idle]   # each closed by the server after 1 s
        for s in idle:
            s.close()
        assert answers[0] == b"" and answers[1] == b"" and answers[2].startswith(b"HTTP/1.1 200 ")
        assert time.monotonic() - t0 < 5
        _wait_for(lambda: srv._active == 0)
        assert request(srv, "GET", "/v1/models")[0] == 200
    finally:
        _stop(srv)
    _wait_for(lambda: threading.active_count() <= threads)


# -- load ----------------------------------------------------------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


CLIENTS, PER_CLIENT, WARMUP = 16, 10, 2


def _job(c: int, i: int) -> dict:
    """Request i of client c: every one different (seed and prompt), the four kinds interleaved."""
    seed = 1000 * c + i
    kind = ("chat", "text", "ids", "chat")[(c + i) % 4]
    stream = (c + i) % 3 == 0
    if kind == "chat":
        msgs = [{"role": "user", "content": f"client {c} asks question {i}"}]
        return {"path": CHAT, "body": {"messages": msgs, "max_tokens": 4, "temperature": 1.0, "seed": seed,
                                       "stream": stream}, "ids": chat_ids(msgs), "seed": seed}
    prompt = f"client {c} writes {i}" if kind == "text" else [c + 1, i + 1, 7]
    ids = TOK.encode(prompt) if kind == "text" else prompt
    return {"path": "/v1/completions", "body": {"prompt": prompt, "max_tokens": 4, "temperature": 1.0, "seed": seed,
                                                "stream": stream}, "ids": ids, "seed": seed}


def _answer(srv, job: dict, busy: list) -> dict:
    """Send one job until it is answered (a 503 is checked, counted and retried): text, usage, finish."""
    for _ in range(2000):
        status, headers, body = r = request(srv, "POST", job["path"], job["body"])
        if status == 503:
            assert_error(r, 503, "server_busy")
            assert int(headers["retry-after"]) >= 1
            busy.append(1)
            time.sleep(0.02)
            continue
        assert status == 200, body[:300]
        if not job["body"]["stream"]:
            d = json.loads(body)
            c = d["choices"][0]
            return {"text": c["message"]["content"] if "message" in c else c["text"], "usage": d["usage"],
                    "finish": c["finish_reason"]}
        events = [e[len(b"data: "):] for e in body.split(b"\n\n") if e.strip()]
        assert events[-1] == b"[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert len({ch["id"] for ch in chunks}) == 1
        text = "".join(ch["choices"][0].get("delta", {}).get("content") or ch["choices"][0].get("text", "")
                       for ch in chunks)
        return {"text": text, "usage": None, "finish": chunks[-1]["choices"][0]["finish_reason"]}
    raise AssertionError("never answered")


def test_load_16_clients_x_10_requests(api, engine):
    dev = engine.dev
    results: dict[tuple[int, int], dict] = {}
    busy: list[int] = []
    errors: list[BaseException] = []
    warm = threading.Barrier(CLIENTS + 1)
    go = threading.Barrier(CLIENTS + 1)

    def client(c: int):
        try:
            for i in range(PER_CLIENT):
                if i == WARMUP:
                    warm.wait(120)
                    go.wait(120)
                results[c, i] = _answer(api, _job(c, i), busy)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            warm.abort()
            go.abort()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    warm.wait(300)                                  # every client has had WARMUP answers
    gc.collect()
    rss0, gpu0 = _rss_bytes(), dev.bytes_allocated
    go.wait(30)
    for t in threads:
        t.join(300)
    elapsed = time.monotonic() - t0
    assert not errors, errors[0]
    gc.collect()
    rss1, gpu1 = _rss_bytes(), dev.bytes_allocated
    assert len(results) == CLIENTS * PER_CLIENT
    print(f"\n[load] {len(results)} requests in {elapsed:.1f} s, {len(busy)} answers 503 (retried; "
          f"{api.refused} of them for the connection limit); "
          f"RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB, device {gpu0} -> {gpu1} bytes")
    assert gpu1 == gpu0, (gpu0, gpu1)                     # no device allocation per request
    assert rss1 - rss0 < 16 << 20, (rss0, rss1)
    # each answer equals the same request run alone: no text went to another request
    for (c, i), got in sorted(results.items()):
        job = _job(c, i)
        ref = reference(api, engine, job["ids"], max_new_tokens=4, temperature=1.0, seed=job["seed"])
        assert got["text"] == ref.text, (c, i)
        assert got["finish"] == "length"
        if got["usage"] is not None:
            assert got["usage"] == {"prompt_tokens": len(job["ids"]), "completion_tokens": 4,
                                    "total_tokens": len(job["ids"]) + 4}
    assert len({r["text"] for r in results.values()}) > 0.9 * len(results)   # distinct: a swap would show


# -- stop strings, alone -------------------------------------------------------------------------

def test_stop_strings_against_str_find():
    rng = random.Random(5)
    for _ in range(2000):
        text = "".join(rng.choice("abc ") for _ in range(rng.randint(0, 30)))
        stops = ["".join(rng.choice("abc ") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 3))]
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        f = StopStrings(stops)
        out = "".join(f.push(p) for p in pieces) + f.flush()
        hits = [text.find(s) for s in stops if s in text]
        assert out == (text[:min(hits)] if hits else text), (text, stops, pieces)
        assert f.hit == bool(hits)


# -- a real tokenizer and chat template ------------------------------------------------------------

@pytest.fixture(scope="module")
def smol_api(smollm2_gguf_path):
    """SmolLM2's tokenizer and chat template (ChatML, from its GGUF) on a tiny random model with
    SmolLM2's vocabulary: real text through the real template, at the tiny model's speed."""
    import dataclasses

    from webdrift.gpu.native import get_device
    from webdrift.runtime.loading import EngineOptions, assemble, make_tokenizer, open_source
    from webdrift.weights import synthetic
    tok = make_tokenizer(open_source(str(smollm2_gguf_path)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(synthetic.PRESETS, "tiny-smollm2-vocab",
                   dataclasses.replace(synthetic.PRESETS["tiny"], vocab_size=tok.vocab_size))
        eng = assemble(synthetic.synthetic_source("tiny-smollm2-vocab", "q4"),
                       EngineOptions(max_context=256, autotune=False), get_device(), tokenizer=tok)
    srv = _start(eng)
    yield srv, eng, tok
    _stop(srv)


@pytest.mark.parametrize("stream", [False, True])
def test_real_chat_template(smol_api, stream):
    srv, eng, tok = smol_api
    template = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert "<|im_start|>system\nYou answer briefly.<|im_end|>" in template and template.endswith("<|im_start|>assistant\n")
    ids = tok.encode(template, add_special_tokens=False)
    ref = reference(srv, eng, ids, max_new_tokens=12, temperature=0.8, seed=11)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=60)
    r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=12, temperature=0.8, seed=11,
                                       stream=stream, stream_options={"include_usage": True} if stream else None)
    if stream:
        chunks = list(r)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        use, finish = chunks[-1].usage, next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices)
    else:
        text, use, finish = r.choices[0].message.content, r.usage, r.choices[0].finish_reason
    assert text == ref.text and text == tok.decode(ref.token_ids)
    assert use.prompt_tokens == len(ids) and use.completion_tokens == ref.stats.new_tokens
    assert finish == ("stop" if ref.stats.finish_reason == "eos" else "length")
