"""KVCompactKernel (wgsl/kv_compact.wgsl): after tree verification, the accepted nodes' K/V
rows of one layer move to consecutive cache slots in place; `pack_moves` writes the move list.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import struct

from ..gpu.base import Device
from .base import Kernel, ceil_div
from .bindings import Bindings


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
      kc     (KVH, cap, DH) f32 K cache
      vc     (KVH, DH, cap) f32 V cache
    Dispatch: (ceil(KVH * DH / 64), 1, 1)."""
    template = "kv_compact"

    def __init__(self, dev: Device, n_kv: int, head_dim: int, cap: int, max_moves: int):
        self.n = n_kv * head_dim
        b = Bindings()
        d = {"MOVES_DECL": b.array("moves", "array<u32>", f"(1 + 2 * {max_moves}) (n, src, dst, ...)"),
             "KC_DECL": b.array("kc", "array<f32>", f"({n_kv}, {cap}, {head_dim}) = (KVH, CAP, DH)", writable=True),
             "VC_DECL": b.array("vc", "array<f32>", f"({n_kv}, {head_dim}, {cap}) = (KVH, DH, CAP)", writable=True),
             "KVH": n_kv, "DH": head_dim, "CAP": cap}
        super().__init__(dev, d, b, "kv_compact")

    def workgroups(self, t: int = 1):
        return (ceil_div(self.n, 64), 1, 1)
