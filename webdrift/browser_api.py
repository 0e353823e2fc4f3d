"""webdrift in the browser: async entry points for Pyodide (used by web/worker.js).

Two layers:
  - Python API: `await load_from_bytes(gguf_bytes)` -> Engine (the same Engine as the desktop's
    `webdrift.load`, on a BrowserDevice); `open_source` + `load_from_source` split it in two so the
    caller can cache the file once it is known to be a model.
  - the worker's API (`api_*`): one engine per worker; arguments arrive as JSON strings or JS
    objects, results leave as JSON strings ({"ok": ...} or {"error": {"name", "message"}}), so no
    Python object outlives a call on the JS side and every error reaches JS as a clean message.
Must not: import numpy or wgpu; touch navigator.gpu other than through webdrift.gpu.browser.
"""

from __future__ import annotations

import functools
import json
import time
import traceback

from . import make_tokenizer
from .errors import InvalidArgumentError, WebdriftError
from .runtime.engine import Engine, GenerationResult, SamplingParams
from .weights.source import ModelSource, open_model_source

__all__ = ["load_from_bytes", "load_from_source", "open_source", "result_dict", "sampling_from_options"]


def _as_bytes(data) -> bytes | bytearray | memoryview:
    """A Python bytes-like from bytes or a JS ArrayBuffer / TypedArray (copied into WASM memory)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data
    to_bytes = getattr(data, "to_bytes", None)   # pyodide JsBuffer
    if to_bytes is None:
        raise InvalidArgumentError(f"model data must be bytes or an ArrayBuffer, got {type(data).__name__}")
    return to_bytes()


def open_source(data, name: str | None = None) -> ModelSource:
    """Parse a GGUF file held in memory (raises ModelFileError / UnsupportedModelError)."""
    return open_model_source(_as_bytes(data), name=name or "<model>")


async def load_from_source(source: ModelSource, *, max_context: int | None = None,
                           weight_format: str | None = None, prefill_chunk: int = 256, device=None,
                           progress=None, prefill_kernels: str = "auto") -> Engine:
    """Build the tokenizer, create the WebGPU device (unless given) and upload the weights.

    prefill_kernels: "gemm", "gemv" or "auto" (gemv on software adapters such as SwiftShader, gemm
    elsewhere); see Engine."""
    tok = make_tokenizer(source)
    if device is None:
        from .gpu.browser import create_browser_device
        device = await create_browser_device()
    eng = Engine(device, source, tok, max_context=max_context, weight_format=weight_format,
                 prefill_chunk=prefill_chunk, progress=progress, prefill_kernels=prefill_kernels)
    check = getattr(device, "check_errors", None)
    if check is not None:
        await check()
    return eng


async def load_from_bytes(data, *, name: str | None = None, max_context: int | None = None,
                          weight_format: str | None = None, prefill_chunk: int = 256, device=None,
                          progress=None, prefill_kernels: str = "auto") -> Engine:
    """`webdrift.load` for the browser: a GGUF file's bytes (or a JS ArrayBuffer) -> Engine."""
    source = open_source(data, name)
    return await load_from_source(source, max_context=max_context, weight_format=weight_format,
                                  prefill_chunk=prefill_chunk, device=device, progress=progress,
                                  prefill_kernels=prefill_kernels)


# -- options and results in the JS module's vocabulary ----------------------------------------------

_OPTION_NAMES = {"maxNewTokens": "max_new_tokens", "temperature": "temperature", "topK": "top_k",
                 "topP": "top_p", "seed": "seed", "stopAtEos": "stop_at_eos"}


def sampling_from_options(opts: dict | None) -> SamplingParams:
    """SamplingParams from generate()'s options (camelCase as in JS, or snake_case)."""
    opts = dict(opts or {})
    kw = {}
    for js_name, py_name in _OPTION_NAMES.items():
        for k in (js_name, py_name):
            if k in opts and opts[k] is not None:
                kw[py_name] = opts[k]
    if isinstance(kw.get("max_new_tokens"), float) and kw["max_new_tokens"].is_integer():
        kw["max_new_tokens"] = int(kw["max_new_tokens"])
    if isinstance(kw.get("top_k"), float) and kw["top_k"].is_integer():
        kw["top_k"] = int(kw["top_k"])
    if isinstance(kw.get("seed"), float) and kw["seed"].is_integer():
        kw["seed"] = int(kw["seed"])
    return SamplingParams.make(**kw)


def result_dict(r: GenerationResult) -> dict:
    s = r.stats
    return {"text": r.text, "tokenIds": list(r.token_ids), "stats": {
        "promptTokens": s.prompt_tokens, "newTokens": s.new_tokens, "tokenizeS": s.tokenize_s,
        "prefillS": s.prefill_s, "decodeS": s.decode_s, "totalS": s.total_s,
        "prefillTokensPerS": s.prefill_tokens_per_s, "decodeTokensPerS": s.decode_tokens_per_s,
        "finishReason": s.finish_reason}}


def engine_info(eng: Engine) -> dict:
    dev, cfg = eng.dev, eng.config
    return {"adapter": dev.info.adapter, "backend": dev.info.backend, "vendor": dev.info.vendor,
            "architecture": getattr(dev, "architecture", ""), "features": sorted(dev.info.features),
            "model": {"name": cfg.name, "arch": cfg.arch, "layers": cfg.n_layers, "dim": cfg.dim,
                      "vocab": cfg.vocab_size, "contextLength": cfg.max_position},
            "maxContext": eng.max_context, "weightBytes": eng.model.weight_bytes,
            "kvBytes": eng.model.kv_bytes, "loadS": eng.load_s}


# -- the worker's API: one engine per worker, JSON in and out ---------------------------------------

class _State:
    source: ModelSource | None = None
    engine: Engine | None = None


_state = _State()


def _error(e: BaseException) -> dict:
    if isinstance(e, WebdriftError):
        return {"error": {"name": type(e).__name__, "message": str(e)}}
    return {"error": {"name": "WebdriftError", "message": f"internal error ({type(e).__name__}): {e}",
                      "detail": traceback.format_exc()[-4000:]}}


def _json_api(fn):
    """Wrap an api_* coroutine: returns a JSON string, never raises into JS."""
    @functools.wraps(fn)
    async def wrapper(*args):
        try:
            return json.dumps({"ok": True, **(await fn(*args) or {})})
        except BaseException as e:  # noqa: BLE001 - everything must reach JS as a message
            return json.dumps(_error(e))
    return wrapper


def _loads(s) -> object:
    return json.loads(s) if isinstance(s, str) else s


@_json_api
async def api_open(data, name: str) -> dict:
    """Parse the model file (before it is cached: a file that is not a model is never cached)."""
    _state.source = None
    t0 = time.perf_counter()
    src = open_source(data, name)
    _state.source = src
    c = src.config
    return {"parseS": time.perf_counter() - t0, "tensors": len(src.tensors),
            "model": {"name": c.name, "arch": c.arch, "layers": c.n_layers, "contextLength": c.max_position}}


@_json_api
async def api_load(opts_json, progress=None) -> dict:
    """Create the device and the engine from the parsed source."""
    if _state.source is None:
        raise InvalidArgumentError("no model was opened")
    opts = _loads(opts_json) or {}
    cb = None
    if progress is not None:
        def cb(done, total, name):
            progress(done, total, name)
    src, _state.source = _state.source, None
    if _state.engine is not None:
        _state.engine.dev.destroy()
        _state.engine = None
    _state.engine = await load_from_source(
        src, max_context=opts.get("maxContext"), weight_format=opts.get("weightFormat"),
        prefill_chunk=int(opts.get("prefillChunk") or 256), progress=cb,
        prefill_kernels=opts.get("prefillKernels") or "auto")
    return {"info": engine_info(_state.engine)}


def _engine() -> Engine:
    if _state.engine is None:
        raise InvalidArgumentError("the engine is not loaded (or was disposed)")
    return _state.engine


async def _run(eng: Engine, prompt, opts, on_token) -> dict:
    sp = sampling_from_options(opts)
    result = None
    async for kind, value in eng.aevents(prompt, sp):
        if kind == "text":
            if on_token is not None:
                on_token(value)
        elif kind == "done":
            result = value
    return {"result": result_dict(result)}


def _prompt(p):
    if isinstance(p, list):
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in p):
            raise InvalidArgumentError("prompt must be a string or an array of integer token ids")
        return p
    if not isinstance(p, str):
        raise InvalidArgumentError(f"prompt must be a string or an array of token ids, got {type(p).__name__}")
    return p


@_json_api
async def api_generate(prompt_json, opts_json, on_token=None) -> dict:
    return await _run(_engine(), _prompt(_loads(prompt_json)), _loads(opts_json), on_token)


@_json_api
async def api_chat(messages_json, opts_json, on_token=None) -> dict:
    eng = _engine()
    messages = _loads(messages_json)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidArgumentError("chat(messages): messages must be an array of {role, content} objects")
    text = eng.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = eng.tokenizer.encode(text, add_special_tokens=False)
    return await _run(eng, ids, _loads(opts_json), on_token)


@_json_api
async def api_tokenize(text_json) -> dict:
    eng = _engine()
    return {"ids": eng.tokenizer.encode(_loads(text_json))}


def api_stop() -> None:
    """Ask the running generation to stop after the current token (sync: called between awaits)."""
    if _state.engine is not None:
        _state.engine.stop()


def api_dispose() -> None:
    eng, _state.engine, _state.source = _state.engine, None, None
    if eng is not None:
        eng.stop()
        eng.dev.destroy()
