"""The matrix-unit prefill GEMM (GemmVariant(mma=True), wgsl/linear_gemm_mma.wgsl) against the SIMT
GEMM on the first layer of synthetic Llama-3.2-1B models (f16, q4), T = 512 random token rows, the
QKV and gate/up layers with their fused RMSNorm: the largest difference relative to the largest
output, and GPU us per dispatch (20 in one pass, timestamps around the pass). It runs in the
browser build's Pyodide on an adapter with matrix units, which only Dawn offers (no local adapter
has them):

    node bundle/node_bench.mjs --webgpu DAWN --python scripts/dawn_mma_check.py --json mma.json \\
        --dawn enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia \\
        --dawn disable-dawn-features=timestamp_quantization

(node_bench.mjs runs this file, then `await main()`, and prints the JSON string it returns.)
Results: docs/BENCHMARKS.md, session 12.
"""
import json
import random
import struct

from webdrift.errors import GPUError, UnsupportedModelError
from webdrift.gpu.base import TimestampRecorder
from webdrift.gpu.browser import create_browser_device
from webdrift.kernels.autotune import GEMM_MMA_CANDIDATES, _step_buffer, static_gemm
from webdrift.kernels.linear import LinearKernel
from webdrift.kernels.norm import PreNorm
from webdrift.models.loader import GPUModel
from webdrift.tensor import TensorDesc
from webdrift.weights.synthetic import synthetic_source

T = 512
MODELS = (("llama-3.2-1b", "f16"), ("llama-3.2-1b", "q4"))


async def run(dev, k, binds, yb, n):
    """y after one dispatch, and GPU ns per dispatch over 20 in one pass."""
    d = k.dispatch(binds, k.workgroups(T))
    dev.submit([d])
    await dev.check_errors()
    y = struct.unpack(f"<{n}f", await dev.read_buffer(yb, 0, 4 * n))
    rec = TimestampRecorder(20, whole=True)
    dev.submit([d] * 20, timestamps=rec)
    await dev.read_timestamps(rec)
    a, b = rec.ticks_ns[0]
    return y, (b - a) / 20


async def layer(dev, rng, name, w, w2):
    x, y = TensorDesc("x", w.i, T), TensorDesc("y", w.o, T)
    xb, yb, sb = dev.create_buffer(x.nbytes), dev.create_buffer(y.nbytes), _step_buffer(dev, tokens=T)
    dev.write_buffer(xb, struct.pack(f"<{x.nbytes // 4}f", *(rng.uniform(-1, 1) for _ in range(x.nbytes // 4))))
    binds = {"step": sb, "x": xb, "y": yb, "w": w.buffers} | ({"w2": w2.buffers} if w2 is not None else {})
    pn = None
    if name != "down":    # the fused RMSNorm, as the model's QKV and gate/up layers have it
        pn = PreNorm(1e-5)
        binds["nw"] = dev.create_buffer(4 * w.i)
        dev.write_buffer(binds["nw"], struct.pack(f"<{w.i}f", *(rng.uniform(0.5, 1.5) for _ in range(w.i))))
    n = T * w.o
    simt = static_gemm(dev, w, w2)
    ref, ref_ns = await run(dev, LinearKernel(dev, "prefill", x, y, w, w2, variant=simt, pre_norm=pn), binds, yb, n)
    scale = max(abs(v) for v in ref) or 1.0
    row = {"fmt": w.fmt, "layer": name, "pre_norm": pn is not None, "o": w.o, "i": w.i,
           "simt_tile": f"{simt.bm}x{simt.bn}/{simt.tm}x{simt.tn}/k{simt.kstep}", "simt_us": round(ref_ns / 1e3, 1),
           "mma": []}
    for c in GEMM_MMA_CANDIDATES:
        tile = f"{c.bm}x{c.bn}/{c.tm}x{c.tn}/k{c.kstep}"
        try:
            got, ns = await run(dev, LinearKernel(dev, "prefill", x, y, w, w2, variant=c, pre_norm=pn), binds, yb, n)
        except (GPUError, UnsupportedModelError, ValueError) as e:   # cannot build or compile: say why
            row["mma"].append({"tile": tile, "error": str(e)[:300]})
            continue
        err = max(abs(a - b) for a, b in zip(got, ref)) / scale
        row["mma"].append({"tile": tile, "us": round(ns / 1e3, 1), "max_err_rel": err})
    for b in (xb, yb, sb, binds.get("nw")):
        if b is not None:
            dev.release_buffer(b)
    return row


async def main():
    dev = await create_browser_device()
    out = {"adapter": dev.info.adapter, "has_mma": dev.has_mma_f16, "configs": [list(c) for c in dev.info.matrix_configs],
           "subgroup_sizes": list(dev.info.subgroup_sizes), "rows": []}
    rng = random.Random(1)
    for model, fmt in MODELS:
        m = GPUModel(dev, synthetic_source(model, fmt), 1024, None, None, autotune=False)
        lw = m.layers[0]
        for name, w, w2 in (("qkv", lw.wqkv, None), ("gateup", lw.w_gate, lw.w_up), ("down", lw.w_down, None)):
            out["rows"].append({"model": model, **await layer(dev, rng, name, w, w2)})
    return json.dumps(out)
