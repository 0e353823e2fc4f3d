"""webdrift: LLM inference on the GPU through WebGPU, on the desktop (wgpu-native) and in the
browser (Pyodide), from one Python core.

    import webdrift
    eng = webdrift.load("smollm2-135m")
    print(eng.generate("Why is the sky blue?", max_new_tokens=32).text)
"""

from __future__ import annotations

from .errors import (
    ContextLengthError,
    DownloadError,
    GPUError,
    GPULimitError,
    InvalidArgumentError,
    ModelFileError,
    ModelNotFoundError,
    TokenizerError,
    UnsupportedModelError,
    WebdriftError,
)

__version__ = "0.1.0"
__all__ = [
    "ContextLengthError",
    "DownloadError",
    "Engine",
    "GPUError",
    "GPULimitError",
    "InvalidArgumentError",
    "ModelFileError",
    "ModelNotFoundError",
    "TokenizerError",
    "UnsupportedModelError",
    "WebdriftError",
    "load",
]


def make_tokenizer(source):
    """The tokenizer described by a ModelSource (GGUF metadata or an HF tokenizer.json)."""
    from .tokenizer import Tokenizer
    info = source.tokenizer_info
    if info.get("kind") == "gguf":
        return Tokenizer.from_gguf_metadata(info["metadata"])
    if info.get("kind") == "hf":
        return Tokenizer.from_tokenizer_json(info["tokenizer_json"], info.get("tokenizer_config"))
    raise TokenizerError(f"{source.path}: the model has no tokenizer")


def load(model: str = "smollm2-135m", *, max_context: int | None = None, weight_format: str | None = None,
         device=None, prefill_chunk: int = 256, layout: str = "linear", auto_pull: bool = True,
         progress=None, fuse: bool = True, autotune: bool = True, prefill_kernels: str = "auto",
         int8_activations: bool | dict | None = None, max_binding_bytes: int | None = None):
    """Load a model: a known name (see `webdrift.hub.KNOWN_MODELS`), a .gguf path, or an HF folder.

    max_context: KV-cache length allocated once (default min(model context, 2048)).
    weight_format: runtime weight format ("f32", "f16", "q8", "q4") of every matrix, re-quantized
    on the GPU at load where the file differs; default follows the file (Q8_0/Q5_x/Q6_K -> q8,
    Q4_0/Q4_1/Q4_K/Q2_K/Q3_K -> q4, F16 -> f16, F32/BF16 -> f32; kernels/convert.runtime_format).
    layout: physical layout of activations ("linear" or "sliced").
    fuse: fold RMSNorms into the linear layers that consume them (False: separate norm kernels).
    autotune: time the decode GEMV variants on this adapter at first use (cached) and keep the fastest.
    prefill_kernels: "gemm" (tiled matrix-matrix kernels), "gemv" (the decode kernels over the
    prompt's rows) or "auto" (gemv on software adapters such as lavapipe, gemm elsewhere).
    int8_activations: decode q4/q8 layers from int8-quantized activations (per 32-block scales,
    like llama.cpp's MMVQ) with integer dot products. None (auto): on GPUs that have them, for
    each GEMV role where measuring both paths shows the faster GEMV repays its quantize dispatch;
    True / False: every role; a dict {"qkv", "o", "gateup", "down", "head": bool}: those roles.
    max_binding_bytes: keep every weight buffer at most this size, below the adapter's
    max-storage-buffer-binding-size (default: the adapter's limit). The token embedding and LM
    head split into row shards to fit it (as they do at the adapter's own limit); to check how a
    model behaves on an adapter with smaller bindings, or to test the sharded path.
    """
    from .hub import resolve_model
    from .runtime.engine import Engine
    from .weights.source import open_model_source
    if weight_format is not None and weight_format not in ("f32", "f16", "q8", "q4"):
        raise InvalidArgumentError(f"weight_format={weight_format!r}: choose one of f32, f16, q8, q4")
    path = resolve_model(model, auto_pull=auto_pull)
    source = open_model_source(path)
    tok = make_tokenizer(source)
    if device is None:
        from .gpu.native import get_device
        device = get_device()
    return Engine(device, source, tok, max_context=max_context, weight_format=weight_format,
                  prefill_chunk=prefill_chunk, layout=layout, progress=progress, fuse=fuse, autotune=autotune,
                  prefill_kernels=prefill_kernels, int8_activations=int8_activations,
                  max_binding_bytes=max_binding_bytes)


def __getattr__(name):
    if name == "Engine":
        from .runtime.engine import Engine
        return Engine
    raise AttributeError(name)
