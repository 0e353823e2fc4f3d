"""Time every prefill-GEMM tile candidate (webdrift/kernels/autotune.py: GEMM_CANDIDATES,
GEMM_F16_CANDIDATES, GEMM_I8_CANDIDATES) on one layer's weight shapes of a model preset, desktop
GPU only (wgpu-native, GPU timestamps). For each shape (qkv, o, gate|up, down), kind (float
GEMM; int8 GEMM for q4 / q8 on adapters with dot4I8Packed) and token count it prints the GPU time
of one GEMM, its TFLOP/s (2 x T x O x I, gate|up counted twice) and its % of the compute peak the
kernel's arithmetic runs at (profile/compute.py, measured in the same run: f32 for the float GEMM,
int8 dot for the int8 GEMM; the int8 GEMM's time excludes its quantize dispatch). `*` marks the
fastest candidate, `s` the static rule's choice (what an untimed adapter runs).

    PYTHONPATH=. python scripts/gemm_tiles.py --synthetic llama-3.1-8b --quant q4 --tokens 256,1024 --json tiles.json

Weights are uninitialised buffers of the right format and shape (speed does not depend on the
values). Not part of the package: a measuring aid for the GEMM tiles.
"""

from __future__ import annotations

import argparse
import json

from webdrift.gpu.base import UNIFORM
from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as at
from webdrift.kernels.convert import allocate_weight
from webdrift.kernels.linear import LinearKernel
from webdrift.kernels.quantize import FORMATS as INT8_FORMATS
from webdrift.kernels.quantize import xq_desc
from webdrift.kernels.step import STEP_BYTES, pack_step
from webdrift.profile.compute import ameasure_peaks
from webdrift.runtime.engine import _run
from webdrift.tensor import TensorDesc
from webdrift.weights.synthetic import synthetic_source


def tile_name(v) -> str:
    return f"{v.bm}x{v.bn}/{v.tm}x{v.tn}/k{v.kstep}" + ("/db" if v.double else "") + ("/f16" if v.f16_tiles else "")


def time_gemm(dev, w, w2, variant, t: int) -> int:
    """GPU ns of one prefill GEMM over t tokens (the tuner's timing loop)."""
    x = xq_desc("x", w.i, t) if variant.int8 else TensorDesc("x", w.i, t)
    y = TensorDesc("y", w.o, t)
    bufs = [dev.create_buffer(x.nbytes, label="x"), dev.create_buffer(y.nbytes, label="y")]
    sb = dev.create_buffer(STEP_BYTES, UNIFORM, "step")
    dev.write_buffer(sb, pack_step(t, 0))
    try:
        k = LinearKernel(dev, "prefill", x, y, w, w2, variant=variant)
        wb = {"w": w.buffers} | ({"w2": w2.buffers} if w2 is not None else {})
        d = k.dispatch({"step": sb, "x": bufs[0], "y": bufs[1], **wb}, k.workgroups(t))
        return at._drive_sync(dev, at._time(dev, d))
    finally:
        for b in bufs + [sb]:
            dev.release_buffer(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", default="llama-3.1-8b", help="model preset (weights/synthetic.py PRESETS)")
    ap.add_argument("--quant", default="q4", choices=["f32", "f16", "q8", "q4"])
    ap.add_argument("--tokens", default="256,1024", help="token counts, comma-separated")
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args()
    dev = get_device()
    if not dev.can_time_sync:
        raise SystemExit("needs an adapter with timestamp queries read back synchronously (wgpu-native)")
    if dev.info.is_cpu:
        print("a software adapter: these timings say nothing about GPUs (a smoke run)")
    cfg = synthetic_source(args.synthetic, args.quant).config
    peaks = _run(ameasure_peaks(dev))
    shapes = {"qkv": (cfg.q_dim + 2 * cfg.kv_dim, cfg.dim, False), "o": (cfg.dim, cfg.q_dim, False),
              "gate|up": (cfg.ffn_dim, cfg.dim, True), "down": (cfg.dim, cfg.ffn_dim, False)}
    kinds = [False] + ([True] if args.quant in INT8_FORMATS and dev.has_dp4a else [])
    rows = []
    print(f"{dev.info.adapter}; peaks TFLOP/s: " + ", ".join(f"{k} {v['tflops']}" for k, v in peaks.items()))
    for name, (o, i, dual) in shapes.items():
        w = allocate_weight(dev, "w", args.quant, o, i)
        w2 = allocate_weight(dev, "w2", args.quant, o, i) if dual else None
        for int8 in kinds:
            peak = peaks["int8" if int8 else "f32"]["tflops"]
            static = at.static_gemm(dev, w, w2, int8)
            for t in (int(s) for s in args.tokens.split(",")):
                res = []
                for cand in at.gemm_candidates(dev, w, w2, int8):
                    ns = time_gemm(dev, w, w2, cand, t)
                    tf = 2.0 * t * o * i * (2 if dual else 1) / ns / 1e3
                    res.append({"shape": name, "o": o, "i": i, "tokens": t, "kind": "int8" if int8 else "float",
                                "tile": tile_name(cand), "ns": ns, "tflops": round(tf, 2),
                                "pct_peak": round(100 * tf / peak, 1), "static": cand == static})
                best = min(res, key=lambda r: r["ns"])
                for r in res:
                    r["best"] = r is best
                    print(f"{name:8s} {o:6d}x{i:<6d} T={t:<5d} {r['kind']:5s} {r['tile']:22s} {r['ns'] / 1e3:9.1f} us "
                          f"{r['tflops']:7.2f} TFLOP/s {r['pct_peak']:5.1f}% {'*' if r['best'] else ' '}"
                          f"{'s' if r['static'] else ''}")
                rows += res
        for u in (w, w2):
            for b in (u.buffers if u is not None else []):
                dev.release_buffer(b)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"adapter": dev.info.adapter, "preset": args.synthetic, "quant": args.quant, "peaks": peaks,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
