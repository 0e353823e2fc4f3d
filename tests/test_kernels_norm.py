"""RMSNormKernel (wgsl/norm.wgsl) vs numpy: plain, fused residual add (ADD_INPUT, the stream
written back), ACCUMULATE (Gemma's post-norms), LAST_ROW (LM-head input) and W_OFFSET."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import device, download, f32_buffer, run, upload
from webdrift.kernels.norm import RMSNormKernel
from webdrift.tensor import TensorDesc

CAP = 72
SENTINEL = -77.0
EPS = 1e-5


def rms_norm(x, w, eps=EPS, w_offset=0.0):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (w + w_offset)


def _data(T, C, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, C)) * 3).astype(np.float32), (1 + rng.standard_normal(C) * 0.2).astype(np.float32)


def assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["linear", "sliced"])
@pytest.mark.parametrize("C", [576, 67, 1030])
@pytest.mark.parametrize("T", [1, 3, 65])
def test_rms_norm_plain(T, C, layout):
    x, w = _data(T, C)
    xd, od = TensorDesc("x", C, CAP, layout=layout), TensorDesc("out", C, CAP, layout=layout)
    xb, ob = upload(xd, x), upload(od, fill=SENTINEL)
    run(RMSNormKernel(device(), xd, od, EPS), {"x": xb, "out": ob, "w": f32_buffer(w)}, T)
    out = download(od, ob)
    assert_close(out[:T], rms_norm(x, w))
    assert (out[T:] == SENTINEL).all()
    np.testing.assert_array_equal(download(xd, xb)[:T], x)   # x is not modified without ADD_INPUT


@pytest.mark.parametrize("layout", ["linear", "sliced"])
@pytest.mark.parametrize("C", [576, 67])
def test_rms_norm_add_input_writes_back_the_stream(C, layout):
    T = 5
    x, w = _data(T, C, 1)
    r = _data(T, C, 2)[0]
    xd = TensorDesc("x", C, CAP, layout=layout)
    od = TensorDesc("out", C, CAP, layout=layout)
    rd = TensorDesc("r", C, CAP, layout=layout)
    xb, ob, rb = upload(xd, x, fill=SENTINEL), upload(od, fill=SENTINEL), upload(rd, r)
    run(RMSNormKernel(device(), xd, od, EPS, add_input=rd), {"x": xb, "out": ob, "w": f32_buffer(w), "r": rb}, T)
    s = x.astype(np.float64) + r
    xs = download(xd, xb)
    assert_close(xs[:T], s)
    assert (xs[T:] == SENTINEL).all()
    assert_close(download(od, ob)[:T], rms_norm(s, w))
    np.testing.assert_array_equal(download(rd, rb)[:T], r)


@pytest.mark.parametrize("layout", ["linear", "sliced"])
def test_rms_norm_accumulate_with_offset(layout):
    """Gemma: out += norm(x) * (1 + w)."""
    T, C = 4, 67
    x, w = _data(T, C, 3)
    acc = _data(T, C, 4)[0]
    xd, od = TensorDesc("x", C, CAP, layout=layout), TensorDesc("out", C, CAP, layout=layout)
    xb, ob = upload(xd, x), upload(od, acc, fill=SENTINEL)
    run(RMSNormKernel(device(), xd, od, 1e-6, w_offset=1.0, accumulate=True), {"x": xb, "out": ob, "w": f32_buffer(w)}, T)
    out = download(od, ob)
    assert_close(out[:T], acc + rms_norm(x, w, 1e-6, 1.0))
    assert (out[T:] == SENTINEL).all()


def test_rms_norm_add_input_and_accumulate():
    T, C = 3, 576
    x, w = _data(T, C, 5)
    r, acc = _data(T, C, 6)[0], _data(T, C, 7)[0]
    xd, od, rd = TensorDesc("x", C, CAP), TensorDesc("out", C, CAP, layout="sliced"), TensorDesc("r", C, CAP)
    xb, ob, rb = upload(xd, x), upload(od, acc), upload(rd, r)
    run(RMSNormKernel(device(), xd, od, EPS, add_input=rd, accumulate=True), {"x": xb, "out": ob, "w": f32_buffer(w), "r": rb},
        T)
    s = x.astype(np.float64) + r
    assert_close(download(xd, xb)[:T], s)
    assert_close(download(od, ob)[:T], acc + rms_norm(s, w))


@pytest.mark.parametrize("add", [False, True])
def test_rms_norm_last_row(add):
    """Reads row n_tokens - 1 of x, writes row 0 of out (a 1-row tensor) and nothing else."""
    T, C = 6, 576
    x, w = _data(T, C, 8)
    r = _data(T, C, 9)[0]
    xd, od, rd = TensorDesc("x", C, CAP), TensorDesc("out", C, 4, layout="sliced"), TensorDesc("r", C, CAP)
    xb, ob, rb = upload(xd, x), upload(od, fill=SENTINEL), upload(rd, r)
    k = RMSNormKernel(device(), xd, od, EPS, add_input=rd if add else None, last_row=True)
    run(k, {"x": xb, "out": ob, "w": f32_buffer(w)} | ({"r": rb} if add else {}), T)
    s = x.astype(np.float64) + (r if add else 0)
    out = download(od, ob)
    assert_close(out[0], rms_norm(s[T - 1], w))
    assert (out[1:] == SENTINEL).all()
    if add:   # only the row read is updated in the stream
        xs = download(xd, xb)
        assert_close(xs[T - 1], s[T - 1])
        np.testing.assert_array_equal(xs[: T - 1], x[: T - 1])
