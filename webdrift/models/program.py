"""Program: one stage's forward pass, built once, as dispatch lists.

    ops    = ForwardBuilder(...).build()        models/forward.py: typed ops + the op graph
    offsets = graph.plan()                      graph/: shapes at capacity, arena offsets
    kernels = [lower(op, ctx) for op in ops]    models/lower.py: kernels + bindings (on first use)
    dispatches(t) -> [(pipeline, bind group, workgroups(t))]   cached per token bucket (a prefill
                                                GEMM's tile per bucket size: Linear.large)

Build time vs step time: everything above happens once per program; a step only picks the
cached dispatch list for its token bucket (and writes the Step uniform, runtime/engine.py).
Must not: import numpy or wgpu; decide how an op runs (forward.py does).
"""

from __future__ import annotations

from dataclasses import replace

from ..gpu.base import STORAGE, Buffer, Dispatch
from ..kernels.base import ceil_div
from ..kernels.linear import qlast_bytes
from .forward import Attention, ForwardBuilder, Linear, Sample
from .lower import LowerContext, lower


class Program:
    """One stage's forward pass: a planned graph bound to buffers, as dispatch lists.

    `dispatches(t, head)` returns the prebuilt list for t tokens (workgroup counts padded to a
    bucket so the list changes rarely); head=False leaves out final norm / LM head / sampling.
    streams: the rows are streams (forward.py), each sampled.
    """

    def __init__(self, model, stage: str, capacity: int, all_logits: bool, layout: str,
                 step_buf: Buffer, ids_buf: Buffer, out_tokens: Buffer, arena: Buffer | None = None,
                 fuse: bool = True, streams: bool = False, tree_buf: Buffer | None = None, lora=None,
                 forecast_buf: Buffer | None = None):
        """tree_buf: the per-row tree records (kernels/tree.py) of a tree-verification program
        (models/forward.py's tree option; every row's logits and argmax spans); lora: the engine's
        LoraPool (LoRA slots in every layer GEMV); forecast_buf: a tree program's forecast vectors
        (kernels/embedding.py)."""
        self.model, self.stage, self.capacity, self.all_logits = model, stage, capacity, all_logits
        self.streams = streams
        self.step_buf, self.ids_buf, self.out_tokens = step_buf, ids_buf, out_tokens
        self.tree_buf, self.forecast_buf = tree_buf, forecast_buf
        self.forward = ForwardBuilder(model, stage, capacity, all_logits, layout, fuse, streams=streams,
                                      tree=tree_buf is not None, lora=lora)   # its decisions
        self.graph = self.forward.build()
        self.arena_bytes = self.graph.plan(alignment=max(256, int(model.dev.info.limits.get(
            "min-storage-buffer-offset-alignment", 256))))
        self.arena = arena
        # bound where a kernel declares a tensor it never touches (the y of a GEMV whose epilogue
        # writes elsewhere)
        self.spare = model.dev.create_buffer(256, STORAGE, "spare")
        self._kernels: list | None = None    # [(op, kernel, bind group)], built on first use
        self._large: list = []               # large_kernels()
        self._qlast: tuple | None = None     # qlast_buffers()
        self._attn_count: Buffer | None = None   # attn_count()
        self._cache: dict = {}

    @property
    def int8_chain(self) -> bool:
        """Whether this program's layer GEMVs write each other's int8 rows (forward.py decides)."""
        return self.forward.chain

    def bind(self, arena: Buffer) -> None:
        if arena is not self.arena:
            self.arena = arena
            self._kernels, self._cache = None, {}   # bind groups name the arena: rebuilt on next use

    def kernels(self) -> list:
        """[(op, kernel, bind group)] for every op, in order (built once, on first use)."""
        if self._kernels is None:
            m = self.model
            ctx = LowerContext(m.dev, m.cfg, self.graph, self.arena, self.step_buf, self.ids_buf, self.out_tokens,
                               self.spare, m.cap_stride, self.capacity, self.tree_buf, self.forecast_buf,
                               self.qlast_buffers(), m.kv_f16, self.attn_count())
            self._kernels, self._large = [], []
            for op in self.graph.ops:
                k, binds = lower(op, ctx)
                self._kernels.append((op, k, k.bind(m.dev, binds)))
                large = None
                if isinstance(op, Linear) and op.large is not None:
                    rows, v = op.large
                    k2, b2 = lower(replace(op, variant=v, large=None), ctx)
                    large = (rows, k2, k2.bind(m.dev, b2))
                self._large.append(large)
        return self._kernels

    def large_kernels(self) -> list:
        """Per op of kernels(): (rows, kernel, bind group) of the prefill GEMM that token buckets
        of at least that many rows take instead (Linear.large), or None."""
        self.kernels()
        return self._large

    def qlast_buffers(self) -> tuple | None:
        """(qy, qcnt) shared by this program's last-workgroup quantizing GEMVs (one runs at a time):
        room for the widest one's outputs and 32-block counters at capacity; the counters start
        at zero and each dispatch leaves them so. None where no GEMV is of that kind."""
        widths = [op.w.o for op in self.graph.ops
                  if isinstance(op, Linear) and op.qout is not None and getattr(op.variant, "qlast", False)]
        if not widths:
            return None
        if self._qlast is None:
            qy, qcnt = qlast_bytes(max(widths), self.capacity)
            self._qlast = (self.model.dev.create_buffer(qy, STORAGE, "qlast.y"),
                           self.model.dev.create_buffer(qcnt, STORAGE, "qlast.count"))
        return self._qlast

    def attn_count(self) -> Buffer | None:
        """The counters of this program's fused attention dispatches (kernels/attention.py: the last
        workgroup of a row's partials merges them), one per (token row, KV head), shared by the
        layers (one runs at a time): zero when created, and each dispatch leaves them so. None
        where no attention kernel merges."""
        if not any(isinstance(op, Attention) and op.kernel.fused for op in self.graph.ops):
            return None
        if self._attn_count is None:
            self._attn_count = self.model.dev.create_buffer(self.capacity * self.model.cfg.n_kv_heads * 4, STORAGE,
                                                            "attention.count")
        return self._attn_count

    def dispatches(self, t: int, head: bool = True, draws: int = 1) -> list[Dispatch]:
        """The dispatch list for t tokens (t <= capacity); cached per (bucket, head, draws).
        draws: tokens the sampler draws from the last row (independent draws, written to
        out_tokens[step * draws ..] and ids[0 .. draws): the streams' first tokens)."""
        bucket = t if self.stage == "decode" else min(self.capacity, ceil_div(t, 64) * 64)
        key = (bucket, head, draws)
        lst = self._cache.get(key)
        if lst is None:
            lst = []
            for (op, k, bg), large in zip(self.kernels(), self.large_kernels()):
                if op.head and not head:
                    continue
                if large is not None and bucket >= large[0]:
                    _, k, bg = large
                if not op.head or self.all_logits or self.streams:
                    rows = bucket
                else:
                    rows = draws if isinstance(op, Sample) else 1
                lst.append(Dispatch(k.pipeline, bg, k.workgroups(rows), op.label))
            self._cache[key] = lst
        return lst
