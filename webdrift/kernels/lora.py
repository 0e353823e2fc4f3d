"""LoRA kernels: LoraShrinkKernel (wgsl/lora_shrink.wgsl, x -> u = scale * x_in A^T per target) and
LoraOut, the GEMV epilogue option that adds u B^T to each output (linear_common.wgsl's
lora_delta, in every LinearKernel variant). Together they are Punica / S-LoRA's shrink + expand,
the expand fused into the base projection's epilogue; models/lora.py holds the adapter pool
both read (A and B in f16, packed two per u32, so no shader-f16 is needed).
The shrink without a dispatch of its own (LoraPartials + LoraOut(fused=True), one token row of
the int8 chain): the kernel that writes the GEMV's int8 input row (a quantizing GEMV epilogue or
the attention combine) also writes each 32-block's share of x_in A^T (quantize_block.wgsl), and
the GEMV sums the shares before its block loop (linear_blk.wgsl): a dependent dispatch less per
LoRA GEMV. Both read the adapter from table entry 0, the one every row of a single request
points at (models/lora.py activate), so only single-request programs take this form.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gpu.base import Device
from ..tensor import TensorDesc
from .base import Kernel, wgsl_float
from .bindings import Bindings
from .norm import PreNorm

MAX_ENTRIES = 16     # adapter-table entries in the control buffer (then the per-row entry index)


def u_width(nseg: int, max_rank: int) -> int:
    """u32 words per row of a shrink's output: [offset, rank, 0, 0] + nseg * max_rank values."""
    return 4 + nseg * max_rank


@dataclass(frozen=True)
class LoraOut:
    """GEMV epilogue: output o (of the first weight; DUAL: part 1 is the second weight's) adds
    sum_j u[t, seg(o) * R + j] * B[off + j, col(o)], B the pool's (P, cols) f16 matrix.
    splits: first outputs of segments 1, 2 (q|k|v: (q_dim, q_dim + kv_dim)); () for one segment;
    dual: the second weight (up) reads segment 1 and columns from w.o on."""
    u: TensorDesc
    max_rank: int
    nseg: int
    cols: int
    splits: tuple[int, ...] = ()
    dual: bool = False
    fused: bool = False          # u is the producer's per-block shares (LoraPartials), summed here

    def declare(self, b: Bindings, n_out: int, n_in: int = 0, wg: int = 0) -> dict:
        """The bindings "lu" (the shrink's rows; fused: the blocks' shares, then "lctl" the
        control buffer, whose entry 0 it reads) and "lb" (the B pool) and the template defines. n_in, wg: the GEMV's inputs
        and workgroup size (fused)."""
        if self.fused:
            jw = self.nseg * self.max_rank
            if self.max_rank % 4:
                raise ValueError(f"the fused LoRA shrink reads shares four at a time; max rank {self.max_rank}")
            return {"LU_DECL": b.array("lu", "array<vec4<f32>>", f"({self.u.w}, {n_in // 32}, {jw // 4}) the input "
                                       "blocks' shares of x_in A^T, four per vec4", writable=True),
                    "LCTL_DECL": b.array("lctl", "array<u32>", f"({MAX_ENTRIES}, 4) adapter table, then (T_cap) "
                                         "entry index"),
                    "LB_DECL": b.array("lb", "array<u32>", f"(P, {self.cols}) f16 B^T rows, two halves per u32"),
                    "LORA": False, "LFUSE": True, "LR": self.max_rank, "LJW": jw, "LP4": max(jw // 4, min(wg, 256)),
                    "LBO": self.cols, "LO1": n_out, "LSEG3": len(self.splits) == 2,
                    "LS1": self.splits[0] if self.splits else 0, "LS2": self.splits[1] if len(self.splits) > 1 else 0}
        uw = u_width(self.nseg, self.max_rank)
        return {"LU_DECL": b.array("lu", "array<u32>", f"({self.u.w}, {uw}) [offset, rank, 0, 0, u]", writable=True),
                "LB_DECL": b.array("lb", "array<u32>", f"(P, {self.cols}) f16 B^T rows, two halves per u32"),
                "LORA": True, "LUW": uw, "LR": self.max_rank, "LBO": self.cols, "LO1": n_out,
                "LSEG3": len(self.splits) == 2, "LS1": self.splits[0] if self.splits else 0,
                "LS2": self.splits[1] if len(self.splits) > 1 else 0}


def partial_words(n_in: int, nseg: int, max_rank: int) -> int:
    """Words per token row of the blocks' shares of a fused shrink (LoraPartials)."""
    return n_in // 32 * nseg * max_rank


@dataclass(frozen=True)
class LoraPartials:
    """A producer's epilogue (quantize_block.wgsl LPART): each 32-block of the int8 row it writes
    for the next GEMV also gets that block's share of the next GEMV's shrink, its values dotted
    with the next GEMV's A rows: part (T_cap, n_in / 32, nseg * max_rank) f32."""
    part: TensorDesc
    nseg: int
    max_rank: int
    n_in: int

    def declare(self, b: Bindings) -> dict:
        """The bindings "lpa" (the next GEMV's A pool), "lpc" (the control buffer: its entry 0)
        and "lpw" (the shares) and the template defines."""
        if self.n_in % 32:
            raise ValueError(f"the LoRA shares are per 32-block; {self.n_in} inputs")
        return {"LPART": True,
                "LPA_DECL": b.array("lpa", "array<vec4<u32>>", f"(P, {self.nseg}, {self.n_in}) f16 A, eight halves per vec4"),
                "LPC_DECL": b.array("lpc", "array<u32>", f"({MAX_ENTRIES}, 4) adapter table, then (T_cap) entry index"),
                "LPW_DECL": b.array("lpw", "array<f32>", f"({self.part.w}, {self.n_in // 32}, "
                                    f"{self.nseg * self.max_rank}) shares", writable=True),
                "LPR": self.max_rank, "LPNSEG": self.nseg, "LPI": self.n_in}


class LoraShrinkKernel(Kernel):
    """u[t] = scale * x_in[t] A^T for one GEMV's LoRA targets. Bindings:
      step   the Step uniform
      x      (T_cap, I) activation (the GEMV's float input, before its fused norm)
      nw     (I) f32 norm weight, with pre_norm
      la     (P, nseg, I) f16 A pool (u32 pairs)
      ctl    u32 adapter table + per-row entry index (models/lora.py)
      lu     (T_cap, u_width) u32 rows (the arena)
    Dispatch: workgroups(t) = (nseg * max_rank, t)."""
    template = "lora_shrink"

    def __init__(self, dev: Device, x: TensorDesc, u: TensorDesc, n_in: int, nseg: int, max_rank: int,
                 pre_norm: PreNorm | None):
        if n_in % 4:
            raise ValueError(f"the LoRA shrink reads inputs a multiple of 4 wide, not {n_in}")
        self.nseg, self.max_rank = nseg, max_rank
        b = Bindings()
        d = {"STEP_DECL": b.step(), "X_DECL": b.tensor("x", x),
             "NW_DECL": b.array("nw", "array<vec4<f32>>", f"({n_in}) norm weight") if pre_norm else "",
             "LA_DECL": b.array("la", "array<vec2<u32>>", f"(P, {nseg}, {n_in}) f16 A, four halves per vec2"),
             "CTL_DECL": b.array("ctl", "array<u32>", f"({MAX_ENTRIES}, 4) adapter table, then (T_cap) entry index"),
             "LU_DECL": b.array("lu", "array<u32>", f"({u.w}, {u_width(nseg, max_rank)}) shrink rows", writable=True),
             "R": max_rank, "NSEG": nseg, "I": n_in, "MAXE": MAX_ENTRIES, "PRE_NORM": pre_norm is not None,
             "EPS": wgsl_float(pre_norm.eps if pre_norm else 0.0),
             "W_OFFSET": wgsl_float(pre_norm.w_offset if pre_norm else 0.0)}
        super().__init__(dev, d, b, "lora_shrink")

    def workgroups(self, t: int):
        return (self.nseg * self.max_rank, t, 1)
