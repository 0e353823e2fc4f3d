"""The forward pass of the decoder-only transformer (Llama / SmolLM / Qwen2; Gemma 3 options),
as a list of typed ops for one stage.

One layer reads like the math (gpt-fast's TransformerBlock.forward):

    q          = rope(norm(x) Wqkv + b)        # and K, V appended to the cache
    x          = x + attention(q, cache) Wo    # Gemma 3: x + post_norm(attention Wo)
    x          = x + (act(norm(x) Wg) * (norm(x) Wu)) Wd

and `ForwardBuilder.layer` is written in that order. Every decision about how an op runs is made
here, once, and carried by the op's fields: which norm is fused into which GEMV, whether a GEMV
reads int8 activations and which decode variant or prefill GEMM tile it runs, which epilogue it has (bias, residual,
activation, softcap, quantizing the next GEMV's int8 row, RoPE + KV append), which attention
kernel. models/lower.py turns each op into a kernel and its bindings without looking at names.

Activation tensors are named in the op graph (graph/) only so the memory planner can place them
in one arena; every op lists what it reads and writes:
    x          (T, dim)          the residual stream
    h{i}, h2_{i} (T, dim)        normed x (unfused norms only)
    qkv{i}     (T, q_dim + 2 kv_dim)   the QKV projection (when RoPE is a separate kernel)
    q{i}       (KVH, T * GROUP, DH)    RoPE'd queries, grouped by KV head
    part{i}    (KVH, T * GROUP, NSPLIT * (DH + 2))  attention partials per key chunk (not in prefill
               graphs with the one-pass attention)
    attn{i}    (T, q_dim)        attention output
    act{i}     (T, ffn_dim)      act(gate) * up
    proj{i}, ffo{i} (T, dim)     Gemma 3: O projection / FFN output before its post-norm
    xq*{i}     (T, row words)    int8 rows of the integer-dot GEMVs (QuantizeKernel's format)
    xl, logits (T or 1, dim / vocab), amax (argmax partials)
    lu_{g}{i}  (T, 4 + nseg * max_rank) u32   LoRA shrink rows of GEMV group g (with a LoRA pool)
    lp_{g}{i}  (T, n_in / 32 * nseg * max_rank) f32   its input blocks' shares instead (fused shrink)

LoRA (models/lora.py's pool, when the engine has LoRA enabled): each of a layer's four GEMVs
(q|k|v, o, gate|up, down) gets a LoraShrink op (u = scale * x_in A^T, x_in the GEMV's input as
the GEMV sees it: for q|k|v and gate|up the RMS-normed x, computed from the float residual
stream) and a LoraEpilogue (+ u B^T on each output, before the bias, the activation, RoPE and any
quantizing epilogue). Two fusions write one more output with LoRA, because the shrink reads
float inputs: the attention combine writes the float rows as well as the O projection's int8
row, and the int8 chain's gate/up GEMV also writes act (the down shrink's input). One token row
of the int8 chain (the decode step) with the pool's fused_shrink (EngineOptions.lora_fused_shrink)
needs no shrink op after layer 0's q|k|v:
the kernel writing a GEMV's int8 input row (the previous GEMV's quantizing epilogue, the
attention combine) also writes each block's share of x_in A^T (LoraShares), summed by the GEMV
(kernels/lora.py). Without a pool the ops are exactly those of a build without LoRA.
Must not: import numpy or wgpu; allocate GPU memory (program.py binds, lower.py builds kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..gpu.base import Buffer
from ..graph import Graph, T
from ..kernels.attention import AttentionCombineKernel, AttentionKernel, AttentionPrefillKernel, AttnChoice
from ..kernels.autotune import (
    GEMM_TUNE_ROWS,
    choose_attention,
    choose_cols,
    choose_gemm,
    choose_gemv,
    choose_qout,
    large_gemm_rows,
    layout_name,
    static_gemm,
)
from ..kernels.base import ceil_div
from ..kernels.linear import GemmVariant, GemvVariant, rope_variant
from ..kernels.lora import partial_words, u_width
from ..kernels.quantize import row_words
from ..kernels.weights import GPUWeight
from ..weights.forecast import MAX_BRANCH as TREE_TOPK
from .choices import layer_role_weights


# -- the ops ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False, kw_only=True)
class Op:
    label: str                   # dispatch label (profiles, traces, tests)
    reads: tuple[str, ...]       # activation tensors (graph names)
    writes: tuple[str, ...]
    head: bool = False           # final norm / LM head / sampling: only the last prompt chunk runs it
    last_row: bool = False       # runs on the last token's row only (head ops without all-row logits)


@dataclass(frozen=True, eq=False, kw_only=True)
class Embed(Op):
    table: GPUWeight             # one row shard of the token embedding (or the whole table)
    sharded: bool                # the table has several shards: write only the ids in this one
    scale: float
    forecast: bool = False       # ids with the FORECAST_ID bit read a forecast vector (tree verification)


@dataclass(frozen=True, eq=False, kw_only=True)
class Norm(Op):
    """out = RMSNorm(x) * (w + offset); accumulate: out += that (Gemma's post-norms into x)."""
    weight: Buffer
    accumulate: bool = False


@dataclass(frozen=True, eq=False, kw_only=True)
class Quantize(Op):
    """x (optionally times the norm weight; 1/rms is applied by the GEMV, or with `whole` here)
    -> int8 blocks for a GEMV over weights of format `fmt`."""
    fmt: str
    norm: Buffer | None
    whole: bool = False


@dataclass(frozen=True, eq=False, kw_only=True)
class LoraShares:
    """With an int8 row's blocks, their shares of the next GEMV's LoRA shrink (kernels/lora.py
    LoraPartials): the tensor `part`, from that GEMV's A pool."""
    part: str
    a: Buffer
    ctl: Buffer
    nseg: int
    max_rank: int
    n_in: int


@dataclass(frozen=True, eq=False, kw_only=True)
class QuantOutput:
    """A GEMV epilogue that also writes the next GEMV's int8 input row."""
    row: str                     # the int8 row tensor
    fmt: str                     # the next GEMV's weight format
    norm: Buffer | None          # the next GEMV's norm weight (applied before quantizing), or None
    write_y: bool                # also write y (the residual stream); False: y is never written
    lora: LoraShares | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class RopeEpilogue:
    """The QKV GEMV applies RoPE, the Q relayout and the KV append itself (no qkv tensor); tree:
    each row rotated by its tree record's position (tree verification)."""
    q: str
    k_cache: Buffer
    v_cache: Buffer
    inv_freq: Buffer
    tree: bool = False


@dataclass(frozen=True, eq=False, kw_only=True)
class LoraShrink(Op):
    """u = scale * x_in A^T for the LoRA targets of one GEMV (kernels/lora.py); x_in = x, or
    RMSNorm(x) * norm weight when `norm` is given (the norm the GEMV applies to its input)."""
    a: Buffer                    # the layer's A pool of this GEMV group (models/lora.py)
    ctl: Buffer                  # adapter table + per-row entry index
    n_in: int
    nseg: int                    # targets of the GEMV (q|k|v: 3, gate|up: 2, else 1)
    max_rank: int
    norm: Buffer | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class LoraEpilogue:
    """The GEMV adds u B^T to each output (its LoraShrink's rows `u`, the B pool `b`; fused: u is
    the blocks' shares LoraShares wrote, summed by the GEMV, which reads the adapter table ctl)."""
    u: str
    b: Buffer
    nseg: int
    max_rank: int
    cols: int                    # B pool row width (outputs of the group's targets)
    splits: tuple[int, ...]      # q|k|v: first outputs of k and v
    dual: bool                   # gate|up: the second weight reads segment 1
    fused: bool = False
    ctl: Buffer | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class Linear(Op):
    """y = x W^T (W: w, or w and w2 as gate/up: y = act(x Wg^T) * (x Wu^T)) with its epilogue."""
    stage: str                   # "decode": GEMV kernels, "prefill": tiled GEMM
    y: str                       # the output tensor (its shape); not in `writes` when an epilogue
                                 # writes elsewhere instead (RoPE; the chain's gate/up)
    w: GPUWeight
    w2: GPUWeight | None = None
    int8_input: bool = False     # x is an int8 row (integer-dot GEMV / GEMM)
    variant: GemvVariant | GemmVariant   # decode: the GEMV variant, prefill: the GEMM's (kernels/autotune.py)
    large: tuple[int, GemmVariant] | None = None   # prefill: (rows, the GEMM for token buckets of at
                                 # least that many rows), where it differs from `variant`
                                 # (autotune.large_gemm_rows; models/program.py lowers both)
    norm: Buffer | None = None   # RMSNorm of x fused in (float input: the weight is bound here)
    pre_norm: bool = False       # x is normalised in the GEMV (float: with `norm`; int8: 1/rms only)
    x_partials: int | None = None   # int8 input from a quantizing epilogue: its partial sums of x^2
    bias: Buffer | None = None
    residual: bool = False       # y += result (the residual stream)
    act: str = "silu"
    softcap: float | None = None
    qout: QuantOutput | None = None
    rope: RopeEpilogue | None = None
    lora: LoraEpilogue | None = None   # + the LoRA term u B^T (before bias / activation / RoPE / qout)
    columns: tuple[int, int] | None = None   # write only logits columns (c0, n): an LM-head row shard


@dataclass(frozen=True, eq=False, kw_only=True)
class RopeKV(Op):
    """RoPE + Q relayout + KV append as its own kernel (QK-norm models, or no epilogue variant)."""
    k_cache: Buffer
    v_cache: Buffer
    inv_freq: Buffer
    q_norm: Buffer | None = None
    k_norm: Buffer | None = None
    tree: bool = False           # rotate each row by its tree record's position (kernels/tree.py)


@dataclass(frozen=True, eq=False, kw_only=True)
class Attention(Op):
    k_cache: Buffer
    v_cache: Buffer
    window: int                  # sliding window (0: the whole cache)
    kernel: AttnChoice           # AttentionKernel's variant, chunk (keys per workgroup: the partials'
                                 # nsplit = ceil(cache rows / chunk); tiled: adapt), V prefetch, adapt
    tree: bool = False           # each query row sees what its tree record allows (kernels/tree.py)
    flash: bool = False          # prefill: AttentionPrefillKernel, the whole softmax in one pass (writes
                                 # the token-major heads; no partials, no Combine)
    quant: str | None = None     # kernel.fused: the merged heads written as the O projection's int8 row
                                 # for weights of this format (writes: partials, merged heads[, f32 rows])


@dataclass(frozen=True, eq=False, kw_only=True)
class Combine(Op):
    quant: str | None            # write the O projection's int8 row for weights of this format
                                 # (a second write: the f32 rows too, or the shares of `lora`)
    nsplit: int                  # the attention's chunks per query row
    lora: LoraShares | None = None   # with quant: the O projection's LoRA shares


@dataclass(frozen=True, eq=False, kw_only=True)
class Argmax(Op):
    per_row: bool = False        # every row's span maxima (the streams, tree verification), not the last row's
    topk: int = 1                # the k largest logits of each span (tree verification: forecast drafts)


@dataclass(frozen=True, eq=False, kw_only=True)
class Sample(Op):
    partials: int                # Argmax's spans
    per_row: bool = False        # one token per logits row (the streams); else draws from the one row


# a tree verification program's float QKV GEMV takes the RoPE epilogue (one token row per
# workgroup: the weight read once per row) while capacity x its bytes is at most this
TREE_ROPE_BYTES = 32 << 20
PREFILL_ATTENTION = "grouped"   # the prefill programs' attention kernel for grouped-query models

# -- the builder ---------------------------------------------------------------------------------
class ForwardBuilder:
    """The op graph of one forward pass of `model` for one stage.

    stage: "decode" (GEMV kernels; also a prefill run over the decode kernels) or "prefill" (GEMM);
    all_logits: logits of every row (scoring) instead of sampling from the last one;
    streams: every row is a stream of its own (runtime/streams.py): logits and a sampled token per
    row (the head runs on every row);
    fuse: fold each RMSNorm into the GEMV that consumes it;
    tree: tree verification (speculative decoding): RoPE positions and attention masks from the
    per-row tree records (kernels/tree.py), every row's logits and their argmax spans.
    """

    def __init__(self, model, stage: str, capacity: int, all_logits: bool, layout: str, fuse: bool = True,
                 streams: bool = False, tree: bool = False, lora=None):
        """lora: the engine's LoraPool (models/lora.py): every layer GEMV gets a LoRA slot."""
        m, cfg = model, model.cfg
        self.lora = lora
        self.m, self.cfg, self.stage, self.all_logits, self.fuse = m, cfg, stage, all_logits, fuse
        self.capacity = capacity     # token rows per step: > 1 gives the integer-dot GEMVs several columns
        self.streams, self.tree = streams, tree
        if tree and not all_logits:
            raise ValueError("tree verification needs every row's logits (all_logits)")
        # int8 activations per GEMV role (the model's choices): decode GEMVs by role; the prefill
        # GEMMs of the layers by role too (a quantize op before each, as the decode GEMVs without
        # the chain), the prefill head (decode kernels on the last row) keeps the float GEMV
        if stage == "decode":
            self.int8 = dict(m.int8_roles)
        else:
            self.int8 = {r: m.prefill_int8_roles.get(r, False) for r in m.int8_roles}
        # every row's logits: the float head (scoring), but a tree verification in the decode
        # kernels keeps the decode steps' int8 head, so its logits round as theirs do
        self.int8["head"] = self.int8["head"] and (not all_logits or (tree and stage == "decode"))
        # the int8 chain (decode): each layer's GEMVs write the next GEMV's int8 rows themselves
        self.chain = stage == "decode" and m.int8_chain and all(self.int8[r] for r in ("qkv", "o", "gateup", "down"))
        # the QKV GEMV applies RoPE, the Q relayout and the KV append (decode): the integer-dot
        # one, or the float one where its variant computes rows in subgroups
        self.rope_epilogue = not cfg.qk_norm and stage == "decode" and (
            self.int8["qkv"] or (fuse and self._float_rope_epilogue()))
        # the O projection's int8 row written by the attention combine (with LoRA also the f32
        # rows its shrink reads)
        self.combine_quant = self.int8["o"] and AttentionCombineKernel.quant_supported(cfg.head_dim)
        # one token row of the int8 chain: the LoRA shrinks in the producers' epilogues
        self.lora_fused = (lora is not None and lora.fused_shrink and self.chain and capacity == 1
                           and not streams and not tree and lora.max_rank % 4 == 0)
        self.nrm = (cfg.norm_eps, cfg.norm_weight_offset)
        # prefill (one sequence, no tree): the one-pass attention writes attn{i} itself
        self.flash = stage == "prefill" and not tree and AttentionPrefillKernel.supported(
            m.dev, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, m.cap_stride)
        self.g = Graph(capacity, layout)
        self._attn = {}              # sliding window -> attn_kernel's choice
        self._tensors()

    def build(self) -> Graph:
        g = self.g
        for w in self.m.tok_embd_shards:
            g.add(Embed(label="embedding", reads=(), writes=("x",), table=w,
                        sharded=len(self.m.tok_embd_shards) > 1, scale=self.cfg.embed_scale, forecast=self.tree))
        for i, lw in enumerate(self.m.layers):
            self.layer(i, lw)
        self.lm_head()
        return g

    def _tensors(self) -> None:
        g, cfg = self.g, self.cfg
        group = cfg.n_heads // cfg.n_kv_heads
        g.tensor("x", cfg.dim)
        for i in range(cfg.n_layers):
            g.tensor(f"h{i}", cfg.dim)
            g.tensor(f"qkv{i}", cfg.q_dim + 2 * cfg.kv_dim)
            g.tensor(f"q{i}", cfg.head_dim, T * group, b=cfg.n_kv_heads)
            if not self.flash:
                g.tensor(f"part{i}", self.nsplit(i) * (cfg.head_dim + 2), T * group, b=cfg.n_kv_heads,
                         layout="linear")
            g.tensor(f"attn{i}", cfg.q_dim)
            g.tensor(f"h2_{i}", cfg.dim)
            g.tensor(f"act{i}", cfg.ffn_dim)
            if cfg.post_norms:
                g.tensor(f"proj{i}", cfg.dim)
                g.tensor(f"ffo{i}", cfg.dim)
        rows = T if self.all_logits or self.streams else 1
        g.tensor("xl", cfg.dim, rows)
        g.tensor("logits", cfg.vocab_size, rows)
        for i in range(cfg.n_layers):   # int8 activation rows for the integer-dot GEMVs, per role
            for nm, role, width in (("xqa", "qkv", cfg.dim), ("xqo", "o", cfg.q_dim), ("xqf", "gateup", cfg.dim),
                                    ("xqd", "down", cfg.ffn_dim)):
                if self.int8[role]:
                    g.tensor(f"{nm}{i}", row_words(width), layout="linear")
        if self.int8["head"]:
            g.tensor("xql", row_words(cfg.dim), rows, layout="linear")
        if not self.all_logits or self.tree:
            g.tensor("amax", 2 * ceil_div(cfg.vocab_size, 4096) * (TREE_TOPK if self.tree else 1),
                     T if self.tree or self.streams else 1, layout="linear")
        if self.lora is not None:
            for i in range(cfg.n_layers):
                for name, grp in self.lora.groups.items():
                    if self._fused(i, name):
                        g.tensor(f"lp_{name}{i}", partial_words(grp.n_in, grp.nseg, self.lora.max_rank), layout="linear")
                    else:
                        g.tensor(f"lu_{name}{i}", u_width(grp.nseg, self.lora.max_rank), layout="linear")

    # -- one decoder layer ---------------------------------------------------------------------
    def layer(self, i: int, lw) -> None:
        q = self.qkv(i, lw)              # q = rope(norm(x) Wqkv + b); K, V appended to the cache
        part = self.attention(i, lw, q)  # softmax(q K^T) V per key chunk (prefill: all of it, attn{i})
        o_in = self.combine(i, lw, part)
        self.o_proj(i, lw, o_in)         # x += attn Wo
        a = self.gate_up(i, lw)          # a = act(norm(x) Wg) * (norm(x) Wu)
        self.down(i, lw, a)              # x += a Wd

    def qkv(self, i: int, lw) -> str:
        cfg, g = self.cfg, self.g
        int8 = self.int8["qkv"]
        x, norm, pre_norm = self._normed_input(i, "qkv", "x", lw.attn_norm, f"xqa{i}", f"h{i}", "attn_norm",
                                               quantize=not (self.chain and i > 0))
        freq = self.m.inv_freq_local if cfg.layer_is_sliding(i) else self.m.inv_freq
        lora = self._lora(i, "qkv", "x", lw.attn_norm)
        common = {"stage": self.stage, "w": lw.wqkv, "int8_input": int8, "bias": lw.bqkv, "reads": (x, *self._u(lora)),
                  "x_partials": self._chained(i > 0), "lora": lora}
        if self.rope_epilogue:
            variant = self._variant(lw.wqkv, int8=int8)
            if not int8:   # the float GEMVs take RoPE in one column, in whole rotation pairs
                variant = rope_variant(variant)
            label = f"L{i}.qkv+rope_kv" if int8 else f"L{i}.norm+qkv+rope_kv"
            g.add(Linear(label=label, writes=(f"q{i}",), y=f"qkv{i}", variant=variant, norm=None if int8 else lw.attn_norm,
                         pre_norm=True, rope=RopeEpilogue(q=f"q{i}", k_cache=lw.k_cache, v_cache=lw.v_cache,
                                                          inv_freq=freq, tree=self.tree), **common))
            return f"q{i}"
        label = f"L{i}.norm+qkv" if norm is not None else f"L{i}.qkv"
        g.add(Linear(label=label, writes=(f"qkv{i}",), y=f"qkv{i}", norm=norm,
                     pre_norm=pre_norm, **self._variants(lw.wqkv, int8=int8), **common))
        g.add(RopeKV(label=f"L{i}.rope_kv", reads=(f"qkv{i}",), writes=(f"q{i}",), k_cache=lw.k_cache,
                     v_cache=lw.v_cache, inv_freq=freq, q_norm=lw.q_norm, k_norm=lw.k_norm, tree=self.tree))
        return f"q{i}"

    def attn_kernel(self, i: int) -> AttnChoice:
        """Layer i's attention kernel, its chunk filled in. Decode: the kernel the engine chose on
        whole decode steps for the layer's window (GPUModel.attn_steps), else the adapter's choice
        timed alone (kernels/autotune.choose_attention); prefill: PREFILL_ATTENTION
        where a KV head serves several query heads (grouped: each K and V chunk read once for
        them), else per head."""
        cfg, m = self.cfg, self.m
        window = cfg.sliding_window if cfg.layer_is_sliding(i) else 0
        if window not in self._attn:
            group = cfg.n_heads // cfg.n_kv_heads
            c = AttnChoice(PREFILL_ATTENTION if 1 < group <= AttentionKernel.MAX_GQA else "head")
            if self.stage == "decode":
                lw = m.layers[i]
                c = m.attn_steps.get(window) or choose_attention(
                    m.dev, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, m.cap_stride, lw.k_cache, lw.v_cache, window,
                    enabled=m.autotune, kv_f16=m.kv_f16)
            self._attn[window] = c._replace(chunk=AttentionKernel.chunk_of(c.variant, c.chunk, cfg.head_dim,
                                                                           m.cap_stride))
        return self._attn[window]

    def nsplit(self, i: int) -> int:
        """Layer i's attention partials per query row."""
        return AttentionKernel.splits(self.attn_kernel(i), self.cfg.head_dim, self.m.cap_stride)

    def attention(self, i: int, lw, q: str) -> str:
        """Layer i's attention: its partials (part{i}); prefill's one-pass kernel writes attn{i}, a
        kernel that merges its partials (fused) also the merged heads (_merged)."""
        cfg = self.cfg
        window = cfg.sliding_window if cfg.layer_is_sliding(i) else 0
        out = f"attn{i}" if self.flash else f"part{i}"
        fused = self._attn_fused(i)
        quant, merged, _, _ = self._merged(i, lw)
        self.g.add(Attention(label=f"L{i}.attention" + ("+combine" + ("+quant" if quant else "") if fused else ""),
                             reads=(q,), writes=(out, *(merged if fused else ())), k_cache=lw.k_cache,
                             v_cache=lw.v_cache, window=window, kernel=self.attn_kernel(i)._replace(fused=fused),
                             tree=self.tree, flash=self.flash, quant=quant if fused else None))
        return out

    def _attn_fused(self, i: int) -> bool:
        """Whether layer i's attention kernel merges its partials itself: the chosen kernel's
        option, kept where the merge writes no LoRA shares (those are the combine's)."""
        return not self.flash and self.attn_kernel(i).fused and not (self.combine_quant and self._shares(i, "o"))

    def _merged(self, i: int, lw) -> tuple:
        """What merging layer i's partials writes: (int8 format or None, the tensors written, the one
        the O projection reads, the O projection's LoRA shares or None). The int8 row where the
        O projection takes one and the merge can write it (with LoRA also attn{i}, the O shrink's
        input, or the shrink's shares); else attn{i}."""
        if self.combine_quant:
            sh = self._shares(i, "o")
            writes = (f"xqo{i}", *self._part(sh)) + ((f"attn{i}",) if self.lora is not None and sh is None else ())
            return lw.wo.fmt, writes, f"xqo{i}", sh
        return None, (f"attn{i}",), f"attn{i}", None

    def combine(self, i: int, lw, part: str) -> str:
        """The attention chunks combined into attn{i}, or into the O projection's int8 row (by the
        attention kernel itself where it merges them)."""
        g = self.g
        if self.flash:    # the attention wrote attn{i}
            if self.int8["o"]:
                g.add(Quantize(label=f"L{i}.quant_o", reads=(part,), writes=(f"xqo{i}",), fmt=lw.wo.fmt, norm=None))
                return f"xqo{i}"
            return part
        quant, writes, out, sh = self._merged(i, lw)
        if not self._attn_fused(i):
            g.add(Combine(label=f"L{i}.attn_combine" + ("+quant" if quant else ""), reads=(part,), writes=writes,
                          quant=quant, nsplit=self.nsplit(i), lora=sh))
        if quant is None and self.int8["o"]:
            g.add(Quantize(label=f"L{i}.quant_o", reads=(f"attn{i}",), writes=(f"xqo{i}",), fmt=lw.wo.fmt, norm=None))
            return f"xqo{i}"
        return out

    def o_proj(self, i: int, lw, o_in: str) -> None:
        self._residual_proj(i, "o", lw.wo, o_in, f"proj{i}", lw.post_attn_norm, "o_proj",
                            next_gemv=(f"xqf{i}", lw.w_gate.fmt, lw.ffn_norm, self._shares(i, "gateup"))
                            if self.chain else None)

    def gate_up(self, i: int, lw) -> str:
        cfg, g = self.cfg, self.g
        lora = self._lora(i, "gateup", "x", lw.ffn_norm)
        act = {"stage": self.stage, "w": lw.w_gate, "w2": lw.w_up, "act": cfg.act, "lora": lora}
        if self.chain:   # writes only the down GEMV's int8 row (y is never written: x satisfies the binding),
            # and act too with LoRA (the down shrink's input), or the shrink's shares
            sh = self._shares(i, "down")
            write_y = lora is not None and sh is None
            writes = ((f"act{i}",) if write_y else ()) + (f"xqd{i}", *self._part(sh))
            g.add(Linear(label=f"L{i}.gate_up+act+quant", reads=(f"xqf{i}", *self._u(lora)), writes=writes, y=f"act{i}",
                         int8_input=True, variant=self._qout_variant(lw.w_gate, lw.w_up), pre_norm=True,
                         x_partials=self._chained(True),
                         qout=QuantOutput(row=f"xqd{i}", fmt=lw.w_down.fmt, norm=None, write_y=write_y, lora=sh),
                         **act))
            return f"xqd{i}"
        int8 = self.int8["gateup"]
        x, norm, pre_norm = self._normed_input(i, "gateup", "x", lw.ffn_norm, f"xqf{i}", f"h2_{i}", "ffn_norm",
                                               quantize=True, quant_label="norm+quant_ffn")
        label = f"L{i}.norm+gate_up+act" if norm is not None else f"L{i}.gate_up+act"
        g.add(Linear(label=label, reads=(x, *self._u(lora)), writes=(f"act{i}",), y=f"act{i}", int8_input=int8, norm=norm,
                     pre_norm=pre_norm,
                     **self._variants(lw.w_gate, lw.w_up, int8=int8), **act))
        if self.int8["down"]:
            g.add(Quantize(label=f"L{i}.quant_down", reads=(f"act{i}",), writes=(f"xqd{i}",), fmt=lw.w_down.fmt,
                           norm=None))
            return f"xqd{i}"
        return f"act{i}"

    def down(self, i: int, lw, a: str) -> None:
        nxt = self.m.layers[i + 1] if i + 1 < len(self.m.layers) else None
        self._residual_proj(i, "down", lw.w_down, a, f"ffo{i}", lw.post_ffn_norm, "down",
                            next_gemv=(f"xqa{i + 1}", nxt.wqkv.fmt, nxt.attn_norm, self._shares(i + 1, "qkv"))
                            if self.chain and nxt else None)

    # -- the head --------------------------------------------------------------------------------
    def lm_head(self) -> None:
        cfg, g, m = self.cfg, self.g, self.m
        last = not (self.all_logits or self.streams)   # only the last row's logits
        head = {"head": True, "last_row": last}
        if self.int8["head"]:
            # the whole norm in the quantize: 1/rms in the GEMV's many small workgroups took a
            # quarter of the 1B q4 head's time at 8 rows (H100, 2026-11-24: 178 against 131 us)
            g.add(Quantize(label="norm+quant_head", reads=("x",), writes=("xql",), fmt=m.output.fmt,
                           norm=m.output_norm, whole=True, **head))
            x, norm, label = "xql", None, "lm_head"
        elif self.fuse and self.stage != "decode" and last:   # the prefill's last row: the GEMV takes the norm
            # (decode: a separate norm, the LM head has many workgroups; every row's logits: a
            # separate norm, as before every prefill GEMM)
            x, norm, label = "x", m.output_norm, "norm+lm_head"
        else:
            g.add(Norm(label="output_norm", reads=("x",), writes=("xl",), weight=m.output_norm, **head))
            x, norm, label = "xl", None, "lm_head"
        # one dispatch per row shard, each writing its columns of logits; decode kernels unless
        # every row's logits are wanted
        stage = "decode" if last else self.stage
        sharded = len(m.output_shards) > 1
        for w in m.output_shards:
            if stage == "decode":
                variant = choose_gemv(m.dev, w, enabled=m.autotune, int8=x == "xql")
                if not last:   # every row's logits: the streams' rows as columns
                    variant = self._cols(variant, w, None)
                if variant.rows * m.dev.max_workgroups < w.o:
                    variant = replace(variant, rows=ceil_div(ceil_div(w.o, m.dev.max_workgroups), variant.mrows)
                                      * variant.mrows)
            else:   # every row's logits: the float GEMM (the vocabulary's y is too big to time)
                variant = static_gemm(m.dev, w)
            g.add(Linear(label=label, reads=(x,), writes=("logits",), y="logits", stage=stage, w=w, int8_input=x == "xql",
                         variant=variant, norm=norm, pre_norm=x == "x", softcap=cfg.final_logit_softcap,
                         columns=(w.row0, w.o) if sharded else None, head=True, last_row=last and x != "xl"))
        if self.tree:
            g.add(Argmax(label="argmax_rows", reads=("logits",), writes=("amax",), per_row=True, head=True,
                         topk=TREE_TOPK))
        if not self.all_logits:
            per_row = {"per_row": self.streams, **head}
            g.add(Argmax(label="argmax", reads=("logits",), writes=("amax",), **per_row))
            g.add(Sample(label="sample", reads=("logits", "amax"), writes=(), partials=ceil_div(cfg.vocab_size, 4096),
                         **per_row))

    # -- decisions shared by the layer ops ----------------------------------------------------------
    def _normed_input(self, i: int, role: str, x: str, norm: Buffer, xq: str, h: str, norm_label: str,
                      quantize: bool, quant_label: str = "norm+quant") -> tuple[str, Buffer | None, bool]:
        """How a pre-normed GEMV gets norm(x): (its input tensor, the norm weight it binds, whether it
        normalises). int8: a QuantizeKernel applied the norm weight (unless the chain's previous GEMV
        wrote the row), the GEMV applies 1/rms; fused: the GEMV does the whole norm; else a norm op."""
        g = self.g
        if self.int8[role]:
            if quantize:
                g.add(Quantize(label=f"L{i}.{quant_label}", reads=(x,), writes=(xq,), fmt=self._weight(i, role).fmt,
                               norm=norm))
            return xq, None, True
        if self.fuse and self.stage == "decode":
            return x, norm, True
        # a float prefill GEMM reads a normed input: fused, every tile would read its BM rows whole
        # for their 1/rms before its first product (H200, 8B f16 at 1024 rows: the fused norm took
        # the Q|K|V GEMM 1.24-2.2x and gate/up 1.1-1.55x its time without it, per tile; the Norm pass
        # 32 us against 0.7 / 2.0 ms saved)
        g.add(Norm(label=f"L{i}.{norm_label}", reads=(x,), writes=(h,), weight=norm))
        return h, None, False

    def _weight(self, i: int, role: str) -> GPUWeight:
        lw = self.m.layers[i]
        return lw.wqkv if role == "qkv" else lw.w_gate

    def _residual_proj(self, i: int, role: str, w: GPUWeight, x: str, post_out: str, post_norm: Buffer | None,
                       name: str, next_gemv: tuple | None) -> None:
        """O projection or down: x += x_in W (Gemma: post_out = x_in W, then x += post_norm(post_out));
        in the int8 chain also the int8 row of the next GEMV, next_gemv = (row, its format, its norm,
        its LoRA shares or None)."""
        g, cfg = self.g, self.cfg
        int8 = self.int8[role]
        # the LoRA shrink reads the float input attn{i} / act{i} (also where this GEMV reads its int8 row)
        lora = self._lora(i, role, f"attn{i}" if role == "o" else f"act{i}", None)
        u, lo = self._u(lora), {"lora": lora}
        if cfg.post_norms:
            g.add(Linear(label=f"L{i}.{name}", reads=(x, *u), writes=(post_out,), y=post_out, stage=self.stage, w=w,
                         int8_input=int8, **self._variants(w, int8=int8), **lo))
            which = "attn" if role == "o" else "ffn"
            g.add(Norm(label=f"L{i}.post_{which}_norm", reads=(post_out,), writes=("x",), weight=post_norm,
                       accumulate=True))
        elif next_gemv is not None:
            row, fmt, norm, sh = next_gemv
            g.add(Linear(label=f"L{i}.{name}+residual+quant", reads=(x, "x", *u), writes=("x", row, *self._part(sh)),
                         y="x", stage=self.stage, w=w, int8_input=int8, variant=self._qout_variant(w), residual=True,
                         qout=QuantOutput(row=row, fmt=fmt, norm=norm, write_y=True, lora=sh), **lo))
        else:
            g.add(Linear(label=f"L{i}.{name}+residual", reads=(x, "x", *u), writes=("x",), y="x", stage=self.stage, w=w,
                         int8_input=int8, **self._variants(w, int8=int8), residual=True,
                         **lo))

    def _lora(self, i: int, group: str, x: str, norm: Buffer | None) -> LoraEpilogue | None:
        """With a LoRA pool: the shrink op of GEMV group `group` (reading float x, normed by `norm`
        when the GEMV's input is norm(x)) and the GEMV's epilogue; None without."""
        p = self.lora
        if p is None:
            return None
        grp = p.groups[group]
        if self._fused(i, group):   # the producer of the GEMV's int8 row wrote the shares
            return LoraEpilogue(u=f"lp_{group}{i}", b=p.lb[i][group], nseg=grp.nseg, max_rank=p.max_rank, cols=grp.cols,
                                splits=grp.splits, dual=group == "gateup", fused=True, ctl=p.ctl)
        u = f"lu_{group}{i}"
        self.g.add(LoraShrink(label=f"L{i}.lora_{group}", reads=(x,), writes=(u,), a=p.la[i][group], ctl=p.ctl,
                              n_in=grp.n_in, nseg=grp.nseg, max_rank=p.max_rank, norm=norm))
        return LoraEpilogue(u=u, b=p.lb[i][group], nseg=grp.nseg, max_rank=p.max_rank, cols=grp.cols,
                            splits=grp.splits, dual=group == "gateup")

    def _fused(self, i: int, group: str) -> bool:
        """Whether GEMV group `group` of layer i reads its LoRA shrink as shares its int8 input's
        producer wrote: every group in the fused one-row chain but layer 0's q|k|v (its row comes
        from a quantize op) and the O projection where the combine does not quantize."""
        return self.lora_fused and (group != "qkv" or i > 0) and (group != "o" or self.combine_quant)

    def _shares(self, i: int, group: str) -> LoraShares | None:
        """The shares a producer writes for GEMV group `group` of layer i, where it is fused."""
        if not self._fused(i, group):
            return None
        p, grp = self.lora, self.lora.groups[group]
        return LoraShares(part=f"lp_{group}{i}", a=p.la[i][group], ctl=p.ctl, nseg=grp.nseg, max_rank=p.max_rank,
                          n_in=grp.n_in)

    @staticmethod
    def _part(sh: LoraShares | None) -> tuple[str, ...]:
        return (sh.part,) if sh is not None else ()

    @staticmethod
    def _u(lora: LoraEpilogue | None) -> tuple[str, ...]:
        return (lora.u,) if lora is not None else ()

    def _float_rope_epilogue(self) -> bool:
        """Whether the float decode QKV GEMV can take the RoPE epilogue: its chosen variant computes
        rows in subgroups (rotation partners as a pair per subgroup, so an even row count). The
        epilogue takes one token row per workgroup, so a program of several rows reads the weight
        once per row: a tree verification program takes it only while that is at most
        TREE_ROPE_BYTES (SmolLM2's QKV, not the 1B's: a dispatch fewer a layer against the weight
        read again; the streams' programs take it whatever the size)."""
        w = self.m.layers[0].wqkv
        c = self._variant(w)
        return (c.variant in ("subgroup", "wide") and c.rows % 2 == 0
                and (not self.tree or self.capacity * w.nbytes <= TREE_ROPE_BYTES))

    def _variant(self, w: GPUWeight, w2: GPUWeight | None = None, int8: bool = False) -> GemvVariant | GemmVariant:
        """The decode GEMV variant or the prefill GEMM configuration measured fastest on this
        adapter (the static rule where it is not measured)."""
        m = self.m
        if self.stage == "decode":
            return self._cols(choose_gemv(m.dev, w, w2, enabled=m.autotune, int8=int8, siblings=self._siblings(w, w2)),
                              w, w2)
        return choose_gemm(m.dev, w, w2, enabled=m.autotune, int8=int8)

    def _siblings(self, w: GPUWeight, w2: GPUWeight | None) -> list | None:
        """The (weight, second weight) of w's role in every layer whose weights have w's format
        and shape (w's own first): a decode GEMV's candidates are re-timed in a chain over them
        (autotune.choose_gemv). None for a weight of no layer role (the LM head)."""
        def same(a, b):
            return b is None if a is None else (b is not None and (a.fmt, a.o, a.i, layout_name(a)) ==
                                                (b.fmt, b.o, b.i, layout_name(b)))
        roles = [layer_role_weights(lw) for lw in self.m.layers]
        for role in roles[0]:
            pairs = [r[role] for r in roles]
            if any(p[0] is w for p in pairs):
                return [(w, w2)] + [p for p in pairs if p[0] is not w and same(w, p[0]) and same(w2, p[1])]
        return None

    def _variants(self, w: GPUWeight, w2: GPUWeight | None = None, int8: bool = False) -> dict:
        """A layer Linear's `variant` (`_variant`) and, for a prefill program of more than
        GEMM_TUNE_ROWS rows, its `large`: the GEMM timed fastest at the program's capacity
        (autotune.choose_gemm says why) for the token buckets from large_gemm_rows on, where that
        is another GEMM (never where the adapter is not tuned)."""
        m, v = self.m, self._variant(w, w2, int8)
        if self.stage != "prefill" or self.capacity <= GEMM_TUNE_ROWS:
            return {"variant": v}
        big = choose_gemm(m.dev, w, w2, enabled=m.autotune, int8=int8, rows=self.capacity)
        return {"variant": v, "large": None if big == v else (large_gemm_rows(self.capacity), big)}

    def _qout_variant(self, w: GPUWeight, w2: GPUWeight | None = None) -> GemvVariant:
        """The integer-dot GEMV variant with a quantizing epilogue (its rows: one int8 block)."""
        m = self.m
        return self._cols(choose_qout(m.dev, w, w2, enabled=m.autotune, siblings=self._siblings(w, w2)), w, w2,
                          qout=True)

    def _cols(self, v: GemvVariant, w: GPUWeight, w2: GPUWeight | None, qout: bool = False) -> GemvVariant:
        """A program of several rows per step (tree verification, the streams, a prefill over
        decode kernels): the integer-dot, subgroup and wide GEMVs read each weight block once for
        several rows (autotune.choose_cols: gemv_cols's static rule, or measured); a one-row
        program keeps the one-row kernel, and a prefill over decode kernels (software adapters)
        keeps the float variants' one-row form (the K-column float GEMVs are measured for tree
        verification and the streams only; each new float choice there would be one more key
        for the browser's tuner to chase over reloads)."""
        m = self.m
        if v.variant != "blk" and not (self.tree or self.streams):
            return v
        return choose_cols(m.dev, w, w2, v, self.capacity, qout=qout, enabled=m.autotune)

    def _chained(self, produced_by_gemv: bool) -> int | None:
        """Partial sums of x^2 per 32-block in an int8 row a quantizing epilogue wrote."""
        return self.cfg.dim // 32 if self.chain and produced_by_gemv else None
