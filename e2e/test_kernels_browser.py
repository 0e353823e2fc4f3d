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
from webdrift.kernels.linear import GemvVariant, LinearKernel
from webdrift.kernels.norm import RMSNormKernel
from webdrift.kernels.step import STEP_BYTES, pack_step
from webdrift.tensor import TensorDesc

args = json.loads(ARGS)
b64 = lambda s: base64.b64decode(s)
dev = await create_browser_device()
out = {"adapter": dev.info.adapter, "features": sorted(dev.info.features)}
step = dev.create_buffer(STEP_BYTES, UNIFORM, "step")

async def run(kernel, bufs, t, read, n):
    dev.write_buffer(step, pack_step(t, 0))
    dev.submit([kernel.dispatch({"step": step, **bufs}, kernel.workgroups(t))])
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
out["rms_norm"] = await run(RMSNormKernel(dev, xd, od, args["eps"]), {"x": xb, "out": ob, "w": f32(b64(args["nw"]), "nw")},
                           T, ob, T * C)

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
        k = LinearKernel(dev, stage, xd2, yd, w, variant=GemvVariant(**cand))
        name = f"{fmt}/" + ("/".join(str(v) for v in cand.values()) if cand else stage)
        try:
            out[name] = await run(k, {"x": xb2, "y": yb, "w": w.buffers}, T, yb, T * O)
        except Exception as e:
            out[name] = "ERROR " + str(e)[:1500]
await dev.check_errors()
dev.destroy()
json.dumps(out)
"""

def run_in_worker(chromium, server, code: str, args: dict) -> dict:
    """Run `code` (with ARGS = the JSON of args) in the module's Pyodide worker on a blank page;
    its last expression, a JSON string, parsed."""
    pg = chromium.page(server["url"] + "/e2e/blank.html")
    try:
        return chromium.eval(pg, """async (code) => {
            const wd = await import("/webdrift.js");
            const rt = await wd.createRuntime();
            try { return JSON.parse(await rt.runPython(code)); } finally { await rt.dispose(); }
        }""", f"ARGS = {json.dumps(json.dumps(args))}\n" + code, timeout_s=400)
    finally:
        pg.close()


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
    res = run_in_worker(chromium, server, KERNEL_CODE, args)
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


# The int8-activation path (what a browser on a real GPU picks for big q4/q8 models): Tint must
# accept the integer-dot kernels, and they must compute what the desktop ones do.
INT8_CODE = r"""
import base64, json, struct
from webdrift.gpu.base import UNIFORM
from webdrift.gpu.browser import create_browser_device
from webdrift.kernels.convert import allocate_weight, upload_rows
from webdrift.kernels.linear import Epilogue, GemmVariant, GemvVariant, LinearKernel, PreNorm, QuantOut
from webdrift.kernels.quantize import QuantizeKernel, xq_desc
from webdrift.kernels.step import STEP_BYTES, pack_step
from webdrift.tensor import TensorDesc

args = json.loads(ARGS)
b64 = lambda s: base64.b64decode(s)
dev = await create_browser_device()
out = {"dp4a": dev.has_dp4a, "subgroups": dev.has_subgroups}
step = dev.create_buffer(STEP_BYTES, UNIFORM, "step")
T, O, I, CAP, eps = args["T"], args["O"], args["I"], args["CAP"], args["eps"]
xd, yd = TensorDesc("x", I, CAP), TensorDesc("y", O, CAP)
qd, nd = xq_desc("xq", I, CAP), xq_desc("n", O, CAP)
xb = dev.create_buffer(xd.nbytes, label="x"); dev.write_buffer(xb, b64(args["x"]))
nwb = dev.create_buffer(4 * I, label="nw"); dev.write_buffer(nwb, b64(args["nw"]))
nw2 = dev.create_buffer(4 * O, label="nw2"); dev.write_buffer(nw2, b64(args["nw2"]))
qb, yb, nb = (dev.create_buffer(d.nbytes, label=d.name) for d in (qd, yd, nd))
dev.write_buffer(step, pack_step(T, 0))
for src, fmt in args["formats"]:
    try:
        w = allocate_weight(dev, fmt, fmt, O, I, "OI")
        if isinstance(src, list):   # a row-split weight: (stored type, rows) of each range, from those rows of w_TYPE
            row0 = 0
            for s, rows in src:
                raw = b64(args["w_" + s])
                per = len(raw) // O
                upload_rows(dev, w, s, raw[row0 * per:(row0 + rows) * per], rows, row0)
                row0 += rows
        else:
            upload_rows(dev, w, src, b64(args["w_" + src]), O)
        qk = QuantizeKernel(dev, xd, qd, fmt, pre_norm=PreNorm(eps, 0.0))
        k = LinearKernel(dev, "decode", qd, yd, w, variant=GemvVariant("blk", rows=4, wg=64), pre_norm=PreNorm(eps, 0.0))
        dev.submit([qk.dispatch({"step": step, "x": xb, "xq": qb, "nw": nwb}, qk.workgroups(T)),
                    k.dispatch({"step": step, "x": qb, "y": yb, "w": w.buffers}, k.workgroups(T))])
        out[fmt + "/blk"] = list(struct.unpack(f"<{T * O}f", await dev.read_buffer(yb, 0, 4 * T * O)))
        for name, gv in (("gemm_i8", GemmVariant(int8=True, kstep=2)), ("gemm_i8_db", GemmVariant(int8=True, kstep=1, double=True))):
            kg = LinearKernel(dev, "prefill", qd, yd, w, variant=gv, pre_norm=PreNorm(eps, 0.0))
            dev.submit([kg.dispatch({"step": step, "x": qb, "y": yb, "w": w.buffers}, kg.workgroups(T))])
            out[fmt + "/" + name] = list(struct.unpack(f"<{T * O}f", await dev.read_buffer(yb, 0, 4 * T * O)))
        kq = LinearKernel(dev, "decode", qd, yd, w, variant=GemvVariant("blk", wg=64, rps=4), pre_norm=PreNorm(eps, 0.0),
                          epilogue=Epilogue(qout=QuantOut(nd, "q8", 0.0, True)))
        dev.submit([kq.dispatch({"step": step, "x": qb, "y": yb, "w": w.buffers, "qout": nb, "qnw": nw2}, kq.workgroups(T))])
        out[fmt + "/qout_y"] = list(struct.unpack(f"<{T * O}f", await dev.read_buffer(yb, 0, 4 * T * O)))
        out[fmt + "/qout_words"] = base64.b64encode(await dev.read_buffer(nb, 0, nd.nbytes)).decode()
        # both rows as the columns of one workgroup (GemvVariant.cols, the streams' kernels)
        for name, cand, ep, extra in (("blk", dict(rows=4, wg=64), Epilogue(), {}),
                                      ("qout", dict(wg=64, rps=4), Epilogue(qout=QuantOut(nd, "q8", 0.0, True)),
                                       {"qout": nb, "qnw": nw2})):
            kc = LinearKernel(dev, "decode", qd, yd, w, variant=GemvVariant("blk", cols=2, **cand),
                              pre_norm=PreNorm(eps, 0.0), epilogue=ep)
            dev.submit([kc.dispatch({"step": step, "x": qb, "y": yb, "w": w.buffers, **extra}, kc.workgroups(T))])
            out[fmt + f"/{name}_cols_y"] = list(struct.unpack(f"<{T * O}f", await dev.read_buffer(yb, 0, 4 * T * O)))
        out[fmt + "/qout_cols_words"] = base64.b64encode(await dev.read_buffer(nb, 0, nd.nbytes)).decode()
    except Exception as e:
        out[fmt] = "ERROR " + str(e)[:1500]
await dev.check_errors()
dev.destroy()
json.dumps(out)
"""


def test_browser_int8_kernels(chromium, server, record):
    """QuantizeKernel (norm fused) + the integer-dot GEMV (q8, q8_0, q4, q4_0, q5k, q6k weights, and row-split
    q4_0|q6k and q5k|q6k ones: rows 0..39 Q4_0, 40..63 Q6_K; rows 0..25 Q5_K, 26..63 Q6_K in channel
    order, a boundary inside a workgroup), plain and with its
    quantizing epilogue, and the int8 prefill GEMM (single and double-buffered tiles), compiled by Tint and run on
    SwiftShader, against the numpy emulation of the desktop tests; with both rows as the columns of
    one workgroup (cols=2), bit-identical to the one-row kernel."""
    from gguf import GGMLQuantizationType, quants

    from tests.gpu_util import random_kquant_blocks
    from tests.test_kernels_kquant import kquant_mins
    from tests.test_kernels_linear_blk import quant_x
    rng = np.random.default_rng(9)
    T, O, I, CAP, eps = 2, 64, 256, 4, 1e-5
    x = rng.standard_normal((T, I)).astype(np.float32)
    nw = (1 + 0.1 * rng.standard_normal(I)).astype(np.float32)
    nw2 = (1 + 0.1 * rng.standard_normal(O)).astype(np.float32)
    w = (rng.standard_normal((O, I)) * 0.2).astype(np.float32)
    q8_raw, w_q8 = _q8_0(w)
    q4_raw, w_q4 = _q4_1(w)
    q6_blocks = random_kquant_blocks("Q6_K", O, I, seed=3)     # q6k: Q6_K's bits, read natively
    w_q6 = quants.dequantize(q6_blocks, GGMLQuantizationType.Q6_K).astype(np.float32)
    q5_blocks = random_kquant_blocks("Q5_K", O, I, seed=4)     # q5k: Q5_K as stored, read natively
    w_q5 = quants.dequantize(q5_blocks, GGMLQuantizationType.Q5_K).astype(np.float32)
    q40_blocks = quants.quantize(w, GGMLQuantizationType.Q4_0)  # q4_0: Q4_0 as stored
    w_q40 = quants.dequantize(q40_blocks, GGMLQuantizationType.Q4_0).astype(np.float32)
    # the blocks' additive terms the kernels take from the float block sums (q4: Q4_1's m, the
    # smallest value of each block here; q4_0: -8 d; q5k: -dmin m)
    mins = {"q4": w_q4.reshape(O, -1, 32).min(-1)}
    mins["q4_0"] = -8.0 * q40_blocks.reshape(O, -1, 18)[..., :2].copy().view("<f2")[..., 0].astype(np.float64)
    mins["q5k"] = kquant_mins("Q5_K", q5_blocks, I)
    split = "q4_0*40|q6k*24"
    w_split = np.concatenate([w_q40[:40], w_q6[40:]])
    mins[split] = np.concatenate([mins["q4_0"][:40], np.zeros((O - 40, I // 32))])
    split5 = "q5k*26|q6k*38"   # a Q5_K_M Q|K|V: int8 rows in channel order, the q6k words shuffled to it
    w_split5 = np.concatenate([w_q5[:26], w_q6[26:]])
    mins[split5] = np.concatenate([mins["q5k"][:26], np.zeros((O - 26, I // 32))])
    enc = lambda b: base64.b64encode(b).decode()
    xp = np.zeros((CAP, I), np.float32)
    xp[:T] = x
    args = {"T": T, "O": O, "I": I, "CAP": CAP, "eps": eps, "x": enc(xp.tobytes()), "nw": enc(nw.tobytes()),
            "nw2": enc(nw2.tobytes()), "w_Q8_0": enc(q8_raw), "w_Q4_1": enc(q4_raw), "w_Q6_K": enc(q6_blocks.tobytes()),
            "w_Q5_K": enc(q5_blocks.tobytes()), "w_Q4_0": enc(q40_blocks.tobytes()),
            "formats": [("Q8_0", "q8"), ("Q8_0", "q8_0"), ("Q4_1", "q4"), ("Q4_0", "q4_0"), ("Q5_K", "q5k"), ("Q6_K", "q6k"),
                        ([("Q4_0", 40), ("Q6_K", O - 40)], split), ([("Q5_K", 26), ("Q6_K", O - 26)], split5)]}
    res = run_in_worker(chromium, server, INT8_CODE, args)
    assert res["dp4a"] and res["subgroups"], res            # Chromium's WGSL offers both
    errors = {k: v for k, v in res.items() if isinstance(v, str) and v.startswith("ERROR")}
    assert not errors, f"int8 kernels failed in the browser: {errors}"
    # what the kernels compute: int8 blocks of u = x * nw, the GEMV scaled by 1/rms(x); q4 adds
    # its min term from the exact block sums of u
    u = (x * nw).astype(np.float32)
    inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps)
    uq = quant_x(u)
    nb = O // 32
    for fmt, wref in (("q8", w_q8), ("q8_0", w_q8), ("q4", w_q4), ("q4_0", w_q40), ("q5k", w_q5), ("q6k", w_q6),
                      (split, w_split), (split5, w_split5)):
        y = np.array(res[fmt + "/blk"]).reshape(T, O)
        want = uq @ wref.T.astype(np.float64)
        if fmt in mins:
            m = np.repeat(mins[fmt], 32, axis=1).astype(np.float64)
            want += (u - uq) @ m.T
        want *= inv
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=fmt)
        for name in ("gemm_i8", "gemm_i8_db"):     # the same block sums and scales as the GEMV
            np.testing.assert_allclose(np.array(res[f"{fmt}/{name}"]).reshape(T, O), y, rtol=1e-5,
                                       atol=1e-5 * np.abs(y).max(), err_msg=f"{fmt}/{name}")
        yq = np.array(res[fmt + "/qout_y"]).reshape(T, O)
        np.testing.assert_allclose(yq, y, rtol=1e-5, atol=1e-5)
        words = np.frombuffer(base64.b64decode(res[fmt + "/qout_words"]), np.uint32).reshape(CAP, -1)[:T]
        q = words[:, :8 * nb].copy().view(np.int8).reshape(T, nb, 32).astype(np.float64)
        d = words[:, 8 * nb:9 * nb].view(np.float32)
        yn = (y * nw2).reshape(T, nb, 32)
        np.testing.assert_allclose(d, np.abs(yn).max(-1) / 127, rtol=1e-4)
        assert np.abs(q * d[..., None] - yn).max() <= 0.51 * d.max() + 1e-6    # int8 of y * next norm weight
        # two columns per workgroup: the one-row kernels' outputs and int8 words, bit for bit
        np.testing.assert_array_equal(res[fmt + "/blk_cols_y"], res[fmt + "/blk"], err_msg=fmt)
        np.testing.assert_array_equal(res[fmt + "/qout_cols_y"], res[fmt + "/qout_y"], err_msg=fmt)
        assert res[fmt + "/qout_cols_words"] == res[fmt + "/qout_words"], fmt
    record("int8_kernels_browser", "ok")


# Weight conversion of every stored type the reader knows (what loading Gemma 3's Q4_K/Q5_0/Q6_K
# GGUF in the browser runs): Tint must compile every decoder, and they must decode like gguf-py.
CONVERT_CODE = r"""
import base64, json
from webdrift.gpu.browser import create_browser_device
from webdrift.kernels.convert import allocate_weight, upload_rows

args = json.loads(ARGS)
dev = await create_browser_device()
out = {}
O, I = args["O"], args["I"]
for src, raw in args["raw"].items():
    for fmt in ("f32", "q8", "q4"):
        try:
            w = allocate_weight(dev, src, fmt, O, I, "OI")
            upload_rows(dev, w, src, base64.b64decode(raw), O)
            out[f"{src}/{fmt}"] = [base64.b64encode(await dev.read_buffer(b, 0, b.size)).decode() for b in w.buffers]
        except Exception as e:
            out[f"{src}/{fmt}"] = "ERROR " + str(e)[:1500]
await dev.check_errors()
dev.destroy()
json.dumps(out)
"""


def test_browser_converts_every_gguf_type(chromium, server):
    """Every source type -> f32 (equal to gguf-py's dequantization), q8 and q4 (within half a
    re-quantization step of it; exact where the format keeps the stored integers)."""
    from tests.gpu_util import source_bytes
    from tests.test_kernels_convert import decode_buffers
    from webdrift.kernels.convert import DIRECT, SOURCE_TYPES

    O, I = 6, 256
    x = np.random.default_rng(11).standard_normal((O, I)).astype(np.float32)
    made = {src: source_bytes(x, src) for src in SOURCE_TYPES}
    args = {"O": O, "I": I, "raw": {s: base64.b64encode(r).decode() for s, (r, _) in made.items()}}
    res = run_in_worker(chromium, server, CONVERT_CODE, args)
    errors = {k: v for k, v in res.items() if isinstance(v, str)}
    assert not errors, f"conversion failed in the browser: {errors}"
    for src, (_, ref) in made.items():
        for fmt in ("f32", "q8", "q4"):
            got, _ = decode_buffers(fmt, O, I, [base64.b64decode(b) for b in res[f"{src}/{fmt}"]])
            blk = ref.reshape(O, -1, 32)
            err = np.abs(got - ref).reshape(O, -1, 32).max(axis=2)
            if fmt == "f32" or (src, fmt) in DIRECT and src != "Q4_K":
                np.testing.assert_array_equal(got, ref, err_msg=f"{src}/{fmt}")
                continue
            half = np.abs(blk).max(axis=2) / 254 if fmt == "q8" else np.ptp(blk, axis=2) / 30
            f16 = 0 if fmt == "q8" else 2.0**-11 * (np.ptp(blk, axis=2) + 2 * np.abs(blk).max(axis=2))
            assert (err <= half * 1.0001 + f16 + 1e-6).all(), f"{src}/{fmt}"


# Decode kernels in the browser: the attention variants (attention_gqa.wgsl, attention_split.wgsl) and the
# float QKV GEMV with the RoPE epilogue (linear_subgroup / linear_wide.wgsl ROPE, rope_epilogue.wgsl).
DECODE_CODE = r"""
import base64, json, struct
from webdrift.gpu.base import UNIFORM
from webdrift.gpu.browser import create_browser_device
from webdrift.kernels.attention import AttentionCombineKernel, AttentionKernel
from webdrift.kernels.convert import allocate_weight, upload_rows
from webdrift.kernels.linear import Epilogue, GemvVariant, LinearKernel, PreNorm, RopeOut
from webdrift.kernels.rope import RopeQKVKernel
from webdrift.kernels.step import STEP_BYTES, pack_step
from webdrift.tensor import TensorDesc

args = json.loads(ARGS)
b64 = lambda s: base64.b64decode(s)
dev = await create_browser_device()
out = {"subgroups": dev.has_subgroups}
step = dev.create_buffer(STEP_BYTES, UNIFORM, "step")

def buf(data, label):
    b = dev.create_buffer(len(data), label=label)
    dev.write_buffer(b, data)
    return b

async def read(b, n):
    return list(struct.unpack(f"<{n}f", await dev.read_buffer(b, 0, 4 * n)))

H, KVH, DH, CAP, T, POS = args["H"], args["KVH"], args["DH"], args["CAP"], args["T"], args["POS"]
G = H // KVH
dev.write_buffer(step, pack_step(T, POS))
# attention, both kernels, then the combine: out (T, H * DH)
qd, od = TensorDesc("q", DH, T * G, b=KVH), TensorDesc("o", H * DH, T)
qb, kb, vb = buf(b64(args["q"]), "q"), buf(b64(args["k"]), "k"), buf(b64(args["v"]), "v")
for name in ("head", "grouped", "split", "split_adapt"):
    variant = name.split("_")[0]
    if variant == "split" and not dev.has_subgroups:
        continue
    try:
        att = AttentionKernel(dev, qd, H, KVH, DH, CAP, T * G, DH ** -0.5, variant=variant,
                              adapt=2 if name == "split_adapt" else 0)   # (70 keys: 2 chunks a workgroup)
        comb = AttentionCombineKernel(dev, od, H, KVH, DH, att.nsplit, T * G)
        pb = dev.create_buffer(KVH * T * G * att.nsplit * (DH + 2) * 4, label="part")
        ob = dev.create_buffer(od.nbytes, label="o")
        dev.submit([att.dispatch({"step": step, "q": qb, "kc": kb, "vc": vb, "part": pb}, att.workgroups(T)),
                    comb.dispatch({"step": step, "part": pb, "out": ob}, comb.workgroups(T))])
        out[f"attn/{name}"] = await read(ob, T * H * DH)
    except Exception as e:
        out[f"attn/{name}"] = "ERROR " + str(e)[:1500]
# the tiled kernel (attention_tiled.wgsl; head_dim 64: subgroups may be 4 lanes), 3 partials a row
DH2 = args["DH2"]
qd2, od2 = TensorDesc("q", DH2, T * G, b=KVH), TensorDesc("o", H * DH2, T)
qb2, kb2, vb2 = buf(b64(args["q2"]), "q2"), buf(b64(args["k2"]), "k2"), buf(b64(args["v2"]), "v2")
try:
    att = AttentionKernel(dev, qd2, H, KVH, DH2, CAP, T * G, DH2 ** -0.5, variant="tiled", adapt=3)
    comb = AttentionCombineKernel(dev, od2, H, KVH, DH2, att.nsplit, T * G)
    pb = dev.create_buffer(KVH * T * G * att.nsplit * (DH2 + 2) * 4, label="part")
    ob = dev.create_buffer(od2.nbytes, label="o")
    dev.submit([att.dispatch({"step": step, "q": qb2, "kc": kb2, "vc": vb2, "part": pb}, att.workgroups(T)),
                comb.dispatch({"step": step, "part": pb, "out": ob}, comb.workgroups(T))])
    out["attn/tiled"] = await read(ob, T * H * DH2)
except Exception as e:
    out["attn/tiled"] = "ERROR " + str(e)[:1500]
# the same kernel merging its 4 partials a row itself (attention_merge.wgsl: the last workgroup
# of a row's, its weights by lane butterflies where the subgroups hold whole heads)
try:
    att = AttentionKernel(dev, qd2, H, KVH, DH2, CAP, T * G, DH2 ** -0.5, variant="tiled", adapt=4, fused=True,
                          out=od2)
    pb = dev.create_buffer(KVH * T * G * att.nsplit * (DH2 + 2) * 4, label="part")
    cnt = dev.create_buffer(4 * T * KVH, label="cnt")
    ob = dev.create_buffer(od2.nbytes, label="o")
    dev.submit([att.dispatch({"step": step, "q": qb2, "kc": kb2, "vc": vb2, "part": pb, "out": ob, "cnt": cnt},
                             att.workgroups(T))])
    out["attn/tiled_fused"] = await read(ob, T * H * DH2)
    out["attn/tiled_fused_cnt"] = await read(cnt, T * KVH)
except Exception as e:
    out["attn/tiled_fused"] = "ERROR " + str(e)[:1500]
# QKV GEMV (f16 weights, RMSNorm fused): RoPE in its epilogue vs the GEMV + RopeQKVKernel
O, I = (H + 2 * KVH) * DH, args["I"]
xd, yd, rel = TensorDesc("x", I, T), TensorDesc("qkv", O, T), TensorDesc("r", DH, T * G, b=KVH)
xb, nwb, fb = buf(b64(args["x"]), "x"), buf(b64(args["nw"]), "nw"), buf(b64(args["freq"]), "freq")
w = allocate_weight(dev, "w", "f16", O, I, "OI")
upload_rows(dev, w, "F32", b64(args["w"]), O)
cache = lambda: buf(bytes(4 * KVH * CAP * DH), "cache")
try:
    # (the split-K wide GEMV: the whole workgroup strides each row, its sums through workgroup memory)
    ksplit = GemvVariant("wide", rows=4, wg=64, mrows=4, ksplit=True)
    for variant, pv, fv in (("subgroup", GemvVariant("subgroup", rows=8, wg=64), GemvVariant("subgroup", rows=16, wg=64)),
                            ("wide", GemvVariant("wide", rows=8, wg=64), GemvVariant("wide", rows=16, wg=64)),
                            ("wide_ksplit", ksplit, ksplit)):
        norm = PreNorm(1e-5, 0.0)
        yb, r1, k1, v1 = dev.create_buffer(yd.nbytes, label="y"), dev.create_buffer(rel.nbytes, label="r"), cache(), cache()
        plain = LinearKernel(dev, "decode", xd, yd, w, variant=pv, pre_norm=norm)
        rope = RopeQKVKernel(dev, yd, rel, H, KVH, DH, CAP, True)
        dev.submit([plain.dispatch({"step": step, "x": xb, "y": yb, "w": w.buffers, "nw": nwb}, plain.workgroups(T)),
                    rope.dispatch({"step": step, "qkv": yb, "q": r1, "kc": k1, "vc": v1, "inv_freq": fb},
                                  rope.workgroups(T))])
        r2, k2, v2 = dev.create_buffer(rel.nbytes, label="r2"), cache(), cache()
        fused = LinearKernel(dev, "decode", xd, yd, w, variant=fv, pre_norm=norm,
                             epilogue=Epilogue(rope=RopeOut(rel, H, KVH, DH, CAP, rope_half=True)))
        spare = dev.create_buffer(256, label="spare")
        dev.submit([fused.dispatch({"step": step, "x": xb, "y": spare, "w": w.buffers, "nw": nwb, "q": r2, "kc": k2,
                                    "vc": v2, "inv_freq": fb}, fused.workgroups(T))])
        for name, b in (("q", r1), ("k", k1), ("v", v1), ("q_f", r2), ("k_f", k2), ("v_f", v2)):
            out[f"{variant}/{name}"] = await read(b, b.size // 4)
except Exception as e:
    out["rope"] = "ERROR " + str(e)[:1500]
await dev.check_errors()
dev.destroy()
json.dumps(out)
"""


def test_browser_grouped_attention_and_rope_epilogue(chromium, server):
    """Tint compiles and SwiftShader runs the four attention kernels (equal to numpy's causal GQA
    attention; the split one also with several chunks a workgroup; the tiled one at head_dim 64)
    and the float QKV GEMV with RoPE in its epilogue (equal to the GEMV followed by
    RopeQKVKernel: q rows, K and V cache contents) for the subgroup and wide variants (and the
    wide one's split-K form)."""
    from tests.test_kernels_attention import attention_ref
    rng = np.random.default_rng(21)
    H, KVH, DH, CAP, T, POS, I = 8, 2, 32, 128, 2, 70, 64
    G = H // KVH
    q = rng.standard_normal((KVH, T * G, DH)).astype(np.float32)
    k = rng.standard_normal((KVH, CAP, DH)).astype(np.float32)
    v = rng.standard_normal((KVH, DH, CAP)).astype(np.float32)
    x = rng.standard_normal((T, I)).astype(np.float32)
    nw = (1 + 0.1 * rng.standard_normal(I)).astype(np.float32)
    w = (rng.standard_normal(((H + 2 * KVH) * DH, I)) * 0.2).astype(np.float32)
    freq = (10000.0 ** (-np.arange(0, DH, 2) / DH)).astype(np.float32)
    DH2 = 64
    q2 = rng.standard_normal((KVH, T * G, DH2)).astype(np.float32)
    k2 = rng.standard_normal((KVH, CAP, DH2)).astype(np.float32)
    v2 = rng.standard_normal((KVH, DH2, CAP)).astype(np.float32)
    enc = lambda a: base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()
    args = {"H": H, "KVH": KVH, "DH": DH, "CAP": CAP, "T": T, "POS": POS, "I": I, "q": enc(q), "k": enc(k),
            "v": enc(v), "x": enc(x), "nw": enc(nw), "w": enc(w), "freq": enc(freq), "DH2": DH2, "q2": enc(q2),
            "k2": enc(k2), "v2": enc(v2)}
    res = run_in_worker(chromium, server, DECODE_CODE, args)
    errors = {k: v for k, v in res.items() if isinstance(v, str) and v.startswith("ERROR")}
    assert not errors, f"kernels failed in the browser: {errors}"
    assert res["subgroups"]
    ref = attention_ref(q, k, v, POS, G, DH ** -0.5)
    for variant in ("head", "grouped", "split", "split_adapt"):
        got = np.array(res[f"attn/{variant}"]).reshape(T, H * DH)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=variant)
    ref2 = attention_ref(q2, k2, v2, POS, G, DH2 ** -0.5)
    for variant in ("tiled", "tiled_fused"):
        np.testing.assert_allclose(np.array(res[f"attn/{variant}"]).reshape(T, H * DH2), ref2, rtol=1e-4, atol=1e-5,
                                   err_msg=variant)
    assert not any(res["attn/tiled_fused_cnt"]), "the merge leaves its counters zero"   # (read as f32 bits)
    for variant in ("subgroup", "wide", "wide_ksplit"):
        for name in ("q", "k", "v"):
            a, b = np.array(res[f"{variant}/{name}_f"]), np.array(res[f"{variant}/{name}"])
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"{variant}/{name}")
            # every variant's sums agree with the subgroup one's (another reduction order)
            np.testing.assert_allclose(b, np.array(res[f"subgroup/{name}"]), rtol=1e-4, atol=1e-4,
                                       err_msg=f"{variant}/{name} vs subgroup")
        kc = np.array(res[f"{variant}/k"]).reshape(KVH, CAP, DH)
        assert np.count_nonzero(kc[:, POS:POS + T]) == KVH * T * DH and not kc[:, :POS].any()   # appended at POS


# The formats of issue 14 (q8pc, q4g128, q4pc, e0m4) in the browser: Tint must compile their
# converters and accessors, and the GEMV variants and the GEMM must compute what numpy does on
# the weights the conversion wrote (decoded here from the documented buffers).
FORMATS_CODE = r"""
import base64, json, struct
from webdrift.gpu.base import UNIFORM
from webdrift.gpu.browser import create_browser_device
from webdrift.kernels.convert import allocate_weight, upload_rows
from webdrift.kernels.linear import GemmVariant, GemvVariant, LinearKernel
from webdrift.kernels.quantize import QuantizeKernel, xq_desc
from webdrift.kernels.step import STEP_BYTES, pack_step
from webdrift.tensor import TensorDesc

args = json.loads(ARGS)
dev = await create_browser_device()
out = {}
step = dev.create_buffer(STEP_BYTES, UNIFORM, "step")
T, O, I, CAP = args["T"], args["O"], args["I"], args["CAP"]
xd, yd, qd = TensorDesc("x", I, CAP), TensorDesc("y", O, CAP), xq_desc("xq", I, CAP)
xb = dev.create_buffer(xd.nbytes, label="x"); dev.write_buffer(xb, base64.b64decode(args["x"]))
yb = dev.create_buffer(yd.nbytes, label="y")
qb = dev.create_buffer(qd.nbytes, label="xq")
dev.write_buffer(step, pack_step(T, 0))
for src, fmt in args["formats"]:
    try:
        w = allocate_weight(dev, fmt, fmt, O, I, "OI")
        if isinstance(src, list):   # a row-split weight: (stored type, rows) of each range
            row0 = 0
            for s, rows in src:
                upload_rows(dev, w, s, base64.b64decode(args["raw"]["split:" + s]), rows, row0)
                row0 += rows
        else:
            upload_rows(dev, w, src, base64.b64decode(args["raw"][src]), O)
        out[fmt + "/buffers"] = [base64.b64encode(await dev.read_buffer(b, 0, b.size)).decode() for b in w.buffers]
        for cand in args["variants"] + [{"stage": "prefill"}]:
            cand = dict(cand)
            stage = cand.pop("stage", "decode")
            k = LinearKernel(dev, stage, xd, yd, w, variant=GemvVariant(**cand))
            name = f"{fmt}/" + ("/".join(str(v) for v in cand.values()) if cand else stage)
            dev.submit([k.dispatch({"step": step, "x": xb, "y": yb, "w": w.buffers}, k.workgroups(T))])
            out[name] = list(struct.unpack(f"<{T * O}f", await dev.read_buffer(yb, 0, 4 * T * O)))
        if fmt in args["int8"]:   # the integer-dot GEMV (one row; unrolled) and int8 GEMM on QuantizeKernel's rows
            qk = QuantizeKernel(dev, xd, qd, fmt)
            dev.submit([qk.dispatch({"step": step, "x": xb, "xq": qb}, qk.workgroups(T))])
            for name, stage, v in (("blk", "decode", GemvVariant("blk", rows=4, wg=64)),
                                   ("blk_u2", "decode", GemvVariant("blk", rows=2, wg=32, unroll=2)),
                                   ("gemm_i8", "prefill", GemmVariant(int8=True))):
                k = LinearKernel(dev, stage, qd, yd, w, variant=v)
                dev.submit([k.dispatch({"step": step, "x": qb, "y": yb, "w": w.buffers}, k.workgroups(T))])
                out[f"{fmt}/int8/{name}"] = list(struct.unpack(f"<{T * O}f", await dev.read_buffer(yb, 0, 4 * T * O)))
    except Exception as e:
        out[fmt] = "ERROR " + str(e)[:1500]
await dev.check_errors()
dev.destroy()
json.dumps(out)
"""


def test_browser_new_weight_formats(chromium, server, record):
    """Conversion from F32 bytes into each format equals the numpy reference scheme (codes within
    one in at most 0.2% of the elements, stored scales equal up to the GPU's division), and the decode GEMV variants and
    the prefill GEMM match numpy on the converted weights. I = 768: q4g128's rows are 6 groups. The K-quant formats (q4k, q5k: Q4_K / Q5_K super-blocks read natively; q8g16:
    Q6_K's integers and scales; q6k: Q6_K's bits repacked) from random blocks, and q4_0 / q8_0 (GGUF
    Q4_0 / Q8_0 with their f16 scales, two a word) from gguf-py's quantization, against gguf-py's
    dequantization; and a row-split weight (rows 0..23 Q4_K in q4k, 24..39 Q6_K in q6k: a Q4_K_M
    Q|K|V under weight_format="exact"). q8pc, q4g128, q4pc and e0m4 also through the integer-dot GEMV
    (one row; unrolled) and the int8 GEMM on QuantizeKernel's rows, against numpy's int8 emulation."""
    from gguf import GGMLQuantizationType, quants

    from tests.gpu_util import random_kquant_blocks
    from tests.test_kernels_formats import NEW, _int8_ref, assert_params, decode_ref, quantize_ref
    kq = [("Q4_K", "q4k"), ("Q5_K", "q5k"), ("Q6_K", "q8g16"), ("Q6_K", "q6k"), ("Q4_0", "q4_0"), ("Q8_0", "q8_0")]
    SPLIT = "q4k*24|q6k*16"

    rng = np.random.default_rng(9)
    T, O, I, CAP = 3, 40, 768, 8
    w = (rng.standard_normal((O, I)) * 0.2).astype(np.float32)
    blocks = {src: random_kquant_blocks(src, O, I, seed=k) for k, src in enumerate(("Q4_K", "Q5_K", "Q6_K"))}
    blocks |= {src: quants.quantize(w, getattr(GGMLQuantizationType, src)) for src in ("Q4_0", "Q8_0")}
    x = np.zeros((CAP, I), np.float32)
    x[:T] = rng.standard_normal((T, I))
    enc = lambda b: base64.b64encode(b).decode()
    args = {"T": T, "O": O, "I": I, "CAP": CAP, "variants": VARIANTS, "x": enc(x.tobytes()), "int8": list(NEW),
            "formats": [["F32", f] for f in NEW] + [[s, f] for s, f in kq] + [[[["Q4_K", 24], ["Q6_K", O - 24]], SPLIT]],
            "raw": {"F32": enc(w.tobytes()), **{s: enc(b.tobytes()) for s, b in blocks.items()},
                    "split:Q4_K": enc(blocks["Q4_K"][:24].tobytes()), "split:Q6_K": enc(blocks["Q6_K"][24:].tobytes())}}
    res = run_in_worker(chromium, server, FORMATS_CODE, args)
    errors = {k: v for k, v in res.items() if isinstance(v, str)}
    assert not errors, f"formats failed in the browser: {errors}"
    for fmt in NEW:
        q, par, val = decode_ref(fmt, O, I, [base64.b64decode(b) for b in res[fmt + "/buffers"]])
        rq, rpar, _ = quantize_ref(w, fmt)
        assert_params(par, rpar, fmt)
        diff = np.abs(q - rq)
        assert diff.max() <= 1 and np.count_nonzero(diff) <= 0.002 * q.size, fmt
        ref = x[:T].astype(np.float64) @ val.astype(np.float64).T
        for name in [f"{fmt}/{c['variant']}/{c['rows']}/{c['wg']}" for c in VARIANTS] + [f"{fmt}/prefill"]:
            np.testing.assert_allclose(np.array(res[name]).reshape(T, O), ref, rtol=1e-4, atol=1e-4, err_msg=name)
        want = _int8_ref(x[:T], q, par, val, fmt)   # the integer-dot paths: numpy's int8 emulation
        for name in ("blk", "blk_u2", "gemm_i8"):
            np.testing.assert_allclose(np.array(res[f"{fmt}/int8/{name}"]).reshape(T, O), want, rtol=1e-4,
                                       atol=1e-4 * np.abs(want).max(), err_msg=f"{fmt} {name}")
    deq = {src: quants.dequantize(blocks[src], getattr(GGMLQuantizationType, src)) for src, _ in kq}
    deq["split"] = np.concatenate([deq["Q4_K"][:24], deq["Q6_K"][24:]])
    for src, fmt in kq + [("split", SPLIT)]:
        val = deq[src]
        ref = x[:T].astype(np.float64) @ val.astype(np.float64).T
        for name in [f"{fmt}/{c['variant']}/{c['rows']}/{c['wg']}" for c in VARIANTS] + [f"{fmt}/prefill"]:
            got = np.array(res[name]).reshape(T, O)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max() * 4, err_msg=name)
    record("new_formats_browser", "ok")
