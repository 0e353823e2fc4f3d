"""Kernel base: a Python class per operator family specialises a WGSL template for a device,
declares its bindings and computes its dispatch size. Subclasses live beside their template
(wgsl/<name>.wgsl <-> webdrift/kernels/<name>.py).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..gpu.base import Device, Dispatch, check_workgroups
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


class Kernel:
    """A compiled kernel instance: pipeline + bindings; `dispatch(buffers, wg)` builds a Dispatch."""
    template = ""

    def __init__(self, dev: Device, defines: dict, bindings: tuple[str, ...], label: str = ""):
        self.dev = dev
        self.defines = dict(defines)
        self.defines.setdefault("F16", dev.has_f16)
        self.defines.setdefault("SUBGROUPS", dev.has_subgroups)
        # Tint (browsers) wants `enable subgroups;`; naga (wgpu-native) rejects it
        self.defines.setdefault("SUBGROUP_ENABLE", dev.wgsl_subgroup_enable)
        self.label = label or self.template
        self.source = specialise(self.template, self.defines)
        if "f16>" in self.source:   # a generated accessor reads native f16 (adapter has shader-f16)
            self.source = "enable f16;\n" + self.source
        self.pipeline = dev.create_pipeline(self.source, bindings, label=self.label)

    def dispatch(self, buffers: list, workgroups: tuple[int, int, int], label: str = "") -> Dispatch:
        check_workgroups(self.dev, workgroups, label or self.label)
        bg = self.dev.create_bind_group(self.pipeline, buffers)
        return Dispatch(self.pipeline, bg, tuple(workgroups), label or self.label)
