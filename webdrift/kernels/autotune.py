"""Kernel choice per device and stage, by measurement at first use (ML Drift's adaptive kernel
selection). For each decode GEMV shape (weight format, O, I, fused gate/up) the candidates are
timed with GPU timestamps on the real weight buffers and the fastest is kept; choices are
cached per adapter in memory and, on the desktop, in a JSON file so later loads skip the search.
A GEMV choice is a linear.GemvVariant (cached as a dict of its fields, defaults left out).
Devices that cannot time kernels synchronously (`dev.can_time_sync` False: the browser), and
software adapters always (lavapipe, SwiftShader: `is_cpu`), take the static choice for the
adapter kind: timing every candidate on a software adapter took minutes of a first load on a
2-core machine (SmolLM2: 52 timings, ~210 s) and its verdicts flip from run to run on a shared
CPU; the static rules below are what those timings mostly chose, and they keep tests
deterministic.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, fields

from ..errors import GPUError, UnsupportedModelError
from ..gpu.base import UNIFORM, Device, TimestampRecorder
from ..tensor import TensorDesc
from .attention import AttentionKernel
from .linear import Epilogue, GemvVariant, LinearKernel, PreNorm, QuantOut
from .quantize import QuantizeKernel, xq_desc
from .step import STEP_BYTES, pack_step
from .weights import wide_supported

CANDIDATES = (
    GemvVariant("split", rows=4, wg=64),
    GemvVariant("subgroup", rows=8, wg=256),
    GemvVariant("subgroup", rows=32, wg=256),
    GemvVariant("subgroup", rows=8, wg=256, unroll=4),
    GemvVariant("subgroup", rows=16, wg=128, unroll=4),
    GemvVariant("row", rows=1, wg=64),
    GemvVariant("wide", rows=8, wg=256),
    GemvVariant("wide", rows=32, wg=256),
    GemvVariant("wide", rows=8, wg=256, unroll=4),
    GemvVariant("wide", rows=16, wg=128, unroll=4),
)
# the integer-dot GEMV (int8 activations from QuantizeKernel; q4 / q8 weights)
BLK_CANDIDATES = tuple(GemvVariant("blk", rows=r, wg=w)
                       for r, w in ((2, 32), (4, 32), (2, 64), (4, 64), (8, 64), (2, 128), (4, 128), (4, 256)))
# the integer-dot GEMV with a quantizing epilogue (32 outputs per workgroup): RPS rows per
# subgroup at a time; bigger workgroups give more subgroups per 32 rows
QOUT_CANDIDATES = tuple(GemvVariant("blk", rows=32, wg=w, rps=r) for w, r in ((256, 4), (512, 2), (1024, 1), (128, 8)))
_memory: dict[str, dict] = {}
_DEFAULTS = asdict(GemvVariant())


def _as_dict(v: GemvVariant) -> dict:
    """A choice as the cache file stores it: variant, rows and wg, and the other fields that
    are not their defaults (the format of the entries written before GemvVariant)."""
    return {f.name: getattr(v, f.name) for f in fields(v)
            if f.name in ("variant", "rows", "wg") or getattr(v, f.name) != _DEFAULTS[f.name]}


def _cache_path() -> str | None:
    from ..cache import cache_dir  # $WEBDRIFT_CACHE/autotune: the one resolver, webdrift/cache.py
    base = str(cache_dir("autotune"))
    try:
        os.makedirs(base, exist_ok=True)
    except OSError:
        return None
    return os.path.join(base, "kernel_choices.json")


def _load_file() -> dict:
    p = _cache_path()
    if p and os.path.exists(p):
        try:
            with open(p) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}
    return {}


_last_busy: dict = {}   # id(device) -> perf_counter() when it was last kept busy by a timing


def _busy(dev: Device, d, seconds: float) -> None:
    """Keep the GPU busy with dispatch d for about `seconds`: a batch is always queued behind the
    one being waited for (a read-back after each batch would leave the GPU idle for the round
    trip), and never more than two, so a slow kernel cannot pile up work."""
    end = time.perf_counter() + seconds
    prev = None
    while True:
        rec = TimestampRecorder(1, whole=True)
        dev.submit([d] * 64, timestamps=rec)
        if prev is not None:
            dev.read_timestamps_sync(prev)
        prev = rec
        if time.perf_counter() >= end:
            break
    dev.read_timestamps_sync(prev)


def _time(dev: Device, d) -> int:
    """GPU ns of one dispatch: the median of 5 timed runs, repeated until a round is no faster
    than the best so far (at most 4 rounds), the best median kept. An idle GPU's clocks are low
    and timings taken before they rise came out up to 4x slow (H100, 2026-11-21: load-time
    timings of the first model of a run, whichever candidate came first losing): a GPU idle for
    more than 0.1 s is first kept busy for 0.25 s (the first time per device) or 0.05 s."""
    now = time.perf_counter()
    last = _last_busy.get(id(dev))
    if (last is None or now - last > 0.1) and not dev.info.is_cpu:
        _busy(dev, d, 0.25 if last is None else 0.05)
    dev.submit([d] * 8)
    best = None
    for _ in range(4):
        rec = TimestampRecorder(5)
        dev.submit([d] * 5, timestamps=rec)
        dev.read_timestamps_sync(rec)
        med = sorted(b - a for a, b in rec.ticks_ns)[2]
        if best is not None and med > 0.97 * best:
            best = min(best, med)
            break
        best = med if best is None else min(best, med)
    _last_busy[id(dev)] = time.perf_counter()
    return best


def _step_buffer(dev: Device, pos0: int = 0):
    """The Step uniform of a one-token decode at position pos0, for timing kernels alone."""
    sb = dev.create_buffer(STEP_BYTES, UNIFORM, "tune.step")
    dev.write_buffer(sb, pack_step(1, pos0))
    return sb


def _unmeasured(dev: Device, key: str, enabled: bool) -> bool:
    """Whether the caller takes its static rule: tuning is off (enabled=False: the static rule
    always, whatever an earlier run cached, so a choice never depends on the machine's history),
    a software adapter (never timed, cached verdicts ignored), or no choice is cached under key
    and none can be measured now."""
    if not enabled or dev.info.is_cpu:
        return True
    return key not in _memory and key not in _load_file() and not dev.can_time_sync


def _cached(key: str, compute):
    if key in _memory:
        return _memory[key]
    disk = _load_file()
    if key in disk:
        _memory[key] = disk[key]
        return disk[key]
    val = _memory[key] = compute()
    p = _cache_path()
    if p:
        disk = _load_file()
        disk[key] = val
        try:
            with open(p + ".tmp", "w") as f:
                json.dump(disk, f, indent=1, sort_keys=True)
            os.replace(p + ".tmp", p)
        except OSError:
            pass
    return val


HOST_NS_PER_DISPATCH = 3000   # host encode cost of the extra quantize dispatch (H100 host, measured ~3-5 us)


def int8_pays(dev: Device, w, w2=None, pre_norm: bool = False, quantize_dispatch: bool = True) -> dict:
    """Time one layer's decode GEMV both ways on this adapter: the best float-activation variant
    (with the RMSNorm fused in when pre_norm) against QuantizeKernel + the best integer-dot
    variant. Returns {"float_ns", "int8_ns", "int8": whether the int8 path is faster, counting
    the extra dispatch's host cost}. quantize_dispatch=False: the producer writes the int8 rows
    itself (the attention combine for the O projection): only the GEMVs are compared. Cached
    like the kernel choices."""
    key = (f"{dev.info.adapter}|{dev.info.backend}|int8pays|{w.fmt}|{w.o}|{w.i}|{int(w2 is not None)}"
           f"|{int(pre_norm)}{'' if quantize_dispatch else '|fused'}")
    return _cached(key, lambda: _measure_int8(dev, w, w2, pre_norm, quantize_dispatch))


def _weights(w, w2) -> dict:
    """The bindings of a GEMV's weight(s)."""
    return {"w": w.buffers} | ({"w2": w2.buffers} if w2 is not None else {})


def _measure_int8(dev: Device, w, w2, pre_norm: bool, quantize_dispatch: bool) -> dict:
    fc, qc = choose_gemv(dev, w, w2), choose_gemv(dev, w, w2, int8=True)
    x, y, xq = TensorDesc("x", w.i, 1), TensorDesc("y", w.o, 1), xq_desc("xq", w.i, 1)
    bufs = [dev.create_buffer(t.nbytes, label="tune") for t in (x, y, xq)] + [dev.create_buffer(4 * w.i, label="tune.nw")]
    sb = _step_buffer(dev)
    xb, yb, qb, nb = bufs
    wb = _weights(w, w2)
    norm = PreNorm(1e-5, 0.0) if pre_norm else None
    nw = {"nw": nb} if pre_norm else {}
    try:
        kf = LinearKernel(dev, "decode", x, y, w, w2, variant=fc, pre_norm=norm)
        t_f = _time(dev, kf.dispatch({"step": sb, "x": xb, "y": yb, **wb, **nw}, kf.workgroups(1)))
        kq = LinearKernel(dev, "decode", xq, y, w, w2, variant=qc, pre_norm=norm)
        qk = QuantizeKernel(dev, x, xq, w.fmt, pre_norm=norm)
        t_q = _time(dev, kq.dispatch({"step": sb, "x": qb, "y": yb, **wb}, kq.workgroups(1)))
        if quantize_dispatch:
            t_q += _time(dev, qk.dispatch({"step": sb, "x": xb, "xq": qb, **nw}, qk.workgroups(1)))
    except (GPUError, UnsupportedModelError):
        return {"float_ns": None, "int8_ns": None, "int8": False}
    finally:
        for b in bufs + [sb]:
            dev.release_buffer(b)
    host = HOST_NS_PER_DISPATCH if quantize_dispatch else 0
    return {"float_ns": t_f, "int8_ns": t_q, "int8": t_q + host < t_f}


def choose_attention(dev: Device, n_heads: int, n_kv: int, head_dim: int, cap: int, k_cache, v_cache,
                     window: int = 0, enabled: bool = True) -> bool:
    """Whether decode attention runs grouped (attention_gqa.wgsl: one workgroup serves every query
    head of a KV head) rather than per query head, timed at a 1024-token context (or the cache's
    length) on this adapter with the layer's own caches; cached. Untimed adapters (browsers):
    per-head, which measured faster on an H100 for every shape but 8B's (1%); software adapters:
    grouped, which lavapipe's timings chose for all of the 20 shapes they were taken on (1.05x to
    4x faster)."""
    group = n_heads // n_kv
    if group == 1 or group > AttentionKernel.MAX_GQA:
        return False
    key = f"{dev.info.adapter}|{dev.info.backend}|attn|{n_heads}|{n_kv}|{head_dim}|{cap}|{window}"
    if _unmeasured(dev, key, enabled):
        return bool(dev.info.is_cpu)
    return bool(_cached(key, lambda: _measure_attention(dev, n_heads, n_kv, head_dim, cap, k_cache, v_cache,
                                                        window))["grouped"])


def _measure_attention(dev: Device, n_heads, n_kv, head_dim, cap, k_cache, v_cache, window) -> dict:
    group = n_heads // n_kv
    q = TensorDesc("q", head_dim, group, b=n_kv)
    sb = _step_buffer(dev, min(cap, 1024) - 1)
    qb = dev.create_buffer(q.nbytes, label="tune.q")
    times = []
    try:
        for grouped in (False, True):
            k = AttentionKernel(dev, q, n_heads, n_kv, head_dim, cap, group, 0.125, window, grouped=grouped)
            pb = dev.create_buffer(n_kv * group * k.nsplit * (head_dim + 2) * 4, label="tune.part")
            times.append(_time(dev, k.dispatch({"step": sb, "q": qb, "kc": k_cache, "vc": v_cache, "part": pb},
                                               k.workgroups(1))))
            dev.release_buffer(pb)
    except (GPUError, UnsupportedModelError):
        return {"per_head_ns": None, "grouped_ns": None, "grouped": False}
    finally:
        dev.release_buffer(sb)
        dev.release_buffer(qb)
    return {"per_head_ns": times[0], "grouped_ns": times[1], "grouped": times[1] < times[0]}


def static_choice(dev: Device, int8: bool = False) -> GemvVariant:
    """The decode GEMV variant of an adapter kind, where none is measured."""
    if int8:
        return GemvVariant("blk", rows=4, wg=64)
    if dev.info.is_cpu:
        return GemvVariant("row", rows=1, wg=64)
    if dev.has_subgroups:
        return GemvVariant("subgroup", rows=8, wg=256)
    return GemvVariant("split", rows=4, wg=64)


def choose_gemv(dev: Device, w, w2=None, enabled: bool = True, int8: bool = False) -> GemvVariant:
    """The fastest decode GEMV configuration for weight w (and w2 when gate/up are fused);
    int8: among the integer-dot variants (input quantized by QuantizeKernel)."""
    lay = layout_name(w)   # float weights: the variant is chosen per layout (q4 / q8: one layout)
    key = (f"{dev.info.adapter}|{dev.info.backend}|gemv|{w.fmt}|{w.o}|{w.i}|{int(w2 is not None)}"
           f"{'|int8' if int8 else ''}{'' if lay == 'OI' else '|' + lay}")
    if _unmeasured(dev, key, enabled):
        return static_choice(dev, int8)
    return GemvVariant(**_cached(key, lambda: _search(dev, w, w2, int8)))


QOUT_STATIC = GemvVariant("blk", rows=32, wg=256, rps=4)


def choose_qout(dev: Device, w, w2=None, enabled: bool = True) -> GemvVariant:
    """The fastest quantizing-epilogue configuration (variant "blk", 32 rows, its wg and rps)
    for weight w, timed like choose_gemv."""
    key = f"{dev.info.adapter}|{dev.info.backend}|gemv_qout|{w.fmt}|{w.o}|{w.i}|{int(w2 is not None)}"
    if _unmeasured(dev, key, enabled):
        return QOUT_STATIC
    return GemvVariant(**_cached(key, lambda: _search_qout(dev, w, w2)))


def _search_qout(dev: Device, w, w2) -> dict:
    x, y, q = xq_desc("x", w.i, 1), TensorDesc("y", w.o, 1), xq_desc("q", w.o, 1)
    bufs = [dev.create_buffer(t.nbytes, label="tune") for t in (x, y, q)] + [dev.create_buffer(4 * w.o, label="tune.nw")]
    sb = _step_buffer(dev)
    best, best_ns = None, None
    limit = int(dev.info.limits.get("max-compute-invocations-per-workgroup", 256))
    for cand in QOUT_CANDIDATES:
        if cand.wg > limit:
            continue
        try:
            k = LinearKernel(dev, "decode", x, y, w, w2, variant=cand, epilogue=Epilogue(qout=QuantOut(q, w.fmt, 0.0, True)))
        except (GPUError, UnsupportedModelError, ValueError):
            continue
        ns = _time(dev, k.dispatch({"step": sb, "x": bufs[0], "y": bufs[1], **_weights(w, w2), "qout": bufs[2],
                                    "qnw": bufs[3]}, k.workgroups(1)))
        if ns > 0 and (best_ns is None or ns < best_ns):
            best, best_ns = cand, ns
    for b in bufs + [sb]:
        dev.release_buffer(b)
    return _as_dict(best or QOUT_STATIC)


def chain_pays(dev: Device, links: list) -> dict:
    """Whether quantizing epilogues beat separate quantize dispatches for one layer. links: per
    producing GEMV (w, w2, next_fmt, next_norm: bool) -- O projection, gate/up, down. Compares
    sum(best integer-dot GEMV + QuantizeKernel of its output + host cost of that dispatch) with
    sum(best quantizing-epilogue GEMV). Returns {"separate_ns", "chained_ns", "chain": bool}."""
    key = f"{dev.info.adapter}|{dev.info.backend}|chain|" + ";".join(
        f"{w.fmt},{w.o},{w.i},{int(w2 is not None)},{nf},{int(nn)}" for w, w2, nf, nn in links)
    return _cached(key, lambda: _measure_chain(dev, links))


def _measure_chain(dev: Device, links: list) -> dict:
    sep = chained = 0
    sb = _step_buffer(dev)
    try:
        for w, w2, nfmt, nnorm in links:
            x, y, q = xq_desc("x", w.i, 1), TensorDesc("y", w.o, 1), xq_desc("q", w.o, 1)
            bufs = [dev.create_buffer(t.nbytes, label="tune") for t in (x, y, q)] + [dev.create_buffer(4 * w.o)]
            xb, yb, qb, nb = bufs
            wb = _weights(w, w2)
            norm = PreNorm(1e-5, 0.0) if nnorm else None
            try:
                k = LinearKernel(dev, "decode", x, y, w, w2, variant=choose_gemv(dev, w, w2, int8=True))
                qk = QuantizeKernel(dev, y, q, nfmt, pre_norm=norm)
                sep += (_time(dev, k.dispatch({"step": sb, "x": xb, "y": yb, **wb}, k.workgroups(1)))
                        + _time(dev, qk.dispatch({"step": sb, "x": yb, "xq": qb} | ({"nw": nb} if nnorm else {}),
                                                 qk.workgroups(1)))
                        + HOST_NS_PER_DISPATCH)
                kq = LinearKernel(dev, "decode", x, y, w, w2, variant=choose_qout(dev, w, w2),
                                  epilogue=Epilogue(qout=QuantOut(q, nfmt, 0.0 if nnorm else None, True)))
                chained += _time(dev, kq.dispatch({"step": sb, "x": xb, "y": yb, **wb, "qout": qb}
                                                  | ({"qnw": nb} if nnorm else {}), kq.workgroups(1)))
            finally:
                for b in bufs:
                    dev.release_buffer(b)
    except (GPUError, UnsupportedModelError, ValueError):
        return {"separate_ns": None, "chained_ns": None, "chain": False}
    finally:
        dev.release_buffer(sb)
    return {"separate_ns": sep, "chained_ns": chained, "chain": chained < sep}


def _search(dev: Device, w, w2, int8: bool) -> dict:
    return _as_dict(_search_timed(dev, w, w2, int8)[0])


def _search_timed(dev: Device, w, w2, int8: bool) -> tuple[GemvVariant, int | None]:
    """The fastest decode GEMV candidate for w (and w2) and its GPU ns (None: none ran)."""
    x = xq_desc("x", w.i, 1) if int8 else TensorDesc("x", w.i, 1)
    y = TensorDesc("y", w.o, 1)
    xb, yb = dev.create_buffer(x.nbytes, label="tune.x"), dev.create_buffer(y.nbytes, label="tune.y")
    sb = _step_buffer(dev)
    best, best_ns = None, None
    for cand in (BLK_CANDIDATES if int8 else CANDIDATES):
        if cand.variant in ("subgroup", "wide") and not dev.has_subgroups:
            continue
        if cand.variant == "wide" and not (wide_supported(w.fmt, w.i, w.layout) and
                                           (w2 is None or wide_supported(w2.fmt, w2.i, w2.layout))):
            continue
        try:
            k = LinearKernel(dev, "decode", x, y, w, w2, variant=cand)
        except (GPUError, UnsupportedModelError):   # a candidate this adapter or weight cannot run
            continue
        d = k.dispatch({"step": sb, "x": xb, "y": yb, **_weights(w, w2)}, k.workgroups(1))
        ns = _time(dev, d)
        if ns > 0 and (best_ns is None or ns < best_ns):
            best, best_ns = cand, ns
    for b in (xb, yb, sb):
        dev.release_buffer(b)
    return best or static_choice(dev, int8), best_ns


# ML Drift's weight-layout search for the float formats: the orders a float weight may be stored
# in (tensor/weight_layout.py); q4 / q8 have one block layout
LAYOUTS = ("OI", "OI4O4")
LAYOUT_PROXY_ROWS = 4096


def layout_name(w) -> str:
    from ..tensor.weight_layout import NAMED_ORDERS
    if w.layout is None:
        return "OI"
    return next((n for n, order in NAMED_ORDERS.items() if order == w.layout.order), "custom")


def choose_layout(dev: Device, fmt: str, o: int, i: int, enabled: bool = True) -> str:
    """The WeightLayout a float (f32 / f16) weight of shape (o, i) is converted into at load:
    each candidate order is timed with its fastest decode GEMV variant on a scratch weight of
    min(o, 4096) rows, and the fastest kept per adapter and shape (cached like the kernel
    choices). q4 / q8 have one layout; untimed (browser) and software adapters keep "OI"
    (row-major, which the wide variant needs)."""
    if fmt not in ("f32", "f16"):
        return "OI"
    key = f"{dev.info.adapter}|{dev.info.backend}|layout|{fmt}|{o}|{i}"
    if _unmeasured(dev, key, enabled):
        return "OI"
    return _cached(key, lambda: _measure_layout(dev, fmt, o, i))["layout"]


def _measure_layout(dev: Device, fmt: str, o: int, i: int) -> dict:
    from .convert import allocate_weight
    out = {}
    for name in LAYOUTS:
        w = allocate_weight(dev, f"tune.{name}", fmt, min(o, LAYOUT_PROXY_ROWS), i, name)
        try:
            _, ns = _search_timed(dev, w, None, False)
        finally:
            for b in w.buffers:
                dev.release_buffer(b)
        out[f"{name}_ns"] = ns
    best = min(LAYOUTS, key=lambda n: out[f"{n}_ns"] or float("inf"))
    return {"layout": best, **out}
