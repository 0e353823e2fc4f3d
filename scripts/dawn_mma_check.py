"""The matrix-unit prefill GEMM (GemmVariant(mma=True), wgsl/linear_gemm_mma.wgsl) against the SIMT
GEMMs on layer 0 of synthetic models (MODELS: shapes x formats), T random token rows, the QKV, O,
gate/up and down layers (the float GEMMs read a normed input, and O and down add the residual y holds, as in
a model): for every matrix-unit tile the
largest difference relative to the largest output of the float SIMT GEMM (the static tile), and
GPU us per dispatch and TFLOP/s (20 dispatches in one pass, timestamps around the pass, the best
of 3 passes after 0.3 s of the same dispatches to raise the clocks), beside
the static float tile and, for q4 / q8, the static int8 tile (without its quantize dispatch and
norm). It runs in the browser build's Pyodide on an adapter with matrix units, which only Dawn
offers (no local adapter has them):

    node bundle/node_bench.mjs --webgpu DAWN --python scripts/dawn_mma_check.py --json mma.json \\
        --dawn enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia \\
        --dawn disable-dawn-features=timestamp_quantization

(node_bench.mjs runs this file, then `await main()`, and prints the JSON string it returns.) On the
desktop, through Dawn (`--gpu-api dawn`, gpu/dawn.py): `python scripts/dawn_mma_check.py`.
Edit MODELS / T / LAYERS for other cases. Results: docs/BENCHMARKS.md, sessions 12, 13 and 31.
"""
import asyncio
import dataclasses
import json
import random
import struct
import time

from webdrift.errors import GPUError, UnsupportedModelError
from webdrift.gpu.base import TimestampRecorder
from webdrift.kernels.autotune import _step_buffer, gemm_candidates, static_gemm
from webdrift.kernels.linear import Epilogue, LinearKernel
from webdrift.kernels.quantize import xq_desc
from webdrift.models.loader import GPUModel
from webdrift.tensor import TensorDesc
from webdrift.weights.source import expected_tensor_shapes
from webdrift.weights.synthetic import synthetic_source

T = 1024
MODELS = (("llama-3.2-1b", "f16"), ("llama-3.1-8b", "f16"), ("llama-3.2-1b", "q4"), ("llama-3.1-8b", "q4"),
          ("llama-3.1-8b", "q8"))
LAYERS = ("qkv", "o", "gateup", "down")
REPEAT = 20
CANDIDATES = None    # the matrix-unit tiles timed: None for the tuner's (autotune.gemm_candidates)
WARM_S = 0.3


def one_layer(model, fmt):
    """The synthetic model with one layer (its weights and shapes as the full model's)."""
    src = synthetic_source(model, fmt)
    src.config = dataclasses.replace(src.config, n_layers=1)
    names = expected_tensor_shapes(src.config)
    src.tensors = {n: t for n, t in src.tensors.items() if n in names}
    return src


async def run(dev, k, binds, yb, n, y0=None):
    """y after one dispatch (n floats, or None; y0: y's bytes before it, the residual), and GPU ns
    per dispatch over REPEAT in one pass."""
    d = k.dispatch(binds, k.workgroups(T))
    if y0 is not None:
        dev.write_buffer(yb, y0)
    dev.submit([d])
    await dev.check_errors()
    y = struct.unpack(f"<{n}f", await dev.read_buffer(yb, 0, 4 * n)) if n else None
    return y, await time_passes(dev, d, yb)


async def time_passes(dev, d, probe, repeat=REPEAT):
    """GPU ns per dispatch of d: `repeat` dispatches in one pass, timestamps around the pass, the
    best of 3 passes after WARM_S seconds of the same (reading 4 bytes of `probe` after each)."""
    end = time.perf_counter() + WARM_S   # clocks up first (an idle GPU's timings come out slow)
    while time.perf_counter() < end:
        dev.submit([d] * repeat)
        await dev.read_buffer(probe, 0, 4)
    best = None
    for _ in range(3):
        rec = TimestampRecorder(repeat, whole=True)
        dev.submit([d] * repeat, timestamps=rec)
        await dev.read_timestamps(rec)
        a, b = rec.ticks_ns[0]
        best = min(best or b - a, b - a)
    return best / repeat


def tile(c):
    return (f"{c.bm}x{c.bn}/{c.tm}x{c.tn}/k{c.kstep}" + (f"/sg{c.sgm}x{c.sgn}" if c.mma else "")
            + ("/direct" if c.direct else "") + ("/db" if c.double else "") + ("/f16" if c.f16_tiles else ""))


async def layer(dev, rng, name, w, w2):
    x, y = TensorDesc("x", w.i, T), TensorDesc("y", w.o, T)
    xb, yb, sb = dev.create_buffer(x.nbytes), dev.create_buffer(y.nbytes), _step_buffer(dev, tokens=T)
    dev.write_buffer(xb, struct.pack(f"<{x.nbytes // 4}f", *(rng.uniform(-1, 1) for _ in range(x.nbytes // 4))))
    binds = {"step": sb, "x": xb, "y": yb, "w": w.buffers} | ({"w2": w2.buffers} if w2 is not None else {})
    n = T * w.o
    flop = 2 * T * w.i * w.o * (2 if w2 is not None else 1)
    ep = Epilogue(residual=name in ("o", "down"))
    row0 = [rng.uniform(-1, 1) for _ in range(w.o)]     # the residual: one random row, every token's
    y0 = struct.pack(f"<{n}f", *(row0 * T)) if ep.residual else None
    simt = static_gemm(dev, w, w2)
    ref, ref_ns = await run(dev, LinearKernel(dev, "prefill", x, y, w, w2, variant=simt, epilogue=ep), binds, yb, n, y0)
    scale = max(abs(v) for v in ref) or 1.0
    row = {"fmt": w.fmt, "layer": name, "T": T, "o": w.o, "i": w.i, "dual": w2 is not None, "residual": ep.residual,
           "simt": {"tile": tile(simt), "us": round(ref_ns / 1e3, 1), "tflops": round(flop / ref_ns / 1e3, 1)}, "mma": []}
    if w.fmt in ("q4", "q8"):   # the int8 GEMM on int8 rows (zeros: speed only)
        xq = xq_desc("x", w.i, T)
        qb = dev.create_buffer(xq.nbytes)
        i8 = static_gemm(dev, w, w2, int8=True)
        _, ns = await run(dev, LinearKernel(dev, "prefill", xq, y, w, w2, variant=i8), binds | {"x": qb}, yb, 0)
        row["int8"] = {"tile": tile(i8), "us": round(ns / 1e3, 1), "tflops": round(flop / ns / 1e3, 1)}
        dev.release_buffer(qb)
    cands = [c for c in gemm_candidates(dev, w, w2) if c.mma] if CANDIDATES is None else [
        c for c in CANDIDATES if c.fits(dev, w2 is not None) and c.takes_weights(w, w2)]
    for c in cands:
        print("trying", name, tile(c), flush=True)
        try:
            got, ns = await run(dev, LinearKernel(dev, "prefill", x, y, w, w2, variant=c, epilogue=ep), binds, yb, n, y0)
        except (GPUError, UnsupportedModelError, ValueError) as e:   # cannot build or compile: say why
            row["mma"].append({"tile": tile(c), "error": str(e)[:300]})
            continue
        except Exception as e:   # e.g. the device lost: the rows so far stand
            row["mma"].append({"tile": tile(c), "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print("ROW", json.dumps({"model": "?", **row}), flush=True)
            raise
        err = max(abs(a - b) for a, b in zip(got, ref)) / scale
        row["mma"].append({"tile": tile(c), "us": round(ns / 1e3, 1), "tflops": round(flop / ns / 1e3, 1),
                           "max_err_rel": err})
    for b in (xb, yb, sb):
        dev.release_buffer(b)
    return row


async def main(dev=None):
    if dev is None:   # in the browser build
        from webdrift.gpu.browser import create_browser_device
        dev = await create_browser_device()
    out = {"adapter": dev.info.adapter, "has_mma": dev.has_mma_f16, "configs": [list(c) for c in dev.info.matrix_configs],
           "subgroup_sizes": list(dev.info.subgroup_sizes), "limits": {k: v for k, v in dev.info.limits.items()
                                                                       if "workgroup" in k}, "rows": []}
    rng = random.Random(1)
    for model, fmt in MODELS:
        m = GPUModel(dev, one_layer(model, fmt), T, None, None, autotune=False)
        lw = m.layers[0]
        mats = {"qkv": (lw.wqkv, None), "o": (lw.wo, None), "gateup": (lw.w_gate, lw.w_up), "down": (lw.w_down, None)}
        for name in LAYERS:
            out["rows"].append({"model": model, **await layer(dev, rng, name, *mats[name])})
            print("ROW", json.dumps(out["rows"][-1]), flush=True)   # partial results survive a failure
        del m, lw, mats
    return json.dumps(out)


if __name__ == "__main__":   # the desktop, on Dawn
    from webdrift.gpu.native import get_device
    print(asyncio.run(main(get_device("dawn"))))
