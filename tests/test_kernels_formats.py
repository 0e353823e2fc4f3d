"""The group-size and per-channel formats of issue 14 (q8pc, q4g128, q4pc, e0m4; kernels/weights.py)
against numpy references of their exact schemes written here:

  q8 kind (q8pc): per group of G inputs (per channel: G = I), d = max|x| / 127 (f32),
                  q = round-half-away(x * (1 / d)) in int8; x' = q d
  q4 kind (q4g128, q4pc): lo = min, d = (max - min) / 15 (f32), q = min(15, trunc((x - lo) / d + 0.5)),
                  d and lo stored as f16; x' = q d16 + lo16
  e0m4:           s = (max - min) * 16 / 15, b = min - s, both rounded to f16 first; the group's
                  values then lie in [b + s, b + 2 s); q = clip(floor(((x - b) / s - 1) * 16 + 0.5), 0, 15),
                  the 4 fraction bits of an f32 whose exponent is 0: x' = (1 + q / 16) s + b
  groups of G along each row, the last one shorter where G does not divide I.

The round trip: GPU conversion (from F32, F16, BF16 and K-quant bytes) decoded from the documented
buffers, compared with the reference quantization of the same source values (codes may differ by
one where the GPU's 1/d rounds differently, in at most 0.2% of the elements); the kernels (decode
GEMV variants, prefill GEMM, gate/up pair, embedding) against numpy on the decoded weights; bad
input refused with clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import device, download, run, source_bytes, upload
from webdrift.errors import InvalidArgumentError, UnsupportedModelError
from webdrift.kernels.convert import allocate_weight, upload_rows
from webdrift.kernels.embedding import EmbeddingKernel
from webdrift.kernels.linear import GemvVariant, LinearKernel
from webdrift.models.manifest import runtime_format
from webdrift.runtime.options import EngineOptions
from webdrift.tensor import TensorDesc

NEW = ("q8pc", "q4g128", "q4pc", "e0m4")
GROUP = {"q8pc": None, "q4g128": 128, "q4pc": None, "e0m4": 32}   # None: the whole row
SENTINEL = 1234.5


def _groups(I: int, G: int | None):
    G = G or I
    return [(a, min(I, a + G)) for a in range(0, I, G)]


def _round_away(v):
    return np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))


def quantize_ref(x: np.ndarray, fmt: str):
    """(codes (O, I) int, params (O, NG, 1 or 2) float32 as stored, values x' (O, I))."""
    x = x.astype(np.float32)
    O, I = x.shape
    gs = _groups(I, GROUP[fmt])
    q = np.zeros((O, I), np.int64)
    par = np.zeros((O, len(gs), 1 if fmt == "q8pc" else 2), np.float32)
    val = np.zeros((O, I), np.float32)
    for k, (a, b) in enumerate(gs):
        g = x[:, a:b]
        lo, hi = g.min(1, keepdims=True), g.max(1, keepdims=True)
        with np.errstate(divide="ignore"):
            if fmt == "q8pc":
                d = np.abs(g).max(1, keepdims=True) / np.float32(127)
                inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
                c = _round_away(g * inv)
                par[:, k, 0], val[:, a:b] = d[:, 0], c * d
            elif fmt == "e0m4":
                s32 = (hi - lo) * np.float32(16.0 / 15.0)
                s, bias = s32.astype(np.float16).astype(np.float32), (lo - s32).astype(np.float16).astype(np.float32)
                inv = np.where(s != 0, np.float32(1) / s, np.float32(0)).astype(np.float32)
                c = np.clip(np.floor(((g - bias) * inv - np.float32(1)) * np.float32(16) + np.float32(0.5)), 0, 15)
                par[:, k, 0], par[:, k, 1] = s[:, 0], bias[:, 0]
                val[:, a:b] = (1 + c / np.float32(16)) * s + bias
            else:
                d = (hi - lo) / np.float32(15)
                inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
                c = np.minimum(15, np.trunc((g - lo) * inv + np.float32(0.5)))
                d16, lo16 = d.astype(np.float16).astype(np.float32), lo.astype(np.float16).astype(np.float32)
                par[:, k, 0], par[:, k, 1] = d16[:, 0], lo16[:, 0]
                val[:, a:b] = c * d16 + lo16
        q[:, a:b] = c
    return q, par, val


def decode_ref(fmt: str, O: int, I: int, raw: list[bytes]):
    """(codes, params, values) of runtime buffers, per the storage kernels/weights.py documents:
    data: int8 x4 per word (q8 kind) or uint4 x8 per word, element 8k+n at nibble n of word k;
    scales: f32 per group (q8 kind) or f16 pairs per group (q4 kind, e0m4)."""
    gs = _groups(I, GROUP[fmt])
    cols = np.concatenate([np.full(b - a, k) for k, (a, b) in enumerate(gs)])
    if fmt == "q8pc":
        q = np.frombuffer(raw[0], np.int8)[: O * I].reshape(O, I).astype(np.int64)
        par = np.frombuffer(raw[1], np.float32)[: O * len(gs)].reshape(O, len(gs), 1)
        return q, par, q * par[:, cols, 0]
    words = np.frombuffer(raw[0], np.uint32)[: O * I // 8].reshape(O, I // 8)
    q = np.stack([(words >> (4 * n)) & 15 for n in range(8)], axis=-1).reshape(O, I).astype(np.int64)
    par = np.frombuffer(raw[1], np.float16)[: O * len(gs) * 2].reshape(O, len(gs), 2).astype(np.float32)
    a, b = par[:, cols, 0], par[:, cols, 1]
    if fmt == "e0m4":
        return q, par, ((1 + q / 16) * a + b).astype(np.float32)
    return q, par, (q * a + b).astype(np.float32)


def assert_params(par, rpar, fmt: str):
    """Stored scales equal the reference's, up to the GPU's division (WGSL allows 2.5 ULP: SwiftShader's
    max|x| / 127 can be 1 ULP off): q8pc's f32 scale within 3e-7; the f16 pairs within one f16 step,
    and equal in at least 99% of the groups."""
    if fmt == "q8pc":
        np.testing.assert_allclose(par, rpar, rtol=3e-7, atol=0)
        return
    np.testing.assert_allclose(par, rpar, rtol=2.0**-10, atol=0)
    assert np.count_nonzero(par != rpar) <= 0.01 * par.size


def gpu_weight(x: np.ndarray, fmt: str, src: str = "F32", name: str = "w"):
    """x stored as src bytes, converted on the GPU into fmt: (GPUWeight, source values, decoded (codes, params, values))."""
    raw, ref = source_bytes(x, src)
    dev = device()
    w = allocate_weight(dev, name, fmt, x.shape[0], x.shape[1])
    upload_rows(dev, w, src, raw, x.shape[0])
    return w, ref, decode_ref(fmt, w.o, w.i, [dev.read_buffer_sync(b) for b in w.buffers])


# -- quantize -> dequantize round trip -------------------------------------------------------------

@pytest.mark.parametrize("fmt", NEW)
@pytest.mark.parametrize("src,I", [("F32", 576), ("F16", 1536), ("BF16", 256), ("Q6_K", 512), ("Q4_K", 256)])
def test_round_trip_matches_numpy_scheme(fmt, src, I):
    O = 9
    x = np.random.default_rng(5).standard_normal((O, I)).astype(np.float32)
    x[3, : min(I, 128)] = 0.25     # a constant group (zero range)
    w, ref, (q, par, val) = gpu_weight(x, fmt, src)
    rq, rpar, rval = quantize_ref(ref, fmt)
    assert_params(par, rpar, fmt)
    diff = np.abs(q - rq)
    assert diff.max() <= 1 and np.count_nonzero(diff) <= 0.002 * q.size, (diff.max(), np.count_nonzero(diff))
    same = diff == 0
    np.testing.assert_allclose(val[same], rval[same], rtol=1e-6, atol=1e-6)
    # the error bound of each scheme: half a step (+ f16 rounding of the stored pair)
    for k, (a, b) in enumerate(_groups(I, GROUP[fmt])):
        g, e = ref[:, a:b], np.abs(val[:, a:b] - ref[:, a:b]).max(1)
        amax, ptp = np.abs(g).max(1), np.ptp(g, axis=1)
        step = amax / 127 if fmt == "q8pc" else ptp / 15
        f16 = 0 if fmt == "q8pc" else 2.0**-10 * (np.abs(rpar[:, k]).sum(1) * (2 if fmt == "e0m4" else 1) + amax)
        assert (e <= step * (1.0 if fmt == "e0m4" else 0.5) * 1.001 + f16 + 1e-6).all(), (fmt, k)
    assert [b.size for b in w.buffers][1] >= O * len(_groups(I, GROUP[fmt])) * 4


def test_e0m4_codes_are_fraction_bits():
    """The stored nibble is the top 4 fraction bits of (x - b) / s as an f32 in [1, 2) (exponent 0):
    OR-ing it under 1.0f's exponent gives the value's float exactly."""
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    _, _, (q, par, _) = gpu_weight(x, "e0m4")
    f = ((q.astype(np.uint32) << 19) | np.uint32(0x3F800000)).view(np.float32)   # the bit-op decode
    s, b = np.repeat(par[..., 0], 32, axis=1), np.repeat(par[..., 1], 32, axis=1)    # per group of 32
    # each value is the nearest of its group's 16 levels b + s * [1, 2): within half a step (s / 32)
    np.testing.assert_array_less(np.abs(f * s + b - x), s / 32 * 1.001 + 2.0**-10 * (np.abs(s) + np.abs(b)))
    assert q.min() == 0 and q.max() == 15          # every group spans its levels: the min and max codes


# -- kernels ---------------------------------------------------------------------------------------

def _linear(stage, T, fmt, O, I, variant=None, dual=False, seed=0):
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((O, I)) / np.sqrt(I)).astype(np.float32)
    x = rng.standard_normal((T, I)).astype(np.float32)
    cap = 72
    xd, yd = TensorDesc("x", I, cap), TensorDesc("y", O, cap)
    w, _, (_, _, wv) = gpu_weight(W, fmt)
    bufs = {"x": upload(xd, x), "y": upload(yd, None, fill=SENTINEL), "w": w.buffers}
    w2 = None
    if dual:
        w2, _, (_, _, w2v) = gpu_weight(W[::-1].copy() * 0.5, fmt, name="w2")
        bufs["w2"] = w2.buffers
    k = LinearKernel(device(), stage, xd, yd, w, w2, variant=variant or GemvVariant())
    run(k, bufs, T)
    y = download(yd, bufs["y"])
    ref = x.astype(np.float64) @ wv.T.astype(np.float64)
    if dual:
        up = x.astype(np.float64) @ w2v.T.astype(np.float64)
        ref = ref / (1 + np.exp(-ref)) * up
    assert (y[T:] == SENTINEL).all()
    return y[:T], ref


VARIANTS = [GemvVariant("row", rows=1, wg=64), GemvVariant("split", rows=4, wg=64),
            GemvVariant("subgroup", rows=8, wg=256)]


@pytest.mark.parametrize("fmt", NEW)
@pytest.mark.parametrize("stage,T,v", [("decode", 1, 0), ("decode", 2, 1), ("decode", 1, 2), ("prefill", 1, None),
                                       ("prefill", 65, None)])
@pytest.mark.parametrize("O,I", [(45, 576), (7, 1536)])
def test_linear_new_formats(fmt, stage, T, v, O, I):
    variant = VARIANTS[v] if v is not None else None
    if variant is not None and variant.variant == "subgroup" and not device().has_subgroups:
        pytest.skip("no subgroups on this adapter")   # not counted: the other variants cover the format
    y, ref = _linear(stage, T, fmt, O, I, variant)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(ref).max()) * 4)


@pytest.mark.parametrize("fmt", ["q4pc", "e0m4"])
@pytest.mark.parametrize("stage,T", [("decode", 3), ("prefill", 65)])
def test_linear_gate_up_pair(fmt, stage, T):
    y, ref = _linear(stage, T, fmt, 40, 256, dual=True, seed=3)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", NEW)
def test_embedding_new_formats(fmt):
    V, D, T, cap = 70, 128, 5, 8
    table = np.random.default_rng(4).standard_normal((V, D)).astype(np.float32)
    w, _, (_, _, tv) = gpu_weight(table, fmt)
    ids = np.array([3, 69, 0, 3, 41], np.uint32)
    od = TensorDesc("out", D, cap)
    idb = device().create_buffer(4 * cap, label="ids")
    device().write_buffer(idb, np.resize(ids, cap).astype(np.uint32))
    bufs = {"ids": idb, "w": w.buffers, "out": upload(od, None, fill=SENTINEL)}
    run(EmbeddingKernel(device(), w, od, scale=2.0), bufs, T)
    np.testing.assert_allclose(download(od, bufs["out"])[:T], 2.0 * tv[ids], rtol=1e-6, atol=1e-6)


# -- bad input -------------------------------------------------------------------------------------

def test_bad_formats_are_refused():
    with pytest.raises(InvalidArgumentError, match="weight_format='q4g64'.*q4g128"):
        EngineOptions(weight_format="q4g64")
    with pytest.raises(UnsupportedModelError, match="'8/4/4' is not one of"):   # a policy, not a storage
        allocate_weight(device(), "w", "8/4/4", 4, 64)
    for fmt in NEW:
        with pytest.raises(UnsupportedModelError, match=f"{fmt} weights need the input size to be a multiple of 32, got 48"):
            allocate_weight(device(), "w", fmt, 4, 48)
    with pytest.raises(UnsupportedModelError, match="the wide GEMV reads q4, q8"):
        w = allocate_weight(device(), "w", "e0m4", 8, 64)
        LinearKernel(device(), "decode", TensorDesc("x", 64, 1), TensorDesc("y", 8, 1), w,
                     variant=GemvVariant("wide", rows=8, wg=256))


def test_mixed_8_4_4_policy():
    """8/4/4 (ML Drift): int8 per-channel attention, int4 per-channel embedding and feed-forward."""
    assert runtime_format(["Q8_0"], "8/4/4", "attn") == "q8pc"
    assert runtime_format(["Q4_K"], "8/4/4", "ffn") == "q4pc"
    assert runtime_format(["F16"], "8/4/4", "embd") == "q4pc"
    with pytest.raises(InvalidArgumentError, match="chooses by a matrix's role"):
        runtime_format(["F16"], "8/4/4", None)


# -- the integer-dot paths (int8 activations) ------------------------------------------------------

def _int8_ref(x, q, par, wv, fmt):
    """The integer-dot kernels' result for int8-quantized x (test_kernels_linear_blk.quant_x):
    per 32-block d_w d_x sum(q_w q_x) + m_w sum(x), i.e. xq W^T + (x - xq) M^T with M the
    weight's value at code 0 (q4 kinds: the pair's min; e0m4: s + b); q8pc has no min term."""
    from tests.test_kernels_linear_blk import quant_x
    xq = quant_x(x)
    out = xq @ wv.T.astype(np.float64)
    if fmt != "q8pc":
        m = wv - (q * (par[..., 0][:, _cols(x.shape[1], fmt)] / (16 if fmt == "e0m4" else 1)))
        out += (x.astype(np.float64) - xq) @ m.T.astype(np.float64)
    return out


def _cols(I, fmt):
    gs = _groups(I, GROUP[fmt])
    return np.concatenate([np.full(b - a, k) for k, (a, b) in enumerate(gs)])


@pytest.mark.parametrize("fmt", NEW)
@pytest.mark.parametrize("I", [576, 1536])
def test_integer_dot_paths(fmt, I):
    """q8pc, q4g128, q4pc and e0m4 read by the integer-dot decode GEMV (one row, unrolled, several
    columns) and the int8 prefill GEMM on QuantizeKernel's rows: against numpy's emulation of the
    int8 arithmetic from the stored codes and scales (tight: only f32 summation differs), and
    within the int8 activations' error of the exact product."""
    from tests.gpu_util import step_buffer, write_step
    from webdrift.kernels.linear import GemmVariant
    from webdrift.kernels.quantize import QuantizeKernel, xq_desc
    dev = device()
    O, T, cap = 45, 5, 72
    rng = np.random.default_rng(I)
    W = (rng.standard_normal((O, I)) / np.sqrt(I)).astype(np.float32)
    x = rng.standard_normal((T, I)).astype(np.float32)
    w, _, (q, par, wv) = gpu_weight(W, fmt)
    xd, qd, yd = TensorDesc("x", I, cap), xq_desc("xq", I, cap), TensorDesc("y", O, cap)
    qb = upload(qd, None)
    run(QuantizeKernel(dev, xd, qd, fmt), {"x": upload(xd, x), "xq": qb}, T)
    want = _int8_ref(x, q, par, wv, fmt)
    exact = x.astype(np.float64) @ wv.T.astype(np.float64)
    for stage, v in (("decode", GemvVariant("blk", rows=4, wg=64)), ("decode", GemvVariant("blk", rows=2, wg=32, unroll=2)),
                     ("decode", GemvVariant("blk", rows=4, wg=64, cols=4)), ("prefill", GemmVariant(int8=True))):
        yb = upload(yd, None, fill=SENTINEL)
        k = LinearKernel(dev, stage, qd, yd, w, variant=v)
        write_step(T)
        dev.submit([k.dispatch({"step": step_buffer(), "x": qb, "y": yb, "w": w.buffers}, k.workgroups(T))])
        y = download(yd, yb)
        assert (y[T:] == SENTINEL).all()
        np.testing.assert_allclose(y[:T], want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=f"{fmt} {v}")
        assert np.abs(y[:T] - exact).max() < 0.03 * np.abs(exact).max()
