"""Kernel base: a Python class per operator family specialises a WGSL template for a device,
declares its bindings by name (kernels/bindings.py) and computes its dispatch size. Families
live beside their templates (webdrift/kernels/linear.py <-> wgsl/linear_*.wgsl).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..errors import GPULimitError
from ..gpu.base import UNI, BindGroup, Device, Dispatch
from .bindings import Bindings
from .template import specialise


def grid_1d(n_workgroups: int, max_per_dim: int = 65535) -> tuple[int, int, int]:
    """A (x, y, 1) grid holding at least n workgroups (for tensors with > 65535 workgroups)."""
    n = max(1, n_workgroups)
    if n <= max_per_dim:
        return (n, 1, 1)
    y = (n + max_per_dim - 1) // max_per_dim
    return ((n + y - 1) // y, y, 1)


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def wgsl_float(x: float) -> str:
    """A WGSL f32 literal of x (always with a '.' or an exponent)."""
    r = repr(float(x))
    return r if ("e" in r or "." in r) else r + ".0"


class Kernel:
    """A compiled kernel instance: pipeline + named bindings. `bind(dev, {name: buffer})` builds
    its bind group (once, at build time), `dispatch` a Dispatch of it."""
    template = ""

    def __init__(self, dev: Device, defines: dict, bindings: Bindings, label: str = ""):
        self.dev = dev
        self.defines = dict(defines)
        self.defines.setdefault("F16", dev.has_f16)
        self.defines.setdefault("SUBGROUPS", dev.has_subgroups)
        # Tint (browsers) wants `enable subgroups;`; naga (wgpu-native) rejects it
        self.defines.setdefault("SUBGROUP_ENABLE", dev.wgsl_subgroup_enable)
        self.label = label or self.template
        self.bindings = bindings
        storage = sum(k != UNI for k in bindings.kinds)
        limit = dev.info.limits.get("max-storage-buffers-per-shader-stage")
        if limit is not None and storage > int(limit):   # (a browser's adapter may offer as few as 8)
            raise GPULimitError(f"kernel {self.label!r} binds {storage} storage buffers; the adapter allows {limit} "
                                "per shader stage")
        self.source = specialise(self.template, self.defines)
        if "f16>" in self.source:   # a generated accessor reads native f16 (adapter has shader-f16)
            self.source = "enable f16;\n" + self.source
        self.pipeline = dev.create_pipeline(self.source, bindings.kinds, label=self.label)

    @property
    def binding_names(self) -> tuple[str, ...]:
        return self.bindings.names

    def bind(self, dev: Device, buffers: dict) -> BindGroup:
        """The bind group of {binding name: Buffer | (Buffer, offset, size) | [Buffers]} (the
        names each kernel's docstring lists); ValueError naming missing or unknown names."""
        return dev.create_bind_group(self.pipeline, self.bindings.buffers(buffers, self.label))

    def dispatch(self, buffers: dict | BindGroup, workgroups: tuple[int, int, int], label: str = "") -> Dispatch:
        """One dispatch over `workgroups`, binding `buffers` (a name dict, as bind takes, or a
        bind group made by bind)."""
        self.dev.check_dispatch(workgroups, label or self.label)
        bg = buffers if isinstance(buffers, BindGroup) else self.bind(self.dev, buffers)
        return Dispatch(self.pipeline, bg, tuple(workgroups), label or self.label)
