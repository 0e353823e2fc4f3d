"""The integer-dot-product decode GEMV (wgsl/linear_blk.wgsl, variant "blk") with its input
quantization (wgsl/quantize.wgsl, QuantizeKernel, with the fused RMSNorm) vs numpy.

QuantizeKernel turns each input row into int8 per 32-block (scale max|x| / 127, round half to
even) and the GEMV multiplies those with the weights' integers exactly (dot4I8Packed), so the
reference emulates that quantization in float64 (tight tolerance: only f32 summation order
differs); the result is also checked against the exact product of the dequantized weights and
the unquantized input (the error budget of int8 activations)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import (
    cache_buffer,
    device,
    download,
    f32_buffer,
    make_weight,
    read_cache,
    upload,
    write_step,
)
from tests.test_kernels_linear import FUSIONS, SENTINEL, _weights, fusion_case, gelu_tanh, rms_norm_ref, silu
from webdrift.errors import UnsupportedModelError
from webdrift.kernels.linear import Epilogue, GemvVariant, LinearKernel, PreNorm, QuantOut, RopeOut
from webdrift.kernels.quantize import QuantizeKernel, xq_desc
from webdrift.tensor import TensorDesc

CAP = 8


def run_linear(stage, T, W, fmt, *, w2=None, bias=None, y0=None, act="silu", softcap=None, x_last_row=False,
               seed=0, tuning=None, norm_w=None, act_layout="linear"):
    """QuantizeKernel (with the norm when norm_w is given) then the blk GEMV, for random x (T, I);
    returns (x, dense W, dense W2, y rows [0, CAP))."""
    assert stage == "decode"
    dev = device()
    O, I = W.shape
    x = np.random.default_rng(seed).standard_normal((T, I)).astype(np.float32)
    xd = TensorDesc("x", I, CAP, layout=act_layout)
    qd = xq_desc("xq", I, CAP)
    yd = TensorDesc("y", O, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    gw, wref = make_weight(W, fmt)
    norm = PreNorm(1e-5, 0.0) if norm_w is not None else None
    qk = QuantizeKernel(dev, xd, qd, fmt, pre_norm=norm, last_row=x_last_row)
    gw2 = w2ref = None
    bufs = {"x": qb, "y": upload(yd, y0, fill=SENTINEL), "w": gw.buffers}
    if w2 is not None:
        gw2, w2ref = make_weight(w2, fmt, name="w2")
        bufs["w2"] = gw2.buffers
    if bias is not None:
        bufs["bias"] = f32_buffer(bias)
    k = LinearKernel(dev, stage, qd, yd, gw, gw2, variant=tuning or GemvVariant(), pre_norm=norm,
                     epilogue=Epilogue(bias=bias is not None, residual=y0 is not None, act=act, softcap=softcap),
                     x_last_row=x_last_row)
    write_step(T)
    qbinds = {"x": xb, "xq": qb} | ({"nw": f32_buffer(norm_w)} if norm_w is not None else {})
    rows = 1 if x_last_row else T
    from tests.gpu_util import step_buffer
    dev.submit([qk.dispatch({"step": step_buffer(), **qbinds}, qk.workgroups(rows)),
                k.dispatch({"step": step_buffer(), **bufs}, k.workgroups(rows))])
    return x, wref, w2ref, download(yd, bufs["y"])

TUNINGS = [pytest.param(GemvVariant("blk", rows=4, wg=64), id="blk4x64"),
           pytest.param(GemvVariant("blk", rows=2, wg=128), id="blk2x128"),
           pytest.param(GemvVariant("blk", rows=1, wg=32), id="blk1x32")]


def quant_x(x):
    """The kernel's int8 view of x (T, I): per 32-block scale and round-half-even integers."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(-1, keepdims=True)
    qs = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(xb * qs)
    return (q * (amax / np.float32(127.0))).reshape(x.shape).astype(np.float64)


def check(y, x, wref, fmt, fn=lambda lin: lin(WREF), rel_exact=3e-2, row_scale=None):
    """fn(lin) builds the expected output from lin(w) = the layer's product with weight w.
    q4 (x = d q + m, GGUF Q4_1 here: m is each block's minimum) takes its min term from the
    unquantized input: d dx sum(q qx) + m sum(x). row_scale (T, 1): the kernel quantized
    x / row_scale and multiplied its result by row_scale (the fused norm's 1/rms), so the
    emulation rounds exactly where the kernel does."""
    x64 = x.astype(np.float64)
    if row_scale is None:
        xq = quant_x(x)
    else:
        xq = quant_x((x64 / row_scale).astype(np.float32)) * row_scale

    def emu(w):
        w = wref if w is WREF else w
        out = xq @ w.T.astype(np.float64)
        if fmt == "q4":
            m = np.repeat(w.reshape(w.shape[0], -1, 32).min(-1), 32, axis=1).astype(np.float64)
            out += (x64 - xq) @ m.T
        return out

    want = fn(emu)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    exact = fn(lambda w: x64 @ (wref if w is WREF else w).T.astype(np.float64))
    scale = max(float(np.abs(exact).max()), float(np.abs(x64 @ wref.T.astype(np.float64)).max()))
    err = np.abs(y - exact).max() / max(1e-6, scale)
    assert err < rel_exact, err


WREF = object()   # stands for the layer's own weight in fn


@pytest.mark.parametrize("tuning", TUNINGS)
@pytest.mark.parametrize("fmt,O,I", [("q8", 45, 576), ("q4", 45, 576), ("q4", 301, 1536), ("q8", 7, 32),
                                     ("q6k", 45, 512), ("q6k", 37, 1536)])
def test_blk_formats(tuning, fmt, O, I):
    T = 3
    x, wref, _, y = run_linear("decode", T, _weights(O, I), fmt, tuning=tuning)
    check(y[:T], x, wref, fmt)
    assert (y[T:] == SENTINEL).all()


@pytest.mark.parametrize("tuning", TUNINGS)
@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_blk_pre_norm(tuning, fmt):
    T, I = 2, 576
    nw = np.random.default_rng(11).standard_normal(I).astype(np.float32)
    x, wref, _, y = run_linear("decode", T, _weights(45, I), fmt, tuning=tuning, norm_w=nw)
    xn = rms_norm_ref(x, nw).astype(np.float32)
    inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
    check(y[:T], xn, wref, fmt, row_scale=inv)   # the kernels quantize x * nw, then scale by 1/rms


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_blk_fusions(fusion, fmt):
    T, W, kw = fusion_case(fusion, GemvVariant("blk", rows=4, wg=64))
    x, wref, w2ref, y = run_linear("decode", T, W, fmt, x_last_row=fusion == "x_last_row", **kw)
    if fusion == "x_last_row":
        check(y[:1], x[T - 1:], wref, fmt)
        assert (y[1:] == SENTINEL).all()
        return
    fn = {"dual_silu": lambda lin: silu(lin(WREF)) * lin(w2ref), "dual_gelu": lambda lin: gelu_tanh(lin(WREF)) * lin(w2ref),
          "bias_residual": lambda lin: lin(WREF) + kw["bias"] + kw["y0"],
          "softcap": lambda lin: 2.0 * np.tanh(lin(WREF) / 2.0)}[fusion]
    check(y[:T], x, wref, fmt, fn)
    assert (y[T:] == SENTINEL).all()


def test_blk_refuses_float_weights_and_unquantized_inputs():
    gw, _ = make_weight(_weights(4, 64), "f16")
    with pytest.raises(UnsupportedModelError, match="reads q8, q4 .*q4k, q5k and q6k"):
        LinearKernel(device(), "decode", xq_desc("xq", 64, 1), TensorDesc("y", 4, 1), gw, variant=GemvVariant("blk"))
    gq, _ = make_weight(_weights(4, 64), "q8")
    with pytest.raises(ValueError, match="QuantizeKernel"):
        LinearKernel(device(), "decode", TensorDesc("x", 64, 1), TensorDesc("y", 4, 1), gq, variant=GemvVariant("blk"))
    with pytest.raises(ValueError, match="cannot quantize"):
        QuantizeKernel(device(), TensorDesc("x", 48, 1), xq_desc("xq", 48, 1), "q8")


@pytest.mark.parametrize("fmt,qfmt,dual,residual,qnorm,wg,qlast", [
    ("q4", "q4", False, True, 0.0, 256, 0),     # down / O projection + residual -> next norm's int8 row
    ("q8", "q8", False, True, 1.0, 64, 0),      # Gemma-style norm weight offset; smaller workgroup
    ("q4", "q8", True, False, None, 128, 0),    # gate/up + SiLU -> the down projection's int8 row, no y
    ("q4", "q4", False, True, 0.0, 64, 2),      # the same, each 32-block quantized by its last workgroup
    ("q8", "q8", False, True, 1.0, 32, 8),
    ("q4", "q8", True, False, None, 128, 4),
    ("q4", "q4", False, True, 0.0, 32, -2),     # 2048 outputs: 1024 workgroups racing to their counters
])
def test_blk_quantizing_epilogue(fmt, qfmt, dual, residual, qnorm, wg, qlast):
    """qout: the GEMV also writes its outputs as the next GEMV's int8 row (norm weight applied,
    partial sums of y^2 per 32 outputs): the same words and scales as the plain GEMV followed by
    QuantizeKernel with that norm, y unchanged, and the partials adding up to sum(y^2). qlast
    (rows per workgroup): 32 / rows workgroups per 32-block, the last to finish quantizing it;
    dispatched twice (its counters reset themselves: the second dispatch writes the same)."""
    dev = device()
    T, O, I = 2, 2048 if qlast < 0 else 96, 576
    qlast = abs(qlast)
    rng = np.random.default_rng(21)
    x = rng.standard_normal((T, I)).astype(np.float32)
    xd, qd, yd = TensorDesc("x", I, CAP), xq_desc("xq", I, CAP), TensorDesc("y", O, CAP)
    nd = xq_desc("next", O, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    y0 = rng.standard_normal((T, O)).astype(np.float32) if residual else None
    gw, _ = make_weight(_weights(O, I, seed=22), fmt)
    gw2 = make_weight(_weights(O, I, seed=23), fmt, name="w2")[0] if dual else None
    wbufs = {"w": gw.buffers} | ({"w2": gw2.buffers} if dual else {})
    nw = rng.standard_normal(O).astype(np.float32)
    write_step(T)
    from tests.gpu_util import run, step_buffer
    run(QuantizeKernel(dev, xd, qd, fmt), {"x": xb, "xq": qb}, T)
    # reference: plain blk GEMV, then QuantizeKernel(norm) on its output
    y_ref = upload(yd, y0)
    plain = LinearKernel(dev, "decode", qd, yd, gw, gw2, variant=GemvVariant("blk", rows=4, wg=wg),
                         epilogue=Epilogue(residual=residual))
    run(plain, {"x": qb, "y": y_ref, **wbufs}, T)
    want = upload(nd, None)
    run(QuantizeKernel(dev, yd, nd, qfmt, pre_norm=PreNorm(1e-5, qnorm) if qnorm is not None else None),
        {"x": y_ref, "xq": want} | ({"nw": f32_buffer(nw)} if qnorm is not None else {}), T)
    # fused
    y_got, got = upload(yd, y0), upload(nd, None)
    variant = GemvVariant("blk", rows=qlast, wg=wg, qlast=True) if qlast else GemvVariant("blk", wg=wg)
    k = LinearKernel(dev, "decode", qd, yd, gw, gw2, variant=variant,
                     epilogue=Epilogue(residual=residual, qout=QuantOut(nd, qfmt, qnorm, residual)))
    assert k.rows == (qlast or 32)
    binds = {"step": step_buffer(), "x": qb, "y": y_got, **wbufs, "qout": got} | (
        {"qnw": f32_buffer(nw)} if qnorm is not None else {})
    if qlast:
        binds |= {"qy": upload(TensorDesc("qy", O, CAP), None), "qcnt": (cnt := f32_buffer(np.zeros(CAP * O // 32, np.float32)))}
        dev.submit([k.dispatch(binds, k.workgroups(T))])
        first = dev.read_buffer_sync(got)
        assert not np.frombuffer(dev.read_buffer_sync(cnt), np.uint32).any()   # every counter back at 0
        if residual:
            dev.write_buffer(y_got, np.ascontiguousarray(np.pad(y0, ((0, CAP - T), (0, 0)))).tobytes())
    dev.submit([k.dispatch(binds, k.workgroups(T))])
    if qlast:
        assert dev.read_buffer_sync(got) == first
    yr, yg = download(yd, y_ref)[:T], download(yd, y_got)[:T]
    if residual:
        np.testing.assert_allclose(yg, yr, rtol=1e-5, atol=1e-5)
    w = np.frombuffer(dev.read_buffer_sync(want), np.uint32).reshape(CAP, -1)[:T]
    g = np.frombuffer(dev.read_buffer_sync(got), np.uint32).reshape(CAP, -1)[:T]
    nb, nbp = O // 32, (O // 32 + 3) // 4 * 4
    mism = (g[:, :8 * nb] != w[:, :8 * nb]).mean()
    assert mism <= 0.02, mism            # int8 words: equal but for values a rounding edge apart
    np.testing.assert_allclose(g[:, 8 * nb:9 * nb].view(np.float32), w[:, 8 * nb:9 * nb].view(np.float32), rtol=1e-5)
    np.testing.assert_allclose(g[:, 8 * nb + nbp:8 * nb + nbp + nb].view(np.float32),
                               w[:, 8 * nb + nbp:8 * nb + nbp + nb].view(np.float32), rtol=1e-4, atol=1e-5)
    if qnorm is not None:
        parts = g[:, 8 * nb + 2 * nbp: 8 * nb + 2 * nbp + nb].view(np.float32)
        np.testing.assert_allclose(parts.sum(1), (yr.astype(np.float64) ** 2).sum(1), rtol=1e-4)


ROPE_CASES = [("blk", "q4", True, False, 4, 1), ("blk", "q4", False, True, 2, 1), ("blk", "q8", True, True, 8, 1),
              ("blk", "q6k", False, True, 4, 1),
              # row-split: a Q4_K_M Q|K|V (Q, K in q4k, V in q6k), and a range boundary inside a
              # workgroup and a head (each row in its range); the float GEMV reads it too
              ("blk", "q4k*192|q6k*64", False, True, 4, 1), ("blk", "q4_0*100|q4k*156", True, False, 8, 1),
              ("subgroup", "q4k*192|q6k*64", True, False, 2, 1),
              ("subgroup", "f16", True, True, 8, 4), ("subgroup", "q8", False, False, 2, 1),
              ("wide", "q4", True, False, 8, 1), ("wide", "f16", False, True, 16, 4),
              ("wide", "f16", True, True, 16, 1, 4), ("wide", "q8", False, False, 8, 1, 2),
              ("wide", "f16", True, False, 2, 1, 2, True), ("wide", "q4", False, True, 8, 1, 4, True),
              ("wide", "f16", True, True, 4, 2, 2, True), ("wide", "q8", False, False, 8, 4, 4, True)]


@pytest.mark.parametrize("kv_f16", [False, True], ids=["kv32", "kv16"])
@pytest.mark.parametrize("variant,fmt,rope_half,bias,rows,unroll,mrows,ksplit",
                         [c + (1,) * (7 - len(c)) + (False,) * (len(c) < 8) for c in ROPE_CASES])
def test_rope_epilogue(variant, fmt, rope_half, bias, rows, unroll, mrows, ksplit, kv_f16):
    """rope: the QKV GEMV applies RoPE, writes q in the attention's relayout and appends K/V to
    the caches itself: the same q rows and cache contents as the plain GEMV followed by
    RopeQKVKernel (both pairings; with the QKV bias; two tokens at positions 37, 38). blk: the
    integer-dot GEMV on a quantized row; subgroup / wide: the float GEMVs with the RMSNorm fused
    (wide with mrows: several rotation pairs per subgroup at a time; ksplit: per workgroup)."""
    from tests.gpu_util import run, step_buffer
    from webdrift.kernels.rope import RopeQKVKernel
    dev = device()
    if not dev.has_subgroups:
        pytest.fail("the CI adapter (lavapipe) offers subgroups; the epilogue must be tested")
    H, KVH, DH, cap, T, pos0 = 4, 2, 32, 64, 2, 37
    O, I = (H + 2 * KVH) * DH, 8192 if ksplit and unroll > 1 else 256   # (split K's strides at a time: run)
    rng = np.random.default_rng(31)
    x = rng.standard_normal((T, I)).astype(np.float32)
    xd = TensorDesc("x", I, CAP)
    xb = upload(xd, x)
    write_step(T, pos0=pos0)
    if variant == "blk":
        src = xq_desc("xq", I, CAP)
        sb = upload(src, None)
        run(QuantizeKernel(dev, xd, src, fmt), {"x": xb, "xq": sb}, T, pos0=pos0)
        tail, norm = {}, None
    else:   # float input with the RMSNorm fused in: its weight binds as "nw"
        src, sb = xd, xb
        tail, norm = {"nw": f32_buffer(rng.standard_normal(I).astype(np.float32))}, PreNorm(1e-5, 0.0)
    tuning = GemvVariant(variant, rows=rows, wg=64, unroll=unroll if variant != "blk" else 1, mrows=mrows,
                         ksplit=ksplit)
    gw, _ = make_weight(_weights(O, I, seed=32), fmt)
    bb = {"bias": f32_buffer(rng.standard_normal(O).astype(np.float32))} if bias else {}
    inv_freq = f32_buffer((10000.0 ** (-np.arange(0, DH, 2) / DH)).astype(np.float32))
    q_rel = TensorDesc("q", DH, T * (H // KVH), b=KVH)
    cache = lambda: cache_buffer(np.full(KVH * cap * DH, 7.0), kv_f16)   # (kv_f16: the caches hold f16)
    # reference: plain GEMV into qkv, then RopeQKVKernel
    yd = TensorDesc("qkv", O, CAP)
    yb = upload(yd, None)
    run(LinearKernel(dev, "decode", src, yd, gw, variant=tuning, pre_norm=norm, epilogue=Epilogue(bias=bias)),
        {"x": sb, "y": yb, "w": gw.buffers, **bb, **tail}, T, pos0=pos0)
    qr, kr, vr = upload(q_rel, None), cache(), cache()
    run(RopeQKVKernel(dev, yd, q_rel, H, KVH, DH, cap, rope_half, kv_f16=kv_f16),
        {"qkv": yb, "q": qr, "kc": kr, "vc": vr, "inv_freq": inv_freq}, T, pos0=pos0)
    # fused
    qf, kf, vf = upload(q_rel, None), cache(), cache()
    rope = RopeOut(q_rel, H, KVH, DH, cap, rope_half, kv_f16)
    k = LinearKernel(dev, "decode", src, yd, gw, variant=tuning, pre_norm=norm, epilogue=Epilogue(bias=bias, rope=rope))
    write_step(T, pos0=pos0)
    dev.submit([k.dispatch({"step": step_buffer(), "x": sb, "y": upload(yd, None), "w": gw.buffers, **bb, **tail,
                            "q": qf, "kc": kf, "vc": vf, "inv_freq": inv_freq}, k.workgroups(T))])
    np.testing.assert_allclose(download(q_rel, qf, squeeze=False), download(q_rel, qr, squeeze=False),
                               rtol=1e-5, atol=1e-5)
    for got, want in ((kf, kr), (vf, vr)):
        g, w = read_cache(got, f16=kv_f16), read_cache(want, f16=kv_f16)
        # (f16: the same f32 sums in another order can round to neighbouring f16 values)
        np.testing.assert_allclose(g, w, rtol=2 ** -10 if kv_f16 else 1e-5, atol=1e-5)
        assert (g != 7.0).sum() == KVH * T * DH      # exactly the two positions were appended
    with pytest.raises(ValueError, match="RoPE in the GEMV epilogue"):
        LinearKernel(dev, "decode", src, yd, gw, variant=GemvVariant(variant, rows=3, wg=64), epilogue=Epilogue(rope=rope))
