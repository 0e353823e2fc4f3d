"""Int8 activation rows for the integer-dot GEMV (linear.py's "blk" variant): their layout, the
defines of wgsl/quantize_block.wgsl that writes them (shared by every producer), and
QuantizeKernel (wgsl/quantize.wgsl), which turns activation rows (optionally RMS-normalised)
into them. A row of i channels for weights of format fmt ("q8" / "q8_0" / "q4" / "q4_0" / "q4k" / "q5k" /
"q6k": it fixes the int8 order: natural for q8 / q8_0 / q5k, q4's evens then odds per 8 values for
the others),
u32 words, NB = i / 32 blocks, NBP = NB rounded up to 4:
  [8 NB: four int8 per word][NBP: f32 block scales][NBP: f32 block sums][NBP: partial sums of x^2]
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..gpu.base import Device
from ..tensor import TensorDesc
from .base import Kernel, wgsl_float
from .bindings import Bindings
from .weights import split_parts

if TYPE_CHECKING:
    from .norm import PreNorm

# weight formats the int8 rows are packed for
FORMATS = ("q8", "q8_0", "q8pc", "q4", "q4_0", "q4g128", "q4pc", "e0m4", "q4k", "q5k", "q6k")
NATURAL_ORDER = ("q8", "q8_0", "q8pc", "q5k")   # formats whose int8 rows are in channel order (the others: q4's)
QWG = 256                # quantize.wgsl's workgroup: one invocation per channel, 8 blocks


def row_words(i: int) -> int:
    """u32 words per row of a quantized activation of i channels; the partial sums of x^2 have
    room for one per 32-block (what a quantizing GEMV epilogue writes)."""
    nb = i // 32
    return 8 * nb + 3 * ceil4(nb)


def n_partials(i: int) -> int:
    """Workgroups quantize.wgsl runs per row (each writes one partial sum of x^2)."""
    return -(-i // QWG)


def ceil4(n: int) -> int:
    """n rounded up to a multiple of 4 (the row's per-block sections are vec4-aligned)."""
    return (n + 3) // 4 * 4


def xq_desc(name: str, i: int, rows: int) -> TensorDesc:
    """The arena tensor holding `rows` quantized activation rows of i channels."""
    return TensorDesc(name, row_words(i), rows)


def order_format(fmt: str) -> str:
    """The format whose int8 row order a weight of format fmt reads: itself; for a row-split
    weight its first range in channel order (NATURAL_ORDER) if it has one, else its first range.
    (Its q6k ranges then read in that order too, their bytes shuffled as they load: a Q5_K_M
    file's Q5_K Q / K with a Q6_K V; q4 / q4_0 / q4k ranges take only q4's order:
    linear_blk.supported.)"""
    parts = split_parts(fmt)
    if not parts:
        return fmt
    return next((f for f, _ in parts if f in NATURAL_ORDER), parts[0][0])


def block_defines(fmt: str, i: int, wg: int) -> dict:
    """Defines of wgsl/quantize_block.wgsl for a kernel writing rows of i channels for fmt
    weights with workgroups of wg invocations."""
    nb = i // 32
    return {"QNB": nb, "QNBP": ceil4(nb), "QSTRIDE": row_words(i), "QP0": 8 * nb + 2 * ceil4(nb),
            "QWG": wg, "QPACK_Q4": order_format(fmt) not in NATURAL_ORDER}


def declare_rows(b: Bindings, name: str, rows: TensorDesc) -> str:
    """The int8 rows a producer writes, WGSL `qout: array<u32>` (quantize_block.wgsl's output)."""
    return b.array(name, "array<u32>", f"({rows.w}, {rows.c}) int8 rows, u32 words", writable=True, var="qout")


class QuantizeKernel(Kernel):
    """Activation rows -> int8 rows of the integer-dot GEMV's input. Bindings:
      step  the Step uniform
      x     (T_cap, C) activation
      xq    (T_cap, row_words(C)) u32 int8 rows (the layout above)
      nw    (C) f32 norm weight, only with pre_norm (the norm weight applied here; the GEMV
            applies 1/rms from the partial sums of x^2 written here; whole: the whole RMSNorm
            is applied here and no partial sums are written)
    Dispatch: (n_partials(C), T)."""
    template = "quantize"

    def __init__(self, dev: Device, x: TensorDesc, xq: TensorDesc, fmt: str, pre_norm: PreNorm | None = None,
                 last_row: bool = False, whole: bool = False):
        """fmt: the consuming weight's format; last_row: read row step.last_row, write row 0;
        whole (with pre_norm): every workgroup reads the whole row for 1/rms and quantizes the
        normalised row (the GEMV then takes no pre_norm)."""
        if x.c % 32 or xq.c != row_words(x.c) or order_format(fmt) not in FORMATS:
            raise ValueError(f"cannot quantize {x.name} ({x.c} channels) into {xq.name} ({xq.c} words) for {fmt}")
        if whole and pre_norm is None:
            raise ValueError("a whole-row quantize applies an RMSNorm: it needs pre_norm")
        b = Bindings()
        d = {"STEP_DECL": b.step(), "X_DECL": b.tensor("x", x), "XQ_DECL": declare_rows(b, "xq", xq),
             "NW_DECL": b.array("nw", "array<f32>", f"({x.c}) norm weight") if pre_norm is not None else "",
             "PRE_NORM": pre_norm is not None, "W_OFFSET": wgsl_float(pre_norm.w_offset if pre_norm else 0.0),
             "WHOLE": whole, "PARTIALS": pre_norm is not None and not whole,
             "EPS": wgsl_float(pre_norm.eps if pre_norm else 0.0),
             "LAST_ROW": last_row, "NT": "1u" if last_row else "step.n_tokens", **block_defines(fmt, x.c, QWG)}
        self.n_groups = n_partials(x.c)
        super().__init__(dev, d, b, f"quantize_{fmt}")

    def workgroups(self, t: int):
        return (self.n_groups, t, 1)
