"""webdrift in the browser: a thin JSON adapter over the Engine for Pyodide (used by web/worker.js).

Two layers:
  - Python API: `await load_from_bytes(gguf_bytes)` -> Engine (the same Engine and the same
    assembly path as the desktop's `webdrift.load`: runtime/loading.py, on a BrowserDevice);
    `open_source` + `load_from_source` split it in two so the caller can cache the file once it
    is known to be a model. Both take the desktop's engine options (EngineOptions).
  - the worker's API (`api_*`): one engine per worker; arguments arrive as JSON strings or JS
    objects, results leave as JSON strings ({"ok": ...} or {"error": {"name", "message"}}), so no
    Python object outlives a call on the JS side and every error reaches JS as a clean message.
    Options in the JS module's camelCase are mapped to Python names in one table each
    (ENGINE_OPTION_NAMES, SAMPLING_OPTION_NAMES); generation and chat are the Engine's own
    (`agenerate`, `achat`), nothing here drives the loop.
Must not: import numpy or wgpu; touch navigator.gpu other than through webdrift.gpu.browser;
generate or apply chat templates itself (that is the Engine's).
"""

from __future__ import annotations

import functools
import json
import time
import traceback
from dataclasses import replace

from .errors import InvalidArgumentError, WebdriftError
from .runtime.engine import Engine, GenerationResult, SamplingParams
from .runtime.loading import EngineOptions, load_browser
from .runtime.loading import open_source as _open_model
from .weights.source import ModelSource

__all__ = ["engine_options", "load_from_bytes", "load_from_source", "open_source", "result_dict",
           "sampling_from_options"]


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
    return _open_model(_as_bytes(data), name=name or "<model>")


async def load_from_source(source: ModelSource, options: EngineOptions | None = None, *, device=None,
                           progress=None, **kw) -> Engine:
    """Build the tokenizer, create the WebGPU device (unless given) and upload the weights.

    options: an EngineOptions, or its fields as keywords (max_context=..., prefill_kernels=...:
    "gemm", "gemv" or "auto", gemv on software adapters such as SwiftShader); see webdrift.load."""
    return await load_browser(source, _with(options, kw), device=device, progress=progress)


async def load_from_bytes(data, options: EngineOptions | None = None, *, name: str | None = None, device=None,
                          progress=None, **kw) -> Engine:
    """`webdrift.load` for the browser: a GGUF file's bytes (or a JS ArrayBuffer) -> Engine."""
    return await load_from_source(open_source(data, name), _with(options, kw), device=device, progress=progress)


def _with(options: EngineOptions | None, kw: dict) -> EngineOptions | None:
    """options with keyword overrides (each an EngineOptions field)."""
    if not kw:
        return options
    bad = sorted(set(kw) - set(EngineOptions.names()))
    if bad:
        raise InvalidArgumentError(f"unknown engine options {bad}; the options are {list(EngineOptions.names())}")
    return replace(options or EngineOptions(), **kw)


# -- options and results in the JS module's vocabulary ----------------------------------------------

# JS name -> Python name. createEngine()'s options: the desktop's webdrift.load options (EngineOptions).
ENGINE_OPTION_NAMES = {"maxContext": "max_context", "weightFormat": "weight_format",
                       "prefillChunk": "prefill_chunk", "layout": "layout", "fuse": "fuse", "autotune": "autotune",
                       "prefillKernels": "prefill_kernels", "int8Activations": "int8_activations",
                       "maxBindingBytes": "max_binding_bytes", "enableLora": "enable_lora",
                       "maxLoraRank": "max_lora_rank", "loraPoolRank": "lora_pool_rank"}
# generate()'s options: the Engine's SamplingParams.
SAMPLING_OPTION_NAMES = {"maxNewTokens": "max_new_tokens", "temperature": "temperature", "topK": "top_k",
                         "topP": "top_p", "seed": "seed", "stopAtEos": "stop_at_eos", "lora": "lora",
                         "loraScale": "lora_scale"}
# JS has one number type: whole numbers of these arrive as floats when computed in JS
_INTEGER_OPTIONS = {"max_context", "prefill_chunk", "max_binding_bytes", "max_new_tokens", "top_k", "seed",
                    "max_lora_rank", "lora_pool_rank"}


def _from_js(opts: dict | None, names: dict[str, str]) -> dict:
    """Python keyword arguments from JS options (camelCase, or snake_case); absent / null: default.
    Keys that are not in `names` are ignored (the worker sends its own, e.g. `model`)."""
    opts = dict(opts or {})
    kw = {}
    for js_name, py_name in names.items():
        for k in (js_name, py_name):
            if k in opts and opts[k] is not None:
                kw[py_name] = opts[k]
    for k in _INTEGER_OPTIONS & set(kw):
        if isinstance(kw[k], float) and kw[k].is_integer():
            kw[k] = int(kw[k])
    return kw


def engine_options(opts: dict | None) -> EngineOptions:
    """EngineOptions from createEngine()'s options (camelCase as in JS, or snake_case)."""
    return EngineOptions(**_from_js(opts, ENGINE_OPTION_NAMES))


def sampling_from_options(opts: dict | None) -> SamplingParams:
    """SamplingParams from generate()'s options (camelCase as in JS, or snake_case)."""
    return SamplingParams.make(**_from_js(opts, SAMPLING_OPTION_NAMES))


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
            "architecture": dev.architecture, "features": sorted(dev.info.features),
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
    options = engine_options(_loads(opts_json))
    cb = None
    if progress is not None:
        def cb(done, total, name):
            progress(done, total, name)
    src, _state.source = _state.source, None
    if _state.engine is not None:
        _state.engine.dev.destroy()
        _state.engine = None
    _state.engine = await load_browser(src, options, progress=cb)
    return {"info": engine_info(_state.engine)}


def _engine() -> Engine:
    if _state.engine is None:
        raise InvalidArgumentError("the engine is not loaded (or was disposed)")
    return _state.engine


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
    eng = _engine()
    prompt = _prompt(_loads(prompt_json))
    result = await eng.agenerate(prompt, sampling_from_options(_loads(opts_json)), on_text=on_token)
    return {"result": result_dict(result)}


@_json_api
async def api_chat(messages_json, opts_json, on_token=None) -> dict:
    eng = _engine()
    messages = _loads(messages_json)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidArgumentError("chat(messages): messages must be an array of {role, content} objects")
    result = await eng.achat(messages, sampling_from_options(_loads(opts_json)), on_text=on_token)
    return {"result": result_dict(result)}


@_json_api
async def api_add_lora(name, data, label=None) -> dict:
    """engine.loadLora(name, url): a GGUF LoRA file's bytes (fetched by the worker) made resident
    (the engine needs LoRA slots: createEngine({enableLora: true}))."""
    eng = _engine()
    if not isinstance(name, str):
        raise InvalidArgumentError("loadLora(name, url): name must be a string")
    eng.add_lora(name, _as_bytes(data), label=label or name)
    return {"loras": eng.loras}


@_json_api
async def api_remove_lora(name) -> dict:
    eng = _engine()
    eng.remove_lora(name)
    return {"loras": eng.loras}


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
