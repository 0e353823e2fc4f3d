"""The tree mask: which keys each query row of a step may see, for tree verification
(speculative decoding) and, later, several streams sharing a prompt prefix.

The host uploads one record of u32 per query row t (the row sits at cache slot pos0 + t):

    tree[t] = (pos, prefix, path[0 .. PW))       ROW_WORDS = 2 + PW

    pos           the row's RoPE position (a tree node: pos0 of the block's root + its depth)
    prefix        keys [0, prefix) are the cache before the block (the prompt and the accepted
                  tokens; = pos0)
    path          one byte per depth, four per word: the block row of the row's ancestor at
                  that depth (the root's 0 first, the row itself last)

The attention reads a tree row's keys in *logical* order, as the single sequence the row's path
would be: positions 0 .. pos, position k < prefix at slot k, position k >= prefix at slot
pos0 + path[k - prefix]. So each key lands in the same chunk and the same lane as in a decode
step at position pos, and a node's attention sums are bit for bit that step's (greedy
speculative decoding then emits exactly the plain decode's tokens). Every key a row reads lies
at or below its own slot pos0 + t (a block is in topological order). A sliding window is
measured from `pos`. RopeQKVKernel rotates by `pos` and still writes K/V at the slot pos0 + t;
after acceptance the host moves the accepted rows to consecutive slots (kernels/kv_compact.py).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import struct

from .base import ceil_div

HEADER_WORDS = 2


def path_words(rows_cap: int) -> int:
    """PW: words of a row's path (one byte per depth, depths 0 .. rows_cap - 1)."""
    return ceil_div(rows_cap, 4)


def row_words(rows_cap: int) -> int:
    return HEADER_WORDS + path_words(rows_cap)


def declare_tree(b, rows_cap: int) -> str:
    """The "tree" binding (read-only u32 records) and its constants, for a template's TREE_DECL."""
    return (b.array("tree", "array<u32>", f"({rows_cap}, {row_words(rows_cap)}) per query row: "
                    "(pos, prefix, path bytes)")
            + f"const TREE_ROW: u32 = {row_words(rows_cap)}u;\n")


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
    pw = path_words(rows_cap)
    if not 0 < len(parents) <= rows_cap or rows_cap > 256:
        raise ValueError(f"a tree of {len(parents)} rows does not fit {rows_cap} (at most 256)")
    dep = depths(parents)
    out = bytearray()
    paths: list[list[int]] = []
    for i, p in enumerate(parents):
        paths.append((paths[p] if i else []) + [i])
        out += struct.pack("<2I", pos0 + dep[i], pos0) + bytes(paths[i]).ljust(4 * pw, b"\0")
    return bytes(out)
