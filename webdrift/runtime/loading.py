"""The one assembly path: model reference -> ModelSource -> tokenizer -> device -> Engine.

Every Engine is built here: `webdrift.load` (desktop), the browser API (webdrift/browser_api.py)
and the tools (bench, profile). How an Engine is built is one `EngineOptions`, checked in one
place: each bad value is an InvalidArgumentError naming the option. The only step that differs
between the desktop and the browser is making the device (`gpu.native.get_device()` is sync,
`gpu.browser.create_browser_device()` is awaited), so `assemble` takes a ready device and two
thin entry points make it:

    load_desktop(model, options)          -> Engine   webdrift.load
    await load_browser(model, options)    -> Engine   webdrift.browser_api
    assemble(source, options, device)     -> Engine   both, and the tools (their own source and
                                                      tokenizer: synthetic weights, token ids only)

model: a known name (webdrift.hub), a .gguf path, an HF folder, or a GGUF file's bytes.
Must not: import numpy, wgpu or js (it runs in Pyodide); import a GPU backend or webdrift.hub
at module level (each entry point imports what it uses, so the browser never loads the
desktop's); import webdrift.tools.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError, TokenizerError, shown
from .options import EngineOptions

if TYPE_CHECKING:   # for annotations only: importing the Engine loads the whole GPU model stack
    from ..tokenizer import Tokenizer
    from ..weights.source import ModelSource
    from .engine import Engine

__all__ = ["EngineOptions", "assemble", "load_browser", "load_desktop", "make_tokenizer", "open_source"]

def make_tokenizer(source: ModelSource) -> Tokenizer:
    """The tokenizer described by a ModelSource (GGUF metadata or an HF tokenizer.json)."""
    from ..tokenizer import Tokenizer
    info = source.tokenizer_info
    if info.get("kind") == "gguf":
        return Tokenizer.from_gguf_metadata(info["metadata"])
    if info.get("kind") == "hf":
        return Tokenizer.from_tokenizer_json(info["tokenizer_json"], info.get("tokenizer_config"))
    raise TokenizerError(f"{source.path}: the model has no tokenizer")


def open_source(model, *, name: str | None = None, auto_pull: bool = True) -> ModelSource:
    """A model reference -> ModelSource: a known name (pulled into the cache if needed and
    auto_pull), a .gguf path or an HF folder, or a GGUF file's bytes (`name` labels them in
    messages, e.g. the URL they were fetched from). A ModelSource is returned as it is."""
    from ..weights.source import ModelSource, open_model_source
    if not isinstance(auto_pull, bool):
        raise InvalidArgumentError(f"auto_pull={shown(auto_pull)}: must be True or False")
    if name is not None and not isinstance(name, str):
        raise InvalidArgumentError(f"name={shown(name)}: must be None or a str")
    if isinstance(model, ModelSource):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        return open_model_source(model, name=name or "<model>")
    if isinstance(model, (str, os.PathLike)):
        from ..hub import resolve_model  # desktop only (pip); never reached with bytes
        return open_model_source(resolve_model(model, auto_pull=auto_pull), name=name)
    raise InvalidArgumentError(f"model must be a known model name, a path or a GGUF file's bytes, "
                               f"got {type(model).__name__}")


def _options(options) -> EngineOptions:
    if options is None:
        return EngineOptions()
    if not isinstance(options, EngineOptions):
        raise InvalidArgumentError(f"options must be an EngineOptions, got {type(options).__name__}")
    return options


def assemble(source: ModelSource, options: EngineOptions | None, device, *, tokenizer=None,
             progress=None, loras: dict | None = None) -> Engine:
    """The Engine for an opened source on a ready device: uploads (and converts) the weights,
    plans the programs. tokenizer: default the source's own (make_tokenizer); progress(done,
    total, name) is called per weight tensor; loras: {name: adapter} made resident (Engine.add_lora;
    the options need enable_lora)."""
    from .engine import Engine
    options = _options(options)
    loras = _loras(loras)
    if loras and not options.enable_lora:
        raise InvalidArgumentError("loras=... needs an engine with LoRA slots: EngineOptions(enable_lora=True)")
    if tokenizer is None:
        tokenizer = make_tokenizer(source)
    eng = Engine(device, source, tokenizer, options, progress=progress)
    for name, src in loras.items():
        eng.add_lora(name, src)
    return eng


def _loras(loras) -> dict:
    """{name: adapter} checked: non-empty str names, a path or a GGUF file's bytes each."""
    if loras is None:
        return {}
    if not isinstance(loras, dict) or not all(
            isinstance(k, str) and k and isinstance(v, (str, os.PathLike, bytes, bytearray, memoryview))
            for k, v in loras.items()):
        raise InvalidArgumentError(f"loras={shown(loras)}: must be a dict {{name: PEFT folder, GGUF LoRA path or "
                                   "a GGUF file's bytes}")
    return dict(loras)


def load_desktop(model, options: EngineOptions | None = None, *, device=None, auto_pull: bool = True,
                 progress=None, loras: dict | None = None) -> Engine:
    """The desktop path (webdrift.load): the model reference opened, its tokenizer built, then the
    desktop device (unless given: gpu.native.get_device(), wgpu-native or, by WEBDRIFT_GPU_API,
    Dawn), then the Engine (with `loras` resident)."""
    options = _options(options)                 # a bad option fails before anything is pulled
    _loras(loras)
    source = open_source(model, auto_pull=auto_pull)
    tokenizer = make_tokenizer(source)
    if device is None:
        from ..gpu.native import get_device
        device = get_device()
    return assemble(source, options, device, tokenizer=tokenizer, progress=progress, loras=loras)


async def load_browser(model, options: EngineOptions | None = None, *, name: str | None = None, device=None,
                       progress=None, timings: dict | None = None) -> Engine:
    """The browser path (webdrift.browser_api): the model (a GGUF file's bytes, or a source
    already opened with open_source) and its tokenizer, then the page's WebGPU device (unless
    given), then the Engine; GPU validation errors raised during the upload surface here.
    timings: a dict given here gets the seconds of each step ("tokenizer", "device", "engine":
    weights uploaded and converted, programs planned; "check": the device's errors awaited)."""
    t = [time.perf_counter()]
    options = _options(options)
    source = open_source(model, name=name)
    tokenizer = make_tokenizer(source)
    t.append(time.perf_counter())
    if device is None:
        from ..gpu.browser import create_browser_device
        device = await create_browser_device()
    t.append(time.perf_counter())
    eng = assemble(source, options, device, tokenizer=tokenizer, progress=progress)
    t.append(time.perf_counter())
    await device.check_errors()
    t.append(time.perf_counter())
    if timings is not None:
        timings.update({k: t[i + 1] - t[i] for i, k in enumerate(("tokenizer", "device", "engine", "check"))})
    return eng
