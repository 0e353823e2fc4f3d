"""The op graph: activation tensors with symbolic shapes, ops in execution order, and the
memory plan that places every activation at an offset in one arena buffer.

Symbolic shapes (Transformer-Lite): a tensor's token axis is an expression of the symbol T
(tokens per step), e.g. T or T * GROUP. Shapes are resolved once for the capacity the program
is built for (the arena is sized for that maximum at build time); a step with fewer tokens only
changes the Step uniform and the workgroup counts, never a buffer or a bind group.

Memory planning (ML Drift's GREEDY-BY-SIZE): tensors sorted by size, largest first, each placed
at the lowest aligned offset that does not overlap any already-placed tensor whose lifetime
(first to last op using it) intersects its own.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tensor import TensorDesc


@dataclass(frozen=True)
class Dim:
    """An affine expression a * T + b of the token symbol T."""
    a: int = 0
    b: int = 0

    def __mul__(self, k: int) -> Dim:
        return Dim(self.a * k, self.b * k)

    __rmul__ = __mul__

    def __add__(self, k: int) -> Dim:
        return Dim(self.a, self.b + k)

    def eval(self, t: int) -> int:
        return self.a * t + self.b


T = Dim(1, 0)


@dataclass
class TensorNode:
    name: str
    c: int                       # channels
    w: Dim | int                 # token axis (symbolic)
    b: int = 1                   # batch axis (e.g. KV heads for the relayout of q)
    layout: str = "linear"
    first: int = -1              # first op index using it
    last: int = -1               # last op index using it
    offset: int = 0              # byte offset in the arena (after planning)
    desc: TensorDesc | None = None


class Graph:
    def __init__(self, capacity: int, layout: str = "linear"):
        self.capacity = capacity          # T the arena is sized for
        self.layout = layout              # physical layout of activations
        self.tensors: dict[str, TensorNode] = {}
        self.ops: list = []               # ops in execution order (models/forward.py's typed ops)
        self.arena_bytes = 0

    def tensor(self, name: str, c: int, w: Dim | int = T, b: int = 1, layout: str | None = None) -> str:
        self.tensors[name] = TensorNode(name, c, w, b, layout or self.layout)
        return name

    def add(self, op) -> None:
        """Append an op (anything with `reads` and `writes`: tensor names); extends the lifetimes
        of the tensors it touches."""
        i = len(self.ops)
        for n in op.reads + op.writes:
            t = self.tensors[n]
            t.first = i if t.first < 0 else t.first
            t.last = i
        self.ops.append(op)

    def desc(self, name: str) -> TensorDesc:
        return self.tensors[name].desc

    def plan(self, alignment: int = 256) -> int:
        """Resolve shapes at capacity and assign arena offsets (greedy by size). Returns bytes."""
        for t in self.tensors.values():
            w = t.w.eval(self.capacity) if isinstance(t.w, Dim) else t.w
            t.desc = TensorDesc(t.name, c=t.c, w=w, b=t.b, layout=t.layout)
        return self._assign(alignment)

    def _assign(self, alignment: int) -> int:
        placed: list[TensorNode] = []
        order = sorted((t for t in self.tensors.values() if t.first >= 0),
                       key=lambda t: (-t.desc.nbytes, t.first))
        total = 0
        for t in order:
            size = t.desc.nbytes
            busy = sorted((p.offset, p.offset + p.desc.nbytes) for p in placed
                          if not (p.last < t.first or t.last < p.first))
            off = 0
            for lo, hi in busy:
                if off + size <= lo:
                    break
                off = max(off, (hi + alignment - 1) // alignment * alignment)
            t.offset = off
            placed.append(t)
            total = max(total, off + size)
        self.arena_bytes = total
        return total
