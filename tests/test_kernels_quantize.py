"""QuantizeKernel (wgsl/quantize.wgsl + quantize_block.wgsl) vs numpy: the int8 rows the
integer-dot GEMV reads (words, block scales and sums, decoded on the host) and, with the RMSNorm
fused in, the norm weight applied and the partial sums of x^2 per workgroup. (Its use as the
GEMV's input is tested with the GEMV: test_kernels_linear_blk.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import device, f32_buffer, run, upload
from tests.test_kernels_linear_blk import CAP, quant_x
from webdrift.kernels.linear import PreNorm
from webdrift.kernels.quantize import QuantizeKernel, n_partials, xq_desc
from webdrift.tensor import TensorDesc


@pytest.mark.parametrize("fmt,I", [("q8", 96), ("q4", 96), ("q4", 1120)])
def test_quantize_layout(fmt, I):
    """The int8 words, scales and sums QuantizeKernel writes, decoded on the host (sliced input;
    1120 channels take five workgroups per row)."""
    T = 3
    x = np.random.default_rng(5).standard_normal((T, I)).astype(np.float32) * 3
    x[1, :32] = 0.0                                   # an all-zero block: scale 0, values 0
    xd, qd = TensorDesc("x", I, CAP, layout="sliced"), xq_desc("xq", I, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    run(QuantizeKernel(device(), xd, qd, fmt), {"x": xb, "xq": qb}, T)
    words = np.frombuffer(device().read_buffer_sync(qb), np.uint32).reshape(CAP, -1)[:T]
    nb = I // 32
    q = words[:, :8 * nb].copy().view(np.int8).reshape(T, nb, 32).astype(np.float64)
    if fmt == "q4":   # per 8 values: evens then odds
        q = q.reshape(T, nb, 4, 2, 4).transpose(0, 1, 2, 4, 3).reshape(T, nb, 32)
    nbp = (nb + 3) // 4 * 4
    d = words[:, 8 * nb: 8 * nb + nb].view(np.float32)
    ssum = words[:, 8 * nb + nbp: 8 * nb + nbp + nb].view(np.float32)
    xb32 = x.reshape(T, nb, 32)
    np.testing.assert_allclose(d, np.abs(xb32).max(-1) / 127, rtol=1e-6)
    np.testing.assert_allclose(ssum, xb32.sum(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(q, np.rint(quant_x(x).reshape(T, nb, 32) / np.where(d > 0, d, 1)[..., None]))
    assert (q[1, 0] == 0).all() and d[1, 0] == 0


def test_quantize_norm_partials():
    """With the norm fused, QuantizeKernel scales by the norm weight and leaves partial sums of
    x^2 (one per workgroup) that add up to the row's."""
    T, I = 2, 2080
    x = np.random.default_rng(6).standard_normal((T, I)).astype(np.float32)
    nw = np.random.default_rng(7).standard_normal(I).astype(np.float32)
    xd, qd = TensorDesc("x", I, CAP), xq_desc("xq", I, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    k = QuantizeKernel(device(), xd, qd, "q8", pre_norm=PreNorm(1e-5, 0.5))
    run(k, {"x": xb, "xq": qb, "nw": f32_buffer(nw)}, T)
    words = np.frombuffer(device().read_buffer_sync(qb), np.uint32).reshape(CAP, -1)[:T]
    nb, nbp = I // 32, (I // 32 + 3) // 4 * 4
    npart = n_partials(I)
    assert npart == 9                  # 2080 channels, 256 per workgroup
    parts = words[:, 8 * nb + 2 * nbp: 8 * nb + 2 * nbp + npart].view(np.float32)
    np.testing.assert_allclose(parts.sum(1), (x.astype(np.float64) ** 2).sum(1), rtol=1e-5)
    u = (x * (nw + 0.5)).reshape(T, nb, 32)
    np.testing.assert_allclose(words[:, 8 * nb: 8 * nb + nb].view(np.float32), np.abs(u).max(-1) / 127, rtol=1e-6)


def test_quantize_whole_row_norm():
    """whole=True (the LM head's input): every workgroup reads the whole row for 1/rms, so the
    block scales and sums are those of the fully normalised row x / rms(x) * (nw + offset), and no
    partial sums are written (the GEMV applies nothing)."""
    T, I = 2, 2080                      # nine workgroups per row, the last one partly idle
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((T, I)) * np.array([[1.0], [7.0]])).astype(np.float32)
    nw = rng.standard_normal(I).astype(np.float32)
    xd, qd = TensorDesc("x", I, CAP), xq_desc("xq", I, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    k = QuantizeKernel(device(), xd, qd, "q4", pre_norm=PreNorm(1e-5, 0.5), whole=True)
    run(k, {"x": xb, "xq": qb, "nw": f32_buffer(nw)}, T)
    words = np.frombuffer(device().read_buffer_sync(qb), np.uint32).reshape(CAP, -1)[:T]
    nb, nbp = I // 32, (I // 32 + 3) // 4 * 4
    x64 = x.astype(np.float64)
    u = (x64 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + 1e-5) * (nw + 0.5)).reshape(T, nb, 32)
    np.testing.assert_allclose(words[:, 8 * nb: 8 * nb + nb].view(np.float32), np.abs(u).max(-1) / 127, rtol=1e-5)
    np.testing.assert_allclose(words[:, 8 * nb + nbp: 8 * nb + nbp + nb].view(np.float32), u.sum(-1),
                               rtol=1e-4, atol=1e-4)
    assert not words[:, 8 * nb + 2 * nbp:].any()       # no partial sums (the buffer started zeroed)
    with pytest.raises(ValueError, match="needs pre_norm"):
        QuantizeKernel(device(), xd, qd, "q4", whole=True)
