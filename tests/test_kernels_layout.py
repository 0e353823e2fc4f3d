"""Tensor virtualization: one kernel template gives the same numbers whatever physical layout its
tensors have. Activations: "linear" (BHWC) vs "sliced" (ML Drift HSWBC4); weights: "OI" vs
"OI4O4". Each kernel runs over every combination; the results must be bitwise identical to each
other (the same arithmetic in the same order, only the addressing differs) and match numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.gpu_util import device, download, f32_buffer, make_weight, physical_index, read_f32, run, upload
from webdrift.kernels.embedding import EmbeddingKernel
from webdrift.kernels.linear import Epilogue, LinearKernel
from webdrift.kernels.norm import RMSNormKernel
from webdrift.tensor import TensorDesc, host_index

ACT = ("linear", "sliced")
CAP = 72


@pytest.mark.parametrize("layout", ACT)
@pytest.mark.parametrize("b,h,w,c", [(1, 1, 5, 7), (3, 1, 4, 8), (2, 3, 2, 5)])
def test_physical_index_matches_host_index(layout, b, h, w, c):
    d = TensorDesc("t", c, w, h, b, layout)
    idx = physical_index(d)
    for bb, yy, xx, cc in itertools.product(range(b), range(h), range(w), range(c)):
        assert idx[bb, yy, xx, cc] == host_index(d, bb, xx, yy, cc)
    assert len(set(idx.ravel().tolist())) == idx.size           # a bijection into the storage
    assert idx.max() < d.nbytes // 4


def _all_equal(results: dict):
    keys = list(results)
    for k in keys[1:]:
        np.testing.assert_array_equal(results[k], results[keys[0]], err_msg=f"{k} vs {keys[0]}")


@pytest.mark.parametrize("C", [67, 576])
def test_rms_norm_same_in_every_layout(C):
    T = 5
    rng = np.random.default_rng(0)
    x, r = rng.standard_normal((2, T, C)).astype(np.float32)
    w = rng.standard_normal(C).astype(np.float32)
    wb = f32_buffer(w)
    results = {}
    for lx, lo, lr in itertools.product(ACT, ACT, ACT):
        xd, od, rd = TensorDesc("x", C, CAP, layout=lx), TensorDesc("o", C, CAP, layout=lo), \
            TensorDesc("r", C, CAP, layout=lr)
        xb, ob = upload(xd, x), upload(od)
        run(RMSNormKernel(device(), xd, od, 1e-5, add_input=rd), {"x": xb, "out": ob, "w": wb, "r": upload(rd, r)}, T)
        results[(lx, lo, lr)] = np.concatenate([download(od, ob, T), download(xd, xb, T)], axis=1)
    _all_equal(results)
    s = x.astype(np.float64) + r
    ref = s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(results[("linear",) * 3][:, :C], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["f32", "f16"])
@pytest.mark.parametrize("stage,T", [("decode", 2), ("prefill", 70)])
def test_linear_same_in_every_layout(stage, T, fmt):
    O, I = 45, 67
    rng = np.random.default_rng(1)
    W = rng.standard_normal((O, I)).astype(np.float32)
    x = rng.standard_normal((T, I)).astype(np.float32)
    y0 = rng.standard_normal((T, O)).astype(np.float32)
    results, refs = {}, {}
    for wl in ("OI", "OI4O4"):
        gw, refs[wl] = make_weight(W, fmt, wl)
        for lx, ly in itertools.product(ACT, ACT):
            xd, yd = TensorDesc("x", I, CAP, layout=lx), TensorDesc("y", O, CAP, layout=ly)
            yb = upload(yd, y0)
            k = LinearKernel(device(), stage, xd, yd, gw, epilogue=Epilogue(residual=True))
            run(k, {"x": upload(xd, x), "y": yb, "w": gw.buffers}, T)
            results[(wl, lx, ly)] = download(yd, yb, T)
    np.testing.assert_array_equal(refs["OI"], refs["OI4O4"])
    _all_equal(results)
    np.testing.assert_allclose(results[("OI", "linear", "linear")], x.astype(np.float64) @ refs["OI"].T + y0,
                               rtol=1e-5, atol=1e-4)


def test_embedding_same_in_every_layout():
    V, C = 20, 67
    E = np.random.default_rng(2).standard_normal((V, C)).astype(np.float32)
    ids = np.array([5, 19, 0, 5], np.uint32)
    idb = device().create_buffer(16)
    device().write_buffer(idb, ids)
    results = {}
    for wl, lo in itertools.product(("OI", "OI4O4"), ACT):
        gw, _ = make_weight(E, "f32", wl)
        od = TensorDesc("o", C, CAP, layout=lo)
        ob = upload(od)
        run(EmbeddingKernel(device(), gw, od), {"ids": idb, "w": gw.buffers, "out": ob}, len(ids))
        results[(wl, lo)] = download(od, ob, len(ids))
    _all_equal(results)
    np.testing.assert_array_equal(results[("OI", "linear")], E[ids])


def test_sliced_writes_keep_padding_channels_zero():
    """Sliced storage is read a whole vec4 at a time, so a write must leave the padding channels
    (c >= C in the last slice) zero even where they held garbage."""
    T, C = 3, 67
    x = np.random.default_rng(3).standard_normal((T, C)).astype(np.float32)
    xd, od = TensorDesc("x", C, 4), TensorDesc("o", C, 4, layout="sliced")
    ob = device().create_buffer(od.nbytes)
    device().write_buffer(ob, np.full(od.nbytes // 4, np.nan, np.float32))
    run(RMSNormKernel(device(), xd, od, 1e-5), {"x": upload(xd, x), "out": ob, "w": f32_buffer(np.ones(C))}, T)
    raw = read_f32(ob, od.nbytes // 4)
    logical = np.zeros(raw.size, bool)
    logical[physical_index(od)[0, 0, :T].ravel()] = True
    pad = np.zeros(raw.size, bool)
    pad[(physical_index(TensorDesc("o", 4 * od.s, 4, layout="sliced"))[0, 0, :T, C:]).ravel()] = True
    assert np.isfinite(raw[logical]).all()
    assert (raw[pad] == 0).all()
