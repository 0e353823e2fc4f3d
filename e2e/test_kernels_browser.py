"""Kernels through the browser backend (webdrift/gpu/browser.py in Pyodide, SwiftShader's WebGPU)
against numpy references computed here: RMSNorm, the decode GEMV in every variant and the
prefill GEMM, with weights converted on the GPU from F32, F16 (runtime f16 without shader-f16),
Q8_0 and Q4_1 bytes made here."""

from __future__ import annotations

import base64
import json

import numpy as np

# Runs inside the worker's Python: inputs arrive as base64 in a JSON string, results leave as JSON.
KERNEL_CODE = r"""
import base64, json, struct
from webdrift.gpu.base import UNIFORM
from webdrift.gpu.browser import create_browser_device
from webdrift.kernels.convert import allocate_weight, upload_rows
from webdrift.kernels.ops import LinearKernel, RMSNormKernel
from webdrift.kernels.step import STEP_BYTES, pack_step
from webdrift.tensor import TensorDesc

args = json.loads(ARGS)
b64 = lambda s: base64.b64decode(s)
dev = await create_browser_device()
out = {"adapter": dev.info.adapter, "features": sorted(dev.info.features)}
step = dev.create_buffer(STEP_BYTES, UNIFORM, "step")

async def run(kernel, bufs, t, read, n):
    dev.write_buffer(step, pack_step(t, 0))
    dev.submit([kernel.dispatch([step] + bufs, kernel.workgroups(t))])
    raw = await dev.read_buffer(read, 0, 4 * n)
    return list(struct.unpack(f"<{n}f", raw))

def f32(data, label):
    b = dev.create_buffer(len(data), label=label)
    dev.write_buffer(b, data)
    return b

# RMSNorm over T rows of C channels (linear layout)
T, C, CAP = args["T"], args["C"], args["CAP"]
xd, od = TensorDesc("x", C, CAP), TensorDesc("out", C, CAP)
xb = dev.create_buffer(xd.nbytes, label="x"); dev.write_buffer(xb, b64(args["x"]))
ob = dev.create_buffer(od.nbytes, label="out")
out["rms_norm"] = await run(RMSNormKernel(dev, xd, od, args["eps"]), [xb, ob, f32(b64(args["nw"]), "nw")], T, ob, T * C)

# decode GEMV y = x W^T for T rows, W (O, I) from F32 and from Q8_0 bytes, each variant
O, I = args["O"], args["I"]
xd2, yd = TensorDesc("x", I, CAP), TensorDesc("y", O, CAP)
xb2 = dev.create_buffer(xd2.nbytes, label="x2"); dev.write_buffer(xb2, b64(args["gx"]))
yb = dev.create_buffer(yd.nbytes, label="y")
for src, fmt in args["formats"]:
    w = allocate_weight(dev, fmt, fmt, O, I, "OI")
    upload_rows(dev, w, src, b64(args["w_" + src]), O)
    for cand in args["variants"] + [{"stage": "prefill"}]:
        stage = cand.pop("stage", "decode")
        k = LinearKernel(dev, stage, xd2, yd, w, **cand)
        name = f"{fmt}/" + ("/".join(str(v) for v in cand.values()) if cand else stage)
        try:
            out[name] = await run(k, [xb2, yb] + w.buffers, T, yb, T * O)
        except Exception as e:
            out[name] = "ERROR " + str(e)[:1500]
await dev.check_errors()
dev.destroy()
json.dumps(out)
"""

VARIANTS = [{"variant": "split", "rows": 4, "wg": 64}, {"variant": "row", "rows": 1, "wg": 64},
            {"variant": "subgroup", "rows": 8, "wg": 256}]


def _q8_0(w: np.ndarray) -> tuple[bytes, np.ndarray]:
    """GGML Q8_0 blocks of 32 (f16 scale d = max|x| / 127, int8 q = round(x / d)) and their values."""
    blocks = w.reshape(-1, 32).astype(np.float32)
    d = np.abs(blocks).max(1, keepdims=True) / 127.0
    d16 = d.astype(np.float16)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    q = np.clip(np.round(blocks * inv), -127, 127).astype(np.int8)
    raw = b"".join(d16[i].tobytes() + q[i].tobytes() for i in range(len(q)))
    return raw, (q.astype(np.float32) * d16.astype(np.float32)).reshape(w.shape)


def _q4_1(w: np.ndarray) -> tuple[bytes, np.ndarray]:
    """GGML Q4_1 blocks of 32 (f16 d = (max - min) / 15, f16 m = min, nibbles: element j in the low
    nibble of byte j, element j + 16 in its high nibble) and their values q * d + m."""
    blocks = w.reshape(-1, 32).astype(np.float32)
    lo, hi = blocks.min(1, keepdims=True), blocks.max(1, keepdims=True)
    d16, m16 = ((hi - lo) / 15.0).astype(np.float16), lo.astype(np.float16)
    d, m = d16.astype(np.float32), m16.astype(np.float32)
    q = np.clip(np.round((blocks - m) / np.where(d > 0, d, 1)), 0, 15).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    raw = b"".join(d16[i].tobytes() + m16[i].tobytes() + packed[i].tobytes() for i in range(len(q)))
    return raw, (q.astype(np.float32) * d + m).reshape(w.shape)


FORMATS = [("F32", "f32"), ("F16", "f16"), ("Q8_0", "q8"), ("Q4_1", "q4")]


def test_browser_kernels_match_numpy(chromium, server, record):
    rng = np.random.default_rng(7)
    T, C, CAP, eps = 3, 576, 8, 1e-5
    x = (rng.standard_normal((T, C)) * 2).astype(np.float32)
    nw = (1 + 0.1 * rng.standard_normal(C)).astype(np.float32)
    O, I = 96, 128
    gx = rng.standard_normal((T, I)).astype(np.float32)
    w = (rng.standard_normal((O, I)) * 0.2).astype(np.float32)
    q8_raw, w_q8 = _q8_0(w)
    q4_raw, w_q4 = _q4_1(w)
    w16 = w.astype(np.float16)
    enc = lambda b: base64.b64encode(b).decode()

    def pad(a, rows):
        out = np.zeros((rows, a.shape[1]), np.float32)
        out[: len(a)] = a
        return base64.b64encode(out.tobytes()).decode()

    args = {"T": T, "C": C, "CAP": CAP, "eps": eps, "x": pad(x, CAP), "nw": base64.b64encode(nw.tobytes()).decode(),
            "O": O, "I": I, "gx": pad(gx, CAP), "w_F32": enc(w.tobytes()), "w_F16": enc(w16.tobytes()),
            "w_Q8_0": enc(q8_raw), "w_Q4_1": enc(q4_raw), "formats": FORMATS, "variants": VARIANTS}
    pg = chromium.page(server["url"] + "/e2e/blank.html")
    try:
        res = chromium.eval(pg, """async (code) => {
            const wd = await import("/webdrift.js");
            const rt = await wd.createRuntime();
            try { return JSON.parse(await rt.runPython(code)); } finally { await rt.dispose(); }
        }""", f"ARGS = {json.dumps(json.dumps(args))}\n" + KERNEL_CODE, timeout_s=400)
    finally:
        pg.close()
    record("kernel_test_adapter", res["adapter"])
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * nw
    np.testing.assert_allclose(np.array(res["rms_norm"]).reshape(T, C), ref, rtol=1e-5, atol=1e-5)
    errors = {k: v for k, v in res.items() if isinstance(v, str) and v.startswith("ERROR")}
    assert not errors, f"kernels failed in the browser: {errors}"
    refs = {"f32": w, "f16": w16.astype(np.float32), "q8": w_q8, "q4": w_q4}
    for _, fmt in FORMATS:
        ref = gx.astype(np.float64) @ refs[fmt].astype(np.float64).T
        names = [f"{fmt}/{c['variant']}/{c['rows']}/{c['wg']}" for c in VARIANTS] + [f"{fmt}/prefill"]
        for name in names:
            got = np.array(res[name]).reshape(T, O)
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=name)
