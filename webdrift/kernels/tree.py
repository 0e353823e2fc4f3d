"""The tree mask: which keys each query row of a step may see, for tree verification
(speculative decoding) and, later, several streams sharing a prompt prefix.

The host uploads one record of u32 per query row t (the row sits at cache slot pos0 + t):

    tree[t] = (pos, prefix, seg_lo, seg_hi, bits[0 .. TW))       ROW_WORDS = 4 + TW

    pos           the row's RoPE position (a tree node: pos0 of the block's root + its depth)
    prefix        keys [0, prefix) are visible (the prompt and the accepted tokens)
    seg_lo/hi     keys [seg_lo, seg_hi) are visible too (a stream's own segment; empty for a tree)
    bits          key pos0 + j is visible iff bit j of bits is set (the row's ancestors in the
                  step's block, itself included)

and key k is visible iff it is one of those AND k <= pos0 + t (every visible key lies at or
below the row's own slot: a block is in topological order, a stream's history below its block).
A sliding window is measured from `pos`. RopeQKVKernel rotates by `pos` and still writes K/V at
the slot pos0 + t; after acceptance the host moves the accepted rows to consecutive slots
(kernels/kv_compact.py).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import struct

from .base import ceil_div

HEADER_WORDS = 4


def tree_words(rows_cap: int) -> int:
    """TW: ancestor-bit words per row for a block of up to rows_cap rows."""
    return ceil_div(rows_cap, 32)


def row_words(rows_cap: int) -> int:
    return HEADER_WORDS + tree_words(rows_cap)


def declare_tree(b, rows_cap: int) -> str:
    """The "tree" binding (read-only u32 records) and its constants, for a template's TREE_DECL."""
    tw = tree_words(rows_cap)
    return (b.array("tree", "array<u32>", f"({rows_cap}, {HEADER_WORDS + tw}) per query row: "
                    "(pos, prefix, seg_lo, seg_hi, ancestor bits)")
            + f"const TREE_TW: u32 = {tw}u;\nconst TREE_ROW: u32 = {HEADER_WORDS + tw}u;\n")


def depths(parents: list[int]) -> list[int]:
    """Depth of each node of a tree given as parent indices (parents[0] = -1: the root; every
    other parent precedes its child)."""
    d = [0] * len(parents)
    for i, p in enumerate(parents[1:], 1):
        d[i] = d[p] + 1
    return d


def pack_tree(parents: list[int], pos0: int, rows_cap: int) -> bytes:
    """The records of a token tree whose root (the last accepted token) sits at slot pos0 and
    whose node i sits at slot pos0 + i: each row sees the cache before pos0 and its ancestors."""
    tw = tree_words(rows_cap)
    if not 0 < len(parents) <= rows_cap:
        raise ValueError(f"a tree of {len(parents)} rows does not fit {rows_cap}")
    dep = depths(parents)
    out = bytearray()
    anc: list[int] = []
    for i, p in enumerate(parents):
        a = (anc[p] if i else 0) | (1 << i)
        anc.append(a)
        words = [(a >> (32 * w)) & 0xFFFFFFFF for w in range(tw)]
        out += struct.pack(f"<{HEADER_WORDS + tw}I", pos0 + dep[i], pos0, 0, 0, *words)
    return bytes(out)
