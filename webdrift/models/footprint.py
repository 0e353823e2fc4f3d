"""What a model needs from a device, computed from its ModelSource before anything is allocated.

`plan_weights` lists the runtime GPU buffers the loader will create (the same inventory and
format policy: models/manifest.py) without reading any tensor data; `check_limits` turns a buffer or binding that the adapter cannot hold into one
GPULimitError that names the tensor, its size, the limit and what to try, instead of a failure
deep in the load; `decode_read_bytes` is the roofline's numerator: the bytes one decode step
must read (every weight the step touches, once, plus the KV cache up to the current position).
webdrift binds each layer weight as one buffer: a layer weight larger than
max-storage-buffer-binding-size (or max-buffer-size) is refused here. The token embedding and
the LM head (tied or not) are the exception: when one buffer would exceed the limit they are held
as row shards (`row_shards`: whole rows per shard, every shard's buffers within the limit; the
embedding and LM head kernels run once per shard), as Gemma 3's 262144-row vocabulary needs on
adapters with 128 MiB bindings.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import GPULimitError, InvalidArgumentError, UnsupportedModelError
from ..kernels.weights import NATIVE_SOURCE, buffer_sizes
from ..tensor.weight_layout import WeightLayout
from ..weights.config import ModelConfig
from .manifest import Matrix, kv_cache_bytes, model_manifest


@dataclass
class WeightPlan:
    label: str              # runtime weight, e.g. "blk.3.wqkv"
    fmt: str                # runtime format: f32 | f16 | q8 | q4
    o: int
    i: int
    buffers: list[int]      # bytes of each runtime buffer (binding)
    staging: int            # bytes of the largest stored source tensor (uploaded in row chunks)
    per_token: bool = True  # read in full by every decode step (False: the untied embedding table)
    shards: list = field(default_factory=list)   # [(row0, rows)] when held as row shards (check_limits)

    @property
    def nbytes(self) -> int:
        return sum(self.buffers)


def _stored_bytes(t) -> int:
    from ..weights.gguf import tensor_nbytes
    try:
        return tensor_nbytes(t.type_name, list(t.shape))
    except InvalidArgumentError:   # a type only the host reads: dequantized to F32 before the upload
        n = 1
        for d in t.shape:
            n *= d
        return 4 * n


def _sizes(fmt: str, o: int, i: int) -> list[int]:
    lay = WeightLayout.named("OI", o, i) if fmt in ("f32", "f16") else None
    return buffer_sizes(fmt, o, i, lay)


def _fits(sizes: list[int], limit: int) -> bool:
    return all((n + 15) // 16 * 16 <= limit for n in sizes)   # buffers are allocated in 16-byte steps


def row_shards(fmt: str, o: int, i: int, limit: int) -> list[tuple[int, int]] | None:
    """Row ranges [(row0, rows), ...] splitting an (o x i) weight of format fmt so that every
    buffer of every shard fits in `limit` bytes: [(0, o)] when the whole weight fits; shards of
    the most rows that fit (a multiple of 64, or of 4 when fewer than 64 fit), the last one
    smaller; None when not even 4 rows fit."""
    if _fits(_sizes(fmt, o, i), limit):
        return [(0, o)]
    lo, hi = 0, o          # the most rows that fit: _sizes grows with the row count
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(_sizes(fmt, mid, i), limit):
            lo = mid
        else:
            hi = mid - 1
    n = lo // 64 * 64 if lo >= 64 else lo // 4 * 4
    if n < 4:
        return None
    return [(r, min(n, o - r)) for r in range(0, o, n)]


def plan_weights(source, weight_format: str | None = None) -> list[WeightPlan]:
    """The runtime buffers the loader will allocate for source's matrices and vectors
    (models/manifest.py's inventory, in its load order)."""
    cfg: ModelConfig = source.config
    ts = source.tensors
    man = model_manifest(cfg, ts)

    def matrix(m: Matrix) -> WeightPlan:
        group = [ts[n] for n in m.names]
        o, i = sum(t.shape[0] for t in group), group[0].shape[1]
        fmt = m.format(ts, weight_format)
        types = sorted({t.type_name for t in group})
        if fmt in NATIVE_SOURCE and types != [NATIVE_SOURCE[fmt][0]]:
            raise UnsupportedModelError(f"{m.label}: {fmt} holds {NATIVE_SOURCE[fmt][0]} super-blocks; "
                                        f"its tensors are {', '.join(types)} (weight_format='exact' picks per tensor)")
        try:
            sizes = _sizes(fmt, o, i)
        except UnsupportedModelError as e:
            raise UnsupportedModelError(f"{m.label} ({o} x {i}): {e}") from None
        return WeightPlan(m.label, fmt, o, i, sizes, max(_stored_bytes(t) for t in group), m.per_token)

    def vector(name: str, n: int | None = None, staging: int | None = None) -> WeightPlan:
        t = ts[name]
        n = n or t.shape[0]
        return WeightPlan(name, "f32", 1, n, _sizes("f32", 1, n), staging or _stored_bytes(t))

    plans = [matrix(man.tok_embd)]
    for lm in man.layers:
        plans += [vector(v) for v in lm.vectors] + [matrix(m) for m in lm.matrices]
        if lm.bqkv:
            plans.append(vector(lm.bqkv[0], sum(ts[b].shape[0] for b in lm.bqkv),
                                max(_stored_bytes(ts[b]) for b in lm.bqkv)))
    plans.append(vector(man.output_norm))
    if man.output is not None:
        plans.append(matrix(man.output))
    return plans


def decode_read_bytes(cfg: ModelConfig, plans: list[WeightPlan], kv_len: float, kv_value_bytes: int = 4) -> float:
    """Bytes one decode step reads at cache length kv_len: each per-token weight once (an untied
    embedding table only one row; a norm vector its n floats, not its padded buffer) plus K and V
    of kv_len positions in every layer (values of kv_value_bytes: 4 f32, 2 f16)."""
    w = sum(4 * p.i if p.o == 1 else p.nbytes if p.per_token else p.nbytes / p.o for p in plans)
    return w + kv_cache_bytes(cfg, kv_len, value_bytes=kv_value_bytes)


def binding_limit(dev, max_binding: int | None = None) -> int:
    """The bytes one weight buffer may have: the adapter's max-storage-buffer-binding-size and
    max-buffer-size, and the caller's cap max_binding (webdrift.load(max_binding_bytes=...))."""
    limit = min(dev.max_binding_size, dev.max_buffer_size)
    return min(limit, int(max_binding)) if max_binding else limit


def check_limits(dev, source, weight_format: str | None, max_context: int,
                 max_binding: int | None = None) -> list[WeightPlan]:
    """Raise GPULimitError, before any allocation, if a runtime weight buffer or a KV cache buffer
    exceeds the adapter's max-buffer-size or max-storage-buffer-binding-size (or max_binding, a
    lower cap the caller asks for). The token embedding and the LM head are split into row shards
    instead (their plans get `shards`); only a row too large for one shard is refused. (Uploads
    go up in row chunks well under the binding limit, see kernels/convert.upload_rows.)"""
    cfg = source.config
    bind, buf = min(dev.max_binding_size, int(max_binding or dev.max_binding_size)), dev.max_buffer_size
    limit = binding_limit(dev, max_binding)
    plans = plan_weights(source, weight_format)
    man = model_manifest(cfg, source.tensors)
    shardable = {m.label for m in (man.tok_embd, man.output) if m is not None and m.shardable}
    adapter = dev.info.adapter or "this adapter"

    def mib(n: float) -> str:
        return f"{n / 2**20:.0f} MiB" if n >= 10 << 20 else f"{n / 2**20:.2g} MiB"

    for p in plans:
        worst = max(p.buffers)
        if worst <= limit:
            continue
        shards = row_shards(p.fmt, p.o, p.i, limit) if p.label in shardable else None
        if shards:
            p.shards = shards
            p.buffers = [n for _, rows in shards for n in _sizes(p.fmt, rows, p.i)]
            continue
        what = f"its {p.fmt} buffer"
        hints = [f for f in ("q4", "q8", "f16")
                 if f != p.fmt and not (f in ("q4", "q8") and p.i % 32) and max(_sizes(f, p.o, p.i)) <= limit]
        hint = (f"weights stored and run as {' or '.join(hints)} (--quant for synthetic models), "
                if hints else "")
        raise GPULimitError(
            f"{source.path}: weight {p.label!r} ({p.o} x {p.i}) needs {mib(worst)} for {what}, but {adapter} "
            f"allows {mib(bind)} per storage binding (max-storage-buffer-binding-size) and {mib(buf)} per buffer "
            f"(max-buffer-size); webdrift binds each layer weight as one buffer (only the token embedding and "
            f"the LM head split into row shards). Try {hint}a smaller model, or an "
            f"adapter with larger limits")
    per_layer = kv_cache_bytes(cfg, max_context, layers=1) // 2     # one layer's K (or V) buffer
    if per_layer > limit:
        raise GPULimitError(f"{source.path}: the KV cache of one layer needs {mib(per_layer)} at max_context="
                            f"{max_context}; {adapter} allows {mib(limit)} per binding: use a shorter max_context "
                            f"(at most {limit // (cfg.kv_dim * 4)})")
    return plans
