"""Lowering: one typed op of models/forward.py -> the kernel that runs it and its bindings.

`lower(op, ctx)` reads only the op's fields and the LowerContext handed to it (the device, the
model's shapes, the planned activation tensors in the arena, the per-engine buffers); it makes
no decision of its own and does not reach back into the Program.
Must not: import numpy or wgpu; choose a kernel variant (forward.py carries every choice).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gpu.base import Buffer
from ..graph import Graph
from ..kernels.base import ceil_div
from ..kernels.ops import (
    ArgmaxKernel,
    AttentionCombineKernel,
    AttentionKernel,
    EmbeddingKernel,
    LinearKernel,
    QuantizeKernel,
    RMSNormKernel,
    RopeQKVKernel,
    SampleKernel,
)
from . import forward as F


@dataclass
class LowerContext:
    dev: object
    cfg: object
    graph: Graph                 # planned: every tensor has its desc and arena offset
    arena: Buffer
    step: Buffer                 # the Step uniform (kernels/step.py)
    ids: Buffer                  # (T_cap) u32 token ids of the step
    out_tokens: Buffer           # (steps) u32 sampled tokens
    spare: Buffer                # bound where a kernel declares a tensor it never touches
    cap_stride: int              # KV cache rows per head
    capacity: int                # tokens per step the program is built for

    def desc(self, name: str):
        return self.graph.desc(name)

    def arena_range(self, name: str) -> tuple:
        t = self.graph.tensors[name]
        return (self.arena, t.offset, t.desc.nbytes)

    @property
    def rows_cap(self) -> int:
        """Query rows per KV head at capacity (attention partials)."""
        return self.capacity * (self.cfg.n_heads // self.cfg.n_kv_heads)

    @property
    def nsplit(self) -> int:
        return ceil_div(self.cap_stride, AttentionKernel.chunk_for(self.cfg.head_dim))


def lower(op: F.Op, ctx: LowerContext) -> tuple:
    """(kernel, bindings in @binding order) for one op."""
    return _LOWER[type(op)](op, ctx)


def _embed(op: F.Embed, c: LowerContext):
    k = EmbeddingKernel(c.dev, op.table, c.desc("x"), op.scale, shard=op.sharded)
    return k, [c.step, c.ids] + op.table.buffers + [c.arena_range("x")]


def _norm(op: F.Norm, c: LowerContext):
    (x,), (out,) = op.reads, op.writes
    k = RMSNormKernel(c.dev, c.desc(x), c.desc(out), c.cfg.norm_eps, c.cfg.norm_weight_offset,
                      accumulate=op.accumulate, last_row=op.last_row)
    return k, [c.step, c.arena_range(x), c.arena_range(out), op.weight]


def _quantize(op: F.Quantize, c: LowerContext):
    (x,), (xq,) = op.reads, op.writes
    nrm = (c.cfg.norm_eps, c.cfg.norm_weight_offset) if op.norm is not None else None
    k = QuantizeKernel(c.dev, c.desc(x), c.desc(xq), op.fmt, pre_norm=nrm, last_row=op.last_row)
    return k, [c.step, c.arena_range(x), c.arena_range(xq)] + ([op.norm] if op.norm is not None else [])


def _linear(op: F.Linear, c: LowerContext):
    cfg = c.cfg
    x = op.reads[0]
    y_desc = c.desc(op.y).columns(*op.columns) if op.columns else c.desc(op.y)
    kw = dict(op.variant)
    if op.rope is not None:
        e = op.rope
        kw["rope"] = {"q": c.desc(e.q), "n_heads": cfg.n_heads, "n_kv": cfg.n_kv_heads, "head_dim": cfg.head_dim,
                      "cap": c.cap_stride, "rope_half": cfg.rope_style == "half"}
    if op.qout is not None:
        q = op.qout
        kw["qout"] = (c.desc(q.row), q.fmt, cfg.norm_weight_offset if q.norm is not None else None, q.write_y)
    k = LinearKernel(c.dev, op.stage, c.desc(x), y_desc, op.w, w2=op.w2, bias=op.bias is not None,
                     residual=op.residual, act=op.act, softcap=op.softcap, x_last_row=op.last_row,
                     pre_norm=(cfg.norm_eps, cfg.norm_weight_offset) if op.pre_norm else None,
                     x_partials=op.x_partials, **kw)
    # y: the output, or a spare buffer where the epilogue writes elsewhere instead (no arena
    # range that could alias an input)
    y_bind = c.arena_range(op.y) if op.y in op.writes else c.spare
    binds = [c.step, c.arena_range(x), y_bind] + op.w.buffers + (op.w2.buffers if op.w2 else [])
    binds += [op.bias] if op.bias is not None else []
    binds += [op.norm] if op.norm is not None else []
    if op.rope is not None:
        binds += [c.arena_range(op.rope.q), op.rope.k_cache, op.rope.v_cache, op.rope.inv_freq]
    if op.qout is not None:
        binds += [c.arena_range(op.qout.row)] + ([op.qout.norm] if op.qout.norm is not None else [])
    return k, binds


def _rope(op: F.RopeKV, c: LowerContext):
    cfg = c.cfg
    (qkv,), (q,) = op.reads, op.writes
    k = RopeQKVKernel(c.dev, c.desc(qkv), c.desc(q), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, c.cap_stride,
                      rope_half=cfg.rope_style == "half", qk_norm=op.q_norm is not None, eps=cfg.norm_eps,
                      w_offset=cfg.norm_weight_offset)
    binds = [c.step, c.arena_range(qkv), c.arena_range(q), op.k_cache, op.v_cache, op.inv_freq]
    return k, binds + ([op.q_norm, op.k_norm] if op.q_norm is not None else [])


def _attention(op: F.Attention, c: LowerContext):
    cfg = c.cfg
    (q,), (part,) = op.reads, op.writes
    scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim ** -0.5
    k = AttentionKernel(c.dev, c.desc(q), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, c.cap_stride, c.rows_cap,
                        scale, window=op.window, grouped=op.grouped)
    return k, [c.step, c.arena_range(q), op.k_cache, op.v_cache, c.arena_range(part)]


def _combine(op: F.Combine, c: LowerContext):
    cfg = c.cfg
    (part,), (out,) = op.reads, op.writes
    k = AttentionCombineKernel(c.dev, c.desc(out), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, c.nsplit, c.rows_cap,
                               quant=op.quant)
    return k, [c.step, c.arena_range(part), c.arena_range(out)]


def _argmax(op: F.Argmax, c: LowerContext):
    k = ArgmaxKernel(c.dev, c.desc("logits"), c.cfg.vocab_size, row="0u")
    return k, [c.step, c.arena_range("logits"), c.arena_range("amax")]


def _sample(op: F.Sample, c: LowerContext):
    k = SampleKernel(c.dev, c.desc("logits"), c.cfg.vocab_size, row="0u", partials=op.partials)
    return k, [c.step, c.arena_range("logits"), c.out_tokens, c.ids, c.arena_range("amax")]


_LOWER = {F.Embed: _embed, F.Norm: _norm, F.Quantize: _quantize, F.Linear: _linear, F.RopeKV: _rope,
          F.Attention: _attention, F.Combine: _combine, F.Argmax: _argmax, F.Sample: _sample}
