"""Weight layouts as permutations of ML Drift's (G, S_O, O4, HWD, S_I, I4) axes.

A linear layer's weight W[o, i] (O outputs, I inputs; G = HWD = 1) is padded to 4*S_O x 4*S_I
and stored in the axis order a kernel reads fastest. I4 is always innermost so four consecutive
inputs of one output are one vec4 (f32) or two packed-f16 words. The consuming kernel picks the
order; the converter kernel (kernels/convert.py) writes it once at load through the same
generated `{w}_index(o, i)` function the consumer reads with, so the two cannot disagree.

Orders used:
  "OI"   = (G, S_O, O4, HWD, S_I, I4): row-major, rows contiguous (GEMV reading one row per lane group)
  "OI4O4"= (G, S_O, HWD, S_I, O4, I4): 4x4 blocks, the four outputs of a slice interleaved
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError
from . import slices

AXIS_NAMES = ("G", "S_O", "O4", "HWD", "S_I", "I4")
NAMED_ORDERS = {
    "OI": ("G", "S_O", "O4", "HWD", "S_I", "I4"),
    "OI4O4": ("G", "S_O", "HWD", "S_I", "O4", "I4"),
}


@dataclass(frozen=True)
class WeightLayout:
    o: int                    # outputs (rows)
    i: int                    # inputs (columns)
    order: tuple[str, ...] = NAMED_ORDERS["OI"]

    def __post_init__(self):
        if sorted(self.order) != sorted(AXIS_NAMES) or self.order[-1] != "I4":
            raise InvalidArgumentError(f"weight layout order {self.order} must permute {AXIS_NAMES} with I4 last")

    @classmethod
    def named(cls, name: str, o: int, i: int) -> WeightLayout:
        if name not in NAMED_ORDERS:
            raise InvalidArgumentError(f"weight layout {name!r} is not one of {sorted(NAMED_ORDERS)}")
        return cls(o, i, NAMED_ORDERS[name])

    @property
    def sizes(self) -> dict[str, int]:
        return {"G": 1, "S_O": slices(self.o), "O4": 4, "HWD": 1, "S_I": slices(self.i), "I4": 4}

    @property
    def strides(self) -> dict[str, int]:
        st, acc = {}, 1
        for ax in reversed(self.order):
            st[ax] = acc
            acc *= self.sizes[ax]
        return st

    @property
    def n_elements(self) -> int:
        n = 1
        for v in self.sizes.values():
            n *= v
        return n

    def index(self, o: int, i: int) -> int:
        """Host-side element index of W[o, i] (the same formula as the WGSL below)."""
        st = self.strides
        return ((o // 4) * st["S_O"] + (o % 4) * st["O4"] + (i // 4) * st["S_I"] + (i % 4))

    def wgsl_index(self, name: str) -> str:
        """`fn {name}_index(o, i) -> u32`: element offset of W[o, i] in this layout."""
        st = self.strides
        return (f"// {name}: weight ({self.o}, {self.i}) padded to ({4 * slices(self.o)}, {4 * slices(self.i)}), "
                f"order {'/'.join(self.order)}\n"
                f"fn {name}_index(o: u32, i: u32) -> u32 {{\n"
                f"  return (o / 4u) * {st['S_O']}u + (o % 4u) * {st['O4']}u + (i / 4u) * {st['S_I']}u + (i % 4u);\n}}\n")
