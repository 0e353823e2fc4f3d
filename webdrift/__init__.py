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
    EngineBusyError,
    GPUError,
    GPULimitError,
    InvalidArgumentError,
    InvalidTextError,
    ModelFileError,
    ModelNotFoundError,
    NumericalError,
    TokenizerError,
    UnsupportedModelError,
    WebdriftError,
)

__version__ = "0.1.0"
__all__ = [
    "ContextLengthError",
    "DownloadError",
    "Engine",
    "EngineBusyError",
    "EngineOptions",
    "GPUError",
    "GPULimitError",
    "InvalidArgumentError",
    "InvalidTextError",
    "ModelFileError",
    "ModelNotFoundError",
    "NumericalError",
    "TokenizerError",
    "UnsupportedModelError",
    "WebdriftError",
    "load",
]


def load(model: str | None = None, *, max_context: int | None = None, weight_format: str | None = None,
         device=None, prefill_chunk: int | None = None, layout: str = "linear", auto_pull: bool = True,
         progress=None, fuse: bool = True, autotune: bool | str = True, prefill_kernels: str = "auto",
         int8_activations: bool | dict | None = None, max_binding_bytes: int | None = None,
         loras: dict | None = None, enable_lora: bool = False, max_lora_rank: int = 64,
         lora_pool_rank: int | None = None, lora_fused_shrink: bool = False, steps_per_submit: int | None = None,
         kv_cache: str | None = None):
    """Load a model: a known name (see `webdrift.hub.KNOWN_MODELS`; default `webdrift.hub.DEFAULT_MODEL`,
    smollm2-135m), a .gguf path, or an HF folder.

    max_context: KV-cache length allocated once (default min(model context, 2048)).
    weight_format: runtime weight format of every matrix ("f32", "f16", "q8", "q8_0", "q8pc",
    "q4", "q4_0", "q4g128", "q4pc", "e0m4", ..., the mixed "8/4/4" or "exact";
    docs/QUANTIZATION.md), re-quantized on the GPU at load where the file differs; default follows
    the file (Q8_0/Q5_0 -> q8_0, Q4_0 -> q4_0, Q4_K -> q4k, Q5_K -> q5k, Q6_K -> q6k, all kept
    as stored; Q5_1 -> q8, Q4_1/Q2_K/Q3_K -> q4, F16 -> f16, F32/BF16 -> f32;
    models/manifest.runtime_format).
    prefill_chunk: prompt tokens per prefill dispatch list (default: 1024 on GPUs, fewer where
    the activations of that many rows would not fit one binding; 256 on software adapters;
    runtime/engine.py auto_prefill_chunk).
    layout: physical layout of activations ("linear" or "sliced").
    fuse: fold RMSNorms into the linear layers that consume them (False: separate norm kernels).
    autotune: time the decode GEMV variants on this adapter at first use (cached) and keep the fastest;
    "force": also on software adapters (lavapipe, SwiftShader), which otherwise keep static rules.
    prefill_kernels: "gemm" (tiled matrix-matrix kernels; on q8/q8_0/q4/q4_0/q4k/q5k/q6k layers with int8 activations
    and integer dot products where the GPU has them), "gemv" (the decode kernels over the
    prompt's rows), "auto" (gemv on software adapters such as lavapipe, gemm elsewhere), or
    "gemm_float" / "gemm_int8" (the float / the int8 GEMM forced).
    int8_activations: decode q8/q8_0/q4/q4_0/q4k/q5k/q6k layers from int8-quantized activations (per 32-block scales,
    like llama.cpp's MMVQ) with integer dot products. None (auto): on GPUs that have them, for
    each GEMV role where measuring both paths shows the faster GEMV repays its quantize dispatch;
    True / False: every role; a dict {"qkv", "o", "gateup", "down", "head": bool}: those roles.
    max_binding_bytes: keep every weight buffer at most this size, below the adapter's
    max-storage-buffer-binding-size (default: the adapter's limit). The token embedding and LM
    head split into row shards to fit it (as they do at the adapter's own limit); to check how a
    model behaves on an adapter with smaller bindings, or to test the sharded path.
    loras: {name: adapter} LoRA adapters made resident at load (a PEFT folder with
    adapter_config.json + adapter_model.safetensors, or a llama.cpp GGUF LoRA file); applied per
    request with generate(..., lora=name, lora_scale=1.0). enable_lora: build the LoRA slots
    without adapters yet (Engine.add_lora later). max_lora_rank: the largest rank the slots take
    (default 64); lora_pool_rank: rank rows of resident adapters together (default 2 *
    max_lora_rank). Without either, the programs are exactly those of a build without LoRA.
    lora_fused_shrink: a single request's decode step over the int8 chain runs its LoRA shrinks in
    the epilogues of the kernels writing each GEMV's int8 row instead of a dispatch per GEMV
    (faster: a rank-16 adapter on the 1B q4 0.73-0.75x of no adapter instead of 0.65x, H100), but
    its sums run in another order than the streams' and tree programs', so a stream's greedy
    tokens may differ from a single run's at int8 rounding (off by default: they are equal).
    steps_per_submit: the most decode steps the engine puts in one GPU submit (1-32; default: the
    device's, `Device.decode_steps_per_submit`); more steps per submit spend less host time per
    token, fewer let a stopped generation end sooner (docs/ARCHITECTURE.md, "The host loop").
    kv_cache: the KV cache's values, "f16" (half the memory of "f32", and half of what decode
    attention reads at depth: llama.cpp's default) or "f32"; default f16 where the adapter has
    shader-f16, else f32. K and V are rounded to f16 as they are appended; scores, softmax and
    sums stay f32. A K or V value beyond f16's range (65504) would overflow (llama.cpp's f16 cache
    has the same limit; the sampler reports a non-finite row as a NumericalError): "f32" then.
    device: a device to load onto (default: `webdrift.gpu.native.get_device()`, wgpu-native's, or
        Dawn's where WEBDRIFT_GPU_API=dawn; `get_device("dawn")` asks for Dawn, gpu/dawn.py).
    auto_pull: fetch a known model into the cache if it is not there yet (False: ModelNotFoundError).
    progress: progress(done, total, name) called per weight tensor uploaded.

    These options are `webdrift.runtime.loading.EngineOptions`; the assembly is
    `webdrift.runtime.loading.load_desktop`, the same path the browser and the tools take.
    """
    from .runtime.loading import EngineOptions, load_desktop
    if model is None:
        from .hub import DEFAULT_MODEL
        model = DEFAULT_MODEL
    options = EngineOptions(max_context=max_context, weight_format=weight_format, prefill_chunk=prefill_chunk,
                            layout=layout, fuse=fuse, autotune=autotune, prefill_kernels=prefill_kernels,
                            int8_activations=int8_activations, max_binding_bytes=max_binding_bytes,
                            enable_lora=enable_lora or bool(loras), max_lora_rank=max_lora_rank,
                            lora_pool_rank=lora_pool_rank, lora_fused_shrink=lora_fused_shrink,
                            steps_per_submit=steps_per_submit, kv_cache=kv_cache)
    return load_desktop(model, options, device=device, auto_pull=auto_pull, progress=progress, loras=loras)


def __getattr__(name):
    if name == "Engine":
        from .runtime.engine import Engine
        return Engine
    if name == "EngineOptions":
        from .runtime.loading import EngineOptions
        return EngineOptions
    raise AttributeError(name)
