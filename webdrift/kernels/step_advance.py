"""StepAdvanceKernel (wgsl/step_advance.wgsl): several decode steps in one submit, the step
uniform of each copied on the GPU from records the host writes once per submit.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..gpu.base import Device
from .base import Kernel
from .bindings import Bindings
from .step import STEP_BYTES


class StepAdvanceKernel(Kernel):
    """wgsl/step_advance.wgsl: the step uniform of the next decode step, copied on the GPU from
    the host's records. Bindings: records, the counter (word 0 of a 64-byte header) then one
    STEP_BYTES record per step; dst, the step buffer (a STEP_UNIFORM buffer). Dispatch: (1, 1, 1).
    `records(...)` packs what the host writes once per submit."""
    template = "step_advance"

    def __init__(self, dev: Device):
        b = Bindings()
        super().__init__(dev, {"RECORDS_DECL": b.array("records", "array<u32>", "(1 + steps, 16) u32: counter, records",
                                                       writable=True),
                               "DST_DECL": b.array("dst", "array<u32>", "(16) u32: the step uniform", writable=True),
                               "WORDS": STEP_BYTES // 4}, b, "step_advance")

    @staticmethod
    def records(steps: list[bytes]) -> bytes:
        """The counter (0) in a STEP_BYTES header, then the steps' records (pack_step's)."""
        return bytes(STEP_BYTES) + b"".join(steps)
