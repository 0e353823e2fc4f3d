"""Causal attention over the KV cache, split over the cache length (flash-decoding):
AttentionKernel (phase 1: wgsl/attention.wgsl per query head, or wgsl/attention_gqa.wgsl per KV
head serving its query heads; both include attention_common.wgsl) writes per-chunk partial
results, AttentionCombineKernel (wgsl/attention_combine.wgsl) merges them and writes the heads
back in token order (or as int8 rows for the O projection's integer-dot GEMV).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..gpu.base import Device
from ..tensor import TensorDesc
from .base import Kernel, ceil_div, wgsl_float
from .bindings import Bindings
from .quantize import block_defines, declare_rows, row_words
from .tree import declare_tree


class AttentionKernel(Kernel):
    """Phase 1: per (chunk of CHUNK keys, query row, KV head) the unnormalised partial result
    (sum_k e_k V[:, k], m = max score, l = sum e_k). Bindings:
      step  the Step uniform (queries at positions pos0 .. pos0 + T - 1)
      q     (B = KVH, W = rows_cap, C = DH) activation: RopeQKVKernel's relayout
      kc    (KVH, cap, DH / 4) vec4<f32> K cache
      vc    (KVH, DH, cap / 4) vec4<f32> V cache
      part  (KVH, rows_cap, nsplit, DH + 2) f32 partials
      tree  (rows_cap / GROUP, ROW_WORDS) u32 per query row, only with tree (kernels/tree.py)
    Dispatch: per head (nsplit, T * GROUP, KVH); grouped (nsplit, T, KVH)."""
    template = "attention"
    MAX_CHUNK = 256

    @classmethod
    def chunk_for(cls, head_dim: int) -> int:
        """Keys per workgroup: the power of two >= head_dim, at least 64. Short chunks give decode
        many workgroups (the cache is split over them like flash-decoding; 256-key chunks left
        1B's decode attention at 34 us on an H100 with 64 workgroups)."""
        return min(cls.MAX_CHUNK, max(64, 1 << (head_dim - 1).bit_length()))

    MAX_GQA = 8   # query heads per KV head the grouped variant unrolls

    def __init__(self, dev: Device, q_rel: TensorDesc, n_heads: int, n_kv: int, head_dim: int, cap: int,
                 rows_cap: int, scale: float, window: int = 0, softcap: float | None = None,
                 grouped: bool = False, tree: bool = False):
        """cap: cache rows per KV head (a multiple of 4); rows_cap: q_rel's rows; window: sliding
        window (0: none); softcap: scores soft-capped at it. grouped (attention_gqa.wgsl): one
        workgroup per (chunk, token, KV head) serves all the query heads of that KV head (K and
        V read once for them); else one per query head. tree: each query row sees only what its
        record in the "tree" binding allows (kernels/tree.py: tree verification)."""
        if head_dim % 4 or head_dim > self.MAX_CHUNK:
            raise UnsupportedModelError(f"attention needs head_dim to be a multiple of 4 and <= {self.MAX_CHUNK}, "
                                        f"got {head_dim}")
        self.CHUNK = self.chunk_for(head_dim)
        self.nsplit = ceil_div(cap, self.CHUNK)
        self.group, self.n_kv = n_heads // n_kv, n_kv
        nj = self.CHUNK // head_dim
        if cap % 4 or ceil_div(self.CHUNK, nj) % 4:
            raise ValueError(f"attention reads V four keys at a time: cache rows {cap} must be a multiple of 4")
        b = Bindings()
        d = {"STEP_DECL": b.step(), "Q_DECL": b.tensor("q", q_rel),
             "KC_DECL": b.array("kc", "array<vec4<f32>>", f"({n_kv}, {cap}, {head_dim // 4}) = (KVH, CAP, DH / 4)",
                                writable=True),
             "VC_DECL": b.array("vc", "array<vec4<f32>>", f"({n_kv}, {head_dim}, {cap // 4}) = (KVH, DH, CAP / 4)",
                                writable=True),
             "PART_DECL": b.array("part", "array<f32>", f"({n_kv}, {rows_cap}, {self.nsplit}, {head_dim + 2}) = "
                                  "(KVH, ROWS_CAP, NSPLIT, DH + 2)", writable=True),
             "CHUNK4": self.CHUNK // 4, "DH": head_dim, "DH4": head_dim // 4, "NJ": nj, "JL": ceil_div(self.CHUNK, nj),
             "GROUP": self.group, "CAP": cap, "CHUNK": self.CHUNK, "NSPLIT": self.nsplit,
             "ROWS_CAP": rows_cap, "SCALE": wgsl_float(scale), "WINDOW": window or 0,
             "SOFTCAP": softcap is not None, "CAP_ATTN": wgsl_float(softcap or 1.0),
             "TREE": tree, "TREE_DECL": declare_tree(b, rows_cap // self.group) if tree else ""}
        self.grouped = grouped
        if grouped:
            if self.group > self.MAX_GQA:
                raise UnsupportedModelError(f"grouped attention unrolls at most {self.MAX_GQA} query heads per KV "
                                            f"head, got {self.group}")
            self.template = "attention_gqa"
            d.update(self._gqa_code(self.group, head_dim))
        super().__init__(dev, d, b, "attention_gqa" if grouped else "attention")

    def _gqa_code(self, group: int, head_dim: int) -> dict:
        """attention_gqa.wgsl's per-head statements, unrolled over the group's heads."""
        hs = range(group)
        j = "\n".join
        return {"QS": group * head_dim // 4, "SC": group * self.CHUNK // 4,
                "RED": group * self.CHUNK, "ML": 2 * group,
                "S_DECL": j(f"  var s{h} = -3.0e38;" for h in hs),
                "A_DECL": j(f"    var a{h} = 0.0;" for h in hs),
                "A_ACC": j(f"      a{h} += dot(qs[{h}u * DH4 + d], kv);" for h in hs),
                "S_SET": j(f"    s{h} = score(a{h});" for h in hs),
                "RED_S": j(f"  red[{h}u * CHUNK + lid] = s{h};" for h in hs),
                "E_SET": j(f"  let e{h} = select(0.0, exp(s{h} - ml[{h}u]), vis);\n"
                           f"  sc[({h}u * CHUNK + lid) / 4u][lid % 4u] = e{h};\n"
                           f"  red[{h}u * CHUNK + lid] = e{h};" for h in hs),
                "O_DECL": j(f"  var o{h} = 0.0;" for h in hs),
                "O_ACC": j(f"      o{h} += dot(sc[{h}u * CHUNK4 + j], v);" for h in hs),
                "RED_O": "  workgroupBarrier();\n" + j(f"  red[{h}u * CHUNK + lid] = o{h};" for h in hs)}

    def workgroups(self, t: int):
        if self.grouped:
            return (self.nsplit, t, self.n_kv)
        return (self.nsplit, t * self.group, self.n_kv)


class AttentionCombineKernel(Kernel):
    """Phase 2: merge each query row's nsplit partials (log-sum-exp) into out[t, h * DH + d].
    Bindings:
      step  the Step uniform
      part  (KVH, rows_cap, nsplit, DH + 2) f32 partials of AttentionKernel
      out   (T_cap, H * DH) activation; with quant, (T_cap, row_words(H * DH)) u32 int8 rows
    Dispatch: (T * GROUP, KVH)."""
    template = "attention_combine"

    def __init__(self, dev: Device, out: TensorDesc, n_heads: int, n_kv: int, head_dim: int, nsplit: int,
                 rows_cap: int, quant: str | None = None):
        """quant ("q8" / "q4"): out is a QuantizeKernel row tensor for n_heads * head_dim channels
        and the heads are written as int8 blocks for that weight format."""
        self.group, self.n_kv = n_heads // n_kv, n_kv
        wg = min(256, max(32, head_dim))
        b = Bindings()
        d = {"STEP_DECL": b.step(),
             "PART_DECL": b.array("part", "array<f32>", f"({n_kv}, {rows_cap}, {nsplit}, {head_dim + 2}) = "
                                  "(KVH, ROWS_CAP, NSPLIT, DH + 2)", writable=True),
             "DH": head_dim, "GROUP": self.group, "NSPLIT": nsplit, "NSPLIT4": -(-nsplit // 4) * 4, "ROWS_CAP": rows_cap,
             "WG": wg, "QUANT": quant is not None}
        if quant is None:
            d["OUT_DECL"] = b.tensor("out", out)
        else:
            if not self.quant_supported(head_dim) or out.c != row_words(n_heads * head_dim):
                raise ValueError(f"the combine writes int8 blocks for head_dim a multiple of 32 up to 256 into "
                                 f"QuantizeKernel rows; got head_dim {head_dim}, {out.name} of {out.c} words")
            d.update(block_defines(quant, n_heads * head_dim, wg), OUT_DECL=declare_rows(b, "out", out))
        super().__init__(dev, d, b, "attention_combine")

    @staticmethod
    def quant_supported(head_dim: int) -> bool:
        return head_dim % 32 == 0 and head_dim <= 256

    def workgroups(self, t: int):
        return (t * self.group, self.n_kv, 1)
