"""RopeQKVKernel (wgsl/rope_qkv.wgsl): RoPE, the Q relayout for attention and the in-place K/V
cache append of one QKV projection's output, in one dispatch; and the bindings that the same
work takes as the QKV GEMV's epilogue (wgsl/rope_epilogue.wgsl, linear.RopeOut).
The caches are the attention's "weights":
  K cache (KVH, CAP, DH): OHWI with O = cache position, I = DH
  V cache (KVH, DH, CAP): OHWI with O = DH, I = cache position
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..gpu.base import Device
from ..tensor import TensorDesc
from .base import Kernel, wgsl_float
from .bindings import Bindings
from .tree import declare_tree


def declare_rope_outputs(b: Bindings, q: TensorDesc, n_kv: int, head_dim: int, cap: int) -> dict:
    """Q_DECL, KC_DECL, VC_DECL, INV_FREQ_DECL: where RoPE's results go (bindings "q", "kc",
    "vc") and the rotation frequencies ("inv_freq"), in this order."""
    return {"Q_DECL": b.tensor("q", q),
            "KC_DECL": b.array("kc", "array<f32>", f"({n_kv}, {cap}, {head_dim}) = (KVH, CAP, DH)", writable=True),
            "VC_DECL": b.array("vc", "array<f32>", f"({n_kv}, {head_dim}, {cap}) = (KVH, DH, CAP)", writable=True),
            "INV_FREQ_DECL": b.array("inv_freq", "array<f32>", f"({head_dim // 2}) per pair, scaling applied")}


class RopeQKVKernel(Kernel):
    """RoPE + Q relayout + KV append of qkv rows [q heads | k heads | v heads]. Bindings:
      step      the Step uniform (token t sits at position pos0 + t)
      qkv       (T_cap, (H + 2 KVH) DH) activation
      q         (B = KVH, W = T_cap * H / KVH, C = DH) activation: the query heads sharing a KV
                head become consecutive rows
      kc, vc    K cache (KVH, cap, DH) and V cache (KVH, DH, cap), f32, written at the positions
      inv_freq  (DH / 2) f32 rotation frequencies
      qn, kn    (DH) f32 QK-norm weights, only with qk_norm
      tree      (T_cap, ROW_WORDS) u32 per-row records, only with tree: row t is rotated by its
                record's `pos` (kernels/tree.py), still written at cache position pos0 + t
    Dispatch: (H + 2 KVH, T)."""
    template = "rope_qkv"

    def __init__(self, dev: Device, qkv: TensorDesc, q_rel: TensorDesc, n_heads: int, n_kv: int, head_dim: int,
                 cap: int, rope_half: bool, qk_norm: bool = False, eps: float = 1e-6, w_offset: float = 0.0,
                 tree: bool = False):
        """rope_half: rotate pairs (i, i + DH/2) (HF); else (2i, 2i+1) (llama.cpp's GGUF order).
        qk_norm: RMSNorm (eps, weight + w_offset) of each q and k head before rotation (Gemma 3)."""
        self.n_slots = n_heads + 2 * n_kv
        b = Bindings()
        d = {"STEP_DECL": b.step(), "QKV_DECL": b.tensor("qkv", qkv),
             **declare_rope_outputs(b, q_rel, n_kv, head_dim, cap),
             "QN_DECL": b.array("qn", "array<f32>", f"({head_dim}) q norm weight") if qk_norm else "",
             "KN_DECL": b.array("kn", "array<f32>", f"({head_dim}) k norm weight") if qk_norm else "",
             "H": n_heads, "KVH": n_kv, "DH": head_dim, "HALF": head_dim // 2, "GROUP": n_heads // n_kv,
             "CAP": cap, "ROPE_HALF": rope_half, "QK_NORM": qk_norm, "EPS": wgsl_float(eps),
             "W_OFFSET": wgsl_float(w_offset), "TREE": tree,
             "TREE_DECL": declare_tree(b, q_rel.w // (n_heads // n_kv)) if tree else ""}
        super().__init__(dev, d, b, "rope_qkv")

    def workgroups(self, t: int):
        return (self.n_slots, t, 1)


class KVSegmentCopyKernel(Kernel):
    """Copies of prompt rows into the streams' segments (runtime/streams.py): cache rows
    [seg_base, pos0) -> [seg_base + s * seg_stride, pos0 + s * seg_stride) for streams
    s = 1 .. n_tokens - 1, in the K and V caches of one layer: the prompt's last partial chunk
    (a shared prompt), or a whole prompt (seg_base 0, n_tokens 2, seg_stride = the target
    stream's offset: streams with their own adapters). Bindings:
      step  the Step uniform (n_tokens = streams, pos0 = prompt length, seg_base, seg_stride)
      kc    (KVH, CAP, DH) K cache;  vc (KVH, DH, CAP) V cache
    Dispatch: workgroups(streams, rows) (a grid-stride loop over the rows' values)."""
    template = "kv_segment_copy"

    def __init__(self, dev: Device, n_kv: int, head_dim: int, cap: int):
        self.per_row = n_kv * head_dim
        b = Bindings()
        d = {"STEP_DECL": b.step(),
             "KC_DECL": b.array("kc", "array<f32>", f"({n_kv}, {cap}, {head_dim}) = (KVH, CAP, DH)", writable=True),
             "VC_DECL": b.array("vc", "array<f32>", f"({n_kv}, {head_dim}, {cap}) = (KVH, DH, CAP)", writable=True),
             "KVH": n_kv, "DH": head_dim, "CAP": cap}
        super().__init__(dev, d, b, "kv_segment_copy")

    def workgroups(self, streams: int, rows: int):
        return (min(4096, max(1, -(-self.per_row * rows // 256))), streams - 1, 1)
