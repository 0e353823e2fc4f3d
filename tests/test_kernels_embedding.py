"""EmbeddingKernel (wgsl/embedding.wgsl) vs numpy: out[t] = E[ids[t]] * scale for every weight
format, odd widths, repeated ids, and untouched rows t >= n_tokens."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import device, download, make_weight, run, upload
from webdrift.kernels.embedding import EmbeddingKernel
from webdrift.tensor import TensorDesc

CAP = 16
SENTINEL = 99.0


def u32_buffer(a):
    a = np.asarray(a, np.uint32)
    buf = device().create_buffer(max(16, a.nbytes), label="ids")
    device().write_buffer(buf, a)
    return buf


def run_embedding(fmt, V, C, ids, scale=1.0, layout="OI", out_layout="linear", seed=0):
    E = np.random.default_rng(seed).standard_normal((V, C)).astype(np.float32)
    gw, eref = make_weight(E, fmt, layout, name="emb")
    od = TensorDesc("out", C, CAP, layout=out_layout)
    ob = upload(od, fill=SENTINEL)
    k = EmbeddingKernel(device(), gw, od, scale)
    run(k, {"ids": u32_buffer(ids), "w": gw.buffers, "out": ob}, len(ids))
    return eref, download(od, ob)


@pytest.mark.parametrize("out_layout", ["linear", "sliced"])
@pytest.mark.parametrize("fmt,layout,C", [("f32", "OI", 67), ("f32", "OI4O4", 67), ("f16", "OI", 67),
                                          ("f16", "OI4O4", 576), ("q8", "OI", 64), ("q4", "OI", 576)])
def test_embedding_formats(fmt, layout, C, out_layout):
    ids = [3, 0, 99, 3, 57]
    eref, out = run_embedding(fmt, 100, C, ids, layout=layout, out_layout=out_layout)
    np.testing.assert_allclose(out[: len(ids)], eref[ids], rtol=1e-6, atol=1e-6)
    assert (out[len(ids):] == SENTINEL).all()


@pytest.mark.parametrize("fmt", ["f32", "q4"])
def test_embedding_scale(fmt):
    """Gemma multiplies the embedding by sqrt(dim)."""
    C = 64
    ids = [7, 1]
    eref, out = run_embedding(fmt, 10, C, ids, scale=float(np.sqrt(C)))
    np.testing.assert_allclose(out[:2], eref[ids] * np.sqrt(C), rtol=1e-6, atol=1e-6)


def test_embedding_one_token_wide_row():
    """One decode token with a row wider than 64 slices * 4 (two workgroups along x)."""
    eref, out = run_embedding("f16", 5, 1030, [4], out_layout="sliced")
    np.testing.assert_allclose(out[0], eref[4], rtol=1e-6, atol=1e-6)
    assert (out[1:] == SENTINEL).all()
