"""EngineOptions: how an Engine is built, every option checked in one place (each bad value an
InvalidArgumentError naming the option). Used by the Engine and by the assembly path
(runtime/loading.py), which re-exports it.
Must not: import numpy, wgpu or js; import the Engine (the Engine imports this).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import InvalidArgumentError
from ..models.manifest import WEIGHT_FORMATS

LAYOUTS = ("linear", "sliced")
MAX_STEPS_PER_SUBMIT = 32   # decode steps one submit may run
# gemm: the GEMMs, int8 on q4/q8 layers where choices.choose_prefill_int8 says so; gemm_float /
# gemm_int8: the float / the int8 GEMM forced (tests; int8 on software adapters)
PREFILL_KERNELS = ("auto", "gemm", "gemv", "gemm_float", "gemm_int8")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class EngineOptions:
    """How an Engine is built; webdrift.load's docstring explains each option."""

    max_context: int | None = None        # KV-cache length, allocated once (None: min(model's, 2048))
    weight_format: str | None = None      # every matrix as one of WEIGHT_FORMATS, or "8/4/4" (None: follows the file)
    prefill_chunk: int | None = None      # prompt tokens per prefill dispatch list (None: chosen,
                                          # runtime/engine.py auto_prefill_chunk)
    layout: str = "linear"                # physical layout of activations: linear | sliced
    fuse: bool = True                     # fold RMSNorms into the linear layers that consume them
    autotune: bool | str = True           # time kernel variants on this adapter at first use (cached);
                                          # "force": on software adapters too (tests)
    prefill_kernels: str = "auto"         # gemm | gemv | auto (gemv on software adapters) | gemm_float | gemm_int8
    int8_activations: bool | dict | None = None   # None: measured per role; True / False; {role: bool}
    max_binding_bytes: int | None = None  # cap on each weight buffer (None: the adapter's limit)
    enable_lora: bool = False             # build the programs with LoRA slots (load(loras=...) sets it)
    max_lora_rank: int = 64               # the largest adapter rank the slots take
    lora_pool_rank: int | None = None     # rank rows of resident adapters (None: 2 * max_lora_rank)
    lora_fused_shrink: bool = False       # the int8 chain's decode step with the shrinks in the producers
    steps_per_submit: int | None = None   # most decode steps in one GPU submit (None: the device's default)
    kv_cache: str | None = None           # the KV cache's values: "f16" | "f32" (None: f16 where shader-f16 exists)

    def __post_init__(self):
        def bad(name: str, want: str):
            raise InvalidArgumentError(f"{name}={getattr(self, name)!r}: {want}")

        if self.max_context is not None and (not _is_int(self.max_context) or self.max_context < 1):
            bad("max_context", "must be a positive integer")
        if self.weight_format is not None and self.weight_format not in WEIGHT_FORMATS:
            bad("weight_format", f"choose one of {', '.join(WEIGHT_FORMATS)}")
        if self.prefill_chunk is not None and (not _is_int(self.prefill_chunk) or self.prefill_chunk < 1):
            bad("prefill_chunk", "must be None or a positive integer")
        if self.layout not in LAYOUTS:
            bad("layout", f"choose {' or '.join(LAYOUTS)}")
        if not isinstance(self.fuse, bool):
            bad("fuse", "must be True or False")
        if not isinstance(self.autotune, bool) and self.autotune != "force":
            bad("autotune", 'must be True, False or "force" (measure on software adapters too)')
        if self.prefill_kernels not in PREFILL_KERNELS:
            bad("prefill_kernels", f"choose one of {', '.join(PREFILL_KERNELS)}")
        i8 = self.int8_activations
        if isinstance(i8, dict):
            # the role names are the model's (GPUModel checks them); here only the shape
            if not all(isinstance(k, str) and isinstance(v, bool) for k, v in i8.items()):
                bad("int8_activations", "a dict must map role names to True / False")
            object.__setattr__(self, "int8_activations", dict(i8))    # no aliasing of the caller's dict
        elif i8 is not None and not isinstance(i8, bool):
            bad("int8_activations", "must be None (auto), True, False or a dict {role: bool}")
        if self.max_binding_bytes is not None and (not _is_int(self.max_binding_bytes)
                                                   or self.max_binding_bytes < 1024):
            bad("max_binding_bytes", "must be an integer >= 1024")
        if not isinstance(self.enable_lora, bool):
            bad("enable_lora", "must be True or False")
        if self.kv_cache not in (None, "f16", "f32"):
            bad("kv_cache", 'choose "f16", "f32" or None (f16 where the adapter has shader-f16)')
        if not isinstance(self.lora_fused_shrink, bool):
            bad("lora_fused_shrink", "must be True or False")
        if not _is_int(self.max_lora_rank) or not 1 <= self.max_lora_rank <= 1024:
            bad("max_lora_rank", "must be an integer in [1, 1024]")
        if self.steps_per_submit is not None and (not _is_int(self.steps_per_submit)
                                                  or not 1 <= self.steps_per_submit <= MAX_STEPS_PER_SUBMIT):
            bad("steps_per_submit", f"must be None (the device's default) or an integer in [1, {MAX_STEPS_PER_SUBMIT}]")
        if self.lora_pool_rank is not None and (not _is_int(self.lora_pool_rank)
                                                or not self.max_lora_rank <= self.lora_pool_rank <= 65536):
            bad("lora_pool_rank", f"must be None or an integer in [max_lora_rank ({self.max_lora_rank}), 65536]")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in fields(cls))
