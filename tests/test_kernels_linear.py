"""LinearKernel (wgsl/linear_split / _row / _subgroup / _wide.wgsl for decode, wgsl/linear_gemm.wgsl
for prefill) vs numpy: every weight format, odd sizes, the fusions (bias, residual, DUAL gate/up +
SiLU / GELU-tanh, softcap, x_last_row), every decode variant the autotuner may pick, and that only
rows t < n_tokens are written."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import device, download, f32_buffer, make_weight, run, upload
from webdrift.kernels.autotune import CANDIDATES
from webdrift.kernels.linear import Epilogue, GemvVariant, LinearKernel, PreNorm
from webdrift.tensor import TensorDesc

SENTINEL = 1234.5
CAP = 136   # token capacity of x and y: one shader per variant serves every T <= 130 (compiles are slow)


def silu(g):
    return g / (1.0 + np.exp(-g))


def gelu_tanh(g):
    return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))


def run_linear(stage, T, W, fmt, *, layout="OI", act_layout="linear", w2=None, bias=None, y0=None,
               act="silu", softcap=None, x_last_row=False, cap=CAP, seed=0, tuning=None, norm_w=None,
               norm_offset=0.0):
    """Run y = linear(x) for random x (T, I); returns (x, dense W, dense W2, y rows [0, cap)).
    tuning: the GemvVariant (default: the kernel's). norm_w: fuse RMSNorm (eps 1e-5, weight
    norm_w + norm_offset) of x into the kernel."""
    O, I = W.shape
    x = np.random.default_rng(seed).standard_normal((T, I)).astype(np.float32)
    xd = TensorDesc("x", I, cap, layout=act_layout)
    yd = TensorDesc("y", O, cap, layout=act_layout)
    gw, wref = make_weight(W, fmt, layout)
    bufs = {"x": upload(xd, x), "y": upload(yd, y0, fill=SENTINEL), "w": gw.buffers}
    w2ref = gw2 = None
    if w2 is not None:
        gw2, w2ref = make_weight(w2, fmt, layout, name="w2")
        bufs["w2"] = gw2.buffers
    if bias is not None:
        bufs["bias"] = f32_buffer(bias)
    if norm_w is not None:
        bufs["nw"] = f32_buffer(norm_w)
    k = LinearKernel(device(), stage, xd, yd, gw, gw2, variant=tuning or GemvVariant(),
                     pre_norm=PreNorm(1e-5, norm_offset) if norm_w is not None else None,
                     epilogue=Epilogue(bias=bias is not None, residual=y0 is not None, act=act, softcap=softcap),
                     x_last_row=x_last_row)
    run(k, bufs, T)
    return x, wref, w2ref, download(yd, bufs["y"])


def assert_close(got, ref, rtol=2e-5):
    ref = np.asarray(ref)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * max(1.0, float(np.abs(ref).max())) * 4)


def _weights(O, I, seed=1):
    return np.random.default_rng(seed).standard_normal((O, I)).astype(np.float32) / np.sqrt(I)


# -- every format, odd sizes ---------------------------------------------------------------------

CASES = [  # (fmt, layout, O, I)
    ("f32", "OI", 45, 67), ("f32", "OI4O4", 45, 67), ("f16", "OI", 45, 67), ("f16", "OI4O4", 45, 67),
    ("q8", "OI", 45, 576), ("q4", "OI", 45, 576), ("f32", "OI4O4", 6, 576), ("f16", "OI4O4", 46, 1536),
    ("q8", "OI", 7, 1536),
]


@pytest.mark.parametrize("fmt,layout,O,I", CASES)
@pytest.mark.parametrize("stage,T", [("decode", 1), ("decode", 3), ("prefill", 1), ("prefill", 65),
                                     ("prefill", 130)])
def test_linear_formats(stage, T, fmt, layout, O, I):
    """T = 65 and 130 leave the last 64-row prefill tile partly valid: rows T.. must stay untouched."""
    W = _weights(O, I)
    x, wref, _, y = run_linear(stage, T, W, fmt, layout=layout)
    assert_close(y[:T], x.astype(np.float64) @ wref.T.astype(np.float64))
    assert (y[T:] == SENTINEL).all(), "rows t >= n_tokens must not be written"


@pytest.mark.parametrize("stage,T", [("decode", 1), ("prefill", 3)])
@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_linear_many_rows(stage, T, fmt):
    """O = 4097: a ragged last workgroup of outputs (decode: 4 rows, prefill: 64 columns)."""
    W = _weights(4097, 128, seed=2)
    x, wref, _, y = run_linear(stage, T, W, fmt)
    assert_close(y[:T], x.astype(np.float64) @ wref.T.astype(np.float64))
    assert (y[T:] == SENTINEL).all()


# -- fusions -------------------------------------------------------------------------------------

STAGES = [("decode", 3), ("prefill", 65)]


@pytest.mark.parametrize("stage,T", STAGES)
@pytest.mark.parametrize("act_layout", ["linear", "sliced"])
def test_linear_bias(stage, T, act_layout):
    W = _weights(45, 67)
    b = np.random.default_rng(5).standard_normal(45).astype(np.float32)
    x, wref, _, y = run_linear(stage, T, W, "f32", bias=b, act_layout=act_layout)
    assert_close(y[:T], x @ wref.T + b)


@pytest.mark.parametrize("stage,T", STAGES)
@pytest.mark.parametrize("act_layout", ["linear", "sliced"])
def test_linear_residual(stage, T, act_layout):
    W = _weights(45, 576)
    y0 = np.random.default_rng(6).standard_normal((T, 45)).astype(np.float32)
    x, wref, _, y = run_linear(stage, T, W, "q8", y0=y0, act_layout=act_layout)
    assert_close(y[:T], x @ wref.T + y0)
    assert (y[T:] == SENTINEL).all()


@pytest.mark.parametrize("stage,T", STAGES)
@pytest.mark.parametrize("act,fn", [("silu", silu), ("gelu_tanh", gelu_tanh)])
@pytest.mark.parametrize("fmt,I", [("f16", 67), ("q4", 576)])
def test_linear_dual_gate_up(stage, T, act, fn, fmt, I):
    Wg, Wu = _weights(45, I, seed=7) * 3, _weights(45, I, seed=8)
    x, wg, wu, y = run_linear(stage, T, Wg, fmt, w2=Wu, act=act)
    x = x.astype(np.float64)
    assert_close(y[:T], fn(x @ wg.T) * (x @ wu.T))
    assert (y[T:] == SENTINEL).all()


@pytest.mark.parametrize("stage,T", STAGES)
def test_linear_softcap(stage, T):
    W = _weights(45, 67) * 8          # outputs ~ N(0, 8): well into tanh's saturation at cap 5
    x, wref, _, y = run_linear(stage, T, W, "f32", softcap=5.0)
    ref = 5.0 * np.tanh((x @ wref.T) / 5.0)
    assert np.abs(x @ wref.T).max() > 10
    assert_close(y[:T], ref)


@pytest.mark.parametrize("fmt", ["f32", "q4"])
def test_linear_decode_x_last_row(fmt):
    """LM head on the last prompt row: reads x row T-1, writes y row 0 only."""
    T = 5
    W = _weights(45, 576)
    x, wref, _, y = run_linear("decode", T, W, fmt, x_last_row=True)
    assert_close(y[0], x[T - 1] @ wref.T)
    assert (y[1:] == SENTINEL).all()


# -- decode variants (kernels/autotune.py picks one per device and shape) -------------------------

VARIANTS = [pytest.param(c, id=f"{c.variant}{c.rows}x{c.wg}u{c.unroll}" + (f"m{c.mrows}" if c.mrows > 1 else "")
                         + ("k" if c.ksplit else ""))
            for c in CANDIDATES] + [
    pytest.param(GemvVariant("split", rows=1, wg=32), id="split1x32")]


def _needs(tuning):
    if tuning.variant == "subgroup" and not device().has_subgroups:
        pytest.fail("the test adapter (lavapipe in CI) must offer subgroups: the variant would go untested")


def _supported(tuning, fmt, layout, I):
    """The wide GEMV reads whole blocks: q4, q8, and row-major f16 with I % 8 == 0 (the kernel
    raises UnsupportedModelError otherwise, see test_wide_refuses_unsupported_weights)."""
    if tuning.variant != "wide":
        return True
    return fmt in ("q4", "q8") or (fmt == "f16" and layout == "OI" and I % 8 == 0)


VARIANT_CASES = [pytest.param(t.values[0], *case, id=f"{t.id}-{case[0]}-{case[1]}-{case[2]}x{case[3]}")
                 for t in VARIANTS
                 for case in [("f32", "OI4O4", 45, 67), ("f16", "OI", 45, 67), ("q8", "OI", 45, 576),
                              ("q4", "OI", 45, 576), ("q4", "OI", 4097, 128), ("f16", "OI", 70, 136),
                              ("q8", "OI", 301, 1536),
                              # 1025 f16 blocks: split K's 2-4 strides at a time run, then its tail
                              ("f16", "OI", 37, 8200)]
                 if _supported(t.values[0], case[0], case[1], case[3])]


@pytest.mark.parametrize("tuning,fmt,layout,O,I", VARIANT_CASES)
def test_linear_decode_variants(tuning, fmt, layout, O, I):
    _needs(tuning)
    T = 3
    x, wref, _, y = run_linear("decode", T, _weights(O, I), fmt, layout=layout, tuning=tuning)
    assert_close(y[:T], x.astype(np.float64) @ wref.T.astype(np.float64))
    assert (y[T:] == SENTINEL).all()


FUSIONS = ["dual_silu", "dual_gelu", "bias_residual", "softcap", "x_last_row"]


def fusion_case(fusion: str, tuning: GemvVariant):
    """(T, W, run_linear keyword arguments) of one fusion test case."""
    T, O, I = 2, 45, 576
    rng = np.random.default_rng(12)
    W = _weights(O, I, seed=13) * 3
    kw = {"tuning": tuning}
    if fusion.startswith("dual"):
        kw.update(w2=_weights(O, I, seed=14), act="silu" if fusion == "dual_silu" else "gelu_tanh")
    if fusion == "bias_residual":
        kw.update(bias=rng.standard_normal(O).astype(np.float32), y0=rng.standard_normal((T, O)).astype(np.float32))
    if fusion == "softcap":
        kw.update(softcap=2.0)
    return T, W, kw


@pytest.mark.parametrize("tuning", VARIANTS)
@pytest.mark.parametrize("fusion", FUSIONS)
def test_linear_decode_variant_fusions(tuning, fusion):
    _needs(tuning)
    T, W, kw = fusion_case(fusion, tuning)
    x, wref, w2ref, y = run_linear("decode", T, W, "q4", x_last_row=fusion == "x_last_row", **kw)
    x = x.astype(np.float64)
    g = x @ wref.T
    if fusion == "x_last_row":
        assert_close(y[0], g[T - 1])
        assert (y[1:] == SENTINEL).all()
        return
    ref = {"dual_silu": lambda: silu(g) * (x @ w2ref.T), "dual_gelu": lambda: gelu_tanh(g) * (x @ w2ref.T),
           "bias_residual": lambda: g + kw.get("bias", 0) + kw.get("y0", 0),
           "softcap": lambda: 2.0 * np.tanh(g / 2.0)}[fusion]()
    assert_close(y[:T], ref)
    assert (y[T:] == SENTINEL).all()


def test_linear_prefill_rejects_x_last_row():
    gw, _ = make_weight(_weights(4, 8), "f32")
    with pytest.raises(ValueError):
        LinearKernel(device(), "prefill", TensorDesc("x", 8, 4), TensorDesc("y", 4, 4), gw, x_last_row=True)


# -- RMSNorm fused into the linear layer (norm + QKV, norm + gate/up, final norm + LM head) -------

def rms_norm_ref(x, w, offset=0.0, eps=1e-5):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (w + offset)


@pytest.mark.parametrize("tuning,fmt,I", [pytest.param(t.values[0], fmt, I, id=f"{t.id}-{fmt}-{I}")
                                          for t in VARIANTS for fmt, I in [("f32", 67), ("q4", 576), ("f16", 136)]
                                          if _supported(t.values[0], fmt, "OI", I)])
def test_linear_pre_norm_decode_variants(tuning, fmt, I):
    _needs(tuning)
    T = 3
    nw = np.random.default_rng(11).standard_normal(I).astype(np.float32)
    x, wref, _, y = run_linear("decode", T, _weights(45, I), fmt, tuning=tuning, norm_w=nw)
    assert_close(y[:T], rms_norm_ref(x, nw) @ wref.T.astype(np.float64), rtol=5e-5)


@pytest.mark.parametrize("stage,T", [("decode", 1), ("decode", 3)])
@pytest.mark.parametrize("act_layout", ["linear", "sliced"])
def test_linear_pre_norm_dual_bias(stage, T, act_layout):
    """norm + gate/up + SiLU (and norm + bias) against numpy RMSNorm then the unfused maths (the
    GEMVs; the float prefill GEMMs read a normed input: test_kernels_gemm_i8.py)."""
    I = 67
    nw = np.random.default_rng(12).standard_normal(I).astype(np.float32)
    Wg, Wu = _weights(45, I, seed=7) * 3, _weights(45, I, seed=8)
    x, wg, wu, y = run_linear(stage, T, Wg, "f16", w2=Wu, act_layout=act_layout, norm_w=nw, norm_offset=1.0)
    h = rms_norm_ref(x, nw, 1.0)
    assert_close(y[:T], silu(h @ wg.T) * (h @ wu.T), rtol=5e-5)
    assert (y[T:] == SENTINEL).all()
    b = np.random.default_rng(5).standard_normal(45).astype(np.float32)
    x, wref, _, y = run_linear(stage, T, _weights(45, I), "f32", bias=b, act_layout=act_layout, norm_w=nw)
    assert_close(y[:T], rms_norm_ref(x, nw) @ wref.T + b, rtol=5e-5)


def test_linear_pre_norm_last_row():
    """final norm + LM head on the last prompt row in one kernel."""
    T, I = 5, 576
    nw = np.random.default_rng(13).standard_normal(I).astype(np.float32)
    x, wref, _, y = run_linear("decode", T, _weights(45, I), "q8", x_last_row=True, norm_w=nw)
    assert_close(y[0], rms_norm_ref(x[T - 1:T], nw)[0] @ wref.T, rtol=5e-5)
    assert (y[1:] == SENTINEL).all()


def test_mrows_is_a_wide_option_of_whole_rows_and_pairs():
    from webdrift.kernels.linear import Epilogue, RopeOut
    gw, _ = make_weight(_weights(24, 64), "q8")
    xd, yd = TensorDesc("x", 64, 4), TensorDesc("y", 24, 4)
    with pytest.raises(ValueError, match="mrows 2"):
        LinearKernel(device(), "decode", xd, yd, gw, variant=GemvVariant("subgroup", rows=8, wg=64, mrows=2))
    with pytest.raises(ValueError, match="mrows 4"):
        LinearKernel(device(), "decode", xd, yd, gw, variant=GemvVariant("wide", rows=6, wg=64, mrows=4))
    rope = RopeOut(q=TensorDesc("q", 8, 4, b=1), n_heads=1, n_kv=1, head_dim=8, cap=16, rope_half=False)
    with pytest.raises(ValueError, match="mrows 3.*whole rotation pairs"):   # a pair would straddle two subgroups
        LinearKernel(device(), "decode", xd, yd, gw, variant=GemvVariant("wide", rows=6, wg=64, mrows=3),
                     epilogue=Epilogue(rope=rope))


def test_wide_refuses_unsupported_weights():
    from webdrift.errors import UnsupportedModelError
    gw, _ = make_weight(_weights(8, 67), "f16")
    xd, yd = TensorDesc("x", 67, 4), TensorDesc("y", 8, 4)
    with pytest.raises(UnsupportedModelError, match="wide GEMV"):
        LinearKernel(device(), "decode", xd, yd, gw, variant=GemvVariant("wide", rows=16, wg=128))


@pytest.mark.parametrize("unroll,mrows", [(1, 1), (4, 1), (1, 2), (1, 4)])
@pytest.mark.parametrize("fmt", ["q4", "q8", "f16"])
def test_wide_dual_and_residual(fmt, unroll, mrows):
    """The wide GEMV with the fusions the model uses: gate/up + SiLU, residual add, bias; 1536
    inputs so the four-chain loop (UNROLL4) runs several times before its tail; MROWS rows per
    subgroup with 70 outputs (the last group of rows runs past the weight)."""
    if not device().has_subgroups:
        pytest.fail("the CI adapter (lavapipe) offers subgroups; the wide GEMV must be tested")
    tuning = GemvVariant("wide", rows=8, wg=256, unroll=unroll, mrows=mrows)
    I = 1536
    Wg, Wu = _weights(70, I, seed=7) * 3, _weights(70, I, seed=8)
    x, wg, wu, y = run_linear("decode", 2, Wg, fmt, w2=Wu, tuning=tuning)
    x = x.astype(np.float64)
    assert_close(y[:2], silu(x @ wg.T) * (x @ wu.T))
    y0 = np.random.default_rng(6).standard_normal((2, 70)).astype(np.float32)
    b = np.random.default_rng(5).standard_normal(70).astype(np.float32)
    x, wref, _, y = run_linear("decode", 2, _weights(70, I), fmt, y0=y0, bias=b, tuning=tuning)
    assert_close(y[:2], x @ wref.T + b + y0)


class _WithoutF16:
    """The test device as an adapter without shader-f16 sees it (SwiftShader in browsers)."""
    has_f16 = False

    def __init__(self, dev):
        self._dev = dev

    def __getattr__(self, name):
        return getattr(self._dev, name)


@pytest.mark.parametrize("stage,T", [("decode", 3), ("prefill", 65)])
def test_f16_native_and_packed_paths_agree(stage, T):
    """Device specialisation: f16 weights read natively (shader-f16) or unpacked from u32 pairs
    give bit-identical results."""
    dev = device()
    assert dev.has_f16, "lavapipe offers shader-f16; both paths must be exercised"
    W = _weights(45, 136)
    x = np.random.default_rng(4).standard_normal((T, 136)).astype(np.float32)
    gw, _ = make_weight(W, "f16")
    outs = []
    for d in (dev, _WithoutF16(dev)):
        xd, yd = TensorDesc("x", 136, CAP), TensorDesc("y", 45, CAP)
        bufs = {"x": upload(xd, x), "y": upload(yd, None, fill=SENTINEL), "w": gw.buffers}
        k = LinearKernel(d, stage, xd, yd, gw)
        assert ("enable f16" in k.source) == (d is dev)
        run(k, bufs, T)
        outs.append(download(yd, bufs["y"])[:T])
    np.testing.assert_array_equal(outs[0], outs[1])
