"""The decoder-only transformer (Llama / SmolLM / Qwen2; Gemma 3 options) on the GPU.

Two jobs, kept apart like gpt-fast's load hook vs model:
  1. load: turn the file's tensors into runtime GPU weights (kernels/convert.py), e.g. the
     file's separate Q, K, V become one fused `wqkv` (rows [q | k | v]) so a layer reads its
     input once; a token embedding / LM head larger than one storage binding is held as row
     shards (footprint.row_shards); and allocate the KV cache once for the maximum context;
  2. build: the op graph of one forward pass for a stage (prefill: GEMM kernels, T tokens;
     decode: GEMV kernels, 1 token; score: all-row logits), planned into one arena.
Per layer (llama):  h = norm(x); qkv = h Wqkv (+b); rope+relayout+KV append; attention;
                    x += attn Wo;  h2 = norm(x); a = silu(h2 Wg) * (h2 Wu); x += a Wd
Must not: import numpy or wgpu (runs in Pyodide); per-token work lives in runtime/.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from ..errors import GPULimitError, InvalidArgumentError, UnsupportedModelError
from ..gpu.base import STORAGE, Buffer, Device, Dispatch
from ..graph import Graph, T
from ..kernels import linear_blk
from ..kernels.attention import AttentionCombineKernel, AttentionKernel
from ..kernels.autotune import (
    chain_pays,
    choose_attention,
    choose_gemv,
    choose_layout,
    choose_qout,
    int8_pays,
)
from ..kernels.base import ceil_div
from ..kernels.convert import SOURCE_TYPES, allocate_weight, runtime_format, upload_rows
from ..kernels.embedding import EmbeddingKernel
from ..kernels.linear import Epilogue, GemvVariant, LinearKernel, PreNorm, QuantOut, RopeOut
from ..kernels.norm import RMSNormKernel
from ..kernels.quantize import QuantizeKernel, row_words
from ..kernels.rope import RopeQKVKernel
from ..kernels.sample import ArgmaxKernel, SampleKernel
from ..kernels.weights import GPUWeight
from ..weights.config import ModelConfig


@dataclass
class LayerWeights:
    attn_norm: Buffer
    wqkv: GPUWeight
    bqkv: Buffer | None
    wo: GPUWeight
    ffn_norm: Buffer
    w_gate: GPUWeight
    w_up: GPUWeight
    w_down: GPUWeight
    k_cache: Buffer             # (KVH, CAP, DH) f32
    v_cache: Buffer             # (KVH, DH, CAP) f32
    q_norm: Buffer | None = None
    k_norm: Buffer | None = None
    post_attn_norm: Buffer | None = None
    post_ffn_norm: Buffer | None = None


def rope_inv_freq(cfg: ModelConfig, theta: float) -> list[float]:
    """inv_freq[i] = theta^(-2i/d), with HF's llama3 / linear rope_scaling applied."""
    d = cfg.head_dim
    inv = [1.0 / (theta ** (2 * i / d)) for i in range(d // 2)]
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type") or rs.get("type")
    if kind == "linear":
        inv = [f / float(rs["factor"]) for f in inv]
    elif kind == "llama3":
        import math
        factor, lo, hi = float(rs["factor"]), float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
        old = float(rs.get("original_max_position_embeddings", 8192))
        lo_wl, hi_wl = old / lo, old / hi
        out = []
        for f in inv:
            wl = 2 * math.pi / f
            if wl < hi_wl:
                out.append(f)
            elif wl > lo_wl:
                out.append(f / factor)
            else:
                sm = (old / wl - lo) / (hi - lo)
                out.append((1 - sm) * f / factor + sm * f)
        inv = out
    elif kind not in (None, "default"):
        raise UnsupportedModelError(f"rope_scaling type {kind!r} is not supported (linear, llama3)")
    return inv


class GPUModel:
    """Runtime weights + KV cache of one model on one device."""

    def __init__(self, dev: Device, source, max_context: int, weight_format: str | None = None,
                 progress=None, autotune: bool = True, int8_activations: bool | dict | None = None,
                 max_binding_bytes: int | None = None):
        """max_binding_bytes: hold no weight buffer larger than this (below the adapter's limits):
        the token embedding / LM head split into row shards at this size, other weights must fit."""
        self.dev, self.cfg, self.cap = dev, source.config, max_context
        self.max_binding = max_binding_bytes
        self.cap_stride = (max_context + 3) // 4 * 4   # KV cache rows per head (attention reads V as vec4)
        cfg = self.cfg
        if cfg.n_heads % cfg.n_kv_heads:
            raise UnsupportedModelError(f"{source.path}: {cfg.n_heads} heads is not a multiple of {cfg.n_kv_heads} KV heads")
        if cfg.head_dim % 4 or cfg.head_dim > 256:
            raise UnsupportedModelError(f"{source.path}: head_dim {cfg.head_dim} is not supported "
                                        "(a multiple of 4, at most 256)")
        self.weight_format = weight_format
        self.autotune = autotune
        self._src = source
        self._progress = progress
        self._done = 0
        self._total = len(source.tensors)
        self.weight_bytes = 0
        self._check_memory()
        # the token embedding and LM head as row shards (one shard, row0 = 0: one buffer per binding
        # as for every other weight); tok_embd / output: the first shard (its format and shape)
        self.tok_embd_shards = self._matrix_shards("token_embd.weight", "token_embd")
        self.tok_embd = self.tok_embd_shards[0]
        self.layers = [self._layer(i) for i in range(cfg.n_layers)]
        self.output_norm = self._vector("output_norm.weight")
        if cfg.tied_embeddings or "output.weight" not in source.tensors:
            self.output_shards = self.tok_embd_shards
        else:
            self.output_shards = self._matrix_shards("output.weight", "output")
        self.output = self.output_shards[0]
        self.inv_freq = self._f32_buffer(rope_inv_freq(cfg, cfg.rope_theta), "inv_freq")
        self.inv_freq_local = (self._f32_buffer(rope_inv_freq(cfg, cfg.rope_local_theta), "inv_freq_local")
                               if cfg.rope_local_theta else self.inv_freq)
        self._src = None
        self.int8_chain = False   # _int8_choice decides (auto: by measurement)
        self.int8_roles = self._int8_choice(int8_activations)
        self.int8 = any(self.int8_roles.values())

    def _chain_possible(self) -> bool:
        """Whether every layer GEMV can write the next one's int8 row (quantizing epilogues need
        subgroups, 32-multiples and pre-norm blocks; the combine needs head_dim % 32 == 0)."""
        cfg = self.cfg
        return (self.dev.has_subgroups and not cfg.post_norms and cfg.dim % 32 == 0 and cfg.ffn_dim % 32 == 0
                and AttentionCombineKernel.quant_supported(cfg.head_dim))

    def _int8_choice(self, wanted: bool | None) -> dict:
        """Which decode GEMVs take int8 activations (QuantizeKernel + integer-dot GEMV), by role:
        qkv, o, gateup, down, head. True/False: all of them (True needs q4/q8 layers). Auto: on
        GPUs with packed integer dot products, per role where the measured GEMV time saved pays
        for the extra quantize dispatch (kernels/autotune.py int8_pays; without timestamps, for
        weights >= 12 MiB); then, where gate/up pays and the layer allows it, every layer GEMV
        with the int8 chain if chain_pays measures it faster (untimed: always); never on software
        adapters."""
        lw = self.layers[0]
        roles = {"qkv": (lw.wqkv, None, True), "o": (lw.wo, None, False), "gateup": (lw.w_gate, lw.w_up, True),
                 "down": (lw.w_down, None, False), "head": (self.output, None, True)}
        mats = [lw.wqkv, lw.wo, lw.w_gate, lw.w_up, lw.w_down]
        ok = self.dev.has_dp4a and all(linear_blk.supported(w.fmt, w.i) for w in mats)
        head_ok = self.dev.has_dp4a and linear_blk.supported(self.output.fmt, self.output.i)
        if isinstance(wanted, dict):    # per role (unnamed roles: off)
            bad = sorted(set(wanted) - set(roles))
            if bad:
                raise InvalidArgumentError(f"int8_activations: unknown roles {bad}; the roles are {sorted(roles)}")
            out = {r: bool(wanted.get(r, False)) for r in roles}
            self.int8_chain = all(out[r] for r in ("qkv", "o", "gateup", "down")) and self._chain_possible()
            if (any(v for r, v in out.items() if r != "head") and not ok) or (out["head"] and not head_ok):
                raise UnsupportedModelError(f"int8 activations for {sorted(r for r, v in out.items() if v)} need "
                                            "q4/q8 weights with inputs a multiple of 32 and packed 4x8 integer dot products")
            return out
        if wanted is not None:
            if wanted and not ok:
                raise UnsupportedModelError(
                    "int8 activations need q4/q8 layer weights with inputs a multiple of 32 and WGSL's "
                    f"packed_4x8_integer_dot_product (weights: {sorted({w.fmt for w in mats})}, "
                    f"adapter: {self.dev.has_dp4a})")
            self.int8_chain = bool(wanted) and self._chain_possible()
            return {r: bool(wanted) and (r != "head" or head_ok) for r in roles}
        out = {}
        for r, (w, w2, norm) in roles.items():
            if self.dev.info.is_cpu or not (head_ok if r == "head" else ok):
                out[r] = False
            elif self.autotune and self.dev.can_time_sync:
                fused = r == "o" and AttentionCombineKernel.quant_supported(self.cfg.head_dim)
                out[r] = bool(int8_pays(self.dev, w, w2, pre_norm=norm, quantize_dispatch=not fused)["int8"])
            else:
                out[r] = w.nbytes + (w2.nbytes if w2 else 0) >= 12 << 20
        if self._chain_possible() and out["gateup"]:
            # the biggest GEMV pays: try every layer GEMV int8, each writing the next one's int8
            # row itself (Program.qchain: no per-layer quantize dispatch), if measuring the
            # quantizing epilogues against separate quantize dispatches says so
            links = [(lw.wo, None, lw.w_gate.fmt, True), (lw.w_gate, lw.w_up, lw.w_down.fmt, False),
                     (lw.w_down, None, lw.wqkv.fmt, True)]
            timed = self.autotune and self.dev.can_time_sync
            if not timed or chain_pays(self.dev, links)["chain"]:   # untimed (browser): the chain
                out.update(qkv=True, o=True, down=True)
                self.int8_chain = True
        return out

    # -- loading ---------------------------------------------------------------------------
    def _check_memory(self) -> None:
        from .footprint import binding_limit, check_limits
        plans = check_limits(self.dev, self._src, self.weight_format, self.cap,   # GPULimitError before allocating
                             max_binding=self.max_binding)
        self._shard_plan = {p.label: p.shards for p in plans if p.shards}
        self._limit = binding_limit(self.dev, self.max_binding)
        cfg = self.cfg
        kv = 2 * cfg.n_layers * cfg.kv_dim * self.cap * 4
        per_layer = cfg.kv_dim * self.cap * 4
        if per_layer > self._limit:
            raise GPULimitError(f"the KV cache of one layer needs {per_layer} bytes at max_context={self.cap}; "
                                f"the adapter allows {self._limit} per binding: use a shorter max_context")
        self.kv_bytes = kv

    def _tick(self, name: str, nbytes: int) -> None:
        self._done += 1
        self.weight_bytes += nbytes
        if self._progress:
            self._progress(self._done, self._total, name)

    def _vector(self, name: str) -> Buffer:
        t = self._src.tensors[name]
        n = t.shape[0]
        w = allocate_weight(self.dev, name, "f32", 1, n, "OI")
        if t.type_name not in SOURCE_TYPES:
            raise UnsupportedModelError(f"{name}: tensor type {t.type_name} is not supported for vectors")
        upload_rows(self.dev, w, t.type_name, t.raw(), 1)
        self._tick(name, w.nbytes)
        return w.buffers[0]

    def _f32_buffer(self, values: list[float], label: str) -> Buffer:
        b = self.dev.create_buffer(4 * len(values), label=label)
        self.dev.write_buffer(b, struct.pack(f"<{len(values)}f", *values))
        return b

    def _matrix(self, names: list[str], label: str, peers: tuple = ()) -> GPUWeight:
        """Rows of the named tensors stacked into one runtime weight (Q|K|V fuse this way). The
        stored types of `peers` join the format choice (gate and up share one GEMV: one format)."""
        ts = [self._src.tensors[n] for n in names]
        i = ts[0].shape[1]
        o = sum(t.shape[0] for t in ts)
        for t in ts:
            if t.type_name not in SOURCE_TYPES and not hasattr(t, "to_numpy"):
                raise UnsupportedModelError(f"{t.name}: tensor type {t.type_name} is not supported "
                                            f"(supported: {', '.join(SOURCE_TYPES)})")
        fmt = runtime_format([self._src.tensors[n].type_name for n in names + list(peers)], self.weight_format)
        # float weights: the layout measured fastest for this shape on this adapter (q4 / q8: one)
        w = allocate_weight(self.dev, label, fmt, o, i, choose_layout(self.dev, fmt, o, i, enabled=self.autotune))
        row0 = 0
        for t in ts:
            src_type, raw = t.type_name, None
            if src_type not in SOURCE_TYPES:  # a type only the host reads (desktop only)
                raw, src_type = t.to_numpy().astype("float32").tobytes(), "F32"
            upload_rows(self.dev, w, src_type, raw if raw is not None else t.raw(), t.shape[0], row0)
            row0 += t.shape[0]
        for n in names:
            self._tick(n, 0)
        self.weight_bytes += w.nbytes
        return w

    def _matrix_shards(self, name: str, label: str) -> list[GPUWeight]:
        """The token embedding or LM head: [one weight] as `_matrix` makes it, or, where
        check_limits planned row shards, one weight per row range, each made by `_matrix` (same
        format rule and conversion) from a view of the tensor holding only those rows."""
        ranges = self._shard_plan.get(label)
        if not ranges:
            w = self._matrix([name], label)
            return [w]
        src, t = self._src, self._src.tensors[name]
        data = memoryview(t.raw()).cast("B")
        shards = []
        try:
            for k, (row0, rows) in enumerate(ranges):
                self._src = _RowsSource(src, name, _RowSlice(t, data, row0, rows))
                w = self._matrix([name], f"{label}.{k}")
                self._src = src
                w.row0 = row0
                if w.o != rows or any(b.size > self._limit for b in w.buffers):
                    raise GPULimitError(f"{name}: row shard {k} ({rows} rows, {w.fmt}) needs buffers of "
                                        f"{[b.size for b in w.buffers]} bytes; the limit is {self._limit}")
                if k + 1 < len(ranges):
                    self._done -= 1   # progress counts the tensor once
                shards.append(w)
        finally:
            self._src = src
        return shards

    def _layer(self, i: int) -> LayerWeights:
        cfg, p = self.cfg, f"blk.{i}."
        bqkv = None
        if cfg.qkv_bias:   # the three biases end to end in one f32 buffer (q_dim + 2 kv_dim)
            bqkv = self.dev.create_buffer(4 * (cfg.q_dim + 2 * cfg.kv_dim), label=p + "bqkv")
            off = 0
            for n in ("attn_q", "attn_k", "attn_v"):
                b = self._src.tensors[p + n + ".bias"]
                tmp = allocate_weight(self.dev, b.name, "f32", 1, b.shape[0], "OI")
                upload_rows(self.dev, tmp, b.type_name, b.raw(), 1)
                self.dev.submit([], copies=[(tmp.buffers[0], 0, bqkv, off, 4 * b.shape[0])])
                self.dev.release_buffer(tmp.buffers[0])
                off += 4 * b.shape[0]
        cap, dh, kvh = self.cap_stride, cfg.head_dim, cfg.n_kv_heads
        lw = LayerWeights(
            attn_norm=self._vector(p + "attn_norm.weight"),
            wqkv=self._matrix([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], p + "wqkv"),
            bqkv=bqkv,
            wo=self._matrix([p + "attn_output.weight"], p + "wo"),
            ffn_norm=self._vector(p + "ffn_norm.weight"),
            w_gate=self._matrix([p + "ffn_gate.weight"], p + "w_gate", peers=(p + "ffn_up.weight",)),
            w_up=self._matrix([p + "ffn_up.weight"], p + "w_up", peers=(p + "ffn_gate.weight",)),
            w_down=self._matrix([p + "ffn_down.weight"], p + "w_down"),
            k_cache=self.dev.create_buffer(kvh * cap * dh * 4, STORAGE, p + "k_cache"),
            v_cache=self.dev.create_buffer(kvh * dh * cap * 4, STORAGE, p + "v_cache"),
        )
        if cfg.qk_norm:
            lw.q_norm = self._vector(p + "attn_q_norm.weight")
            lw.k_norm = self._vector(p + "attn_k_norm.weight")
        if cfg.post_norms:
            lw.post_attn_norm = self._vector(p + "post_attention_norm.weight")
            lw.post_ffn_norm = self._vector(p + "post_ffw_norm.weight")
        return lw


class _RowSlice:
    """Rows row0 .. row0+rows of a source tensor as a tensor of their own (same stored type):
    the bytes of whole rows (every stored type keeps a row in whole blocks)."""

    def __init__(self, t, data: memoryview, row0: int, rows: int):
        n = t.shape[0]
        if len(data) % n:
            raise UnsupportedModelError(f"{t.name}: {len(data)} bytes do not split into {n} rows")
        per = len(data) // n
        self.name, self.type_name, self.shape = t.name, t.type_name, (rows,) + tuple(t.shape[1:])
        self._t, self._row0, self._data = t, row0, data[row0 * per:(row0 + rows) * per]

    def raw(self):
        return self._data

    def __getattr__(self, a: str):
        if a == "to_numpy" and hasattr(self._t, "to_numpy"):   # host dequantization (desktop only)
            return lambda: self._t.to_numpy()[self._row0:self._row0 + self.shape[0]]
        raise AttributeError(a)


class _RowsSource:
    """A model source with one tensor replaced (by a _RowSlice); everything else delegated."""

    def __init__(self, src, name: str, view: _RowSlice):
        self._base = src
        self.tensors = dict(src.tensors)
        self.tensors[name] = view

    def __getattr__(self, a: str):
        return getattr(self._base, a)


class Program:
    """One stage's forward pass: a planned graph bound to buffers, as dispatch lists.

    `dispatches(t, head)` returns the prebuilt list for t tokens (workgroup counts padded to a
    bucket so the list changes rarely); head=False leaves out final norm / LM head / sampling.
    """

    def __init__(self, model: GPUModel, stage: str, capacity: int, all_logits: bool, layout: str,
                 step_buf: Buffer, ids_buf: Buffer, out_tokens: Buffer, arena: Buffer | None = None,
                 fuse: bool = True):
        self.model, self.stage, self.capacity, self.all_logits = model, stage, capacity, all_logits
        self.fuse = fuse   # fold each RMSNorm into the linear layer that consumes it
        # decode on q4/q8 layers: int8 activations for the integer-dot GEMV (GPUModel decides)
        self.q8 = {r: stage == "decode" and v for r, v in model.int8_roles.items()}
        self.q8["head"] = self.q8["head"] and not all_logits
        # the int8 chain: each layer's GEMVs write the next GEMV's int8 rows themselves (quantizing
        # epilogues, the combine for the O projection): no quantize dispatch but layer 0's
        self.qchain = model.int8_chain and all(self.q8[r] for r in ("qkv", "o", "gateup", "down"))
        self.step_buf, self.ids_buf, self.out_tokens = step_buf, ids_buf, out_tokens
        self.graph = self._build_graph(layout)
        self.arena_bytes = self.graph.plan(alignment=max(256, int(model.dev.info.limits.get(
            "min-storage-buffer-offset-alignment", 256))))
        self.arena = arena
        self._spare_buf = None
        self._ops = None
        self._cache: dict = {}

    def bind(self, arena: Buffer) -> None:
        self.arena = arena

    # -- graph -----------------------------------------------------------------------------
    def _build_graph(self, layout: str) -> Graph:
        m, cfg = self.model, self.model.cfg
        g = Graph(self.capacity, layout)
        group = cfg.n_heads // cfg.n_kv_heads
        nsplit = ceil_div(m.cap_stride, AttentionKernel.chunk_for(cfg.head_dim))
        g.tensor("x", cfg.dim)
        for i in range(cfg.n_layers):
            g.tensor(f"h{i}", cfg.dim)
            g.tensor(f"qkv{i}", cfg.q_dim + 2 * cfg.kv_dim)
            g.tensor(f"q{i}", cfg.head_dim, T * group, b=cfg.n_kv_heads)
            g.tensor(f"part{i}", nsplit * (cfg.head_dim + 2), T * group, b=cfg.n_kv_heads, layout="linear")
            g.tensor(f"attn{i}", cfg.q_dim)
            g.tensor(f"h2_{i}", cfg.dim)
            g.tensor(f"act{i}", cfg.ffn_dim)
            if cfg.post_norms:
                g.tensor(f"proj{i}", cfg.dim)
                g.tensor(f"ffo{i}", cfg.dim)
        rows = T if self.all_logits else 1
        g.tensor("xl", cfg.dim, rows)
        g.tensor("logits", cfg.vocab_size, rows)
        q8 = self.q8   # int8 activation rows for the integer-dot GEMVs, per role
        for i in range(cfg.n_layers):
            for nm, role, width in (("xqa", "qkv", cfg.dim), ("xqo", "o", cfg.q_dim), ("xqf", "gateup", cfg.dim),
                                    ("xqd", "down", cfg.ffn_dim)):
                if q8[role]:
                    g.tensor(f"{nm}{i}", row_words(width), layout="linear")
        if q8["head"]:
            g.tensor("xql", row_words(cfg.dim), rows, layout="linear")

        fuse = self.fuse
        g.op("embedding", [], ["x"], ("embed",))
        chain = self.qchain
        # the QKV GEMV applies RoPE, the Q relayout and the KV append itself: the integer-dot one,
        # or (decode kernels) the float one where its variant computes rows in subgroups
        rope_fused = not cfg.qk_norm and (q8["qkv"] or (fuse and self._float_rope_ok()))
        for i in range(cfg.n_layers):
            if q8["qkv"] and not (chain and i > 0):    # (in the chain, layer i-1's down wrote xqa{i})
                g.op(f"L{i}.norm+quant", ["x"], [f"xqa{i}"], ("quant", i, "attn"))
            if rope_fused and q8["qkv"]:
                g.op(f"L{i}.qkv+rope_kv", [f"xqa{i}"], [f"q{i}"], ("qkv", i))
            elif q8["qkv"]:
                g.op(f"L{i}.qkv", [f"xqa{i}"], [f"qkv{i}"], ("qkv", i))
            elif rope_fused:
                g.op(f"L{i}.norm+qkv+rope_kv", ["x"], [f"q{i}"], ("qkv", i))
            elif fuse:
                g.op(f"L{i}.norm+qkv", ["x"], [f"qkv{i}"], ("qkv", i))
            else:
                g.op(f"L{i}.attn_norm", ["x"], [f"h{i}"], ("norm", i, "attn"))
                g.op(f"L{i}.qkv", [f"h{i}"], [f"qkv{i}"], ("qkv", i))
            if not rope_fused:
                g.op(f"L{i}.rope_kv", [f"qkv{i}"], [f"q{i}"], ("rope", i))
            g.op(f"L{i}.attention", [f"q{i}"], [f"part{i}"], ("attn", i))
            o_in = f"attn{i}"
            if q8["o"] and AttentionCombineKernel.quant_supported(cfg.head_dim):   # combine writes int8
                o_in = f"xqo{i}"
                g.op(f"L{i}.attn_combine+quant", [f"part{i}"], [o_in], ("combine", i))
            else:
                g.op(f"L{i}.attn_combine", [f"part{i}"], [o_in], ("combine", i))
            if q8["o"] and o_in == f"attn{i}":
                g.op(f"L{i}.quant_o", [f"attn{i}"], [f"xqo{i}"], ("quant", i, "o"))
                o_in = f"xqo{i}"
            if cfg.post_norms:
                g.op(f"L{i}.o_proj", [o_in], [f"proj{i}"], ("oproj", i))
                g.op(f"L{i}.post_attn_norm", [f"proj{i}"], ["x"], ("postnorm", i, "attn"))
            elif chain:
                g.op(f"L{i}.o_proj+residual+quant", [o_in, "x"], ["x", f"xqf{i}"], ("oproj", i))
            else:
                g.op(f"L{i}.o_proj+residual", [o_in, "x"], ["x"], ("oproj", i))
            if chain:
                g.op(f"L{i}.gate_up+act+quant", [f"xqf{i}"], [f"xqd{i}"], ("gateup", i))
            elif q8["gateup"]:
                g.op(f"L{i}.norm+quant_ffn", ["x"], [f"xqf{i}"], ("quant", i, "ffn"))
                g.op(f"L{i}.gate_up+act", [f"xqf{i}"], [f"act{i}"], ("gateup", i))
            elif fuse:
                g.op(f"L{i}.norm+gate_up+act", ["x"], [f"act{i}"], ("gateup", i))
            else:
                g.op(f"L{i}.ffn_norm", ["x"], [f"h2_{i}"], ("norm", i, "ffn"))
                g.op(f"L{i}.gate_up+act", [f"h2_{i}"], [f"act{i}"], ("gateup", i))
            d_in = f"act{i}"
            if chain:
                d_in = f"xqd{i}"
            elif q8["down"]:
                g.op(f"L{i}.quant_down", [f"act{i}"], [f"xqd{i}"], ("quant", i, "down"))
                d_in = f"xqd{i}"
            if cfg.post_norms:
                g.op(f"L{i}.down", [d_in], [f"ffo{i}"], ("down", i))
                g.op(f"L{i}.post_ffn_norm", [f"ffo{i}"], ["x"], ("postnorm", i, "ffn"))
            elif chain and i + 1 < cfg.n_layers:
                g.op(f"L{i}.down+residual+quant", [d_in, "x"], ["x", f"xqa{i + 1}"], ("down", i))
            else:
                g.op(f"L{i}.down+residual", [d_in, "x"], ["x"], ("down", i))
        if q8["head"]:
            g.op("norm+quant_head", ["x"], ["xql"], ("quant", None, "head"))
            g.op("lm_head", ["xql"], ["logits"], ("lm_head",))
        elif fuse and self.stage != "decode":   # decode: a separate norm (the LM head has many workgroups)
            g.op("norm+lm_head", ["x"], ["logits"], ("lm_head",))
        else:
            g.op("output_norm", ["x"], ["xl"], ("final_norm",))
            g.op("lm_head", ["xl"], ["logits"], ("lm_head",))
        if not self.all_logits:
            g.tensor("amax", 2 * ceil_div(cfg.vocab_size, 4096), 1, layout="linear")
            g.op("argmax", ["logits"], ["amax"], ("argmax",))
            g.op("sample", ["logits", "amax"], [], ("sample",))
        return g

    def _spare(self) -> Buffer:
        """A small storage buffer for bindings a kernel never touches (the y of a GEMV whose
        epilogue writes elsewhere)."""
        if self._spare_buf is None:
            self._spare_buf = self.model.dev.create_buffer(256, STORAGE, "spare")
        return self._spare_buf

    def _float_rope_ok(self) -> bool:
        """Whether the float QKV GEMV of this program can take the RoPE epilogue: decode kernels
        whose chosen variant computes rows in subgroups (pairs of rotation partners per subgroup)."""
        m = self.model
        if self.stage != "decode":
            return False
        c = choose_gemv(m.dev, m.layers[0].wqkv, enabled=m.autotune)
        return c.variant in ("subgroup", "wide") and c.rows % 2 == 0

    # -- kernels and bind groups (built once) ------------------------------------------------
    def _arena(self, name: str):
        t = self.graph.tensors[name]
        return (self.arena, t.offset, t.desc.nbytes)

    def _build_ops(self) -> list:
        m, cfg, dev, g = self.model, self.model.cfg, self.model.dev, self.graph
        D = g.desc
        a = self._arena
        stage = "decode" if self.stage == "decode" else "prefill"
        group = cfg.n_heads // cfg.n_kv_heads
        rows_cap = self.capacity * group
        nsplit = ceil_div(m.cap_stride, AttentionKernel.chunk_for(cfg.head_dim))
        scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim ** -0.5
        # device specialisation: decode GEMVs use the variant measured fastest on this adapter
        def qout_for(w, w2=None):
            return choose_qout(dev, w, w2, enabled=m.autotune)

        def chained(produced_by_gemv: bool):   # partial sums of x^2 in a row made by a quantizing epilogue
            return cfg.dim // 32 if self.qchain and produced_by_gemv else None

        def mv_for(w, w2=None, int8=False):
            return choose_gemv(dev, w, w2, enabled=m.autotune, int8=int8) if stage == "decode" else GemvVariant()

        def residual_proj(node, w, post_out: str, next_gemv: tuple | None):
            """O projection or down: + residual into x (Gemma: into post_out); in the int8 chain
            also the int8 row of the next GEMV, next_gemv = (its weight format, its norm weight)."""
            out = post_out if cfg.post_norms else "x"
            src = node.reads[0]
            binds = {"step": self.step_buf, "x": a(src), "y": a(out), "w": w.buffers}
            if len(node.writes) == 2:
                q = node.writes[1]
                fmt, norm = next_gemv
                k = LinearKernel(dev, stage, D(src), D(out), w, variant=qout_for(w),
                                 epilogue=Epilogue(residual=True, qout=QuantOut(D(q), fmt, cfg.norm_weight_offset, True)))
                return k, binds | {"qout": a(q), "qnw": norm}
            k = LinearKernel(dev, stage, D(src), D(out), w, variant=mv_for(w, int8=src.startswith("xq")),
                             epilogue=Epilogue(residual=not cfg.post_norms))
            return k, binds
        quant_src = {"attn": lambda i: ("x", f"xqa{i}", m.layers[i].wqkv, m.layers[i].attn_norm),
                     "o": lambda i: (f"attn{i}", f"xqo{i}", m.layers[i].wo, None),
                     "ffn": lambda i: ("x", f"xqf{i}", m.layers[i].w_gate, m.layers[i].ffn_norm),
                     "down": lambda i: (f"act{i}", f"xqd{i}", m.layers[i].w_down, None),
                     "head": lambda i: ("x", "xql", m.output, m.output_norm)}
        ops = []
        for node in g.ops:
            kind = node.build[0]
            multi = None   # [(kernel, bindings)]: one dispatch per row shard (embedding, LM head)
            head = node.label in ("output_norm", "lm_head", "norm+lm_head", "norm+quant_head", "argmax", "sample")
            nrm = PreNorm(cfg.norm_eps, cfg.norm_weight_offset)
            if kind == "embed":   # one dispatch per row shard, each writing the tokens in its rows
                shards = m.tok_embd_shards
                multi = [(EmbeddingKernel(dev, w, D("x"), cfg.embed_scale, shard=len(shards) > 1),
                          {"step": self.step_buf, "ids": self.ids_buf, "w": w.buffers, "out": a("x")}) for w in shards]
            elif kind == "norm":
                i, which = node.build[1], node.build[2]
                lw = m.layers[i]
                out = f"h{i}" if which == "attn" else f"h2_{i}"
                k = RMSNormKernel(dev, D("x"), D(out), cfg.norm_eps, cfg.norm_weight_offset)
                binds = {"step": self.step_buf, "x": a("x"), "out": a(out),
                         "w": lw.attn_norm if which == "attn" else lw.ffn_norm}
            elif kind == "postnorm":
                i, which = node.build[1], node.build[2]
                lw = m.layers[i]
                src = f"proj{i}" if which == "attn" else f"ffo{i}"
                k = RMSNormKernel(dev, D(src), D("x"), cfg.norm_eps, cfg.norm_weight_offset, accumulate=True)
                binds = {"step": self.step_buf, "x": a(src), "out": a("x"),
                         "w": lw.post_attn_norm if which == "attn" else lw.post_ffn_norm}
            elif kind == "quant":
                src, dst, w, nw = quant_src[node.build[2]](node.build[1])
                k = QuantizeKernel(dev, D(src), D(dst), w.fmt, pre_norm=nrm if nw is not None else None,
                                   last_row=dst == "xql" and not self.all_logits)
                binds = {"step": self.step_buf, "x": a(src), "xq": a(dst)} | ({"nw": nw} if nw is not None else {})
            elif kind == "qkv":
                i = node.build[1]
                lw = m.layers[i]
                src = node.reads[0]
                normed = src in ("x", f"xqa{i}")
                bias = {"bias": lw.bqkv} if lw.bqkv else {}
                if node.writes[0] == f"q{i}":   # RoPE, the Q relayout and the KV append in the epilogue
                    rope = RopeOut(D(f"q{i}"), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, m.cap_stride,
                                   rope_half=cfg.rope_style == "half")
                    int8 = src.startswith("xq")
                    mv = mv_for(lw.wqkv, int8=int8)
                    if not int8:   # the float GEMV's subgroups compute pairs of rows: give it twice the
                        mv = replace(mv, rows=2 * mv.rows)   # chosen rows, or half its subgroups idle
                    k = LinearKernel(dev, stage, D(src), D(f"qkv{i}"), lw.wqkv, variant=mv,
                                     pre_norm=replace(nrm, x_partials=chained(i > 0) if int8 else None),
                                     epilogue=Epilogue(bias=lw.bqkv is not None, rope=rope))
                    freq = m.inv_freq_local if cfg.layer_is_sliding(i) else m.inv_freq
                    # y is never written: a spare buffer (no arena range that could alias x or q)
                    binds = ({"step": self.step_buf, "x": a(src), "y": self._spare(), "w": lw.wqkv.buffers} | bias
                             | ({} if int8 else {"nw": lw.attn_norm})
                             | {"q": a(f"q{i}"), "kc": lw.k_cache, "vc": lw.v_cache, "inv_freq": freq})
                else:
                    k = LinearKernel(dev, stage, D(src), D(f"qkv{i}"), lw.wqkv,
                                     variant=mv_for(lw.wqkv, int8=src.startswith("xq")),
                                     pre_norm=replace(nrm, x_partials=chained(i > 0)) if normed else None,
                                     epilogue=Epilogue(bias=lw.bqkv is not None))
                    binds = {"step": self.step_buf, "x": a(src), "y": a(f"qkv{i}"), "w": lw.wqkv.buffers} | bias
                    binds |= {"nw": lw.attn_norm} if src == "x" else {}
            elif kind == "rope":
                i = node.build[1]
                lw = m.layers[i]
                k = RopeQKVKernel(dev, D(f"qkv{i}"), D(f"q{i}"), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, m.cap_stride,
                                  rope_half=cfg.rope_style == "half", qk_norm=cfg.qk_norm, eps=cfg.norm_eps,
                                  w_offset=cfg.norm_weight_offset)
                freq = m.inv_freq_local if cfg.layer_is_sliding(i) else m.inv_freq
                binds = {"step": self.step_buf, "qkv": a(f"qkv{i}"), "q": a(f"q{i}"), "kc": lw.k_cache,
                         "vc": lw.v_cache, "inv_freq": freq}
                if cfg.qk_norm:
                    binds |= {"qn": lw.q_norm, "kn": lw.k_norm}
            elif kind == "attn":
                i = node.build[1]
                lw = m.layers[i]
                window = cfg.sliding_window if cfg.layer_is_sliding(i) else 0
                grouped = stage == "decode" and choose_attention(
                    dev, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, m.cap_stride, lw.k_cache, lw.v_cache, window,
                    enabled=m.autotune)
                k = AttentionKernel(dev, D(f"q{i}"), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, m.cap_stride, rows_cap,
                                    scale, window=window, grouped=grouped)
                binds = {"step": self.step_buf, "q": a(f"q{i}"), "kc": lw.k_cache, "vc": lw.v_cache, "part": a(f"part{i}")}
            elif kind == "combine":
                i = node.build[1]
                dst = node.writes[0]
                k = AttentionCombineKernel(dev, D(dst), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, nsplit, rows_cap,
                                           quant=m.layers[i].wo.fmt if dst.startswith("xq") else None)
                binds = {"step": self.step_buf, "part": a(f"part{i}"), "out": a(dst)}
            elif kind == "oproj":
                lw = m.layers[node.build[1]]
                k, binds = residual_proj(node, lw.wo, f"proj{node.build[1]}", (lw.w_gate.fmt, lw.ffn_norm))
            elif kind == "gateup":
                i = node.build[1]
                lw = m.layers[i]
                src = node.reads[0]
                normed = src in ("x", f"xqf{i}")
                if node.writes[0].startswith("xq"):   # int8 chain: writes only the down GEMV's input row
                    q = node.writes[0]
                    k = LinearKernel(dev, stage, D(src), D(f"act{i}"), lw.w_gate, lw.w_up,
                                     variant=qout_for(lw.w_gate, lw.w_up), pre_norm=replace(nrm, x_partials=chained(True)),
                                     epilogue=Epilogue(act=cfg.act, qout=QuantOut(D(q), lw.w_down.fmt, None, False)))
                    # y is never written (QSKIP_Y): any arena range satisfies the binding
                    binds = {"step": self.step_buf, "x": a(src), "y": a("x"), "w": lw.w_gate.buffers,
                             "w2": lw.w_up.buffers, "qout": a(q)}
                else:
                    k = LinearKernel(dev, stage, D(src), D(f"act{i}"), lw.w_gate, lw.w_up,
                                     variant=mv_for(lw.w_gate, lw.w_up, int8=src.startswith("xq")),
                                     pre_norm=nrm if normed else None, epilogue=Epilogue(act=cfg.act))
                    binds = {"step": self.step_buf, "x": a(src), "y": a(f"act{i}"), "w": lw.w_gate.buffers,
                             "w2": lw.w_up.buffers}
                    binds |= {"nw": lw.ffn_norm} if src == "x" else {}
            elif kind == "down":
                i = node.build[1]
                nxt = m.layers[i + 1] if len(node.writes) == 2 else None
                k, binds = residual_proj(node, m.layers[i].w_down, f"ffo{i}",
                                         (nxt.wqkv.fmt, nxt.attn_norm) if nxt else None)
            elif kind == "final_norm":
                k = RMSNormKernel(dev, D("x"), D("xl"), cfg.norm_eps, cfg.norm_weight_offset,
                                  last_row=not self.all_logits)
                binds = {"step": self.step_buf, "x": a("x"), "out": a("xl"), "w": m.output_norm}
            elif kind == "lm_head":   # one dispatch per row shard, each writing its columns of logits
                lm_stage = "decode" if not self.all_logits else stage
                src = node.reads[0]     # x (norm fused in), xl (normalised) or xql (quantized)
                last = src in ("x", "xql") and not self.all_logits
                multi = []
                for w in m.output_shards:
                    lm = (choose_gemv(dev, w, enabled=m.autotune, int8=src == "xql")
                          if lm_stage == "decode" else GemvVariant())
                    if lm.rows * dev.max_workgroups < w.o:
                        lm = replace(lm, rows=ceil_div(w.o, dev.max_workgroups))
                    y = D("logits") if len(m.output_shards) == 1 else D("logits").columns(w.row0, w.o)
                    k = LinearKernel(dev, lm_stage, D(src), y, w, variant=lm,
                                     pre_norm=nrm if src in ("x", "xql") else None,
                                     epilogue=Epilogue(softcap=cfg.final_logit_softcap), x_last_row=last)
                    multi.append((k, {"step": self.step_buf, "x": a(src), "y": a("logits"), "w": w.buffers}
                                  | ({"nw": m.output_norm} if src == "x" else {})))
            elif kind == "argmax":
                k = ArgmaxKernel(dev, D("logits"), cfg.vocab_size, row="0u")
                binds = {"step": self.step_buf, "logits": a("logits"), "part": a("amax")}
            elif kind == "sample":
                k = SampleKernel(dev, D("logits"), cfg.vocab_size, row="0u", partials=ceil_div(cfg.vocab_size, 4096))
                binds = {"step": self.step_buf, "logits": a("logits"), "out_tokens": self.out_tokens, "ids": self.ids_buf,
                         "part": a("amax")}
            else:  # pragma: no cover
                raise AssertionError(kind)
            for kern, bb in multi or [(k, binds)]:
                ops.append((node.label, kern, kern.bind(dev, bb), head))
        return ops

    def dispatches(self, t: int, head: bool = True) -> list[Dispatch]:
        """The dispatch list for t tokens (t <= capacity); cached per (bucket, head)."""
        bucket = t if self.stage == "decode" else min(self.capacity, ceil_div(t, 64) * 64)
        key = (bucket, head)
        lst = self._cache.get(key)
        if lst is None:
            if self._ops is None:
                self._ops = self._build_ops()
            lst = []
            for label, k, bg, is_head in self._ops:
                if is_head and not head:
                    continue
                rows = 1 if (is_head and not self.all_logits) else bucket
                wg = k.workgroups(rows)
                lst.append(Dispatch(k.pipeline, bg, wg, label))
            self._cache[key] = lst
        return lst
