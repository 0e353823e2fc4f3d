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
from ..kernels.attention import AttentionCombineKernel, AttentionKernel, AttentionPrefillKernel
from ..kernels.embedding import EmbeddingKernel
from ..kernels.linear import Epilogue, LinearKernel, PreNorm, QuantOut, RopeOut
from ..kernels.lora import LoraOut, LoraPartials, LoraShrinkKernel
from ..kernels.norm import RMSNormKernel
from ..kernels.quantize import QuantizeKernel
from ..kernels.rope import RopeQKVKernel
from ..kernels.sample import ArgmaxKernel, SampleKernel
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
    tree: Buffer | None = None   # (capacity, ROW_WORDS) u32 tree records (kernels/tree.py), tree programs
    forecast: Buffer | None = None   # (rows, dim) f32 forecast vectors (DS2D drafts), tree programs
    qlast: tuple | None = None   # (qy, qcnt) of the last-workgroup quantizing GEMVs (Program.qlast_buffers)
    kv_f16: bool = False         # the KV caches hold f16 (GPUModel.kv_f16)
    attn_count: Buffer | None = None   # (capacity, KVH) u32 counters of fused attention (Program.attn_count)

    def desc(self, name: str):
        return self.graph.desc(name)

    def arena_range(self, name: str) -> tuple:
        t = self.graph.tensors[name]
        return (self.arena, t.offset, t.desc.nbytes)

    @property
    def rows_cap(self) -> int:
        """Query rows per KV head at capacity (attention partials)."""
        return self.capacity * (self.cfg.n_heads // self.cfg.n_kv_heads)


def lower(op: F.Op, ctx: LowerContext) -> tuple:
    """(kernel, {binding name: buffer}) for one op (kernel.bind turns the names into a bind group)."""
    return _LOWER[type(op)](op, ctx)


def _embed(op: F.Embed, c: LowerContext):
    fc = op.forecast and op.table.row0 == 0
    k = EmbeddingKernel(c.dev, op.table, c.desc("x"), op.scale, shard=op.sharded, forecast=fc)
    return k, {"step": c.step, "ids": c.ids, "w": op.table.buffers, "out": c.arena_range("x")} | (
        {"fc": c.forecast} if fc else {})


def _norm(op: F.Norm, c: LowerContext):
    (x,), (out,) = op.reads, op.writes
    k = RMSNormKernel(c.dev, c.desc(x), c.desc(out), c.cfg.norm_eps, c.cfg.norm_weight_offset,
                      accumulate=op.accumulate, last_row=op.last_row)
    return k, {"step": c.step, "x": c.arena_range(x), "out": c.arena_range(out), "w": op.weight}


def _quantize(op: F.Quantize, c: LowerContext):
    (x,), (xq,) = op.reads, op.writes
    pre = PreNorm(c.cfg.norm_eps, c.cfg.norm_weight_offset) if op.norm is not None else None
    k = QuantizeKernel(c.dev, c.desc(x), c.desc(xq), op.fmt, pre_norm=pre, last_row=op.last_row, whole=op.whole)
    return k, {"step": c.step, "x": c.arena_range(x), "xq": c.arena_range(xq)} | ({"nw": op.norm} if pre else {})


def _linear(op: F.Linear, c: LowerContext):
    cfg = c.cfg
    x = op.reads[0]
    y = c.desc(op.y).columns(*op.columns) if op.columns else c.desc(op.y)
    rope = qout = None
    if op.rope is not None:
        rope = RopeOut(c.desc(op.rope.q), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, c.cap_stride,
                       rope_half=cfg.rope_style == "half", kv_f16=c.kv_f16, tree=op.rope.tree)
    if op.qout is not None:
        q = op.qout
        qout = QuantOut(c.desc(q.row), q.fmt, cfg.norm_weight_offset if q.norm is not None else None, q.write_y)
    pre = PreNorm(cfg.norm_eps, cfg.norm_weight_offset, op.x_partials) if op.pre_norm else None
    lo = op.lora
    lora = (LoraOut(c.desc(lo.u), lo.max_rank, lo.nseg, lo.cols, lo.splits, lo.dual, lo.fused) if lo is not None else None)
    sh = op.qout.lora if op.qout is not None else None
    k = LinearKernel(c.dev, op.stage, c.desc(x), y, op.w, op.w2, variant=op.variant, pre_norm=pre,
                     epilogue=Epilogue(bias=op.bias is not None, residual=op.residual, act=op.act, softcap=op.softcap,
                                       qout=qout, rope=rope, lora=lora, lpart=_lpart(sh, c)),
                     x_last_row=op.last_row)
    # y: the output, or a spare buffer where the epilogue writes elsewhere instead (no arena
    # range that could alias an input)
    binds = {"step": c.step, "x": c.arena_range(x), "y": c.arena_range(op.y) if op.y in op.writes else c.spare,
             "w": op.w.buffers}
    if op.w2 is not None:
        binds["w2"] = op.w2.buffers
    if op.bias is not None:
        binds["bias"] = op.bias
    if op.norm is not None:
        binds["nw"] = op.norm
    if op.rope is not None:
        binds |= {"q": c.arena_range(op.rope.q), "kc": op.rope.k_cache, "vc": op.rope.v_cache,
                  "inv_freq": op.rope.inv_freq} | ({"tree": c.tree} if op.rope.tree else {})
    if op.qout is not None:
        binds["qout"] = c.arena_range(op.qout.row)
        if op.qout.norm is not None:
            binds["qnw"] = op.qout.norm
        if op.variant.qlast:
            binds["qy"], binds["qcnt"] = c.qlast
    if lo is not None:
        binds |= {"lu": c.arena_range(lo.u), "lb": lo.b} | ({"lctl": lo.ctl} if lo.fused else {})
    return k, binds | _lpart_binds(sh, c)


def _lpart(sh: F.LoraShares | None, c: LowerContext) -> LoraPartials | None:
    return LoraPartials(c.desc(sh.part), sh.nseg, sh.max_rank, sh.n_in) if sh is not None else None


def _lpart_binds(sh: F.LoraShares | None, c: LowerContext) -> dict:
    return {"lpa": sh.a, "lpc": sh.ctl, "lpw": c.arena_range(sh.part)} if sh is not None else {}


def _lora_shrink(op: F.LoraShrink, c: LowerContext):
    (x,), (u,) = op.reads, op.writes
    pre = PreNorm(c.cfg.norm_eps, c.cfg.norm_weight_offset) if op.norm is not None else None
    k = LoraShrinkKernel(c.dev, c.desc(x), c.desc(u), op.n_in, op.nseg, op.max_rank, pre)
    binds = {"step": c.step, "x": c.arena_range(x), "la": op.a, "ctl": op.ctl, "lu": c.arena_range(u)}
    return k, binds | ({"nw": op.norm} if pre else {})


def _rope(op: F.RopeKV, c: LowerContext):
    cfg = c.cfg
    (qkv,), (q,) = op.reads, op.writes
    k = RopeQKVKernel(c.dev, c.desc(qkv), c.desc(q), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, c.cap_stride,
                      rope_half=cfg.rope_style == "half", qk_norm=op.q_norm is not None, eps=cfg.norm_eps,
                      w_offset=cfg.norm_weight_offset, tree=op.tree, kv_f16=c.kv_f16)
    binds = {"step": c.step, "qkv": c.arena_range(qkv), "q": c.arena_range(q), "kc": op.k_cache, "vc": op.v_cache,
             "inv_freq": op.inv_freq} | ({"tree": c.tree} if op.tree else {})
    return k, binds | ({"qn": op.q_norm, "kn": op.k_norm} if op.q_norm is not None else {})


def _attention(op: F.Attention, c: LowerContext):
    cfg = c.cfg
    (q,), (part, *merged) = op.reads, op.writes
    scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim ** -0.5
    if op.flash:
        k = AttentionPrefillKernel(c.dev, c.desc(q), c.desc(part), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                                   c.cap_stride, c.rows_cap, scale, window=op.window,
                                   keys=8 if c.cap_stride % 8 == 0 else 4, kv_f16=c.kv_f16)
        return k, {"step": c.step, "q": c.arena_range(q), "kc": op.k_cache, "vc": op.v_cache,
                   "out": c.arena_range(part)}
    k = AttentionKernel(c.dev, c.desc(q), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, c.cap_stride, c.rows_cap,
                        scale, window=op.window, **op.kernel._asdict(), tree=op.tree, kv_f16=c.kv_f16,
                        out=c.desc(merged[0]) if merged else None, quant=op.quant,
                        out_f=c.desc(merged[1]) if len(merged) > 1 else None)
    binds = {"step": c.step, "q": c.arena_range(q), "kc": op.k_cache, "vc": op.v_cache, "part": c.arena_range(part)}
    if merged:   # fused: the merged heads (and f32 rows), the program's counters
        binds |= {"out": c.arena_range(merged[0]), "cnt": c.attn_count}
        if len(merged) > 1:
            binds["outf"] = c.arena_range(merged[1])
    return k, binds | ({"tree": c.tree} if op.tree else {})


def _combine(op: F.Combine, c: LowerContext):
    cfg = c.cfg
    (part,), (out, *more) = op.reads, op.writes
    outf = [t for t in more if op.lora is None or t != op.lora.part]
    k = AttentionCombineKernel(c.dev, c.desc(out), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, op.nsplit, c.rows_cap,
                               quant=op.quant, out_f=c.desc(outf[0]) if outf else None, lpart=_lpart(op.lora, c))
    return k, {"step": c.step, "part": c.arena_range(part), "out": c.arena_range(out)} | (
        {"outf": c.arena_range(outf[0])} if outf else {}) | _lpart_binds(op.lora, c)


def _argmax(op: F.Argmax, c: LowerContext):
    k = ArgmaxKernel(c.dev, c.desc("logits"), c.cfg.vocab_size, row="0u", per_row=op.per_row, topk=op.topk)
    return k, {"step": c.step, "logits": c.arena_range("logits"), "part": c.arena_range("amax")}


def _sample(op: F.Sample, c: LowerContext):
    k = SampleKernel(c.dev, c.desc("logits"), c.cfg.vocab_size, row="r" if op.per_row else "0u",
                     partials=op.partials)
    return k, {"step": c.step, "logits": c.arena_range("logits"), "out_tokens": c.out_tokens, "ids": c.ids,
               "part": c.arena_range("amax")}


_LOWER = {F.Embed: _embed, F.Norm: _norm, F.Quantize: _quantize, F.Linear: _linear, F.RopeKV: _rope,
          F.Attention: _attention, F.Combine: _combine, F.Argmax: _argmax, F.Sample: _sample,
          F.LoraShrink: _lora_shrink}
