"""EmbeddingKernel (wgsl/embedding.wgsl): gather rows of a (vocab, dim) weight, or of one row
shard of it, for the step's token ids.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..gpu.base import Device
from ..tensor import TensorDesc
from .base import Kernel, ceil_div, wgsl_float
from .bindings import Bindings
from .weights import GPUWeight

FORECAST_ID = 0x80000000   # an id with this bit: a forecast vector's row, not a token


class EmbeddingKernel(Kernel):
    """out[t, :] = w[ids[t], :] * scale for t < n_tokens. Bindings:
      step  the Step uniform
      ids   (T_cap) u32 token ids of the step
      w     the (vocab, dim) weight, any runtime format (w.buffers), or one row shard of it
      out   (T_cap, dim) activation
      fc    (forecast) (FORECAST_ROWS, dim) f32 forecast vectors: a row whose id has the
            FORECAST_ID bit reads vector id & ~FORECAST_ID instead (unscaled: they are the layer
            input itself), tree verification's DS2D rows (runtime/speculative.py)
    Dispatch: (ceil(dim / 256), T)."""
    template = "embedding"

    def __init__(self, dev: Device, w: GPUWeight, out: TensorDesc, scale: float = 1.0, nt: str = "step.n_tokens",
                 shard: bool = False, forecast: bool = False):
        """shard: w is a row shard of the table (rows w.row0 .. w.row0 + w.o): write only the
        tokens whose ids fall in it (one dispatch per shard covers the whole table); forecast: also
        the forecast rows (binding fc; one shard's dispatch only)."""
        self.out = out
        b = Bindings()
        d = {"STEP_DECL": b.step(),
             "IDS_DECL": b.array("ids", "array<u32>", "(T_cap) token ids", writable=True),
             "W_DECL": b.weight("w", w, lambda n, k: w.wgsl(n, k, native_f16=dev.has_f16)),
             "OUT_DECL": b.tensor("out", out), "SCALE": wgsl_float(scale), "NT": nt,
             "SHARD": shard, "ROW0": w.row0, "NROWS": w.o, "FORECAST": forecast,
             "FC_DECL": b.array("fc", "array<vec4<f32>>", "(rows, dim / 4) forecast vectors") if forecast else "",
             "FORECAST_ID": FORECAST_ID}
        super().__init__(dev, d, b, "embedding")

    def workgroups(self, t: int):
        return (ceil_div(self.out.s, 64), t, 1)
