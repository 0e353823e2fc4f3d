"""The OpenAI chat-completions protocol as `webdrift api` speaks it: requests checked into a
GenerationRequest, the answers' JSON (whole, or as stream chunks), errors in OpenAI's shape, and
stop strings cut out of streamed text (a desktop tool's module, stdlib only, no I/O).

Request fields (both endpoints): model (absent or this server's id; another id is 404),
max_tokens (chat: also max_completion_tokens; default: the rest of the context for chat, 16 for
completions), temperature (0..2, default 1; below 0.001 counts as 0, greedy), top_p (0..1; 0 is
greedy), top_k (an extension: 0 = off), seed, stop (a string or up to 16), n (1 only: several
response streams are not implemented), stream, stream_options.include_usage, user (ignored).
Chat: messages with roles system (developer is taken as system), user, assistant; content a
string or a list of text parts. Completions: prompt as a string, token ids, or a one-item list
of either. Fields a client library may send at their neutral value (presence_penalty=0,
logprobs=false, tools=[], ...) are accepted at that value only; any other field is a 400
("Unrecognized request argument"), as OpenAI answers.
Must not: do I/O, touch the engine or import beyond the standard library, webdrift.errors and
webdrift's version; put more than ~1 KB of a client's input into an error message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .. import __version__
from ..errors import ContextLengthError, InvalidArgumentError, TokenizerError, WebdriftError

MAX_STOP = 16                 # stop strings per request
MIN_TEMPERATURE = 1e-3        # lower is taken as greedy: the same spike at the top token, and 1/T stays
                              # far from float32's range in the sampler
FINGERPRINT = f"webdrift-{__version__}"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def short(text, limit: int = 200) -> str:
    """A client-supplied (or any) string cut to `limit` characters for a message or a log line."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class ApiError(Exception):
    """An HTTP error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, short(message, 1000), type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @classmethod
    def from_webdrift(cls, e: WebdriftError, param: str | None = None) -> ApiError:
        """The HTTP error for an error the engine raised on a request's input (or its own)."""
        if isinstance(e, ContextLengthError):
            return cls(400, str(e), param=param, code="context_length_exceeded")
        if isinstance(e, (InvalidArgumentError, TokenizerError)):
            return cls(400, str(e), param=param, code="invalid_value")
        return cls(500, f"{type(e).__name__}: {e}", type="server_error", code="engine_error")


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=code)


# -- requests --------------------------------------------------------------------------------------

@dataclass
class GenerationRequest:
    """One request's generation, checked: what the worker needs and nothing else."""

    kind: str                                   # "chat" or "text"
    prompt: list[dict] | str | list[int]        # messages (chat), text or token ids
    max_tokens: int | None                      # None: up to the end of the context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stops: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False

    @property
    def param(self) -> str:
        """The field that holds the prompt (named by errors about it)."""
        return "messages" if self.kind == "chat" else "prompt"

    def sampling(self, max_new_tokens: int, vocab_size: int) -> dict:
        """Keyword arguments of the engine's SamplingParams.make for this request: a temperature
        under MIN_TEMPERATURE or top_p = 0 is greedy; a top_k of the vocabulary or more is no top-k."""
        greedy = self.temperature < MIN_TEMPERATURE or self.top_p == 0.0
        return {"max_new_tokens": max_new_tokens, "temperature": 0.0 if greedy else self.temperature,
                "top_k": self.top_k if self.top_k < vocab_size else 0, "top_p": 1.0 if greedy else self.top_p,
                "seed": self.seed}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(name, f"must be a number, got {type(v).__name__}", "invalid_type")
    v = float(v)
    if not lo <= v <= hi:     # also refuses NaN
        raise _bad(name, f"{v!r} is out of range [{lo:g}, {hi:g}]")
    return v


def _integer(body: dict, name: str, default: int | None, lo: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v):
        raise _bad(name, f"must be an integer, got {type(v).__name__}", "invalid_type")
    if lo is not None and v < lo:
        raise _bad(name, f"{v} is below the minimum {lo}")
    return v


def _bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(name, f"must be true or false, got {type(v).__name__}", "invalid_type")
    return v


def _text(v, param: str) -> str:
    if not isinstance(v, str):
        raise _bad(param, f"must be a string, got {type(v).__name__}", "invalid_type")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(param, "is not valid Unicode (it holds a lone surrogate)") from None
    return v


def _stops(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list):
        raise _bad("stop", f"must be a string or a list of strings, got {type(v).__name__}", "invalid_type")
    if len(items) > MAX_STOP:
        raise _bad("stop", f"at most {MAX_STOP} stop strings, got {len(items)}")
    out = [_text(s, "stop") for s in items]
    if any(not s for s in out):
        raise _bad("stop", "a stop string must not be empty")
    return out


# fields accepted only at their neutral value (what a client library may send by default)
_NEUTRAL = {
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},), "logprobs": (False, 0),
    "top_logprobs": (0,), "echo": (False,), "best_of": (1,), "suffix": ("",), "tools": ([],),
    "tool_choice": ("none", "auto"), "parallel_tool_calls": (True, False), "response_format": ({"type": "text"},),
}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
           "stream_options", "user"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "presence_penalty", "frequency_penalty", "logit_bias",
                         "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "response_format"}
COMPLETION_FIELDS = _COMMON | {"prompt", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "echo",
                               "best_of", "suffix"}


def _messages(v) -> list[dict]:
    if not isinstance(v, list) or not v:
        raise _bad("messages", "must be a non-empty list of {role, content} objects",
                   "invalid_type" if not isinstance(v, list) else "invalid_value")
    out = []
    for i, m in enumerate(v):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(p, f"must be an object, got {type(m).__name__}", "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"{p}.role", f"{short(repr(role), 40)} is not one of system, developer, user, assistant")
        for k in m:
            if k not in ("role", "content", "name") and m[k] not in (None, []):
                raise _bad(f"{p}.{short(k, 40)}", "is not supported (webdrift has no tool or function calls)")
        content = m.get("content")
        if isinstance(content, list):        # content parts: text only
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise _bad(f"{p}.content[{j}]", "only text parts ({\"type\": \"text\", \"text\": ...}) are supported")
                texts.append(_text(part.get("text"), f"{p}.content[{j}].text"))
            content = "".join(texts)
        elif content is None and role == "assistant":
            content = ""
        out.append({"role": ROLES[role], "content": _text(content, f"{p}.content")})
    return out


def _prompt(v) -> str | list[int]:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]                               # a batch of one
    if isinstance(v, str):
        return _text(v, "prompt")
    if isinstance(v, list) and all(_is_int(t) for t in v):
        return list(v)
    if isinstance(v, list):
        raise _bad("prompt", "several prompts in one request are not supported: send one request per prompt")
    raise _bad("prompt", f"must be a string or a list of token ids, got {type(v).__name__}", "invalid_type")


def parse_request(kind: str, body, model_id: str) -> GenerationRequest:
    """A request body (parsed JSON) -> GenerationRequest, or ApiError (400, or 404 for another model)."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    allowed = CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS
    for k in body:
        if k not in allowed:
            raise ApiError(400, f"Unrecognized request argument supplied: {short(k, 60)}", param=short(k, 60),
                           code="unknown_parameter")
        if k in _NEUTRAL and body[k] is not None and body[k] not in _NEUTRAL[k]:
            raise _bad(k, f"{short(json.dumps(body[k]), 60)} is not supported by webdrift (only "
                          f"{' or '.join(json.dumps(x) for x in _NEUTRAL[k])})", "unsupported_value")
    model = body.get("model")
    if model is not None and model != model_id:
        if not isinstance(model, str):
            raise _bad("model", f"must be a string, got {type(model).__name__}", "invalid_type")
        raise ApiError(404, f"The model '{short(model, 80)}' does not exist: this server runs '{model_id}'",
                       param="model", code="model_not_found")
    n = _integer(body, "n", 1, lo=1)
    if n != 1:
        raise _bad("n", f"{n}: webdrift answers one choice per request (several response streams are not "
                        "implemented yet); send n=1, or several requests")
    if kind == "chat":
        if "messages" not in body:
            raise _bad("messages", "is required", "missing_required_parameter")
        prompt = _messages(body["messages"])
        max_tokens = _integer(body, "max_completion_tokens", None, lo=1)
        max_tokens = _integer(body, "max_tokens", max_tokens, lo=1)
    else:
        if "prompt" not in body:
            raise _bad("prompt", "is required", "missing_required_parameter")
        prompt = _prompt(body["prompt"])
        max_tokens = _integer(body, "max_tokens", 16, lo=1)       # OpenAI's default for completions
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or set(opts) - {"include_usage"}):
        raise _bad("stream_options", "must be an object with at most include_usage")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _bad("seed", f"must be an integer, got {type(seed).__name__}", "invalid_type")
    user = body.get("user")
    if user is not None:
        _text(user, "user")
    return GenerationRequest(
        kind=kind, prompt=prompt, max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0), top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=_integer(body, "top_k", 0, lo=0), seed=seed, stops=_stops(body), stream=_bool(body, "stream", False),
        include_usage=_bool(opts or {}, "include_usage", False))


# -- stop strings ----------------------------------------------------------------------------------

class StopStrings:
    """Cuts streamed text at the first stop string: `push` returns the text that can be sent now
    (holding back a tail that may be the start of a stop string), `hit` turns True at a match
    (the stop string and everything after it are dropped), `flush` returns the held tail at the end."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = ""
        self.hit = False

    def push(self, piece: str) -> str:
        if self.hit:
            return ""
        text = self.hold + piece
        if not self.stops:
            return text
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit, self.hold = True, ""
            return text[:cut]
        keep = 0          # the longest tail of text that begins some stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:k]):
                    keep = k
                    break
        self.hold = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        out, self.hold = ("" if self.hit else self.hold), ""
        return out


# -- answers ---------------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass(frozen=True)
class Envelope:
    """The fields every answer to one request shares."""

    kind: str            # "chat" or "text"
    id: str              # chatcmpl-... / cmpl-...
    created: int
    model: str

    @classmethod
    def make(cls, kind: str, token: str, created: int, model: str) -> Envelope:
        return cls(kind, ("chatcmpl-" if kind == "chat" else "cmpl-") + token, created, model)

    def _head(self, chunk: bool) -> dict:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}

    def completion(self, text: str, finish: str, prompt_tokens: int, completion_tokens: int) -> dict:
        """The whole answer (stream: false)."""
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**self._head(False), "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, text: str | None = None, finish: str | None = None, first: bool = False,
              with_usage: bool = False) -> dict:
        """One stream event: the chat's opening role delta (first), a text piece, or the finish."""
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self._head(True), "choices": [choice], **({"usage": None} if with_usage else {})}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        """The last event with stream_options.include_usage: no choices, the counts."""
        return {**self._head(True), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}


def model_card(model_id: str, created: int) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "webdrift"}
