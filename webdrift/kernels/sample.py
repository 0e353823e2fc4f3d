"""Sampling on the GPU: SampleKernel (wgsl/sample.wgsl: greedy, or temperature + top-k + top-p
with a counter-based RNG) and ArgmaxKernel (wgsl/sample_argmax.wgsl: greedy's first phase, the
maximum of each span of the vocabulary in its own workgroup).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..gpu.base import Device
from ..tensor import TensorDesc
from .base import Kernel, ceil_div
from .bindings import Bindings

# The token SampleKernel writes when a logit of the row is NaN or infinite (never a token id:
# vocabularies are far below 2**32); the host raises NumericalError when it reads one back.
NONFINITE_TOKEN = 0xFFFFFFFF


class SampleKernel(Kernel):
    """Tokens sampled from logits rows, one per workgroup r (NONFINITE_TOKEN if a logit of the row
    is NaN or infinite), written to out_tokens[step.step * step.n_out + r] and ids[r]. Bindings:
      step        the Step uniform (temperature, top_k, top_p, seed, step, n_out)
      logits      (rows, V) activation; row `row` is sampled (a WGSL expression of r: "r" for the
                  streams, one row each; "0u": the one row, drawn n_out times)
      out_tokens  (steps) u32 generated tokens, read back by the host
      ids         (T_cap) u32 the next step's token ids (the embedding's input)
      part        (rows, partials, 2) u32 ArgmaxKernel's (value bits, id) per span, only with partials
    Dispatch: (1, rows sampled, 1)."""
    template = "sample"

    def __init__(self, dev: Device, logits: TensorDesc, vocab: int, row: str = "step.last_row", partials: int = 0):
        """partials: the number of ArgmaxKernel spans greedy sampling reduces; 0: scan the row."""
        b = Bindings()
        d = {"STEP_DECL": b.step(), "L_DECL": b.tensor("logits", logits, var="l"),
             "OUT_TOKENS_DECL": b.array("out_tokens", "array<u32>", "(steps) sampled tokens", writable=True),
             "IDS_DECL": b.array("ids", "array<u32>", "(T_cap) next step's token ids", writable=True),
             "PART_DECL": (b.array("part", "array<u32>", f"({partials}, 2) argmax (value bits, id) per span",
                                   writable=True) if partials else ""),
             "V": vocab, "CH": ceil_div(vocab, 256), "LROW": row,
             "PART_ROW": "r" if row == "r" else "0u", "NPART": partials}   # per-row spans only per row
        super().__init__(dev, d, b, "sample")

    def workgroups(self, t: int = 1):
        return (1, t, 1)


class ArgmaxKernel(Kernel):
    """Greedy sampling's first phase: the maximum of each SPAN of logits (ties: lowest id; the id
    NONFINITE_TOKEN for a span holding a NaN or an infinity).
    Bindings:
      step    the Step uniform
      logits  (rows, V) activation; row `row` (a WGSL expression) is read; per_row: every row
      part    (n_parts, 2) u32 (value bits, id) per span; per_row: (rows, n_parts, 2); topk > 1:
              (rows, n_parts, topk, 2), each span's topk largest, best first (an entry past the
              span's size: id NONFINITE_TOKEN - 1)
    Dispatch: (n_parts, 1, 1); per_row: (n_parts, T, 1)."""
    template = "sample_argmax"

    def __init__(self, dev: Device, logits: TensorDesc, vocab: int, row: str = "step.last_row", span: int = 4096,
                 per_row: bool = False, topk: int = 1):
        """per_row: the spans of every row r < n_tokens at part[r * n_parts ..] (the streams'
        sampler and tree verification read them; `row` is then ignored)."""
        self.n_parts = ceil_div(vocab, span)
        self.per_row = per_row
        b = Bindings()
        shape = f"({'rows, ' if per_row else ''}{self.n_parts}, {f'{topk}, ' if topk > 1 else ''}2) (value bits, id)"
        d = {"STEP_DECL": b.step(), "L_DECL": b.tensor("logits", logits, var="l"),
             "PART_DECL": b.array("part", "array<u32>", shape, writable=True),
             "V": vocab, "SPAN": span, "LROW": "r" if per_row else row, "PER_ROW": per_row, "NPART": self.n_parts,
             "TOPK": topk > 1, "K": topk}
        super().__init__(dev, d, b, "argmax")

    def workgroups(self, t: int = 1):
        return (self.n_parts, t if self.per_row else 1, 1)
