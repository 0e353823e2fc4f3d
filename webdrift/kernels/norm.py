"""RMSNormKernel (wgsl/norm.wgsl): RMSNorm over channels, with the residual add fused (the
stream written back), Gemma's post-norm accumulate, and the last-row mode feeding the LM head.
(RMSNorm fused into the GEMV or quantizer that consumes x instead: PreNorm.)
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gpu.base import Device
from ..tensor import TensorDesc
from .base import Kernel, wgsl_float
from .bindings import Bindings


@dataclass(frozen=True)
class PreNorm:
    """RMSNorm of x fused in: x / sqrt(mean(x^2) + eps) * (nw + w_offset). Float GEMVs bind the
    norm weight as "nw"; blk GEMVs get x normed-by-weight from QuantizeKernel and apply 1/rms
    from x_partials partial sums of x^2 in the row (None: QuantizeKernel's n_partials)."""
    eps: float
    w_offset: float = 0.0
    x_partials: int | None = None


class RMSNormKernel(Kernel):
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * (w + w_offset). Bindings:
      step  the Step uniform
      x     (T_cap, C) activation (with add_input: x += r is written back first)
      out   (T_cap, C) activation (last_row: row 0 only, from x's row step.last_row)
      w     (C) f32 norm weight
      r     (T_cap, C) activation, only with add_input
    Dispatch: (T, 1, 1)."""
    template = "norm"

    def __init__(self, dev: Device, x: TensorDesc, out: TensorDesc, eps: float, w_offset: float = 0.0,
                 add_input: TensorDesc | None = None, accumulate: bool = False, last_row: bool = False):
        """accumulate: out += the normalised row (Gemma's post-norms add it into the stream)."""
        b = Bindings()
        d = {"STEP_DECL": b.step(), "X_DECL": b.tensor("x", x), "OUT_DECL": b.tensor("out", out),
             "W_DECL": b.array("w", "array<f32>", f"({x.c}) norm weight"),
             "R_DECL": b.tensor("r", add_input) if add_input is not None else "",
             "EPS": wgsl_float(eps), "W_OFFSET": wgsl_float(w_offset), "ADD_INPUT": add_input is not None,
             "ACCUMULATE": accumulate, "LAST_ROW": last_row, "NT": "1u" if last_row else "step.n_tokens"}
        super().__init__(dev, d, b, "rms_norm")

    def workgroups(self, t: int):
        return (t, 1, 1)
