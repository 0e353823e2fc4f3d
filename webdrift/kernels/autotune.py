"""Kernel choice per device and stage, by measurement at first use (ML Drift's adaptive kernel
selection). For each decode GEMV shape (weight format, O, I, fused gate/up) the candidates are
timed with GPU timestamps on the real weight buffers and the fastest is kept; choices are
cached per adapter in memory and, on the desktop, in a JSON file so later loads skip the search.
A GEMV choice is a linear.GemvVariant (cached as a dict of its fields, defaults left out).
Every measurement is written once, as a generator that yields each TimestampRecorder it has
submitted and wants read: `_drive_sync` reads them at once (the native backend, `can_time_sync`:
choices are measured when the model asks for them), `_drive_async` awaits them (the browser,
whose reads are asynchronous). A device that can time only asynchronously (`dev.has_timestamps`
without `can_time_sync`) gets the static choice at first use, and the measurement is queued:
`await tune_pending(dev)` runs the queue in small steps (one timing per await) and the results
are cached (`export_choices` / `import_choices`: the browser keeps them in IndexedDB), so the
next load finds them. Where each dispatch takes less than a timestamp quantum (Chrome rounds
timestamps to 100 us), the async timing times growing batches of the dispatch in one pass.
Software adapters (lavapipe, SwiftShader: `is_cpu`) take the static choice for the adapter
kind unless tuning is forced (autotune="force", for tests): timing every candidate on a
software adapter took minutes of a first load on a 2-core machine (SmolLM2: 52 timings, ~210 s)
and its verdicts flip from run to run on a shared CPU; the static rules below are what those
timings mostly chose, and they keep tests deterministic.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, fields, replace

from ..errors import GPUError, UnsupportedModelError
from ..gpu.base import RW, UNIFORM, Device, TimestampRecorder
from ..tensor import TensorDesc
from .attention import AttentionCombineKernel, AttentionKernel, AttnChoice
from .base import ceil_div
from .flush import L2FlushKernel
from .linear import (
    Epilogue,
    GemmVariant,
    GemvVariant,
    LinearKernel,
    PreNorm,
    QuantOut,
    ks_red_floats,
    qlast_bytes,
)
from .norm import RMSNormKernel
from .quantize import QuantizeKernel, xq_desc
from .step import STEP_BYTES, pack_step
from .template import kernels_id
from .weights import wide_slices, wide_supported

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
    GemvVariant("wide", rows=16, wg=256, mrows=2),
    GemvVariant("wide", rows=32, wg=256, mrows=4),
    GemvVariant("wide", rows=8, wg=128, mrows=2),
    GemvVariant("wide", rows=16, wg=128, mrows=4),
    # split K: each row's blocks strided by the whole workgroup (H100 f16, session 17: 8B QKV,
    # O and down, 1B QKV / O / down, 3B QKV / O / down; BENCHMARKS.md)
    GemvVariant("wide", rows=2, wg=256, mrows=2, ksplit=True),
    GemvVariant("wide", rows=4, wg=256, mrows=4, ksplit=True),
    GemvVariant("wide", rows=8, wg=256, mrows=8, ksplit=True),
    GemvVariant("wide", rows=8, wg=256, mrows=4, ksplit=True),
    GemvVariant("wide", rows=2, wg=128, mrows=2, ksplit=True),
    GemvVariant("wide", rows=4, wg=128, mrows=4, ksplit=True),
    # ... taking 2 or 4 strides of the block loop at a time (more weight blocks in flight per
    # invocation before a row group's sums meet)
    GemvVariant("wide", rows=4, wg=256, mrows=4, ksplit=True, unroll=2),
    GemvVariant("wide", rows=8, wg=256, mrows=4, ksplit=True, unroll=2),
    GemvVariant("wide", rows=8, wg=256, mrows=8, ksplit=True, unroll=2),
    GemvVariant("wide", rows=2, wg=256, mrows=2, ksplit=True, unroll=4),
    GemvVariant("wide", rows=4, wg=128, mrows=4, ksplit=True, unroll=2),
    GemvVariant("wide", rows=4, wg=128, mrows=4, ksplit=True, unroll=4),
)
# the integer-dot GEMV (int8 activations from QuantizeKernel; q4 / q8 weights); unroll: blocks a
# stride apart per iteration, their loads issued together (H200, 2026-11-29, 8B q4_0 in chains of
# 16 dependent dispatches: down 12.1 us with r2 wg64 u4 against 12.6 at best without, O 6.1 (u2)
# against 6.6, and with each 32-block quantized by its last workgroup 16.0 / 9.9 against 16.9 /
# 10.4; docs/BENCHMARKS.md session 35)
BLK_CANDIDATES = tuple(GemvVariant("blk", rows=r, wg=w, unroll=u)
                       for r, w, u in ((2, 32, 1), (4, 32, 1), (2, 64, 1), (4, 64, 1), (8, 64, 1), (2, 128, 1),
                                       (4, 128, 1), (4, 256, 1), (2, 32, 2), (2, 64, 2), (4, 128, 2), (2, 64, 4)))
# the integer-dot GEMV with a quantizing epilogue (32 outputs per workgroup): RPS rows per
# subgroup at a time; bigger workgroups give more subgroups per 32 rows
QOUT_CANDIDATES = tuple(GemvVariant("blk", rows=32, wg=w, rps=r) for w, r in ((256, 4), (512, 2), (1024, 1), (128, 8)))
# ... and the one-row kernels, each 32-block quantized by its last workgroup (faster where many
# small workgroups stream a weight best: H100, 1B / 8B q4 gate/up, down and O, 10-30%;
# BENCHMARKS.md, session 16)
QLAST_CANDIDATES = tuple(replace(c, qlast=True) for c in BLK_CANDIDATES if c.wg >= 32 and 32 % c.rows == 0)
# the prefill GEMMs (kernels/linear_gemm.py): tile configurations, the static rule's preference
# first; a candidate runs where it fits the adapter (invocations, workgroup memory). The last of
# each list is the fallback every WebGPU adapter runs (256 invocations, <= 16 KiB), and what
# software adapters use.
GEMM_CANDIDATES = (
    GemmVariant(bm=64, bn=128, tm=4, tn=8, kstep=4, double=True),
    GemmVariant(bm=128, bn=128, tm=8, tn=8, kstep=4, double=True),
    GemmVariant(bm=128, bn=64, tm=8, tn=4, kstep=4, double=True),
    GemmVariant(bm=128, bn=128, tm=8, tn=8, kstep=2, double=True),
    GemmVariant(bm=64, bn=64, tm=4, tn=4, kstep=8, double=True),
    GemmVariant(bm=64, bn=64, tm=4, tn=4, kstep=2, double=True),
    GemmVariant(),
)
# f16 weights: the same tiles with f16 weight tiles in workgroup memory (shader-f16), tried first
GEMM_F16_CANDIDATES = tuple(GemmVariant(**{**asdict(c), "f16_tiles": True}) for c in GEMM_CANDIDATES[:4])
# matrix units (Device.has_mma_f16): sgm x sgn subgroups a workgroup, each tm x tn 16 x 16
# results; the big tiles for long prompts and wide layers, the small ones to fill the GPU on short
# chunks; the `direct` ones load W's matrices from f16 row-major weights (no W tile)
GEMM_MMA_CANDIDATES = (      # each the fastest on some 1B / 8B layer on the H100 (BENCHMARKS.md, session 13)
    GemmVariant(mma=True, bm=128, bn=128, tm=4, tn=4, kstep=8, sgm=2, sgn=2),
    GemmVariant(mma=True, bm=128, bn=128, tm=4, tn=2, kstep=8, sgm=2, sgn=4),
    GemmVariant(mma=True, bm=128, bn=128, tm=2, tn=4, kstep=8, sgm=4, sgn=2),
    GemmVariant(mma=True, bm=128, bn=128, tm=2, tn=2, kstep=8, sgm=4, sgn=4),
    GemmVariant(mma=True, bm=128, bn=128, tm=4, tn=2, kstep=16, sgm=2, sgn=4),
    GemmVariant(mma=True, bm=256, bn=128, tm=4, tn=4, kstep=8, sgm=4, sgn=2),
    GemmVariant(mma=True, bm=128, bn=256, tm=4, tn=4, kstep=8, sgm=2, sgn=4),
    GemmVariant(mma=True, bm=64, bn=128, tm=2, tn=4, kstep=8, sgm=2, sgn=2),
    GemmVariant(mma=True, bm=64, bn=64, tm=2, tn=2, kstep=8, sgm=2, sgn=2),       # short prompt chunks
    GemmVariant(mma=True, direct=True, bm=128, bn=128, tm=4, tn=4, kstep=8, sgm=2, sgn=2),
)
MMA_DUAL_RESULTS = 8          # gate/up (two weights): at most this many 16 x 16 results a subgroup each
GEMM_I8_CANDIDATES = (
    GemmVariant(int8=True, bm=64, bn=128, tm=4, tn=8, kstep=1, double=True),
    GemmVariant(int8=True, bm=64, bn=128, tm=4, tn=8, kstep=2, double=True),
    GemmVariant(int8=True, bm=64, bn=128, tm=4, tn=8, kstep=4),
    GemmVariant(int8=True, bm=128, bn=64, tm=8, tn=4, kstep=1, double=True),
    GemmVariant(int8=True, bm=128, bn=128, tm=8, tn=8, kstep=1, double=True),
    GemmVariant(int8=True, bm=64, bn=64, tm=4, tn=4, kstep=2, double=True),
    GemmVariant(int8=True, bm=64, bn=64, tm=4, tn=4, kstep=1, double=True),
    GemmVariant(int8=True, bm=64, bn=64, tm=4, tn=4, kstep=2),
)
GEMM_TUNE_ROWS = 256          # tokens of the timed GEMM tiles for short prompts (choose_gemm; the chunk's too)


def large_gemm_rows(capacity: int) -> int:
    """The token bucket from which a prefill program of `capacity` rows runs the GEMM chosen at
    its capacity instead of the one chosen at GEMM_TUNE_ROWS (models/forward.py, Linear.large):
    the geometric mean of the two row counts, on the programs' 64-row bucket grid."""
    return ceil_div(math.isqrt(GEMM_TUNE_ROWS * capacity), 64) * 64


_memory: dict[str, dict] = {}
_DEFAULTS = asdict(GemvVariant())


def _as_dict(v: GemvVariant) -> dict:
    """A choice as the cache file stores it: variant, rows and wg, and the other fields that
    are not their defaults (the format of the entries written before GemvVariant)."""
    return {f.name: getattr(v, f.name) for f in fields(v)
            if f.name in ("variant", "rows", "wg") or getattr(v, f.name) != _DEFAULTS[f.name]}


# v2: timed after an L2 flush (kernel_choices.json held choices timed with warm caches)
CACHE_FILE = "kernel_choices_v2.json"


def _cache_path() -> str | None:
    from ..cache import cache_dir  # $WEBDRIFT_CACHE/autotune: the one resolver, webdrift/cache.py
    base = str(cache_dir("autotune"))
    try:
        os.makedirs(base, exist_ok=True)
    except OSError:
        return None
    return os.path.join(base, CACHE_FILE)


def _load_file() -> dict:
    p = _cache_path()
    if p and os.path.exists(p):
        try:
            with open(p) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}
    return {}


FORCE = "force"          # autotune="force": measure on software adapters too (tests)
_pending: dict = {}      # key -> (device, measurement factory): queued for tune_pending (async timing)
_new: dict = {}          # key -> choice measured by tune_pending and not exported yet
_last_busy: dict = {}    # id(device) -> perf_counter() when it was last kept busy by a timing


# -- the two drivers of a measurement generator ------------------------------------------------

CHECK = object()   # yielded after compiling a candidate: the driver raises its compile error into the generator


def _drive_sync(dev: Device, gen):
    """Run a measurement generator, reading each timestamp recorder it yields at once (the
    native backend raises compile errors at once, so CHECK has nothing to do)."""
    try:
        rec = next(gen)
        while True:
            if rec is not CHECK:
                dev.read_timestamps_sync(rec)
            rec = gen.send(None)
    except StopIteration as stop:
        return stop.value


async def _drive_async(dev: Device, gen, pause=None):
    """Run a measurement generator, awaiting each timestamp read (the browser's event loop runs
    between them: one timing per await). At CHECK the device's pending errors are awaited and a
    GPUError (a candidate the adapter cannot compile, e.g. over its workgroup-memory limit: the
    browser reports it asynchronously) is thrown into the generator, which skips that candidate.
    `await pause()` before each next submit (the engine's requests go first)."""
    try:
        rec = next(gen)
        while True:
            if rec is CHECK:
                try:
                    await dev.check_errors()
                except GPUError as e:
                    rec = gen.throw(e)
                    continue
            else:
                await dev.read_timestamps(rec)
            if pause is not None:
                await pause()
            rec = gen.send(None)
    except StopIteration as stop:
        return stop.value


# -- the cache and the decision --------------------------------------------------------------------

def key_prefix(dev: Device) -> str:
    """The start of every cached choice's key: the adapter, its backend and the kernels' hash
    (template.kernels_id: a choice measured on other kernels is measured again)."""
    return f"{dev.info.adapter}|{dev.info.backend}|k{kernels_id()}|"


def _store(key: str, val: dict) -> dict:
    _memory[key] = val
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


def _lookup(key: str) -> dict | None:
    if key in _memory:
        return _memory[key]
    disk = _load_file()
    if key in disk:
        _memory[key] = disk[key]
        return disk[key]
    return None


def tunable(dev: Device, enabled) -> bool:
    """Whether choices are measured (now or queued) and cached on dev: tuning is on, the adapter
    is a GPU (a software adapter only with enabled="force") and it has timestamp queries."""
    return bool(enabled) and (not dev.info.is_cpu or enabled == FORCE) and dev.has_timestamps


def _decide(dev: Device, key: str, enabled, measure, static: dict) -> dict:
    """The choice cached under key; else measured now (synchronous timing), or queued for
    tune_pending (asynchronous timing) with `static` used meanwhile; `static` also where the
    adapter is not tuned at all (tunable() False: a choice never depends on the machine's
    history when tuning is off or the adapter is a software one)."""
    if not tunable(dev, enabled):
        return static
    hit = _lookup(key)
    if hit is not None:
        return hit
    if dev.can_time_sync:
        return _store(key, _drive_sync(dev, measure()))
    _pending.setdefault(key, (dev, measure))
    return static


def _sub(key: str, measure):
    """Inside a measurement: the choice cached under key, measured first if it is not."""
    hit = _lookup(key)
    if hit is None:
        hit = yield from measure()
        _store(key, hit)
        _new[key] = hit
    return hit


def pending(dev: Device) -> list[str]:
    """Keys of the measurements queued for dev (asynchronous timing)."""
    return [k for k, (d, _) in _pending.items() if d is dev]


async def tune_pending(dev: Device, progress=None, pause=None, cancelled=None) -> dict:
    """Measure every queued choice of dev, one after another; returns {key: choice} of what was
    measured (also kept in memory for the next load: export_choices). progress(done, total, key)
    after each; `await pause()` before each and between a measurement's timings (e.g. while the
    engine generates: a request waits for one timing at most) and cancelled() (True: stop,
    leaving the rest queued) let the caller run this in the background."""
    keys = pending(dev)
    out = {}
    for n, key in enumerate(keys):
        if cancelled is not None and cancelled():
            break
        if pause is not None:
            await pause()
        if cancelled is not None and cancelled():
            break
        _, measure = _pending.pop(key)
        if key not in _memory:
            val = await _drive_async(dev, measure(), pause)
            _store(key, val)
            _new[key] = val
        out[key] = _memory[key]
        if progress is not None:
            progress(n + 1, len(keys), key)
    return out


def export_choices(new_only: bool = False) -> dict:
    """The cached choices {key: choice} (new_only: those measured since the last export)."""
    out = dict(_new if new_only else _memory)
    _new.clear()
    return out


def cached_keys() -> list[str]:
    """Keys of the choices known in memory (measured, loaded from the file or imported)."""
    return list(_memory)


def import_choices(choices: dict) -> int:
    """Seed the in-memory cache (the browser's stored choices); returns how many were new."""
    n = 0
    for k, v in (choices or {}).items():
        if isinstance(k, str) and isinstance(v, dict) and k not in _memory:
            _memory[k] = v
            n += 1
    return n


def forget(dev: Device | None = None) -> None:
    """Drop the queued measurements (of dev, or all): its buffers are gone."""
    for k in [k for k, (d, _) in _pending.items() if dev is None or d is dev]:
        del _pending[k]


# -- timing ----------------------------------------------------------------------------------------

BUSY_SETTLE_S = 2.0   # _busy: at most this long past its minimum, waiting for the clocks to settle


def _warm(dev: Device, d):
    """A GPU idle for more than 0.1 s is first kept busy with d (a dispatch or the list timed:
    _busy): 0.25 s the first time per device, 0.05 s after."""
    last = _last_busy.get(id(dev))
    if (last is None or time.perf_counter() - last > 0.1) and not dev.info.is_cpu:
        yield from _busy(dev, d, 0.25 if last is None else 0.05)


def _rounds(median):
    """The best of up to 4 rounds of `median()` (a generator returning one round's median ns),
    stopping at a round no faster than 0.97x the best so far."""
    best = None
    for _ in range(4):
        med = yield from median()
        if best is not None and med > 0.97 * best:
            return min(best, med)
        best = med if best is None else min(best, med)
    return best


def _busy(dev: Device, d, seconds: float):
    """Keep the GPU busy with dispatch d (or a list of dispatches, run in order: at least 64 a
    batch) for at least `seconds`, then until its clocks have stopped
    rising (a batch of d no more than 3% faster than the fastest before it), at most BUSY_SETTLE_S
    more: on an H100 fresh from idle, a first model's load-time timings of small kernels came
    out 2-4x slow after the 0.25 s (the LM head's, bound by memory, unchanged), and the choices
    made from them decoded 3% slower (2026-11-25). A batch is always queued behind the one being
    waited for (a read-back after each batch would leave the GPU idle for the round trip), and
    never more than two, so a slow kernel cannot pile up work."""
    end = time.perf_counter() + seconds
    prev, best, settled = None, None, False
    ds = d if isinstance(d, list) else [d]
    while True:
        rec = TimestampRecorder(1, whole=True)
        dev.submit(ds * ceil_div(64, len(ds)), timestamps=rec)
        if prev is not None:
            yield prev
            span = sum(b - a for a, b in prev.ticks_ns)
            settled = best is not None and span >= 0.97 * best
            best = span if best is None else min(best, span)
        prev = rec
        now = time.perf_counter()
        if now >= end and (settled or now >= end + BUSY_SETTLE_S):
            break
    yield prev


BATCH_MIN_NS = 2_000_000      # async timing: a timed batch lasts at least this (>> a 100 us quantum)
BATCH_MAX = 4096              # ... or this many dispatches
QUANTA = 32                   # ... and the timed kernel's share of it at least this many timestamp quanta


def _quantum(spans: list[int]) -> int:
    """The timestamps' resolution as the spans show it: their greatest common divisor when that
    is >= 1 us (browsers quantize timestamps, Chrome to 100 us), else 0 (full resolution)."""
    g = math.gcd(*spans)
    return g if g >= 1000 else 0


def _batch_ns(dev: Device, dispatches: list):
    """GPU ns of one submit of `dispatches` in one timed pass (a generator, like _time)."""
    rec = TimestampRecorder(1, whole=True)
    dev.submit(dispatches, timestamps=rec)
    yield rec
    return sum(b - a for a, b in rec.ticks_ns)


def best_pass_ns(dev: Device, ds: list, warm_s: float, passes: int = 5) -> int:
    """GPU ns of the dispatches ds in one timed pass, the best of `passes`, after keeping the GPU
    busy with them for warm_s and until its clocks settle (_busy); synchronous timing only. For
    the scripts that time chains of dependent dispatches (scripts/gemv_chain.py and others)."""
    _drive_sync(dev, _busy(dev, ds, warm_s))
    return min(_drive_sync(dev, _batch_ns(dev, ds)) for _ in range(passes))


def _time(dev: Device, d):
    """GPU ns of one dispatch (a generator: `ns = yield from _time(dev, d)`).

    Synchronous timing (native): each timed run after an L2-evicting dispatch (_flush_dispatch;
    GPUs only), the median of 5 timed runs, repeated until a round is no faster
    than the best so far (at most 4 rounds), the best median kept. An idle GPU's clocks are low
    and timings taken before they rise came out up to 4x slow (H100, 2026-11-21: load-time
    timings of the first model of a run, whichever candidate came first losing): a GPU idle for
    more than 0.1 s is first kept busy (_warm: 0.25 s the first time per device, 0.05 s after, then
    until its clocks stop rising).
    Asynchronous timing (browser): batches of k dispatches in one timed pass, k growing 4x until
    a batch lasts BATCH_MIN_NS and, where timestamps are quantized (browsers), d's share of it
    spans QUANTA quanta; on GPUs each run after the L2-evicting dispatch, whose batch is timed
    alone and subtracted, the median of 5 such rounds / k; on software adapters (no flush) the
    best of 3 batches / k."""
    yield from _warm(dev, d)
    if dev.can_time_sync:
        dev.submit([d] * 8)
        flush = _flush_dispatch(dev, d)

        def median():
            rec = TimestampRecorder(10 if flush else 5)
            dev.submit([f for _ in range(5) for f in ((flush, d) if flush else (d,))], timestamps=rec)
            yield rec
            return sorted(b - a for a, b in (rec.ticks_ns[1::2] if flush else rec.ticks_ns))[2]
        best = yield from _rounds(median)
    else:
        # a batch of k runs of d, each after the L2-evicting dispatch where there is one; the
        # flush's own time is a batch of k flushes, timed in the same round and subtracted (the
        # flush binds d's output writable, so each run starts after its flush and before the
        # next). Without the flush, k runs of d read the same weights from L2 (Dawn on an H100,
        # 2026-11-24: the 1B's f16 candidates timed warm, the chosen ones ran the model at 0.56x
        # of wgpu-native's decode).
        flush = _flush_dispatch(dev, d)
        spans: list[int] = []

        def batch(k):
            return [x for _ in range(k) for x in (flush, d)] if flush else [d] * k

        def run(k):            # GPU ns of k runs of d alone (the flushes' batch subtracted)
            a = yield from _batch_ns(dev, batch(k))
            f = (yield from _batch_ns(dev, [flush] * k)) if flush else 0
            spans.extend((a, f) if flush else (a,))
            return a, a - f
        k = 4
        while True:
            a, part = yield from run(k)
            quantum = _quantum(spans)
            if k >= BATCH_MAX or (a >= BATCH_MIN_NS and part >= QUANTA * quantum):
                break
            if a < BATCH_MIN_NS:
                k = min(BATCH_MAX, k * 4 if a < BATCH_MIN_NS // 8 else k * 2)
            else:      # long enough, but d's share is within a few quanta of the flush's
                k = min(BATCH_MAX, max(2 * k, -(-QUANTA * quantum * k // max(part, quantum))))
        runs = [part // k]
        for _ in range(4 if flush else 2):
            runs.append((yield from run(k))[1] // k)
        best = max(0, sorted(runs)[len(runs) // 2]) if flush else min(runs)
    _last_busy[id(dev)] = time.perf_counter()
    return best


def _time_each(dev: Device, ds: list):
    """The sum of each dispatch's _time (a generator, like _time): each timed alone."""
    total = 0
    for d in ds:
        total += yield from _time(dev, d)
    return total


def _time_seq(dev: Device, ds: list):
    """GPU ns of the dependent dispatches ds run back to back in one pass, as a decode step runs
    them (a generator, like _time): the gaps between them count, which timing each alone misses
    (H100, 2026-11-25: the int8 chain's quantizing epilogues and the GEMVs + quantize dispatches
    they replace came out level timed alone, so the choice flipped between runs; in the model the
    chain decoded the 1B q4 at 985 tok/s, the separate dispatches at 905). Synchronous timing:
    each run after the L2-evicting dispatch in a submit of its own, one timestamp pair around the
    pass, the median of 5, rounds as _time's. Without synchronous timestamps (browsers: no
    whole-pass timestamps there), the sum of each dispatch's _time."""
    if not dev.can_time_sync:
        return (yield from _time_each(dev, ds))
    yield from _warm(dev, ds)
    dev.submit(ds * 4)
    flush = _flush_dispatch(dev, ds[0])

    def median():
        recs = []
        for _ in range(5):
            if flush:
                dev.submit([flush])
            recs.append(TimestampRecorder(1, whole=True))
            dev.submit(ds, timestamps=recs[-1])
        yield from recs
        return sorted(b - a for rec in recs for a, b in rec.ticks_ns)[2]
    best = yield from _rounds(median)
    _last_busy[id(dev)] = time.perf_counter()
    return best


_flushes: dict = {}    # id(device) -> (device, L2FlushKernel, its scratch buffer) or (device, None, None)


def _flush_dispatch(dev: Device, d):
    """The dispatch run before each timed run of d on a GPU (None on software adapters): it reads
    more bytes than the last-level cache holds, so every candidate is timed reading its weights
    from memory as in a decode step, not from an L2 warmed by the previous run (a 1B model's
    33 MiB down projection fits an H100's 50 MiB L2: timed warm, the fastest-in-L2 variant won
    and streamed at ~1 TB/s in the model, H100 2026-11-23). It also binds d's first writable
    buffer writable (l2_flush.wgsl), which orders it with d. The scratch buffer is kept per device."""
    got = _flushes.get(id(dev))
    if got is None or got[0] is not dev:
        k = buf = None
        if not dev.info.is_cpu:
            k = L2FlushKernel(dev)
            buf = dev.create_buffer(k.nbytes, label="tune.l2_flush")
        got = _flushes[id(dev)] = (dev, k, buf)
    _, k, buf = got
    if k is None:
        return None
    out = next(b for kind, b in zip(d.pipeline.bindings, d.bind_group.buffers) if kind == RW)
    return k.dispatch({"buf": buf, "sync": out}, k.workgroups())


def _step_buffer(dev: Device, pos0: int = 0, tokens: int = 1):
    """The Step uniform of a decode step of `tokens` rows at position pos0, for timing kernels alone."""
    sb = dev.create_buffer(STEP_BYTES, UNIFORM, "tune.step")
    dev.write_buffer(sb, pack_step(tokens, pos0))
    return sb


HOST_NS_PER_DISPATCH = 3000   # host encode cost of the extra quantize dispatch (H100 host, measured ~3-5 us)


def _gemv_key(dev: Device, w, w2, int8: bool) -> str:
    lay = layout_name(w)   # float weights: the variant is chosen per layout (q4 / q8: one layout)
    return (f"{key_prefix(dev)}gemv|{w.fmt}|{w.o}|{w.i}|{int(w2 is not None)}"
            f"{'|int8' if int8 else ''}{'' if lay == 'OI' else '|' + lay}")


def _qout_key(dev: Device, w, w2) -> str:
    return f"{key_prefix(dev)}gemv_qout2|{w.fmt}|{w.o}|{w.i}|{int(w2 is not None)}"


def int8_pays(dev: Device, w, w2=None, pre_norm: bool = False, quantize_dispatch: bool = True,
              enabled=FORCE, static: bool = False) -> dict:
    """Time one layer's decode GEMV both ways on this adapter: the best float-activation variant
    (with the RMSNorm fused in when pre_norm) against QuantizeKernel + the best integer-dot
    variant. Returns {"float_ns", "int8_ns", "int8": whether the int8 path is faster, counting
    the extra dispatch's host cost}. quantize_dispatch=False: the producer writes the int8 rows
    itself (the attention combine for the O projection): only the GEMVs are compared. Cached
    like the kernel choices; `static` is the verdict while unmeasured (asynchronous timing).
    Measured whenever called (enabled=FORCE, software adapters too): choices.py calls it only
    where the adapter is tuned."""
    key = (f"{key_prefix(dev)}int8pays|{w.fmt}|{w.o}|{w.i}|{int(w2 is not None)}"
           f"|{int(pre_norm)}{'' if quantize_dispatch else '|fused'}")
    return _decide(dev, key, enabled, lambda: _measure_int8(dev, w, w2, pre_norm, quantize_dispatch),
                   {"float_ns": None, "int8_ns": None, "int8": static})


def _weights(w, w2) -> dict:
    """The bindings of a GEMV's weight(s)."""
    return {"w": w.buffers} | ({"w2": w2.buffers} if w2 is not None else {})


def _gemv_choice(dev: Device, w, w2, int8: bool):
    """Inside a measurement: the best GEMV variant (measured first if not cached)."""
    return GemvVariant(**(yield from _sub(_gemv_key(dev, w, w2, int8), lambda: _search(dev, w, w2, int8))))


def _measure_int8(dev: Device, w, w2, pre_norm: bool, quantize_dispatch: bool):
    fc = yield from _gemv_choice(dev, w, w2, False)
    qc = yield from _gemv_choice(dev, w, w2, True)
    x, y, xq = TensorDesc("x", w.i, 1), TensorDesc("y", w.o, 1), xq_desc("xq", w.i, 1)
    bufs = [dev.create_buffer(t.nbytes, label="tune") for t in (x, y, xq)] + [dev.create_buffer(4 * w.i, label="tune.nw")]
    sb = _step_buffer(dev)
    xb, yb, qb, nb = bufs
    wb = _weights(w, w2)
    norm = PreNorm(1e-5, 0.0) if pre_norm else None
    nw = {"nw": nb} if pre_norm else {}
    try:
        kf = LinearKernel(dev, "decode", x, y, w, w2, variant=fc, pre_norm=norm)
        yield CHECK
        t_f = yield from _time(dev, kf.dispatch({"step": sb, "x": xb, "y": yb, **wb, **nw}, kf.workgroups(1)))
        kq = LinearKernel(dev, "decode", xq, y, w, w2, variant=qc, pre_norm=norm)
        qk = QuantizeKernel(dev, x, xq, w.fmt, pre_norm=norm)
        yield CHECK
        t_q = yield from _time(dev, kq.dispatch({"step": sb, "x": qb, "y": yb, **wb}, kq.workgroups(1)))
        if quantize_dispatch:
            t_q += yield from _time(dev, qk.dispatch({"step": sb, "x": xb, "xq": qb, **nw}, qk.workgroups(1)))
    except (GPUError, UnsupportedModelError):
        return {"float_ns": None, "int8_ns": None, "int8": False}
    finally:
        for b in bufs + [sb]:
            dev.release_buffer(b)
    host = HOST_NS_PER_DISPATCH if quantize_dispatch else 0
    return {"float_ns": t_f, "int8_ns": t_q, "int8": t_q + host < t_f}


def choose_attention(dev: Device, n_heads: int, n_kv: int, head_dim: int, cap: int, k_cache, v_cache,
                     window: int = 0, enabled=True, kv_f16: bool = False) -> AttnChoice:
    """The decode attention kernel: "head" (attention.wgsl: a workgroup per query head),
    "grouped" (attention_gqa.wgsl: one per KV head serving its query heads) or "split"
    (attention_split.wgsl: grouped, 16- to 64-key chunks, subgroups, V loaded before or after the
    scores, or several chunks a workgroup: ADAPT_PARTIALS), each timed with its combine at 1024- and 4096-token contexts (as far as the cache
    reaches) on this adapter with the layer's own caches, the least total kept; cached.
    Unmeasured adapters: split (32 keys; on an H100 a quarter less time than grouped at depth
    1024, level at 4096) where subgroups exist on a GPU (browsers until tuned), else grouped on
    software adapters (what lavapipe's timings chose for all of the 20 shapes they were taken on,
    1.05x to 4x faster than per-head), else per-head. kv_f16: the caches hold f16 (chosen apart
    from f32 caches: half the bytes to read)."""
    cands = attention_candidates(dev, n_heads, n_kv, head_dim, cap)
    if len(cands) == 1:
        return cands[0]
    key = _attn_key(dev, n_heads, n_kv, head_dim, cap, window, kv_f16)
    static = AttnChoice("split", 32)
    if dev.info.is_cpu or static not in cands:
        static = AttnChoice("grouped") if AttnChoice("grouped") in cands else AttnChoice()
    got = _decide(dev, key, enabled,
                  lambda: _measure_attention(dev, n_heads, n_kv, head_dim, cap, k_cache, v_cache, window, cands,
                                             kv_f16),
                  static._asdict())
    return AttnChoice(got["variant"], got["chunk"], got["prefetch_v"], got.get("adapt", 0))


def _attn_key(dev: Device, n_heads: int, n_kv: int, head_dim: int, cap: int, window: int, kv_f16: bool) -> str:
    return f"{key_prefix(dev)}attn5|{n_heads}|{n_kv}|{head_dim}|{cap}|{window}" + ("|kv16" if kv_f16 else "")


def attention_ranking(dev: Device, n_heads: int, n_kv: int, head_dim: int, cap: int, window: int = 0,
                      kv_f16: bool = False, k: int = 3) -> list[AttnChoice]:
    """The k fastest of choose_attention's timed candidates, then the fastest of each variant
    not among them that took at most twice the fastest's time (kernels timed alone after a flush
    rank one variant against another unlike whole steps do: the tiled kernel, H200 2026-11-25,
    docs/BENCHMARKS.md session 22), fastest first (after it measured them; [] where it did not:
    untimed adapters, or asynchronous timing not yet run)."""
    ns = (_lookup(_attn_key(dev, n_heads, n_kv, head_dim, cap, window, kv_f16)) or {}).get("ns") or {}
    timed = sorted((c for c in attention_candidates(dev, n_heads, n_kv, head_dim, cap) if c.name in ns),
                   key=lambda c: ns[c.name])
    out = timed[:k]
    for c in timed[k:]:
        if c.variant not in {o.variant for o in out} and ns[c.name] <= 2 * ns[timed[0].name]:
            out.append(c)
    return out


def attention_steps(dev: Device, key: str, build, cands: list, positions: list, enabled=FORCE) -> AttnChoice:
    """The decode attention kernel of a model chosen on whole decode steps: build(c, step) ->
    the decode program with attention kernel c (models/program.py Program, unbound; `step`: a
    one-token Step uniform) for each candidate (attention_ranking's), each step timed whole at
    each of `positions` (_time_programs), the least total kept; cached under key (the model's
    shapes, formats and cache rows). Timings of each attention kernel alone after an L2 flush
    (choose_attention) can rank differently from the step: H100, 2026-11-25, a kernel that timed
    46 against 114 us decoded the 1B 11% slower (docs/BENCHMARKS.md, session 21). The first
    candidate where there is nothing to time (fewer than two, or no whole-pass timestamps)."""
    if len(cands) < 2 or not dev.can_time_sync:
        return cands[0]
    by_name = {c.name: c for c in cands}
    got = _decide(dev, f"{key_prefix(dev)}attnstep3|{key}", enabled,
                  lambda: _time_programs(dev, lambda name, step: build(by_name[name], step), [c.name for c in cands],
                                         positions),
                  {"best": cands[0].name})
    return by_name.get(got["best"], cands[0])


# the split attention's `adapt` candidates: at most this many partials a row, each workgroup
# taking as many 16- or 32-key chunks as that needs (a deep context's combine then reads a few
# dozen partials, not hundreds; a short one keeps a chunk per workgroup)
ADAPT_PARTIALS = (32, 64)
TILED_SPLITS = (8, 16, 32, 64)   # the tiled attention's partials a row (its workgroups: that times KV heads)
# the most partials a row the tiled attention merges itself (AttnChoice.fused) as a whole-step
# candidate: on an H100 (2026-11-25, docs/BENCHMARKS.md session 23) the merge of 16 decoded the
# 1B 1-2% faster than the same kernel with its combine dispatch, the merge of 32 1-3.5% slower
MERGE_MOST = 16


def attention_candidates(dev: Device, n_heads: int, n_kv: int, head_dim: int, cap: int) -> list[AttnChoice]:
    """The decode attention kernels a shape can use: per-head always; grouped where a KV head
    serves 2 .. MAX_GQA query heads; split (each chunk length, V prefetched or not; 16- and
    32-key chunks also several a workgroup, ADAPT_PARTIALS) up to MAX_GQA with subgroups; tiled
    (TILED_SPLITS partials a row) where AttentionKernel.tiled_supported."""
    group = n_heads // n_kv
    cands = [AttnChoice()]
    if 1 < group <= AttentionKernel.MAX_GQA:
        cands.append(AttnChoice("grouped"))
    if group <= AttentionKernel.MAX_GQA and dev.has_subgroups:
        cands += [AttnChoice("split", c, pf) for c in AttentionKernel.SPLIT_CHUNKS for pf in (False, True)]
        cands += [AttnChoice("split", c, False, a) for c in (16, 32) for a in ADAPT_PARTIALS]
    if group <= AttentionKernel.MAX_GQA and AttentionKernel.tiled_supported(dev, head_dim, cap):
        cands += [AttnChoice("tiled", AttentionKernel.TILE, False, n) for n in TILED_SPLITS]
    return cands


def _measure_attention(dev: Device, n_heads, n_kv, head_dim, cap, k_cache, v_cache, window, cands, kv_f16=False):
    group = n_heads // n_kv
    q = TensorDesc("q", head_dim, group, b=n_kv)
    out = TensorDesc("o", n_heads * head_dim)
    steps = [_step_buffer(dev, min(cap, ctx) - 1) for ctx in sorted({min(cap, 1024), min(cap, 4096)})]
    qb = dev.create_buffer(q.nbytes, label="tune.q")
    ob = dev.create_buffer(out.nbytes, label="tune.o")
    times, built = {}, []
    try:
        for c in cands:   # every candidate built before the first is timed (as _fastest)
            try:
                k = AttentionKernel(dev, q, n_heads, n_kv, head_dim, cap, group, 0.125, window, variant=c.variant,
                                    chunk=c.chunk or 32, prefetch_v=c.prefetch_v, adapt=c.adapt, kv_f16=kv_f16)
                comb = AttentionCombineKernel(dev, out, n_heads, n_kv, head_dim, k.nsplit, group)
                yield CHECK
            except (GPUError, UnsupportedModelError):
                continue
            built.append((c, k, comb))
        for c, k, comb in built:
            pb = None
            try:
                pb = dev.create_buffer(n_kv * group * k.nsplit * (head_dim + 2) * 4, label="tune.part")
                t = 0
                for sb in steps:
                    t += yield from _time(dev, k.dispatch({"step": sb, "q": qb, "kc": k_cache, "vc": v_cache,
                                                           "part": pb}, k.workgroups(1)))
                    t += yield from _time(dev, comb.dispatch({"step": sb, "part": pb, "out": ob}, comb.workgroups(1)))
                times[c.name] = t
            except (GPUError, UnsupportedModelError):
                continue
            finally:
                if pb is not None:
                    dev.release_buffer(pb)
    finally:
        for b in (*steps, qb, ob):
            dev.release_buffer(b)
    best = min(cands, key=lambda c: times.get(c.name, float("inf")))
    return best._asdict() | {"ns": times}


def static_choice(dev: Device, int8: bool = False) -> GemvVariant:
    """The decode GEMV variant of an adapter kind, where none is measured."""
    if int8:
        return GemvVariant("blk", rows=4, wg=64)
    if dev.info.is_cpu:
        return GemvVariant("row", rows=1, wg=64)
    if dev.has_subgroups:
        return GemvVariant("subgroup", rows=8, wg=256)
    return GemvVariant("split", rows=4, wg=64)


def choose_gemv(dev: Device, w, w2=None, enabled=True, int8: bool = False, siblings=None) -> GemvVariant:
    """The fastest decode GEMV configuration for weight w (and w2 when gate/up are fused);
    int8: among the integer-dot variants (input quantized by QuantizeKernel). siblings: the
    (w, w2) of this role in the model's layers, w's first (models/forward.py): the CHAIN_TOP
    fastest alone are timed again in a chain over CHAIN_LAYERS of them and the fastest there
    kept (_chain_best; cached apart from the choices timed alone)."""
    sib = chained(dev, siblings)
    key = _gemv_key(dev, w, w2, int8) + (f"|ch{len(sib)}" if sib else "")
    return GemvVariant(**_decide(dev, key, enabled, lambda: _search(dev, w, w2, int8, sib),
                                 _as_dict(static_choice(dev, int8))))


QOUT_STATIC = GemvVariant("blk", rows=32, wg=256, rps=4)
COLS_MAX = 8          # token rows per workgroup of the integer-dot GEMV in a several-row program
COLS_ACC = 32         # accumulators per invocation (rows x cols x 2 with gate/up) at most
COLS_RED = 4096       # floats of workgroup memory for the sums without subgroups (16 KiB)


def blk_cols(v: GemvVariant, tokens: int, dual: bool, qout: bool = False, subgroups: bool = True) -> GemvVariant:
    """The integer-dot variant v for a decode program of `tokens` rows per step (the streams:
    MAX_STREAMS; a prefill over decode kernels: its chunk): NCOL = tokens rounded up to a power of
    two, at most COLS_MAX, each weight block read once for NCOL rows. A static rule: a column's
    sums are the one-row kernel's whatever the rows per workgroup, so rows (down to 2, keeping
    the RoPE epilogue's pairs) or, with the quantizing epilogue, RPS (down to 1) are halved to
    keep COLS_ACC accumulators; without subgroups NCOL is halved until the sums fit COLS_RED; a
    last-workgroup quantizing variant (qlast: one column) becomes QOUT_STATIC's several-column form.
    One-row programs and the float variants: v unchanged (the one-row kernel)."""
    if v.variant != "blk" or tokens <= 1:
        return v
    cols, per = min(COLS_MAX, 1 << (tokens - 1).bit_length()), 2 if dual else 1
    if qout:   # the quantizing epilogue (its rows: one int8 block; qlast's is one column only)
        v = QOUT_STATIC if v.qlast else v
        rps = v.rps
        while rps > 1 and rps * cols * per > COLS_ACC:
            rps //= 2
        return replace(v, rps=rps, cols=cols)
    rows = v.rows
    while rows > 2 and rows * cols * per > COLS_ACC:
        rows //= 2
    while not subgroups and cols > 1 and rows * cols * per * v.wg > COLS_RED:
        cols //= 2
    return replace(v, rows=rows, cols=cols)


CONFIRM_COLS = 3      # choose_cols: its fastest candidates timed twice (_fastest's confirm)
COLS_FLOATS = 160     # float GEMVs: accumulators + live input floats per lane, all columns, at most
KS_RED_FLOATS = 4096  # split-K wide GEMVs: their sums' workgroup memory, all columns (16 KiB, WebGPU's minimum)


def gemv_cols(v: GemvVariant, tokens: int, dual: bool, qout: bool = False, subgroups: bool = True,
              fmt: str = "f16") -> GemvVariant:
    """The decode GEMV variant v for a program of `tokens` rows per step: blk_cols for the
    integer-dot variant; the subgroup and wide float variants (forward.py keeps one column where
    one carries the RoPE epilogue) take NCOL = tokens rounded up to a power of two, at most
    COLS_MAX, halved until the lane's accumulators (unroll 4 and mrows count, gate/up doubles) fit
    COLS_ACC, its accumulators plus live input floats (a wide block of fmt per chain) fit
    COLS_FLOATS and (split K) its sums in workgroup memory fit KS_RED_FLOATS. A column's sums are
    the one-row kernel's whatever NCOL; split / row and one-row programs: v unchanged."""
    if v.variant == "blk":
        return blk_cols(v, tokens, dual, qout, subgroups)
    if v.variant not in ("subgroup", "wide") or tokens <= 1:
        return v
    if v.ksplit:   # several strides at a time is a one-column form of split K
        v = replace(v, unroll=1)
    chains = 4 if v.unroll == 4 else 1
    acc = chains * v.mrows * (2 if dual else 1)
    xf = chains * 4 * (wide_slices(fmt) if v.variant == "wide" else 1)
    cols = min(COLS_MAX, 1 << (tokens - 1).bit_length())
    # split K: each column's sums also pass through workgroup memory
    red = ks_red_floats(v.wg, v.mrows * (2 if dual else 1)) if v.ksplit else 0
    while cols > 1 and (cols * acc > COLS_ACC or cols * (acc + xf) > COLS_FLOATS or cols * red > KS_RED_FLOATS):
        cols //= 2
    return replace(v, cols=cols)


def choose_qout(dev: Device, w, w2=None, enabled=True, siblings=None) -> GemvVariant:
    """The fastest quantizing-epilogue configuration (variant "blk", 32 rows, its wg and rps)
    for weight w, timed like choose_gemv (siblings: as there)."""
    sib = chained(dev, siblings)
    key = _qout_key(dev, w, w2) + (f"|ch{len(sib)}" if sib else "")
    return GemvVariant(**_decide(dev, key, enabled, lambda: _search_qout(dev, w, w2, sib), _as_dict(QOUT_STATIC)))


def _fastest(dev: Device, cands, build, binds: dict, t: int, errors=(GPUError, UnsupportedModelError, ValueError),
             confirm: int = 0, siblings: list | None = None):
    """The fastest of `cands` (a generator, driven like every measurement): build(cand) makes the
    kernel (a candidate this adapter or weight cannot run raises one of `errors`, or fails to
    compile, and is skipped), each dispatched on `binds` over t token rows and timed; confirm:
    the `confirm` fastest are timed once more and each keeps its better time (one slow timing
    cannot decide a long candidate list). Every candidate is built before the first is timed:
    compiling between timings left the GPU idle for a driver's compile time each (hundreds of ms
    with a cold shader cache), and on an H100 the first process of a fresh machine timed small
    kernels 1.5-4x slow, its later processes, compiling from the cache, not (2026-11-25).
    siblings (a decode GEMV's: `chained`): the CHAIN_TOP fastest are timed again in a chain over
    those weights and the fastest there is kept (_chain_best).
    Returns (the fastest candidate or None, its GPU ns alone or None)."""
    built = []     # (candidate, kernel, dispatch)
    for cand in cands:
        try:
            k = build(cand)
            yield CHECK
        except errors:
            continue
        built.append((cand, k, k.dispatch(_declared(k, binds), k.workgroups(t))))
    timed = []     # (ns, order, candidate, kernel, dispatch)
    for cand, k, d in built:
        ns = yield from _time(dev, d)
        if ns > 0:
            timed.append((ns, len(timed), cand, k, d))
    timed.sort(key=lambda r: r[:2])
    for i, (ns, order, cand, k, d) in enumerate(timed[:confirm]):
        again = yield from _time(dev, d)
        timed[i] = (min(ns, again) if again > 0 else ns, order, cand, k, d)
    timed.sort(key=lambda r: r[:2])
    if not timed:
        return None, None
    if not siblings:
        return timed[0][2], timed[0][0]
    best = yield from _chain_best(dev, [(cand, k) for _, _, cand, k, _ in timed[:CHAIN_TOP]], binds, siblings, t)
    return best, next(ns for ns, _, cand, _, _ in timed if cand == best)


CHAIN_LAYERS = 8   # a decode GEMV's candidates re-timed in a chain over this many layers' weights of its role
CHAIN_TOP = 4      # ... the fastest this many of them timed alone


def _chain_best(dev: Device, ranked: list, binds: dict, siblings: list, t: int):
    """Of `ranked` (candidate, kernel), fastest alone first: the one whose chain of dispatches
    over the `siblings` weights ((w, w2 or None) of consecutive layers of one role), run back to
    back in one pass after an L2 flush (_time_seq), takes the least time; the first where none
    ran. Timed alone, a kernel's start and end weigh more than in the decode step, where each
    layer's GEMV follows the one before: on an H200 the 8B f16 gate/up the tuner picked alone
    ran 67.1 us a layer in the engine's own chain where another candidate ran 61.0, and the 8B
    q4_0 int8 chain's picks 0.5-1 us behind the chain's best (2026-11-29, docs/BENCHMARKS.md
    session 35)."""
    best, best_ns = ranked[0][0], None
    for cand, k in ranked:
        try:
            ds = [k.dispatch(_declared(k, {**binds, **_weights(sw, sw2)}), k.workgroups(t)) for sw, sw2 in siblings]
            ns = yield from _time_seq(dev, ds)
        except (GPUError, UnsupportedModelError, ValueError):
            continue
        if ns > 0 and (best_ns is None or ns < best_ns):
            best, best_ns = cand, ns
    return best


def chained(dev: Device, siblings) -> list | None:
    """The sibling weights a decode GEMV choice is re-timed over (_chain_best), or None: fewer
    than two, or no whole-pass timestamps (browsers: a chain there is timed as its dispatches
    alone, no new information)."""
    ok = siblings and len(siblings) >= 2 and CHAIN_LAYERS >= 2 and dev.can_time_sync
    return list(siblings[:CHAIN_LAYERS]) if ok else None


def _declared(k, binds: dict) -> dict:
    """The bindings of `binds` kernel k declares (candidates of one search declare different ones)."""
    return {n: b for n, b in binds.items() if n in k.binding_names}


def _qout_buffers(dev: Device, w, t: int = 1) -> dict:
    """Scratch bindings of a quantizing-epilogue GEMV of weight w over t rows: its int8 rows, the
    next norm's weight and the last-workgroup form's outputs and counters (each kernel is given
    the ones it declares: _fastest)."""
    qy, qcnt = qlast_bytes(w.o, t)
    return {"qout": dev.create_buffer(xq_desc("q", w.o, t).nbytes, label="tune.q"),
            "qnw": dev.create_buffer(4 * w.o, label="tune.nw"), "qy": dev.create_buffer(qy, label="tune.qy"),
            "qcnt": dev.create_buffer(qcnt, label="tune.qcnt")}


def _search_qout(dev: Device, w, w2, siblings=None):
    x, y, q = xq_desc("x", w.i, 1), TensorDesc("y", w.o, 1), xq_desc("q", w.o, 1)
    bufs = {"x": dev.create_buffer(x.nbytes, label="tune"), "y": dev.create_buffer(y.nbytes, label="tune"),
            "step": _step_buffer(dev), **_qout_buffers(dev, w)}
    limit = int(dev.info.limits.get("max-compute-invocations-per-workgroup", 256))
    try:
        best, _ = yield from _fastest(
            dev, [c for c in QOUT_CANDIDATES + QLAST_CANDIDATES if c.wg <= limit],
            lambda c: LinearKernel(dev, "decode", x, y, w, w2, variant=c,
                                   epilogue=Epilogue(qout=QuantOut(q, w.fmt, 0.0, True))),
            {**bufs, **_weights(w, w2)}, 1, siblings=siblings)
    finally:
        for b in bufs.values():
            dev.release_buffer(b)
    return _as_dict(best or QOUT_STATIC)


def choose_cols(dev: Device, w, w2, v: GemvVariant, tokens: int, qout: bool = False, enabled=True) -> GemvVariant:
    """The decode GEMV variant v (the one-row choice) for a program of `tokens` rows per step:
    gemv_cols's static rule, or, where the adapter is tuned, the fastest of the one-row kernel and
    the K-column forms for 4 and for `tokens` rows, timed over min(tokens, 2 COLS_MAX) rows
    (cached per shape, variant and row count). Every candidate sums a row in the same order, so
    the choice changes the speed only, never a stream's tokens."""
    dual, sub = w2 is not None, dev.has_subgroups
    cands = cols_candidates(v, tokens, dual, qout, sub, w.fmt)
    static = cands[0]
    if static == v:
        return v
    key = (f"{key_prefix(dev)}gemv_cols|{w.fmt}|{w.o}|{w.i}|{int(dual)}|{int(qout)}|{tokens}|"
           + ",".join(f"{k}={x}" for k, x in sorted(_as_dict(v).items())))
    return GemvVariant(**_decide(dev, key, enabled, lambda: _search_cols(dev, w, w2, cands, min(tokens, 2 * COLS_MAX), qout),
                                 _as_dict(static)))


def cols_candidates(v: GemvVariant, tokens: int, dual: bool, qout: bool, subgroups: bool,
                    fmt: str) -> list[GemvVariant]:
    """choose_cols's candidates, the static rule's first: for the integer-dot GEMV, v and every
    one-row candidate of its kind (QOUT_CANDIDATES with the quantizing epilogue, else
    BLK_CANDIDATES) at each power-of-two column count from 2 to the static NCOL (blk_cols caps
    their accumulators), then the one-row kernel v. The fastest differ by shape and row count
    (H100, 2026-11-24, scripts/streams_gemv.py, 1B q4 at 4 / 8 rows: gate/up 128 x 4 columns,
    down 256 x 2, LM head 32 x 8, QKV one column; the static rule's was up to 1.5x slower).
    The float variants: the static rule, its 4-column form and v."""
    static = gemv_cols(v, tokens, dual, qout, subgroups, fmt)
    if v.variant != "blk":
        return list(dict.fromkeys([static, gemv_cols(v, min(tokens, 4), dual, qout, subgroups, fmt), v]))
    counts = [c for c in (2, 4, 8, 16) if c <= static.cols]
    kinds = [v, *(QOUT_CANDIDATES if qout else BLK_CANDIDATES)]   # (qlast ones: one column only, skipped)
    return list(dict.fromkeys([static, *(blk_cols(k, c, dual, qout, subgroups) for c in counts for k in kinds), v]))


def _search_cols(dev: Device, w, w2, cands: list, t: int, qout: bool):
    i8 = cands[0].variant == "blk"
    x = xq_desc("x", w.i, t) if i8 else TensorDesc("x", w.i, t)
    y, q = TensorDesc("y", w.o, t), xq_desc("q", w.o, t)
    bufs = {"step": _step_buffer(dev, tokens=t), "x": dev.create_buffer(x.nbytes, label="tune"),
            "y": dev.create_buffer(y.nbytes, label="tune")} | (_qout_buffers(dev, w, t) if qout else {})
    try:
        best, _ = yield from _fastest(
            dev, cands,
            lambda c: LinearKernel(dev, "decode", x, y, w, w2, variant=c,
                                   epilogue=Epilogue(qout=QuantOut(q, w.fmt, 0.0, True) if qout else None)),
            {**bufs, **_weights(w, w2)}, t, confirm=CONFIRM_COLS)
    finally:
        for b in bufs.values():
            dev.release_buffer(b)
    return _as_dict(best or cands[0])


def chain_pays(dev: Device, key: str, build, pos: int, enabled=FORCE) -> dict:
    """Whether a model's int8 chain (each layer GEMV writing the next one's int8 row) beats its
    decode step with separate quantize dispatches on this adapter. build(chain, step) -> the
    decode program of each (models/program.py Program, unbound; `step`: the Step uniform of a
    one-token step at position pos); both are bound to one scratch arena and each whole step is
    timed back to back in one pass (_time_seq), twice each, alternately. Timing each layer GEMV
    with its quantize dispatch against the quantizing GEMV instead came out level on an H100 where
    the chain decoded the 1B q4 9% faster (and the 8B q4 1% slower), choosing the chain in 1 of 7
    decisions on fresh tuner caches; whole steps timed this way ranked the two as their decode speeds did (1B q4 /
    q8, 3B q4: chain, +7-13%), but for the 8B q4, within 2%, not reliably (2026-11-25,
    docs/BENCHMARKS.md session 21). Needs whole-pass timestamps (synchronous timing): elsewhere,
    e.g. browsers, the chain. Cached under key (the model's shapes and formats, choices.chain_key).
    Returns {"separate_ns", "chained_ns", "chain"}."""
    static = {"separate_ns": None, "chained_ns": None, "chain": True}
    if not dev.can_time_sync:
        return static
    return _decide(dev, f"{key_prefix(dev)}chain3|{key}", enabled, lambda: _measure_chain(dev, build, pos), static)


def _measure_chain(dev: Device, build, pos: int):
    got = yield from _time_programs(dev, build, [True, False], [pos])
    ns = got["ns"]
    if not ns:
        return {"separate_ns": None, "chained_ns": None, "chain": False}
    return {"separate_ns": ns[False], "chained_ns": ns[True], "chain": ns[True] < ns[False]}


def _time_programs(dev: Device, make, variants: list, positions: list):
    """GPU ns of a decode step of each variant's program (make(v, step) -> an unbound Program over
    the Step uniform `step`), summed over the step `positions`: all bound to one
    scratch arena and compiled before the first timing, each whole step timed back to back in one
    pass (_time_seq), twice each, alternately. {"ns": {variant: ns}, "best": the fastest};
    {"ns": {}, "best": variants[0]} where one failed to build or run."""
    sb = _step_buffer(dev, positions[0])
    arena = None
    try:
        progs = [make(v, sb) for v in variants]
        arena = dev.create_buffer(max(p.arena_bytes for p in progs), label="tune.arena")
        for p in progs:
            p.bind(arena)
        steps = [p.dispatches(1) for p in progs]   # every kernel compiled before the first timing
        yield CHECK
        ns = dict.fromkeys(variants, 0)
        for pos in positions:
            dev.write_buffer(sb, pack_step(1, pos))
            best = {}
            for _ in range(2):
                for v, ds in zip(variants, steps):
                    t = yield from _time_seq(dev, ds)
                    best[v] = min(best.get(v, t), t)
            for v in variants:
                ns[v] += best[v]
    except (GPUError, UnsupportedModelError, ValueError):
        return {"ns": {}, "best": variants[0]}
    finally:
        for b in (sb, arena):
            if b is not None:
                dev.release_buffer(b)
    return {"ns": ns, "best": min(variants, key=lambda v: ns[v])}


def _search(dev: Device, w, w2, int8: bool, siblings=None):
    best, _ = yield from _search_timed(dev, w, w2, int8, siblings)
    return _as_dict(best)


def _search_timed(dev: Device, w, w2, int8: bool, siblings=None):
    """The fastest decode GEMV candidate for w (and w2) and its GPU ns alone (None: none ran);
    siblings: the fastest in a chain over them among the CHAIN_TOP fastest alone (_fastest)."""
    x = xq_desc("x", w.i, 1) if int8 else TensorDesc("x", w.i, 1)
    y = TensorDesc("y", w.o, 1)
    xb, yb = dev.create_buffer(x.nbytes, label="tune.x"), dev.create_buffer(y.nbytes, label="tune.y")
    sb = _step_buffer(dev)
    wide_ok = wide_supported(w.fmt, w.i, w.layout) and (w2 is None or wide_supported(w2.fmt, w2.i, w2.layout))
    # (and those whose workgroup count the adapter refuses: few rows per workgroup of an LM head)
    cands = [c for c in (BLK_CANDIDATES if int8 else CANDIDATES)
             if (c.variant not in ("subgroup", "wide") or dev.has_subgroups) and (c.variant != "wide" or wide_ok)
             and ceil_div(w.o, c.wg if c.variant == "row" else c.rows) <= dev.max_workgroups]
    try:
        best, best_ns = yield from _fastest(dev, cands, lambda c: LinearKernel(dev, "decode", x, y, w, w2, variant=c),
                                            {"step": sb, "x": xb, "y": yb, **_weights(w, w2)}, 1,
                                            errors=(GPUError, UnsupportedModelError), siblings=siblings)
    finally:
        for b in (xb, yb, sb):
            dev.release_buffer(b)
    return best or static_choice(dev, int8), best_ns


# -- the prefill GEMMs -------------------------------------------------------------------------------

def gemm_candidates(dev: Device, w, w2=None, int8: bool = False) -> list[GemmVariant]:
    """The GEMM configurations this adapter runs for weight w (and w2), the static preference first."""
    if int8:
        cands = GEMM_I8_CANDIDATES
    else:
        f16 = w.fmt == "f16" and (w2 is None or w2.fmt == "f16")
        cands = (GEMM_F16_CANDIDATES if f16 else ()) + GEMM_CANDIDATES + tuple(
            c for c in GEMM_MMA_CANDIDATES if c.takes_weights(w, w2)
            and (w2 is None or c.tm * c.tn <= MMA_DUAL_RESULTS))
    return [c for c in cands if c.fits(dev, w2 is not None)]


def static_gemm(dev: Device, w, w2=None, int8: bool = False) -> GemmVariant:
    """The prefill GEMM where none is measured: software adapters the fallback 64 x 64 tile
    (tests pin it), GPUs the first candidate that fits."""
    cands = gemm_candidates(dev, w, w2, int8)
    fallback = (GEMM_I8_CANDIDATES if int8 else GEMM_CANDIDATES)[-1]
    if dev.info.is_cpu or not cands:
        return fallback
    return cands[0]


def _gemm_key(dev: Device, w, w2, int8: bool, rows: int = GEMM_TUNE_ROWS) -> str:
    return (f"{key_prefix(dev)}gemm|{w.fmt}|{w.o}|{w.i}|{int(w2 is not None)}"
            f"{'|int8' if int8 else ''}{'' if layout_name(w) == 'OI' else '|' + layout_name(w)}"
            f"{'' if rows == GEMM_TUNE_ROWS else f'|r{rows}'}")


def choose_gemm(dev: Device, w, w2=None, enabled=True, int8: bool = False, rows: int = GEMM_TUNE_ROWS) -> GemmVariant:
    """The fastest prefill GEMM configuration for weight w (and w2: gate/up), timed on `rows`
    tokens with the real weights like choose_gemv; int8: the integer-dot GEMM. The best tile
    depends on the rows: on the 1B q4 shapes (H200, 2026-11-29) the 1024-row winners of O and
    down took 1.6x and 2.7x the 256-row winners' time at 256 rows, the 256-row winners 1.13x and
    1.06x the 1024-row ones' at 1024 rows; on the 8B f16 ones through Dawn (session 32) the
    256-row winners (64 x 64 matrix-unit tiles) ran 90-102 TFLOP/s at 1024 rows where 128 x 128
    tiles ran 119-139. So a prefill program takes this at GEMM_TUNE_ROWS and at its chunk
    (models/forward.py, Linear.large; large_gemm_rows), each for the token buckets nearer to it."""
    static = asdict(static_gemm(dev, w, w2, int8))
    got = _decide(dev, _gemm_key(dev, w, w2, int8, rows), enabled, lambda: _search_gemm(dev, w, w2, int8, rows),
                  static)
    try:
        return GemmVariant(**{k: v for k, v in got.items() if not k.endswith("_ns")})
    except TypeError:      # a cache entry of another version
        return GemmVariant(**static)


def gemm_int8_pays(dev: Device, w, w2=None, enabled=FORCE, static: bool = True, rows: int = GEMM_TUNE_ROWS,
                   normed: bool = False) -> dict:
    """Time one layer's prefill GEMM both ways over `rows` tokens (the prefill chunk): the best
    float tile against QuantizeKernel + the best int8 tile (the tiles chosen at `rows`,
    choose_gemm), the two sides timed in turn twice and each side's faster run kept (timed once
    each, the choice at 1024 rows once put an 8B q4 Q|K|V on the float GEMM, which takes 1.8x
    the int8 one's time there; H200, 2026-11-29, cause of that timing not isolated); normed (QKV,
    gate/up: the norm is fused in the int8 side's quantize): the float GEMM reads a normed input
    (forward.py's Norm op before it), so that RMSNorm pass counts on the float side. Returns
    {"float_ns", "int8_ns", "int8"}; cached; `static` while unmeasured (asynchronous timing).
    Measured whenever called (enabled FORCE): models/choices.py calls it only where the adapter is
    tuned."""
    key = (f"{key_prefix(dev)}gemm_int8_pays5|{w.fmt}|{w.o}|{w.i}|{int(w2 is not None)}|"
           f"{rows}|{int(normed)}")
    return _decide(dev, key, enabled, lambda: _measure_gemm_int8(dev, w, w2, rows, normed),
                   {"float_ns": None, "int8_ns": None, "int8": static})


def _measure_gemm_int8(dev: Device, w, w2, rows: int, normed: bool):
    f = yield from _sub(_gemm_key(dev, w, w2, False, rows), lambda: _search_gemm(dev, w, w2, False, rows))
    q = yield from _sub(_gemm_key(dev, w, w2, True, rows), lambda: _search_gemm(dev, w, w2, True, rows))
    if not f.get("best_ns") or not q.get("best_ns"):
        return {"float_ns": f.get("best_ns"), "int8_ns": q.get("best_ns"), "int8": bool(q.get("best_ns"))}
    fv, qv = (GemmVariant(**{k: v for k, v in c.items() if not k.endswith("_ns")}) for c in (f, q))
    x, xq, y = TensorDesc("x", w.i, rows), xq_desc("xq", w.i, rows), TensorDesc("y", w.o, rows)
    if y.nbytes > dev.max_binding_size:
        return {"float_ns": None, "int8_ns": None, "int8": True}
    bufs = [dev.create_buffer(d.nbytes, label="tune") for d in (x, xq, y, x)] + [dev.create_buffer(4 * w.i)]
    xb, qb, yb, nb, wb = bufs
    sb = _step_buffer(dev, tokens=rows)
    ws = _weights(w, w2)
    errors = (GPUError, UnsupportedModelError, ValueError)
    try:
        try:     # the int8 side: its quantize dispatch and GEMM (where either cannot run: float)
            qk = QuantizeKernel(dev, x, xq, w.fmt)
            ik = LinearKernel(dev, "prefill", xq, y, w, w2, variant=qv)
            yield CHECK
            int8_side = [qk.dispatch({"step": sb, "x": xb, "xq": qb}, qk.workgroups(rows)),
                         ik.dispatch({"step": sb, "x": qb, "y": yb, **ws}, ik.workgroups(rows))]
        except errors:
            return {"float_ns": None, "int8_ns": None, "int8": False}
        try:     # the float side, with the Norm pass of a normed role
            fk = LinearKernel(dev, "prefill", x, y, w, w2, variant=fv)
            nk = RMSNormKernel(dev, x, x, 1e-5) if normed else None
            yield CHECK
            float_side = [fk.dispatch({"step": sb, "x": xb, "y": yb, **ws}, fk.workgroups(rows))]
            if nk is not None:
                float_side.append(nk.dispatch({"step": sb, "x": xb, "out": nb, "w": wb}, nk.workgroups(rows)))
        except errors:
            float_side = None
        t_i = t_f = None
        for _ in range(2):
            t = yield from _time_each(dev, int8_side)
            t_i = t if t_i is None else min(t_i, t)
            if float_side is not None:
                t = HOST_NS_PER_DISPATCH * (len(float_side) - 1) + (yield from _time_each(dev, float_side))
                t_f = t if t_f is None else min(t_f, t)
        if t_f is None:
            return {"float_ns": None, "int8_ns": t_i, "int8": True}
    finally:
        for b in bufs + [sb]:
            dev.release_buffer(b)
    return {"float_ns": t_f, "int8_ns": t_i, "int8": t_i + HOST_NS_PER_DISPATCH < t_f}


def _search_gemm(dev: Device, w, w2, int8: bool, rows: int = GEMM_TUNE_ROWS):
    """The fastest GEMM candidate's fields over `rows` tokens, with its GPU ns as "best_ns" (None:
    none ran)."""
    x = xq_desc("x", w.i, rows) if int8 else TensorDesc("x", w.i, rows)
    y = TensorDesc("y", w.o, rows)
    if y.nbytes > dev.max_binding_size:     # e.g. a large vocabulary's LM head: not timed
        return {**asdict(static_gemm(dev, w, w2, int8)), "best_ns": None}
    xb, yb = dev.create_buffer(x.nbytes, label="tune.x"), dev.create_buffer(y.nbytes, label="tune.y")
    sb = _step_buffer(dev, tokens=rows)
    try:
        best, best_ns = yield from _fastest(dev, gemm_candidates(dev, w, w2, int8),
                                            lambda c: LinearKernel(dev, "prefill", x, y, w, w2, variant=c),
                                            {"step": sb, "x": xb, "y": yb, **_weights(w, w2)}, rows)
    finally:
        for b in (xb, yb, sb):
            dev.release_buffer(b)
    return {**asdict(best or static_gemm(dev, w, w2, int8)), "best_ns": best_ns}


# ML Drift's weight-layout search for the float formats: the orders a float weight may be stored
# in (tensor/weight_layout.py); q4 / q8 have one block layout
LAYOUTS = ("OI", "OI4O4")
LAYOUT_PROXY_ROWS = 4096


def layout_name(w) -> str:
    from ..tensor.weight_layout import NAMED_ORDERS
    if w.layout is None:
        return "OI"
    return next((n for n, order in NAMED_ORDERS.items() if order == w.layout.order), "custom")


def choose_layout(dev: Device, fmt: str, o: int, i: int, enabled=True) -> str:
    """The WeightLayout a float (f32 / f16) weight of shape (o, i) is converted into at load:
    each candidate order is timed with its fastest decode GEMV variant on a scratch weight of
    min(o, 4096) rows, and the fastest kept per adapter and shape (cached like the kernel
    choices). q4 / q8 have one layout; unmeasured (browser until tuned: the tuned layout applies
    from the next load, when weights are converted) and software adapters keep "OI" (row-major,
    which the wide variant needs)."""
    if fmt not in ("f32", "f16"):
        return "OI"
    key = f"{key_prefix(dev)}layout|{fmt}|{o}|{i}"
    return _decide(dev, key, enabled, lambda: _measure_layout(dev, fmt, o, i), {"layout": "OI"})["layout"]


def _measure_layout(dev: Device, fmt: str, o: int, i: int):
    from .convert import allocate_weight
    out = {}
    for name in LAYOUTS:
        w = allocate_weight(dev, f"tune.{name}", fmt, min(o, LAYOUT_PROXY_ROWS), i, name)
        try:
            _, ns = yield from _search_timed(dev, w, None, False)
        finally:
            for b in w.buffers:
                dev.release_buffer(b)
        out[f"{name}_ns"] = ns
    best = min(LAYOUTS, key=lambda n: out[f"{n}_ns"] or float("inf"))
    return {"layout": best, **out}
