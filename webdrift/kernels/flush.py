"""L2FlushKernel (wgsl/l2_flush.wgsl): reads a scratch buffer larger than the GPU's last-level
cache, so a kernel timed right after it reads its weights from memory (kernels/autotune.py).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..gpu.base import Device
from .base import Kernel
from .bindings import Bindings

FLUSH_BYTES = 256 << 20   # > the L2 of every GPU we know (H100 / H200 50 MiB, RTX 4090 72 MiB,
                          # RDNA3's 96 MiB Infinity Cache); capped by the adapter's binding limit


class L2FlushKernel(Kernel):
    """Bindings: buf, the scratch buffer (FLUSH_BYTES or the adapter's binding limit); sync, the
    timed kernel's output (bound writable, never written: orders the flush and the kernel).
    Dispatch: (1024, 1, 1) (a grid-stride loop)."""
    template = "l2_flush"

    def __init__(self, dev: Device):
        b = Bindings()
        super().__init__(dev, {"BUF_DECL": b.array("buf", "array<vec4<u32>>", "scratch", writable=True),
                               "SYNC_DECL": b.array("sync", "array<u32>", "the timed kernel's output", writable=True)},
                         b, "l2_flush")
        self.nbytes = min(FLUSH_BYTES, dev.max_binding_size, dev.max_buffer_size) // 16 * 16

    def workgroups(self) -> tuple[int, int, int]:
        return (1024, 1, 1)
