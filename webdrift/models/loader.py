"""GPUModel: one model's runtime weights and KV cache on one device.

The file says what the model is; the runtime buffers say what the kernels want (gpt-fast's load
hook): the loader walks models/manifest.py's inventory and turns each entry into a GPU weight
through kernels/convert.py (Q, K and V stacked into one `wqkv` so a layer reads its input once;
every stored type converted on the GPU into the runtime format; float weights in the layout
measured fastest for their shape), holds a token embedding / LM head larger than one storage
binding as row shards (footprint.row_shards), and allocates the KV cache once for the maximum
context. What the forward pass runs on these weights is decided in models/choices.py.
Must not: import numpy or wgpu (runs in Pyodide); read a tensor's bytes more than once.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ..errors import GPULimitError, UnsupportedModelError
from ..gpu.base import STORAGE, Buffer, Device
from ..kernels.autotune import GEMM_TUNE_ROWS, choose_layout
from ..kernels.convert import SOURCE_TYPES, allocate_weight, upload_rows
from ..kernels.rope import kv_bytes, kv_type
from ..kernels.weights import GPUWeight
from .choices import Int8Choice, choose_int8, choose_prefill_int8
from .footprint import binding_limit, check_limits
from .manifest import LayerManifest, Matrix, kv_cache_bytes, model_manifest


def rope_inv_freq(cfg, theta: float) -> list[float]:
    """inv_freq[i] = theta^(-2i/d), with HF's llama3 / linear rope_scaling applied."""
    d = cfg.head_dim
    inv = [1.0 / (theta ** (2 * i / d)) for i in range(d // 2)]
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type") or rs.get("type")
    if kind == "linear":
        inv = [f / float(rs["factor"]) for f in inv]
    elif kind == "llama3":
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


@dataclass
class LayerWeights:
    attn_norm: Buffer           # (dim) f32
    wqkv: GPUWeight             # (q_dim + 2 kv_dim, dim): rows [q | k | v]
    bqkv: Buffer | None         # (q_dim + 2 kv_dim) f32, Qwen2
    wo: GPUWeight               # (dim, q_dim)
    ffn_norm: Buffer            # (dim) f32
    w_gate: GPUWeight           # (ffn_dim, dim)
    w_up: GPUWeight             # (ffn_dim, dim), the same format as w_gate
    w_down: GPUWeight           # (dim, ffn_dim)
    k_cache: Buffer             # (KVH, CAP, DH) f32, or f16 (GPUModel.kv_f16)
    v_cache: Buffer             # (KVH, DH, CAP)
    q_norm: Buffer | None = None          # (head_dim) Gemma 3
    k_norm: Buffer | None = None
    post_attn_norm: Buffer | None = None  # (dim) Gemma 3
    post_ffn_norm: Buffer | None = None


class GPUModel:
    """Runtime weights + KV cache of one model on one device."""

    def __init__(self, dev: Device, source, max_context: int, weight_format: str | None = None,
                 progress=None, autotune: bool = True, int8_activations: bool | dict | None = None,
                 prefill_int8: bool | None = None,
                 max_binding_bytes: int | None = None, prefill_rows: int = GEMM_TUNE_ROWS,
                 kv_cache: str | None = None):
        """max_binding_bytes: hold no weight buffer larger than this (below the adapter's limits):
        the token embedding / LM head split into row shards at this size, other weights must fit.
        prefill_rows: the prefill chunk (the rows the int8-or-float GEMM choice is timed over).
        kv_cache: the caches' values, "f16" (half the memory, and of what decode attention reads;
        llama.cpp's default) or "f32"; None: f16 where the adapter has shader-f16."""
        self.dev, self.cfg, self.cap = dev, source.config, max_context
        self.cap_stride = (max_context + 3) // 4 * 4   # KV cache rows per head (attention reads V as vec4)
        cfg = self.cfg
        if cfg.n_heads % cfg.n_kv_heads:
            raise UnsupportedModelError(f"{source.path}: {cfg.n_heads} heads is not a multiple of {cfg.n_kv_heads} KV heads")
        if cfg.head_dim % 4 or cfg.head_dim > 256:
            raise UnsupportedModelError(f"{source.path}: head_dim {cfg.head_dim} is not supported "
                                        "(a multiple of 4, at most 256)")
        self.weight_format = weight_format
        self.autotune = autotune
        self._tensors = source.tensors
        self._progress = progress
        self._done = 0
        self._total = len(source.tensors)
        self.weight_bytes = 0
        # GPULimitError before allocating anything; row shards planned for the embedding / LM head
        plans = check_limits(dev, source, weight_format, max_context, max_binding=max_binding_bytes)
        self._shard_plan = {p.label: p.shards for p in plans if p.shards}
        self._limit = binding_limit(dev, max_binding_bytes)
        # "f16" / "f32" (kv_type refuses f16 without shader-f16; the value itself: EngineOptions checks it)
        self.kv_cache = kv_type(dev, kv_cache == "f16" or (kv_cache is None and dev.has_f16))
        self.kv_bytes = kv_cache_bytes(cfg, max_context, value_bytes=kv_bytes(self.kv_f16))
        man = model_manifest(cfg, source.tensors)
        # tok_embd / output: the first shard (its format and shape); one shard when it fits
        self.tok_embd_shards = self._matrix_shards(man.tok_embd)
        self.tok_embd = self.tok_embd_shards[0]
        self.layers = [self._layer(lm) for lm in man.layers]
        self.output_norm = self._vector(man.output_norm)
        self.output_shards = self.tok_embd_shards if man.output is None else self._matrix_shards(man.output)
        self.output = self.output_shards[0]
        self.inv_freq = self._f32_buffer(rope_inv_freq(cfg, cfg.rope_theta), "inv_freq")
        self.inv_freq_local = (self._f32_buffer(rope_inv_freq(cfg, cfg.rope_local_theta), "inv_freq_local")
                               if cfg.rope_local_theta else self.inv_freq)
        self._tensors = None
        self.int8_choice: Int8Choice = choose_int8(self, int8_activations)
        # decode attention kernels chosen on whole decode steps, by window (runtime/engine.py)
        self.attn_steps: dict = {}
        # the layers' prefill GEMMs on int8 rows, by role (choices.choose_prefill_int8)
        self.prefill_int8_roles: dict = choose_prefill_int8(self, prefill_int8, prefill_rows)

    @property
    def kv_f16(self) -> bool:
        """Whether the KV caches hold f16 (self.kv_cache == "f16")."""
        return self.kv_cache == "f16"

    @property
    def prefill_int8(self) -> bool:
        """Whether any layer's prefill GEMM reads int8 rows."""
        return any(self.prefill_int8_roles.values())

    @property
    def int8_roles(self) -> dict:
        """Which decode GEMVs take int8 activations, by role (qkv, o, gateup, down, head)."""
        return self.int8_choice.roles

    @property
    def int8_chain(self) -> bool:
        return self.int8_choice.chain

    @property
    def int8(self) -> bool:
        """Whether any decode GEMV takes int8 activations."""
        return any(self.int8_choice.roles.values())

    # -- loading ---------------------------------------------------------------------------
    def _tick(self, name: str, nbytes: int) -> None:
        self._done += 1
        self.weight_bytes += nbytes
        if self._progress:
            self._progress(self._done, self._total, name)

    def _vector(self, name: str) -> Buffer:
        t = self._tensors[name]
        if t.type_name not in SOURCE_TYPES:
            raise UnsupportedModelError(f"{name}: tensor type {t.type_name} is not supported for vectors")
        w = allocate_weight(self.dev, name, "f32", 1, t.shape[0], "OI")
        upload_rows(self.dev, w, t.type_name, t.raw(), 1)
        self._tick(name, w.nbytes)
        return w.buffers[0]

    def _biases(self, names: tuple[str, ...], label: str) -> Buffer:
        """Vectors end to end in one f32 buffer (Qwen2's Q, K and V biases)."""
        ts = [self._tensors[n] for n in names]
        buf = self.dev.create_buffer(4 * sum(t.shape[0] for t in ts), label=label)
        off = 0
        for t in ts:
            tmp = allocate_weight(self.dev, t.name, "f32", 1, t.shape[0], "OI")
            upload_rows(self.dev, tmp, t.type_name, t.raw(), 1)
            self.dev.submit([], copies=[(tmp.buffers[0], 0, buf, off, 4 * t.shape[0])])
            self.dev.release_buffer(tmp.buffers[0])
            off += 4 * t.shape[0]
        return buf

    def _f32_buffer(self, values: list[float], label: str) -> Buffer:
        b = self.dev.create_buffer(4 * len(values), label=label)
        self.dev.write_buffer(b, struct.pack(f"<{len(values)}f", *values))
        return b

    def _upload(self, m: Matrix, tensors: list, label: str) -> GPUWeight:
        """`tensors` (the entry's file tensors, or a row slice of one) stacked as rows into one
        runtime weight of the entry's format."""
        for t in tensors:
            if t.type_name not in SOURCE_TYPES and not hasattr(t, "to_numpy"):
                raise UnsupportedModelError(f"{t.name}: tensor type {t.type_name} is not supported "
                                            f"(supported: {', '.join(SOURCE_TYPES)})")
        i, o = tensors[0].shape[1], sum(t.shape[0] for t in tensors)
        fmt = m.format(self._tensors, self.weight_format)
        # float weights: the layout measured fastest for this shape on this adapter (q4 / q8: one)
        w = allocate_weight(self.dev, label, fmt, o, i, choose_layout(self.dev, fmt, o, i, enabled=self.autotune))
        row0 = 0
        for t in tensors:
            if t.type_name in SOURCE_TYPES:
                upload_rows(self.dev, w, t.type_name, t.raw(), t.shape[0], row0)
            else:   # a type only the host reads (desktop only): dequantized to F32 on the host
                upload_rows(self.dev, w, "F32", t.to_numpy().astype("float32").tobytes(), t.shape[0], row0)
            row0 += t.shape[0]
        self.weight_bytes += w.nbytes
        return w

    def _matrix(self, m: Matrix) -> GPUWeight:
        w = self._upload(m, [self._tensors[n] for n in m.names], m.label)
        for n in m.names:
            self._tick(n, 0)
        return w

    def _matrix_shards(self, m: Matrix) -> list[GPUWeight]:
        """The token embedding or LM head: [one weight], or, where check_limits planned row
        shards, one weight per row range, each converted from a view of the tensor's rows."""
        ranges = self._shard_plan.get(m.label)
        if not ranges:
            return [self._matrix(m)]
        (name,) = m.names
        t = self._tensors[name]
        data = memoryview(t.raw()).cast("B")
        shards = []
        for k, (row0, rows) in enumerate(ranges):
            w = self._upload(m, [RowSlice(t, data, row0, rows)], f"{m.label}.{k}")
            w.row0 = row0
            if w.o != rows or any(b.size > self._limit for b in w.buffers):
                raise GPULimitError(f"{name}: row shard {k} ({rows} rows, {w.fmt}) needs buffers of "
                                    f"{[b.size for b in w.buffers]} bytes; the limit is {self._limit}")
            shards.append(w)
        self._tick(name, 0)   # progress counts the tensor once
        return shards

    def _layer(self, lm: LayerManifest) -> LayerWeights:
        cfg, p = self.cfg, f"blk.{lm.index}."
        cap, dh, kvh = self.cap_stride, cfg.head_dim, cfg.n_kv_heads
        opt = {n: self._vector(n) if n else None for n in (lm.q_norm, lm.k_norm, lm.post_attn_norm, lm.post_ffn_norm)}
        return LayerWeights(
            bqkv=self._biases(lm.bqkv, p + "bqkv") if lm.bqkv else None,
            attn_norm=self._vector(lm.attn_norm),
            wqkv=self._matrix(lm.wqkv),
            wo=self._matrix(lm.wo),
            ffn_norm=self._vector(lm.ffn_norm),
            w_gate=self._matrix(lm.w_gate),
            w_up=self._matrix(lm.w_up),
            w_down=self._matrix(lm.w_down),
            k_cache=self.dev.create_buffer(kvh * cap * dh * kv_bytes(self.kv_f16), STORAGE, p + "k_cache"),
            v_cache=self.dev.create_buffer(kvh * dh * cap * kv_bytes(self.kv_f16), STORAGE, p + "v_cache"),
            q_norm=opt[lm.q_norm], k_norm=opt[lm.k_norm],
            post_attn_norm=opt[lm.post_attn_norm], post_ffn_norm=opt[lm.post_ffn_norm])


class RowSlice:
    """Rows row0 .. row0+rows of a file tensor as a tensor of their own (same stored type): the
    bytes of whole rows (every stored type keeps a row in whole blocks)."""

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
