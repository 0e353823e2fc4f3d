"""Kernel choice per device and stage, by measurement at first use (ML Drift's adaptive kernel
selection). For each decode GEMV shape (weight format, O, I, fused gate/up) the candidates are
timed with GPU timestamps on the real weight buffers and the fastest is kept; choices are
cached per adapter in memory and, on the desktop, in a JSON file so later loads skip the search.
Without timestamp queries the static choice for the adapter kind is used.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import json
import os

from ..errors import GPUError, UnsupportedModelError
from ..gpu.base import UNIFORM, Device, TimestampRecorder
from ..tensor import TensorDesc
from .step import STEP_BYTES, pack_step
from .weights import wide_supported

CANDIDATES = (
    {"variant": "split", "rows": 4, "wg": 64},
    {"variant": "subgroup", "rows": 8, "wg": 256},
    {"variant": "subgroup", "rows": 32, "wg": 256},
    {"variant": "subgroup", "rows": 8, "wg": 256, "unroll": 4},
    {"variant": "subgroup", "rows": 16, "wg": 128, "unroll": 4},
    {"variant": "row", "rows": 1, "wg": 64},
    {"variant": "wide", "rows": 8, "wg": 256},
    {"variant": "wide", "rows": 32, "wg": 256},
)
# the integer-dot GEMV (int8 activations from QuantizeKernel; q4 / q8 weights)
BLK_CANDIDATES = tuple({"variant": "blk", "rows": r, "wg": w}
                       for r, w in ((2, 32), (4, 32), (2, 64), (4, 64), (8, 64), (2, 128), (4, 128), (4, 256)))
_memory: dict[str, dict] = {}


def _cache_path() -> str | None:
    base = os.environ.get("WEBDRIFT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "webdrift")
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


def static_choice(dev: Device, int8: bool = False) -> dict:
    if int8:
        return {"variant": "blk", "rows": 4, "wg": 64}
    if dev.info.is_cpu:
        return {"variant": "row", "rows": 1, "wg": 64}
    if dev.has_subgroups:
        return {"variant": "subgroup", "rows": 8, "wg": 256}
    return {"variant": "split", "rows": 4, "wg": 64}


def choose_gemv(dev: Device, w, w2=None, enabled: bool = True, int8: bool = False) -> dict:
    """The fastest decode GEMV configuration for weight w (and w2 when gate/up are fused);
    int8: among the integer-dot variants (input quantized by QuantizeKernel)."""
    key = f"{dev.info.adapter}|{dev.info.backend}|gemv|{w.fmt}|{w.o}|{w.i}|{int(w2 is not None)}{'|int8' if int8 else ''}"
    if key in _memory:
        return _memory[key]
    disk = _load_file()
    if key in disk:
        _memory[key] = disk[key]
        return disk[key]
    if not enabled or not dev.has_timestamps or not hasattr(dev, "read_timestamps"):
        return static_choice(dev, int8)
    from . import gemv_blk
    from .ops import LinearKernel
    x = gemv_blk.xq_desc("x", w.i, 1) if int8 else TensorDesc("x", w.i, 1)
    y = TensorDesc("y", w.o, 1)
    xb, yb = dev.create_buffer(x.nbytes, label="tune.x"), dev.create_buffer(y.nbytes, label="tune.y")
    sb = dev.create_buffer(STEP_BYTES, UNIFORM, "tune.step")
    dev.write_buffer(sb, pack_step(1, 0))
    best, best_ns, timings = None, None, {}
    for cand in (BLK_CANDIDATES if int8 else CANDIDATES):
        if cand["variant"] in ("subgroup", "wide") and not dev.has_subgroups:
            continue
        if cand["variant"] == "wide" and not (wide_supported(w.fmt, w.i, w.layout) and
                                              (w2 is None or wide_supported(w2.fmt, w2.i, w2.layout))):
            continue
        try:
            k = LinearKernel(dev, "decode", x, y, w, w2=w2, **cand)
        except (GPUError, UnsupportedModelError):   # a candidate this adapter or weight cannot run
            continue
        d = k.dispatch([sb, xb, yb] + w.buffers + (w2.buffers if w2 else []), k.workgroups(1))
        dev.submit([d] * 8)                              # warm up (and let the clocks rise)
        rec = TimestampRecorder(5)
        dev.submit([d] * 5, timestamps=rec)
        dev.read_timestamps(rec)
        ns = sorted(b - a for a, b in rec.ticks_ns)[2]  # the median
        timings[f"{cand['variant']}/{cand['rows']}/{cand['wg']}/{cand.get('unroll', 1)}"] = ns
        if ns > 0 and (best_ns is None or ns < best_ns):
            best, best_ns = cand, ns
    for b in (xb, yb, sb):
        dev.release_buffer(b)
    best = dict(best or static_choice(dev, int8))
    _memory[key] = best
    p = _cache_path()
    if p:
        disk = _load_file()
        disk[key] = best
        try:
            with open(p + ".tmp", "w") as f:
                json.dump(disk, f, indent=1, sort_keys=True)
            os.replace(p + ".tmp", p)
        except OSError:
            pass
    return best
