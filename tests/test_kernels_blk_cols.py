"""The integer-dot decode GEMV with several token rows per workgroup (wgsl/linear_blk.wgsl COLS,
GemvVariant.cols: each weight block read once for NCOL rows) vs numpy, and vs the one-row kernel.

- Outputs against numpy's emulation of the int8 arithmetic (test_kernels_linear_blk.check: the
  integer block sums are exact, only f32 summation differs) for q8 and q4, NCOL 2 / 4 / 8, token
  counts that are not multiples of NCOL (3, 5, 11), with gate/up (DUAL), bias + residual and the
  RMSNorm's 1/rms (PRE_NORM); rows past the token count untouched.
- Each column sums in the one-row kernel's order, so the outputs equal the one-row kernel's
  bit for bit (what lets a stream's tokens equal a single generation's, tests/test_streams.py).
- QOUT (the int8 chain): each column's int8 row dequantized against numpy's quantization of the
  column's y, and bit-identical to the one-row kernel's words.
- ROPE: every column is a stream at its own cache row (Step row_step 0, seg_stride): q, K and V
  against numpy's RoPE of the emulated product, and bit-identical to the one-row kernel's.
- Without subgroups (the workgroup-memory reduction), the same.
- The static rule (autotune.blk_cols) and where forward.py applies it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.gpu_util import device, download, f32_buffer, make_weight, upload, write_step
from tests.test_kernels_linear import SENTINEL, _weights, rms_norm_ref, silu
from tests.test_kernels_linear_blk import WREF, check, quant_x
from webdrift.kernels.autotune import blk_cols
from webdrift.kernels.linear import Epilogue, GemvVariant, LinearKernel, PreNorm, QuantOut, RopeOut
from webdrift.kernels.quantize import QuantizeKernel, xq_desc
from webdrift.tensor import TensorDesc

CAP = 16


class NoSubgroups:
    """The device as an adapter without subgroups sees it (the workgroup-memory reductions)."""

    def __init__(self, dev):
        self._dev = dev

    has_subgroups = False
    wgsl_subgroup_enable = False

    def __getattr__(self, name):
        return getattr(self._dev, name)


def quantized_input(x, fmt, norm_w=None):
    """QuantizeKernel's int8 rows of x (with the norm weight when norm_w is given)."""
    dev = device()
    T, I = x.shape
    xd, qd = TensorDesc("x", I, CAP), xq_desc("xq", I, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    write_step(T)
    from tests.gpu_util import step_buffer
    norm = PreNorm(1e-5, 0.0) if norm_w is not None else None
    qk = QuantizeKernel(dev, xd, qd, fmt, pre_norm=norm)
    dev.submit([qk.dispatch({"step": step_buffer(), "x": xb, "xq": qb}
                            | ({"nw": f32_buffer(norm_w)} if norm_w is not None else {}), qk.workgroups(T))])
    return qd, qb, norm


def gemv(dev, variant, qd, qb, yd, y0, gw, gw2, norm, ep: Epilogue, T, extra=None, **step):
    """Run one blk GEMV over T rows; returns its y buffer."""
    from tests.gpu_util import step_buffer
    yb = upload(yd, y0, fill=SENTINEL)
    k = LinearKernel(dev, "decode", qd, yd, gw, gw2, variant=variant, pre_norm=norm, epilogue=ep)
    assert k.workgroups(T)[1] == -(-T // variant.cols)
    write_step(T, **step)
    binds = {"step": step_buffer(), "x": qb, "y": yb, "w": gw.buffers} | ({"w2": gw2.buffers} if gw2 else {})
    dev.submit([k.dispatch(binds | (extra or {}), k.workgroups(T))])
    return yb


CASES = [("plain", 3), ("dual", 5), ("bias_residual", 11), ("pre_norm", 5)]


@pytest.mark.parametrize("case,T", CASES)
@pytest.mark.parametrize("fmt,cols", [(f, c) for f in ("q8", "q4") for c in (2, 4, 8)] + [("q6k", 4)])
def test_cols_vs_numpy_and_one_row(fmt, case, T, cols):
    dev = device()
    O, I = 45, 512 if fmt == "q6k" else 576
    c = Case(case, fmt, T, O, I, np.random.default_rng(cols * 100 + T), seeds=(13, 14))
    outs = {k: download(c.yd, c.run(dev, GemvVariant("blk", rows=4, wg=64, cols=k))) for k in (1, cols)}
    y = outs[cols]
    assert (y[T:] == SENTINEL).all()
    np.testing.assert_array_equal(y[:T], outs[1][:T])      # the one-row kernel's sums, bit for bit
    c.check(y)


class Case:
    """A blk GEMV case over T random rows of I inputs and O outputs: "plain", "dual" (gate/up +
    SiLU), "bias_residual" or "pre_norm" (the RMSNorm's 1/rms), its weights (seeds, x 3 for the
    first) and quantized input; run(dev, variant) -> its y buffer; check(y) against numpy."""

    def __init__(self, case, fmt, T, O, I, rng, seeds):
        self.case, self.fmt, self.T = case, fmt, T
        self.x = rng.standard_normal((T, I)).astype(np.float32)
        self.gw, self.wref = make_weight(_weights(O, I, seed=seeds[0]) * 3, fmt)
        self.gw2 = self.w2ref = None
        if case == "dual":
            self.gw2, self.w2ref = make_weight(_weights(O, I, seed=seeds[1]), fmt, name="w2")
        self.bias = rng.standard_normal(O).astype(np.float32) if case == "bias_residual" else None
        self.y0 = rng.standard_normal((T, O)).astype(np.float32) if case == "bias_residual" else None
        self.nw = rng.standard_normal(I).astype(np.float32) if case == "pre_norm" else None
        self.qd, self.qb, self.norm = quantized_input(self.x, fmt, self.nw)
        self.yd = TensorDesc("y", O, CAP)
        self.ep = Epilogue(bias=self.bias is not None, residual=self.y0 is not None)
        self.extra = {"bias": f32_buffer(self.bias)} if self.bias is not None else {}

    def run(self, dev, variant):
        return gemv(dev, variant, self.qd, self.qb, self.yd, self.y0, self.gw, self.gw2, self.norm, self.ep, self.T,
                    self.extra)

    def source(self, dev, variant) -> str:
        return LinearKernel(dev, "decode", self.qd, self.yd, self.gw, self.gw2, variant=variant, pre_norm=self.norm,
                            epilogue=self.ep).source

    def check(self, y):
        T, x, wref, fmt = self.T, self.x, self.wref, self.fmt
        if self.case == "pre_norm":
            inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
            check(y[:T], rms_norm_ref(x, self.nw).astype(np.float32), wref, fmt, row_scale=inv)
        elif self.case == "dual":
            check(y[:T], x, wref, fmt, lambda lin: silu(lin(WREF)) * lin(self.w2ref))
        elif self.case == "bias_residual":
            check(y[:T], x, wref, fmt, lambda lin: lin(WREF) + self.bias + self.y0)
        else:
            check(y[:T], x, wref, fmt)


@pytest.mark.parametrize("fmt,dual", [("q8", True), ("q4", False)])
def test_cols_without_subgroups(fmt, dual):
    """The workgroup-memory tree reduction (adapters without subgroups): numpy and one-row."""
    dev = NoSubgroups(device())
    T, O, I = 7, 45, 576
    rng = np.random.default_rng(3)
    x = rng.standard_normal((T, I)).astype(np.float32)
    gw, wref = make_weight(_weights(O, I, seed=13) * 3, fmt)
    gw2, w2ref = make_weight(_weights(O, I, seed=14), fmt, name="w2") if dual else (None, None)
    qd, qb, _ = quantized_input(x, fmt)
    yd = TensorDesc("y", O, CAP)
    outs = {c: download(yd, gemv(dev, GemvVariant("blk", rows=2, wg=32, cols=c), qd, qb, yd, None, gw, gw2, None,
                                 Epilogue(), T)) for c in (1, 4)}
    assert "subgroupAdd(" not in LinearKernel(dev, "decode", qd, yd, gw, gw2,
                                             variant=GemvVariant("blk", rows=2, wg=32, cols=4)).source
    np.testing.assert_array_equal(outs[4][:T], outs[1][:T])
    assert (outs[4][T:] == SENTINEL).all()
    check(outs[4][:T], x, wref, fmt, (lambda lin: silu(lin(WREF)) * lin(w2ref)) if dual else (lambda lin: lin(WREF)))


def dequant_rows(words: np.ndarray, n: int, q4: bool) -> np.ndarray:
    """(T, n) values of int8 rows (quantize.wgsl's layout: 8 words of int8 per 32-block, q4 packed
    evens then odds per 8 values; then the f32 block scales)."""
    nb = n // 32
    b = words[:, :8 * nb].copy().view(np.int8).reshape(len(words), nb, 32).astype(np.float64)
    if q4:   # bytes of word k: values 8(k//2) + (k%2) + {0, 2, 4, 6}
        perm = np.empty(32, int)
        for k in range(8):
            for j in range(4):
                perm[4 * k + j] = 8 * (k // 2) + (k % 2) + 2 * j
        v = np.empty_like(b)
        v[:, :, perm] = b
        b = v
    d = words[:, 8 * nb:9 * nb].copy().view(np.float32).astype(np.float64)
    return (b * d[:, :, None]).reshape(len(words), n)


@pytest.mark.parametrize("fmt,qfmt,dual,qnorm,cols,T", [
    ("q4", "q4", False, 0.0, 4, 5),     # down / O projection + residual -> the next norm's int8 row
    ("q8", "q8", False, 1.0, 8, 11),    # Gemma-style norm weight offset
    ("q4", "q8", True, None, 2, 3),     # gate/up + SiLU -> the down projection's int8 row, no y
])
def test_cols_quantizing_epilogue(fmt, qfmt, dual, qnorm, cols, T):
    dev = device()
    O, I = 96, 576
    rng = np.random.default_rng(21 + T)
    x = rng.standard_normal((T, I)).astype(np.float32)
    qd, qb, _ = quantized_input(x, fmt)
    yd, nd = TensorDesc("y", O, CAP), xq_desc("next", O, CAP)
    residual = not dual
    y0 = rng.standard_normal((T, O)).astype(np.float32) if residual else None
    gw, wref = make_weight(_weights(O, I, seed=22), fmt)
    gw2, w2ref = make_weight(_weights(O, I, seed=23), fmt, name="w2") if dual else (None, None)
    nw = rng.standard_normal(O).astype(np.float32)
    ep = Epilogue(residual=residual, qout=QuantOut(nd, qfmt, qnorm, residual))
    got = {}
    for c in (1, cols):
        qo = upload(nd, None)
        extra = {"qout": qo} | ({"qnw": f32_buffer(nw)} if qnorm is not None else {})
        yb = gemv(dev, GemvVariant("blk", rows=32, wg=128, rps=2, cols=c), qd, qb, yd, y0, gw, gw2, None, ep, T, extra)
        got[c] = (download(yd, yb), np.frombuffer(dev.read_buffer_sync(qo), np.uint32).reshape(CAP, -1))
    (y1, q1), (yc, qc) = got[1], got[cols]
    np.testing.assert_array_equal(qc[:T], q1[:T])   # words, scales, sums and partials, bit for bit
    assert (qc[T:] == 0).all()
    np.testing.assert_array_equal(yc, y1)
    fn = (lambda lin: silu(lin(WREF)) * lin(w2ref)) if dual else (lambda lin: lin(WREF) + y0)
    # the column's y (numpy's emulation) times the next norm weight, quantized by numpy
    x64, xq = x.astype(np.float64), quant_x(x)

    def emu(w):
        w = wref if w is WREF else w
        out = xq @ w.T.astype(np.float64)
        if fmt == "q4":
            out += (x64 - xq) @ np.repeat(w.reshape(w.shape[0], -1, 32).min(-1), 32, axis=1).T
        return out
    want_y = fn(emu)
    if residual:
        check(yc[:T], x, wref, fmt, fn)
    u = want_y * (nw + qnorm) if qnorm is not None else want_y
    deq = dequant_rows(qc[:T], O, qfmt == "q4")
    step = np.abs(u).reshape(T, -1, 32).max(-1, keepdims=True) / 127.0
    err = np.abs(deq.reshape(T, -1, 32) - u.reshape(T, -1, 32)) / step
    assert err.max() < 0.5 + 0.02, err.max()          # within half an int8 step (+ f32 slack)
    nb, nbp = O // 32, (O // 32 + 3) // 4 * 4
    if qnorm is not None:   # the partial sums of y^2 per 32 outputs
        parts = qc[:T, 8 * nb + 2 * nbp: 8 * nb + 2 * nbp + nb].view(np.float32)
        np.testing.assert_allclose(parts.sum(1), (want_y ** 2).sum(1), rtol=1e-4)


def rope_ref(v, pos, inv_freq, half):
    """numpy RoPE of one head's vector at position pos."""
    dh = len(v)
    out = v.astype(np.float64).copy()
    for k in range(dh // 2):
        i, j = (k, k + dh // 2) if half else (2 * k, 2 * k + 1)
        ang = pos * np.float64(inv_freq[k])
        a, b = v[i], v[j]
        out[i], out[j] = a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)
    return out


@pytest.mark.parametrize("fmt,rope_half,cols,T", [("q4", True, 4, 5), ("q8", False, 2, 3), ("q8", True, 8, 11)])
def test_cols_rope_streams(fmt, rope_half, cols, T):
    """The QKV GEMV with RoPE + KV append, its T rows streams at position pos0, row t's K and V
    at cache row pos0 + t * stride (kernels/step.py): q, K and V against numpy, and the one-row
    kernel's, bit for bit."""
    dev = device()
    H, KVH, DH, pos0, stride = 4, 2, 32, 5, 6
    cap = pos0 + stride * T
    group = H // KVH
    O, I = (H + 2 * KVH) * DH, 256
    rng = np.random.default_rng(31 + T)
    x = rng.standard_normal((T, I)).astype(np.float32)
    nw = rng.standard_normal(I).astype(np.float32)
    qd, qb, norm = quantized_input(x, fmt, nw)
    gw, wref = make_weight(_weights(O, I, seed=32), fmt)
    bias = rng.standard_normal(O).astype(np.float32)
    inv_freq = (10000.0 ** (-np.arange(0, DH, 2) / DH)).astype(np.float32)
    q_rel = TensorDesc("q", DH, CAP * group, b=KVH)
    yd = TensorDesc("qkv", O, CAP)
    rope = RopeOut(q_rel, H, KVH, DH, cap, rope_half)
    got = {}
    for c in (1, cols):
        qf = upload(q_rel, None)
        kf, vf = (f32_buffer(np.full(KVH * cap * DH, 7.0, np.float32)) for _ in range(2))
        extra = {"bias": f32_buffer(bias), "q": qf, "kc": kf, "vc": vf, "inv_freq": f32_buffer(inv_freq)}
        gemv(dev, GemvVariant("blk", rows=4, wg=64, cols=c), qd, qb, yd, None, gw, None, norm,
             Epilogue(bias=True, rope=rope), T, extra, pos0=pos0, streams=(0, stride), n_out=T)
        got[c] = (download(q_rel, qf, squeeze=False), *(np.frombuffer(dev.read_buffer_sync(b), np.float32)
                                                        for b in (kf, vf)))
    for a, b in zip(got[1], got[cols]):
        np.testing.assert_array_equal(b, a)
    qg, kg, vg = got[cols]
    # numpy: y = the normed input's emulated product + bias, rotated at pos0
    xn = rms_norm_ref(x, nw).astype(np.float32)
    inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
    xq = quant_x((xn.astype(np.float64) / inv).astype(np.float32)) * inv
    y = xq @ wref.T.astype(np.float64)
    if fmt == "q4":
        y += (xn.astype(np.float64) - xq) @ np.repeat(wref.reshape(O, -1, 32).min(-1), 32, axis=1).T
    y += bias
    kc, vc = np.full((KVH, cap, DH), 7.0), np.full((KVH, DH, cap), 7.0)
    qw = np.zeros((KVH, T * group, DH))
    for t in range(T):
        for h in range(H):
            qw[h // group, t * group + h % group] = rope_ref(y[t, h * DH:(h + 1) * DH], pos0, inv_freq, rope_half)
        for h in range(KVH):
            kc[h, pos0 + t * stride] = rope_ref(y[t, (H + h) * DH:(H + h + 1) * DH], pos0, inv_freq, rope_half)
            vc[h, :, pos0 + t * stride] = y[t, (H + KVH + h) * DH:(H + KVH + h + 1) * DH]
    tol = 1e-3 * np.abs(y).max()
    np.testing.assert_allclose(qg[:, :T * group], qw, atol=tol)
    np.testing.assert_allclose(kg.reshape(KVH, cap, DH), kc, atol=tol)
    np.testing.assert_allclose(vg.reshape(KVH, DH, cap), vc, atol=tol)


def test_cols_refused_where_they_do_not_apply():
    dev = device()
    gw, _ = make_weight(_weights(32, 64), "q8")
    gf, _ = make_weight(_weights(32, 64), "f16")
    qd, yd = xq_desc("xq", 64, 4), TensorDesc("y", 32, 4)
    for kw in ({"w": gf, "x": TensorDesc("x", 64, 4), "variant": GemvVariant("split", rows=4, wg=64, cols=4)},
               {"w": gw, "x": qd, "variant": GemvVariant("blk", cols=4), "x_last_row": True},
               {"w": gw, "x": qd, "variant": GemvVariant("blk", cols=17)}):
        with pytest.raises(ValueError, match="token rows per workgroup"):
            LinearKernel(dev, "decode", kw.pop("x"), yd, kw.pop("w"), **kw)


def test_static_cols_rule():
    """blk_cols: one-row programs and the float variants unchanged; several rows: NCOL = the
    row count rounded up to a power of two, at most 8, with at most 32 accumulators per
    invocation (rows halved, down to 2; the quantizing epilogue's RPS halved, down to 1)."""
    blk = GemvVariant("blk", rows=4, wg=64)
    assert blk_cols(blk, 1, dual=False) == blk
    assert blk_cols(GemvVariant("subgroup", rows=8, wg=256), 16, dual=False).cols == 1
    assert blk_cols(blk, 3, dual=False) == GemvVariant("blk", rows=4, wg=64, cols=4)
    assert blk_cols(blk, 16, dual=False) == GemvVariant("blk", rows=4, wg=64, cols=8)
    assert blk_cols(blk, 16, dual=True) == GemvVariant("blk", rows=2, wg=64, cols=8)
    assert blk_cols(GemvVariant("blk", rows=8, wg=128), 64, dual=True) == GemvVariant("blk", rows=2, wg=128, cols=8)
    assert blk_cols(GemvVariant("blk", rows=2, wg=64), 2, dual=False) == GemvVariant("blk", rows=2, wg=64, cols=2)
    assert blk_cols(GemvVariant("blk", rows=4, wg=256), 16, dual=False, subgroups=False) == \
        GemvVariant("blk", rows=4, wg=256, cols=4)       # 4 x 4 sums x 256 invocations: 4096 floats
    q = GemvVariant("blk", rows=32, wg=256, rps=4)
    assert blk_cols(q, 16, dual=True, qout=True) == GemvVariant("blk", rows=32, wg=256, rps=2, cols=8)
    assert blk_cols(q, 16, dual=False, qout=True) == GemvVariant("blk", rows=32, wg=256, rps=4, cols=8)
    assert blk_cols(GemvVariant("blk", rows=32, wg=1024, rps=1), 8, dual=True, qout=True) == \
        GemvVariant("blk", rows=32, wg=1024, rps=1, cols=8)


def test_cols_measured_where_tuned(monkeypatch, tmp_path):
    """choose_cols: untuned (autotune off, software adapters): the static rule; tuned (lavapipe
    forced): the static rule's form first, then v and every one-row candidate of its kind at 2, 4
    and 8 columns, then the one-row kernel, are timed (plain and with the quantizing epilogue)
    and the fastest is cached per shape and row count."""
    from webdrift.kernels import autotune
    from webdrift.kernels.autotune import choose_cols
    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    dev = device()
    gw, _ = make_weight(_weights(64, 256), "q8")
    v, q = GemvVariant("blk", rows=4, wg=64), GemvVariant("blk", rows=32, wg=128, rps=4)
    assert choose_cols(dev, gw, None, v, 16, enabled=False) == blk_cols(v, 16, dual=False)
    assert choose_cols(dev, gw, None, v, 16) == blk_cols(v, 16, dual=False)          # software: the rule
    assert choose_cols(dev, gw, None, v, 1, enabled="force") == v                    # one row: nothing to choose
    calls = []
    real = autotune._search_cols
    monkeypatch.setattr(autotune, "_search_cols", lambda *a: calls.append(a[3]) or real(*a))
    for var, qout in ((v, False), (q, True)):
        got = choose_cols(dev, gw, None, var, 16, qout=qout, enabled="force")
        assert got in calls[-1]
        assert choose_cols(dev, gw, None, var, 16, qout=qout, enabled="force") == got      # cached
    kinds = {False: (v, *autotune.BLK_CANDIDATES), True: (q, *autotune.QOUT_CANDIDATES)}
    assert len(calls) == 2
    for cands, qout in zip(calls, (False, True)):
        assert cands[0] == blk_cols(kinds[qout][0], 16, False, qout) and cands[-1] == kinds[qout][0]
        want = {blk_cols(k, c, False, qout) for k in kinds[qout] for c in (2, 4, 8)}
        assert set(cands[1:-1]) | {cands[0]} == want and len(cands) == len(set(cands))
        assert {c.cols for c in cands} == {1, 2, 4, 8}


def test_last_workgroup_choice_in_the_column_search(monkeypatch, tmp_path):
    """A quantizing GEMV chosen in its last-workgroup form (qlast: timing decides, so a loaded
    machine may pick it anywhere): a several-row program's search (choose_cols) times it beside
    the 32-row kinds, whose several-column forms stand in for it (qlast takes one column)."""
    from webdrift.kernels import autotune
    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    qlast = GemvVariant("blk", rows=2, wg=32, qlast=True)

    def search_qout(dev, w, w2, siblings=None):   # a generator like the real search
        return autotune._as_dict(qlast)
        yield  # (makes this a generator)
    monkeypatch.setattr(autotune, "_search_qout", search_qout)
    dev = device()
    gw, _ = make_weight(_weights(64, 256), "q8")
    assert autotune.choose_qout(dev, gw, enabled="force") == qlast
    calls = []
    real = autotune._search_cols
    monkeypatch.setattr(autotune, "_search_cols", lambda *a: calls.append(a[3]) or real(*a))
    got = autotune.choose_cols(dev, gw, None, qlast, 4, qout=True, enabled="force")
    assert calls[0][0] == blk_cols(autotune.QOUT_STATIC, 4, False, True) and calls[0][-1] == qlast
    assert got in calls[0] and (got == qlast or not got.qlast)


def test_fastest_confirms_its_leaders(monkeypatch):
    """autotune._fastest with confirm=k: the k fastest candidates are timed once more and keep
    their better time, so one slow timing of the true fastest does not lose it the choice; a
    candidate that fails to build is skipped; without confirm the first timings decide."""
    from webdrift.kernels import autotune

    class Built:
        binding_names = ()

        def __init__(self, name):
            self.name = name

        def workgroups(self, t):
            return (1, 1, 1)

        def dispatch(self, binds, wg):
            return self.name

    timings = {}

    def fake_time(dev, d):      # a generator like autotune._time: scripted ns per candidate
        return timings[d].pop(0)
        yield  # (makes this a generator)

    def build(name):
        if name == "broken":
            raise ValueError("cannot run")
        return Built(name)

    monkeypatch.setattr(autotune, "_time", fake_time)
    # first timings a 70, b 60, c 90; again: a 40, b 55
    for confirm, want in ((0, ("b", 60)), (1, ("b", 55)), (2, ("a", 40))):
        timings.update(a=[70, 40], b=[60, 55], c=[90, 90])
        got = autotune._drive_sync(None, autotune._fastest(None, ["a", "broken", "b", "c"], build, {}, 1,
                                                            confirm=confirm))
        assert got == want


@pytest.mark.parametrize("fmt,case,I,wg,unroll,cols", [
    ("q4", "dual", 1536, 32, 2, 1),      # 48 blocks: lanes 16..31's second block is past the row
    ("q8", "pre_norm", 1536, 64, 3, 1),  # 48 blocks, a stride of 64: every later block masked
    ("q4_0", "plain", 4096, 64, 2, 1),   # 128 blocks: two strides exactly
    ("q6k", "bias_residual", 1536, 32, 3, 1),
    ("q4k", "plain", 1536, 32, 2, 1),
    ("q4", "dual", 1536, 32, 2, 4),      # several columns
    ("q8", "pre_norm", 576, 32, 2, 2),
])
def test_unroll_same_sums(fmt, case, I, wg, unroll, cols):
    """GemvVariant.unroll on the integer-dot GEMV (BU blocks a stride apart per iteration, their
    loads issued together): the same outputs as one block an iteration, bit for bit (the sums
    are added in the same order), and against numpy; blocks past a row's end (NB not a multiple
    of the stride x unroll) add nothing."""
    dev = device()
    T = 3
    c = Case(case, fmt, T, 37, I, np.random.default_rng(I + unroll), seeds=(31, 32))
    v = GemvVariant("blk", rows=4, wg=wg, unroll=unroll, cols=cols)
    outs = {u: download(c.yd, c.run(dev, replace(v, unroll=u))) for u in (1, unroll)}
    y = outs[unroll]
    np.testing.assert_array_equal(y, outs[1])
    src = c.source(dev, v)
    assert f"const BU: u32 = {unroll}u;" in src and src.count("let ok = b0 +") == unroll - 1
    if fmt in ("q4_0", "q4k"):   # (check's emulation takes the block minimum as q4's min term)
        exact = c.x.astype(np.float64) @ c.wref.T.astype(np.float64)
        np.testing.assert_allclose(y[:T], exact, atol=0.03 * np.abs(exact).max())
        return
    c.check(y)


@pytest.mark.parametrize("qlast", [0, 4])
def test_unroll_quantizing_epilogue(qlast):
    """The int8 chain's GEMVs unrolled (32 rows a workgroup, lanes striding the blocks; or the
    last workgroup of each 32-block quantizing it): y and the int8 row bit for bit those of one
    block an iteration."""
    from tests.gpu_util import step_buffer
    dev = device()
    T, O, I = 2, 96, 1536
    rng = np.random.default_rng(5)
    x = rng.standard_normal((T, I)).astype(np.float32)
    qd, qb, _ = quantized_input(x, "q4")
    gw, _ = make_weight(_weights(O, I, seed=33), "q4")
    yd, nd = TensorDesc("y", O, CAP), xq_desc("next", O, CAP)
    y0 = rng.standard_normal((T, O)).astype(np.float32)
    nw = rng.standard_normal(O).astype(np.float32)
    got = {}
    for u in (1, 3):
        v = GemvVariant("blk", rows=qlast, wg=64, unroll=u, qlast=True) if qlast else GemvVariant("blk", wg=64, rps=2, unroll=u)
        k = LinearKernel(dev, "decode", qd, yd, gw, None, variant=v,
                         epilogue=Epilogue(residual=True, qout=QuantOut(nd, "q4", 0.0, True)))
        yb, ob = upload(yd, y0), upload(nd, None)
        binds = {"step": step_buffer(), "x": qb, "y": yb, "w": gw.buffers, "qout": ob, "qnw": f32_buffer(nw)}
        if qlast:
            binds |= {"qy": upload(TensorDesc("qy", O, CAP), None),
                      "qcnt": f32_buffer(np.zeros(CAP * O // 32, np.float32))}
        write_step(T)
        dev.submit([k.dispatch(binds, k.workgroups(T))])
        got[u] = (download(yd, yb)[:T], dev.read_buffer_sync(ob))
    np.testing.assert_array_equal(got[3][0], got[1][0])
    assert got[3][1] == got[1][1]
    ref = (x.astype(np.float64) @ _weights(O, I, seed=33).T.astype(np.float64)) + y0
    np.testing.assert_allclose(got[3][0], ref, rtol=0.05, atol=0.05 * np.abs(ref).max())
