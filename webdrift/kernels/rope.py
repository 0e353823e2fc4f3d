"""RopeQKVKernel (wgsl/rope_qkv.wgsl): RoPE, the Q relayout for attention and the in-place K/V
cache append of one QKV projection's output, in one dispatch; and the bindings that the same
work takes as the QKV GEMV's epilogue (wgsl/rope_epilogue.wgsl, linear.RopeOut).
The caches are the attention's "weights":
  K cache (KVH, CAP, DH): OHWI with O = cache position, I = DH
  V cache (KVH, DH, CAP): OHWI with O = DH, I = cache position
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..gpu.base import Device
from ..tensor import TensorDesc
from .base import Kernel, wgsl_float
from .bindings import Bindings
from .tree import declare_tree


def kv_type(dev: Device, kv_f16: bool) -> str:
    """The caches' element type: "f16" (half the bytes a decode step's attention reads, as
    llama.cpp's default cache; needs shader-f16) or "f32"."""
    if kv_f16 and not dev.has_f16:
        raise UnsupportedModelError("kv_cache='f16' needs shader-f16, which this adapter lacks; use kv_cache='f32'")
    return "f16" if kv_f16 else "f32"


def kv_bytes(kv_f16: bool) -> int:
    """Bytes of one cache value."""
    return 2 if kv_f16 else 4


def declare_caches(b: Bindings, dev: Device, n_kv: int, head_dim: int, cap: int, kv_f16: bool) -> dict:
    """KC_DECL, VC_DECL (bindings "kc", "vc": the caches as arrays of values) and KV_T, the values'
    type (writes convert to it: `kv_t(x)`, wgsl alias)."""
    t = kv_type(dev, kv_f16)
    return {"KC_DECL": b.array("kc", f"array<{t}>", f"({n_kv}, {cap}, {head_dim}) = (KVH, CAP, DH)", writable=True),
            "VC_DECL": b.array("vc", f"array<{t}>", f"({n_kv}, {head_dim}, {cap}) = (KVH, DH, CAP)", writable=True),
            "KV_T": t}


def declare_rope_outputs(b: Bindings, dev: Device, q: TensorDesc, n_kv: int, head_dim: int, cap: int,
                         kv_f16: bool) -> dict:
    """Q_DECL, KC_DECL, VC_DECL, INV_FREQ_DECL: where RoPE's results go (bindings "q", "kc",
    "vc": declare_caches) and the rotation frequencies ("inv_freq"), in this order."""
    return {"Q_DECL": b.tensor("q", q), **declare_caches(b, dev, n_kv, head_dim, cap, kv_f16),
            "INV_FREQ_DECL": b.array("inv_freq", "array<f32>", f"({head_dim // 2}) per pair, scaling applied")}


class RopeQKVKernel(Kernel):
    """RoPE + Q relayout + KV append of qkv rows [q heads | k heads | v heads]. Bindings:
      step      the Step uniform (token t sits at position pos0 + t)
      qkv       (T_cap, (H + 2 KVH) DH) activation
      q         (B = KVH, W = T_cap * H / KVH, C = DH) activation: the query heads sharing a KV
                head become consecutive rows
      kc, vc    K cache (KVH, cap, DH) and V cache (KVH, DH, cap), f32 or (kv_f16) f16, written
                at the positions
      inv_freq  (DH / 2) f32 rotation frequencies
      qn, kn    (DH) f32 QK-norm weights, only with qk_norm
      tree      (T_cap, ROW_WORDS) u32 per-row records, only with tree: row t is rotated by its
                record's `pos` (kernels/tree.py), still written at cache position pos0 + t
    Dispatch: (H + 2 KVH, T)."""
    template = "rope_qkv"

    def __init__(self, dev: Device, qkv: TensorDesc, q_rel: TensorDesc, n_heads: int, n_kv: int, head_dim: int,
                 cap: int, rope_half: bool, qk_norm: bool = False, eps: float = 1e-6, w_offset: float = 0.0,
                 tree: bool = False, kv_f16: bool = False):
        """rope_half: rotate pairs (i, i + DH/2) (HF); else (2i, 2i+1) (llama.cpp's GGUF order).
        qk_norm: RMSNorm (eps, weight + w_offset) of each q and k head before rotation (Gemma 3)."""
        self.n_slots = n_heads + 2 * n_kv
        b = Bindings()
        d = {"STEP_DECL": b.step(), "QKV_DECL": b.tensor("qkv", qkv),
             **declare_rope_outputs(b, dev, q_rel, n_kv, head_dim, cap, kv_f16),
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
      kc    (KVH, CAP, DH) K cache;  vc (KVH, DH, CAP) V cache (f32, or f16 with kv_f16)
    Dispatch: workgroups(streams, rows) (a grid-stride loop over the rows' values)."""
    template = "kv_segment_copy"

    def __init__(self, dev: Device, n_kv: int, head_dim: int, cap: int, kv_f16: bool = False):
        self.per_row = n_kv * head_dim
        b = Bindings()
        d = {"STEP_DECL": b.step(), **declare_caches(b, dev, n_kv, head_dim, cap, kv_f16),
             "KVH": n_kv, "DH": head_dim, "CAP": cap}
        super().__init__(dev, d, b, "kv_segment_copy")

    def workgroups(self, streams: int, rows: int):
        return (min(4096, max(1, -(-self.per_row * rows // 256))), streams - 1, 1)
