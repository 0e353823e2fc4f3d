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
Kernel choices: createEngine passes the choices the browser stored (IndexedDB, keyed like the
desktop's cache) in `kernelChoices`; what the adapter can time but has not yet measured is queued
by the tuner (kernels/autotune.py) and `api_tune` measures it in the background (pausing while
the engine generates) and returns the new choices for the worker to store: they apply from the
next load. `api_bench` runs the benchmark protocol (profile/benchmark.py) and returns the same
report as `webdrift bench`.
Must not: import numpy or wgpu; touch navigator.gpu other than through webdrift.gpu.browser;
generate or apply chat templates itself (that is the Engine's).
"""

from __future__ import annotations

import asyncio
import functools
import json
import platform
import time
import traceback
from dataclasses import replace

from .errors import InvalidArgumentError, WebdriftError
from .kernels import autotune
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
                       "maxLoraRank": "max_lora_rank", "loraPoolRank": "lora_pool_rank",
                       "loraFusedShrink": "lora_fused_shrink", "stepsPerSubmit": "steps_per_submit",
                       "kvCache": "kv_cache"}
# generate()'s options: the Engine's SamplingParams.
SAMPLING_OPTION_NAMES = {"maxNewTokens": "max_new_tokens", "temperature": "temperature", "topK": "top_k",
                         "topP": "top_p", "seed": "seed", "stopAtEos": "stop_at_eos", "numResponses": "n",
                         "firstTokens": "first_tokens", "speculative": "speculative", "lora": "lora",
                         "loraScale": "lora_scale"}
# JS has one number type: whole numbers of these arrive as floats when computed in JS
_INTEGER_OPTIONS = {"max_context", "prefill_chunk", "max_binding_bytes", "max_new_tokens", "top_k", "seed", "n",
                    "max_lora_rank", "lora_pool_rank", "steps_per_submit"}


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
        "finishReason": s.finish_reason, "specPasses": s.spec_passes, "draftedTokens": s.drafted_tokens,
        "acceptedTokens": s.accepted_tokens, "plainSteps": s.plain_steps}}


def engine_info(eng: Engine) -> dict:
    dev, cfg = eng.dev, eng.config
    return {"adapter": dev.info.adapter, "backend": dev.info.backend, "vendor": dev.info.vendor,
            "architecture": dev.architecture, "features": sorted(dev.info.features),
            "model": {"name": cfg.name, "arch": cfg.arch, "layers": cfg.n_layers, "dim": cfg.dim,
                      "vocab": cfg.vocab_size, "contextLength": cfg.max_position},
            "maxContext": eng.max_context, "weightBytes": eng.model.weight_bytes,
            "kvBytes": eng.model.kv_bytes, "loadS": eng.load_s,
            "tuning": {"pending": len(autotune.pending(dev)), "timestamps": dev.has_timestamps,
                       "queued": [k.removeprefix(autotune.key_prefix(dev)) for k in autotune.pending(dev)],
                       "tuned": autotune.tunable(dev, eng.model.autotune),
                       "cached": sum(1 for k in autotune.cached_keys() if _adapter_key(dev, k))}}


def _adapter_key(dev, key: str) -> bool:
    return key.startswith(autotune.key_prefix(dev))


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
    options = engine_options(opts)
    imported = autotune.import_choices(_choice_dict(opts.get("kernelChoices")))
    cb = None
    if progress is not None:
        def cb(done, total, name):
            progress(done, total, name)
    src, _state.source = _state.source, None
    if _state.engine is not None:
        _state.engine.dev.destroy()
        _state.engine = None
    steps: dict = {}
    _state.engine = await load_browser(src, options, progress=cb, timings=steps)
    info = engine_info(_state.engine)
    info["tuning"]["imported"] = imported
    info["loadStepsS"] = steps
    return {"info": info}


def _choice_dict(v) -> dict:
    """Stored kernel choices ({key: choice}) from JS (an object or JSON text); anything else: none."""
    v = _loads(v) if isinstance(v, str) else v
    if v is not None and not isinstance(v, dict) and hasattr(v, "to_py"):
        v = v.to_py()
    return v if isinstance(v, dict) else {}


@_json_api
async def api_tune(progress=None) -> dict:
    """Measure the kernel choices the engine's build queued (asynchronous timestamps), one timing
    per await, pausing while the engine generates; returns {"choices": the new ones (to store),
    "tuned": how many were measured, "seconds"}. They apply from the next load."""
    eng = _engine()
    dev = eng.dev
    t0 = time.perf_counter()

    async def pause():
        while eng.busy and _state.engine is eng:
            await asyncio.sleep(0.02)

    def cb(done, total, key):
        if progress is not None:
            progress(done, total, key.removeprefix(autotune.key_prefix(dev)))

    got = await autotune.tune_pending(dev, progress=cb, pause=pause, cancelled=lambda: _state.engine is not eng)
    new = {k: v for k, v in autotune.export_choices(new_only=True).items() if _adapter_key(dev, k)}
    return {"choices": new, "tuned": len(got), "seconds": time.perf_counter() - t0}


@_json_api
async def api_bench(opts_json, progress=None) -> dict:
    """The benchmark protocol on this page's GPU (profile/benchmark.py; the desktop's `webdrift
    bench` options in camelCase): the opened model (api_open), if any, and synthetic shapes.
    Returns {"report": the desktop's report schema, "choices": kernel choices measured}."""
    from . import __version__
    from .gpu.browser import create_browser_device
    from .profile import benchmark as bm
    from .weights.synthetic import PRESETS, QUANTS, check_choice, synthetic_source
    o = _loads(opts_json) or {}
    autotune.import_choices(_choice_dict(o.get("kernelChoices")))

    def names(v) -> list[str]:
        items = v if isinstance(v, list) else [v] if v else []
        return [x.strip() for item in items for x in str(item).split(",") if x.strip()]

    quick = bool(o.get("quick"))
    synthetic, quants = names(o.get("synthetic")), names(o.get("quant"))
    for q in quants:
        check_choice("quant", q, QUANTS)
    for n in synthetic:
        check_choice("synthetic model", n, PRESETS)
    src, _state.source = _state.source, None
    if quick and not synthetic and src is None:
        synthetic = ["tiny"]
    if not synthetic and src is None:
        synthetic = ["smollm2-135m"]
    quants = quants or (["f16", "q8", "q4"] if quick else ["q4"])
    protocols = bm.parse_protocol(o["protocol"]) if o.get("protocol") else (bm.QUICK_PROTOCOL if quick else bm.PROTOCOL)
    repeats = int(o.get("repeats") or 1)
    chunk = int(o["prefillChunk"]) if o.get("prefillChunk") is not None else None   # None: the engine's choice
    profile_tokens = int(o.get("profileTokens") or 0)
    # the engine option (checked by EngineOptions), a whole number again if JS sent 4.0
    sps = _from_js(o, {"stepsPerSubmit": "steps_per_submit"}).get("steps_per_submit")
    if repeats < 1 or (chunk is not None and chunk < 1) or profile_tokens < 0:
        raise InvalidArgumentError("repeats and prefillChunk must be >= 1, profileTokens >= 0")
    i8 = {"auto": None, "on": True, "off": False, None: None, True: True, False: False}.get(o.get("int8Activations"))
    tune = o.get("autotune", True)
    if tune not in (True, False, "force"):
        raise InvalidArgumentError(f'autotune={tune!r}: must be true, false or "force"')
    lines: list[str] = []

    def report(phase, done=0, total=0, **kw):
        if progress is not None:
            progress(json.dumps({"phase": phase, "loaded": done, "total": total, **kw}))

    def log(line: str):
        lines.append(line)
        report("log", message=line)

    dev = await create_browser_device()
    try:
        mib = int(o.get("rooflineMiB") or (16 if quick else 1024))
        report("roofline", message=f"streaming read over {mib} MiB, compute peaks")
        roof = await bm.ameasure_rooflines(dev, mib, quick)
        log(f"adapter: {dev.info.adapter} ({dev.info.backend}); streaming read {roof['best_GBps']} GB/s "
            f"({roof['bytes'] >> 20} MiB, {roof['method']})")
        sources = ([src] if src is not None else []) + [synthetic_source(n, q) for n in synthetic for q in quants]
        note = "the browser runs no peers (they need CUDA on the host); compare with `webdrift bench` rows"

        def report_of(rows: list) -> dict:
            bm.fill_skipped_peers(rows, note, note)
            rep = bm.make_report(
                version=__version__, date=str(o.get("date") or ""), command=str(o.get("command") or "bench() in the browser"),
                machine=bm.machine_info(dev, str(o.get("route") or bm.BROWSER_ROUTE), str(o.get("host") or ""),
                                        platform.python_version()),
                protocols=protocols, prefill_chunk=chunk, repeats=repeats, roofline=roof, peers_note=note,
                results=list(rows))
            rep["log"] = list(lines)
            return rep

        def new_choices() -> dict:
            return {k: v for k, v in autotune.export_choices(new_only=True).items() if _adapter_key(dev, k)}

        results = []
        for i, s in enumerate(sources):
            if i:   # the models done so far, and the choices measured: kept by a host whose run is cut short
                report("partial", i, len(sources), report=bm.mark_incomplete(report_of(results), i, len(sources)),
                       choices=new_choices())
            label = "/".join(bm.model_label(s))
            results += await bm.abench_model(
                dev, s, protocols, roof["best_GBps"], repeats, chunk, log=log, int8_activations=i8, autotune=tune,
                peak_tflops=roof["compute"]["f32"]["tflops"], profile_tokens=profile_tokens, steps_per_submit=sps,
                int8_peak_tflops=(roof["compute"].get("int8") or {}).get("tflops"),
                mma_peak_tflops=(roof["compute"].get("mma_f16") or {}).get("tflops"),
                progress=lambda phase, d, t, label=label, i=i: report(phase, d, t, model=label, index=i,
                                                                     models=len(sources)))
        return {"report": report_of(results), "choices": new_choices()}
    finally:
        dev.destroy()


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


def _results(result) -> dict:
    """{"result": {text, tokenIds, stats}}, or a list of them for numResponses > 1."""
    if isinstance(result, list):
        return {"result": [result_dict(r) for r in result]}
    return {"result": result_dict(result)}


def _on_text(on_token, sp: SamplingParams):
    """The engine's text callback for JS's onToken(piece) (numResponses > 1: onToken(piece, stream))."""
    if on_token is None or sp.n == 1:
        return on_token
    return lambda ev: on_token(ev[1], ev[0])


@_json_api
async def api_generate(prompt_json, opts_json, on_token=None) -> dict:
    eng = _engine()
    prompt = _prompt(_loads(prompt_json))
    sp = sampling_from_options(_loads(opts_json))
    return _results(await eng.agenerate(prompt, sp, on_text=_on_text(on_token, sp)))


@_json_api
async def api_chat(messages_json, opts_json, on_token=None) -> dict:
    eng = _engine()
    messages = _loads(messages_json)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidArgumentError("chat(messages): messages must be an array of {role, content} objects")
    sp = sampling_from_options(_loads(opts_json))
    return _results(await eng.achat(messages, sp, on_text=_on_text(on_token, sp)))


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
