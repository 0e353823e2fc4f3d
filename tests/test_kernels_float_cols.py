"""The float decode GEMVs with several token rows per workgroup (wgsl/linear_subgroup.wgsl and
linear_wide.wgsl with NCOL > 1, GemvVariant.cols: each weight slice / block loaded once for NCOL
rows; what tree verification and the streams run) vs numpy, and vs the one-row kernel.

- Every column runs the one-row kernel's statements (template #repeat copies), so its outputs
  equal the one-row kernel's bit for bit: what keeps a tree node's logits a decode step's
  (greedy speculative decoding = plain greedy) and a stream's tokens a single generation's.
- Outputs against numpy for f16 / q4 / q8 / f32 weights, NCOL 2 / 4 / 8 and token counts that are
  not multiples of NCOL (the last workgroup's spare columns write nothing), with gate/up, bias +
  residual and the fused RMSNorm (one barrier-separated 1/rms per column).
- The static rule (autotune.gemv_cols) for the float variants, and what LinearKernel refuses.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import device
from tests.test_kernels_linear import SENTINEL, _weights, assert_close, rms_norm_ref, run_linear, silu
from webdrift.kernels.autotune import gemv_cols
from webdrift.kernels.linear import GemvVariant, LinearKernel, RopeOut
from webdrift.tensor import TensorDesc

VARIANTS = {
    "subgroup": GemvVariant("subgroup", rows=8, wg=256),
    "subgroup_u4": GemvVariant("subgroup", rows=8, wg=128, unroll=4),
    "wide": GemvVariant("wide", rows=8, wg=256),
    "wide_u4": GemvVariant("wide", rows=16, wg=128, unroll=4),
    "wide_m2": GemvVariant("wide", rows=16, wg=256, mrows=2),
    "wide_m4": GemvVariant("wide", rows=16, wg=128, mrows=4),
    "wide_ks": GemvVariant("wide", rows=4, wg=128, mrows=2, ksplit=True),
    "wide_ks32": GemvVariant("wide", rows=4, wg=32, mrows=4, ksplit=True),   # 8 columns of gate/up: 64 sums, 32 invocations
}
CASES = [("plain", 3), ("dual", 5), ("bias_residual", 11), ("pre_norm", 6)]


def _run(case, T, fmt, variant, seed):
    O, I = 70, 1536      # 1536 inputs: the four-chain loops run several times before their tails
    rng = np.random.default_rng(seed)
    W = _weights(O, I, seed=7) * 3
    kw = {}
    if case == "dual":
        kw["w2"] = _weights(O, I, seed=8)
    elif case == "bias_residual":
        kw["bias"] = rng.standard_normal(O).astype(np.float32)
        kw["y0"] = rng.standard_normal((T, O)).astype(np.float32)
    elif case == "pre_norm":
        kw["norm_w"] = rng.standard_normal(I).astype(np.float32)
    x, wref, w2ref, y = run_linear("decode", T, W, fmt, tuning=variant, seed=seed, **kw)
    return x.astype(np.float64), wref, w2ref, y, kw


@pytest.mark.parametrize("case,T", CASES)
@pytest.mark.parametrize("name,fmt,cols", [("subgroup", "f16", 4), ("subgroup_u4", "q4", 8), ("subgroup", "f32", 2),
                                           ("wide", "q8", 4), ("wide_u4", "f16", 2), ("wide_m2", "q4", 4),
                                           ("wide_m4", "f16", 8), ("wide_ks", "f16", 4), ("wide_ks", "q8", 2),
                                           ("wide_ks32", "f16", 8)])
def test_float_cols_vs_numpy_and_one_row(name, fmt, cols, case, T):
    if not device().has_subgroups:
        pytest.fail("the CI adapter (lavapipe) offers subgroups; the subgroup / wide GEMVs must be tested")
    v = VARIANTS[name]
    seed = 100 * cols + T
    x, wref, w2ref, y, kw = _run(case, T, fmt, GemvVariant(**{**v.__dict__, "cols": cols}), seed)
    *_, y1, _ = _run(case, T, fmt, v, seed)
    np.testing.assert_array_equal(y[:T], y1[:T])       # the one-row kernel's sums, bit for bit
    assert (y[T:] == SENTINEL).all()                    # spare columns of the last workgroup
    if case == "dual":
        ref = silu(x @ wref.T) * (x @ w2ref.T)
    elif case == "bias_residual":
        ref = x @ wref.T + kw["bias"] + kw["y0"]
    elif case == "pre_norm":
        ref = rms_norm_ref(x, kw["norm_w"]) @ wref.T
    else:
        ref = x @ wref.T
    assert_close(y[:T], ref, rtol=1e-4)


def test_float_cols_source_has_one_copy_per_column():
    """NCOL copies of the accumulators, one weight read per slice shared by them in the loop."""
    from tests.gpu_util import make_weight
    gw, _ = make_weight(_weights(32, 64), "f16")
    xd, yd = TensorDesc("x", 64, 8), TensorDesc("y", 32, 8)
    src = LinearKernel(device(), "decode", xd, yd, gw, variant=GemvVariant("subgroup", rows=8, wg=256, cols=4)).source
    assert all(f"var acc{c} = 0.0;" in src for c in range(4)) and "var acc4" not in src
    assert LinearKernel(device(), "decode", xd, yd, gw, variant=GemvVariant("subgroup", rows=8, wg=256,
                                                                            cols=4)).workgroups(9) == (4, 3, 1)


def test_float_cols_refused_where_they_do_not_apply():
    from tests.gpu_util import make_weight
    gw, _ = make_weight(_weights(32, 64), "f16")
    xd, yd = TensorDesc("x", 64, 4), TensorDesc("y", 32, 4)
    for kw in ({"variant": GemvVariant("split", rows=4, wg=64, cols=4)},
               {"variant": GemvVariant("subgroup", rows=8, wg=256, cols=2), "x_last_row": True}):
        with pytest.raises(ValueError, match="token rows per workgroup"):
            LinearKernel(device(), "decode", xd, yd, gw, **kw)
    # RoPE in the epilogue keeps one column on the float variants
    gq, _ = make_weight(_weights(3 * 8, 64), "f16")
    rope = RopeOut(q=TensorDesc("q", 8, 4, b=1), n_heads=1, n_kv=1, head_dim=8, cap=16, rope_half=False)
    from webdrift.kernels.linear import Epilogue
    with pytest.raises(ValueError, match="token rows per workgroup"):
        LinearKernel(device(), "decode", xd, TensorDesc("y", 24, 4), gq,
                     variant=GemvVariant("subgroup", rows=8, wg=256, cols=2), epilogue=Epilogue(rope=rope))


def test_static_float_cols_rule():
    """gemv_cols for the float variants: NCOL = the rows rounded up to a power of two, at most 8,
    with at most 32 accumulators per lane (unroll 4 and mrows count; gate/up doubles): NCOL halved
    to fit; one-row programs and split / row: unchanged."""
    sg = GemvVariant("subgroup", rows=8, wg=256)
    assert gemv_cols(sg, 1, dual=False) == sg
    assert gemv_cols(sg, 3, dual=False) == GemvVariant("subgroup", rows=8, wg=256, cols=4)
    assert gemv_cols(sg, 30, dual=True) == GemvVariant("subgroup", rows=8, wg=256, cols=8)
    assert gemv_cols(GemvVariant("subgroup", rows=8, wg=256, unroll=4), 30, dual=True).cols == 4
    assert gemv_cols(GemvVariant("wide", rows=16, wg=128, mrows=4), 64, dual=True).cols == 4
    assert gemv_cols(GemvVariant("wide", rows=16, wg=128, mrows=4), 64, dual=False).cols == 8
    assert gemv_cols(GemvVariant("split", rows=4, wg=64), 16, dual=False).cols == 1
    # split K: each column's 8 sums (4 rows x gate/up) take 65 floats of workgroup memory each
    # (256 invocations: at most 64 subgroups, and the total): 520 a column, 4096 at most
    assert gemv_cols(GemvVariant("wide", rows=4, wg=256, mrows=4, ksplit=True), 64, dual=True).cols == 4
    assert gemv_cols(GemvVariant("wide", rows=4, wg=256, mrows=4, ksplit=True), 64, dual=False).cols == 8
