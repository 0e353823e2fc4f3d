"""KVCompactKernel (wgsl/kv_compact.wgsl): after tree verification, the accepted nodes' K/V
rows of one layer move to consecutive cache slots in place; `pack_moves` writes the move list.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import struct

from ..gpu.base import Device
from .base import Kernel, ceil_div
from .bindings import Bindings
from .rope import declare_caches


def moves_bytes(max_moves: int) -> int:
    return 4 * (1 + 2 * max_moves)


def pack_moves(moves: list[tuple[int, int]], max_moves: int) -> bytes:
    """(n, src_0, dst_0, ...) for moves [(src, dst)] with dst ascending and dst < src."""
    if len(moves) > max_moves:
        raise ValueError(f"{len(moves)} moves; the buffer holds {max_moves}")
    for k, (s, d) in enumerate(moves):
        if not d < s or (k and d <= moves[k - 1][1]):
            raise ValueError(f"move {k} ({s} -> {d}): destinations must ascend and lie below their sources")
    flat = [x for m in moves for x in m]
    return struct.pack(f"<{1 + len(flat)}I", len(moves), *flat)


class KVCompactKernel(Kernel):
    """Moves K/V cache rows src -> dst of one layer. Bindings:
      moves  (1 + 2 max_moves) u32 (n, src_0, dst_0, ...)
      kc     (KVH, cap, DH) K cache (f32, or f16 with kv_f16)
      vc     (KVH, DH, cap) V cache
    Dispatch: (ceil(KVH * DH / 64), 1, 1)."""
    template = "kv_compact"

    def __init__(self, dev: Device, n_kv: int, head_dim: int, cap: int, max_moves: int, kv_f16: bool = False):
        self.n = n_kv * head_dim
        b = Bindings()
        d = {"MOVES_DECL": b.array("moves", "array<u32>", f"(1 + 2 * {max_moves}) (n, src, dst, ...)"),
             **declare_caches(b, dev, n_kv, head_dim, cap, kv_f16),
             "KVH": n_kv, "DH": head_dim, "CAP": cap}
        super().__init__(dev, d, b, "kv_compact")

    def workgroups(self, t: int = 1):
        return (ceil_div(self.n, 64), 1, 1)
