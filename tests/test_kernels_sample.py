"""SampleKernel (wgsl/sample.wgsl) vs numpy: greedy argmax (ties -> lowest id) and sampling with
temperature / top-k / top-p (HF semantics) from many draws: every token is in the allowed set,
the empirical frequencies match the renormalised probabilities, and the counter-based RNG is a
function of (seed, step). Vocabulary sizes are not multiples of the 256-thread workgroup."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import device, read_u32, run, run_steps, step_buffer, upload, write_step
from webdrift.kernels.sample import ArgmaxKernel, SampleKernel
from webdrift.tensor import TensorDesc

_kernels: dict = {}


def sampler(V: int, rows: int = 1, span: int = 0):
    """(kernel, logits desc, argmax kernel or None): compiled once per vocabulary size (compiles
    are slow on lavapipe); span > 0: greedy through ArgmaxKernel's per-span maxima."""
    if (V, rows, span) not in _kernels:
        d = TensorDesc("logits", V, rows)
        am = ArgmaxKernel(device(), d, V, span=span) if span else None
        _kernels[(V, rows, span)] = (SampleKernel(device(), d, V, partials=am.n_parts if am else 0), d, am)
    return _kernels[(V, rows, span)]


def u32_zeros(n):
    buf = device().create_buffer(4 * max(4, n), label="u32")
    device().write_buffer(buf, np.full(max(4, n), 0xDEADBEEF, np.uint32))
    return buf


# -- greedy --------------------------------------------------------------------------------------

def greedy(logits: np.ndarray, step: int = 0, span: int = 0) -> tuple[int, int, int]:
    """(token from out_tokens[step], ids[0], rows) for logits (rows, V); samples row rows - 1."""
    rows, V = logits.shape
    k, d, am = sampler(V, rows, span)
    out, ids = u32_zeros(step + 1), u32_zeros(4)
    lb = upload(d, logits)
    if am is None:
        run(k, {"logits": lb, "out_tokens": out, "ids": ids}, rows, step=step, temperature=0.0)
    else:
        part = u32_zeros(2 * am.n_parts)
        write_step(rows, step=step, temperature=0.0)
        device().submit([am.dispatch({"step": step_buffer(), "logits": lb, "part": part}, am.workgroups()),
                         k.dispatch({"step": step_buffer(), "logits": lb, "out_tokens": out, "ids": ids, "part": part},
                                    k.workgroups())])
    return int(read_u32(out)[step]), int(read_u32(ids)[0]), rows


@pytest.mark.parametrize("V,span", [(50, 0), (257, 0), (1000, 0), (1000, 256), (5000, 300)])
def test_greedy_argmax_spans(V, span):
    """Through ArgmaxKernel's per-span maxima (several spans; a partial last one) and ties across
    spans (lowest id wins)."""
    rng = np.random.default_rng(V + span)
    for where in (0, V - 1, V // 2 + 1, 37, span):
        lg = rng.standard_normal((2, V)).astype(np.float32) - 50
        lg[1, where] = 0.0
        lg[0, 3] = 10.0                                          # another row: not sampled
        assert greedy(lg, step=2, span=span)[:2] == (where, where)
    if span:
        lg = rng.standard_normal((1, V)).astype(np.float32)
        lg[0, [span + 1, 2 * span + 3, V - 1]] = 7.0
        assert greedy(lg, span=span)[0] == span + 1


@pytest.mark.parametrize("V", [50, 257, 1000])
def test_greedy_argmax(V):
    rng = np.random.default_rng(V)
    for where in (0, V - 1, V // 2 + 1, 37):
        lg = rng.standard_normal((1, V)).astype(np.float32) - 50   # all negative
        lg[0, where] = 0.0
        tok, ids0, _ = greedy(lg, step=3)
        assert tok == ids0 == where


@pytest.mark.parametrize("V", [50, 1000])
def test_greedy_ties_pick_the_lowest_id(V):
    lg = np.random.default_rng(1).standard_normal((1, V)).astype(np.float32)
    for a, b in ((3, V - 2), (10, 11), (V - 2, V - 1)):        # different and same thread chunks
        x = lg.copy()
        x[0, [a, b]] = 9.0
        assert greedy(x)[0] == a
        x[0, :] = 1.5                                          # everything tied
        assert greedy(x)[0] == 0


def test_greedy_reads_the_last_row():
    lg = np.random.default_rng(2).standard_normal((3, 300)).astype(np.float32)
    lg[0, 5] = lg[1, 6] = 50.0
    lg[2, 299] = 50.0
    assert greedy(lg)[0] == 299


# -- sampling ------------------------------------------------------------------------------------

def allowed_probs(logits, temperature, top_k=0, top_p=1.0) -> np.ndarray:
    """HF warpers in generate()'s order: temperature, top-k (ties at the k-th value kept), top-p
    (the smallest set of most probable tokens whose mass >= top_p); renormalised, float64."""
    z = logits.astype(np.float64) / temperature
    keep = np.ones(z.size, bool)
    if 0 < top_k < z.size:
        keep = z >= np.sort(z)[-top_k]
    p = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        n = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
        q = np.zeros_like(p)
        q[order[:n]] = p[order[:n]]
        p = q / q.sum()
    return p


def top_p_keeping(logits, temperature, top_k, n_keep) -> float:
    """A top_p half-way between two cumulative masses, so exactly n_keep tokens survive whatever
    the rounding of the GPU's sums."""
    p = np.sort(allowed_probs(logits, temperature, top_k))[::-1]
    c = np.cumsum(p)
    return float((c[n_keep - 2] + c[n_keep - 1]) / 2)


def draw(logits, n, seed=7, step0=0, **params) -> np.ndarray:
    V = logits.size
    k, d, _ = sampler(V)
    out, ids = u32_zeros(step0 + n), u32_zeros(4)
    steps = [dict(n_tokens=1, pos0=0, step=step0 + i, seed=seed, **params) for i in range(n)]
    run_steps(k, {"logits": upload(d, logits[None]), "out_tokens": out, "ids": ids}, steps)
    toks = read_u32(out)[step0: step0 + n]
    assert read_u32(ids)[0] == toks[-1]
    return toks.astype(np.int64)


def check_distribution(toks, p):
    """Every token allowed; per-token counts within 5 sigma and chi-square within ~6 sigma."""
    n = toks.size
    bad = np.flatnonzero(p[toks] == 0)
    assert bad.size == 0, f"drew tokens outside the allowed set: {sorted(set(toks[bad].tolist()))}"
    counts = np.bincount(toks, minlength=p.size)
    k = p > 0
    expect = n * p[k]
    z = (counts[k] - expect) / np.sqrt(expect * (1 - p[k]) + 1e-12)
    assert np.abs(z).max() < 5, f"max z-score {np.abs(z).max():.2f}"
    chi2, df = float(((counts[k] - expect) ** 2 / expect).sum()), max(1, int(k.sum()) - 1)
    assert chi2 < df + 6 * np.sqrt(2 * df) + 10, f"chi-square {chi2:.1f} with {df} degrees of freedom"


def _logits(V, spread, seed):
    return (np.random.default_rng(seed).standard_normal(V) * spread).astype(np.float32)


def test_sample_temperature():
    lg = _logits(50, 1.0, 10)
    p = allowed_probs(lg, 0.7)
    check_distribution(draw(lg, 4000, temperature=0.7), p)


def test_sample_top_k():
    lg = _logits(50, 1.0, 11)
    p = allowed_probs(lg, 1.0, top_k=10)
    assert (p > 0).sum() == 10
    check_distribution(draw(lg, 1500, temperature=1.0, top_k=10), p)


def test_sample_top_p():
    lg = _logits(1000, 3.0, 12)
    top_p = top_p_keeping(lg, 1.0, 0, 12)
    p = allowed_probs(lg, 1.0, top_p=top_p)
    assert (p > 0).sum() == 12
    check_distribution(draw(lg, 1500, temperature=1.0, top_p=top_p), p)


def test_sample_top_k_then_top_p():
    """top-p acts on the renormalised top-k distribution (HF order)."""
    lg = _logits(1000, 2.0, 13)
    top_p = top_p_keeping(lg, 0.8, 40, 8)
    p = allowed_probs(lg, 0.8, top_k=40, top_p=top_p)
    assert (p > 0).sum() == 8
    assert (allowed_probs(lg, 0.8, top_p=top_p) > 0).sum() != 8      # the order matters here
    check_distribution(draw(lg, 1000, temperature=0.8, top_k=40, top_p=top_p), p)


def test_sample_top_k_one_is_greedy():
    lg = _logits(1000, 1.0, 14)
    assert (draw(lg, 40, temperature=1.5, top_k=1) == int(np.argmax(lg))).all()


def test_sample_is_a_function_of_seed_and_step():
    lg = _logits(50, 0.5, 15)                     # flat-ish: many tokens likely
    a = draw(lg, 200, seed=1, temperature=1.0)
    b = draw(lg, 200, seed=1, temperature=1.0)
    np.testing.assert_array_equal(a, b)
    shifted = draw(lg, 100, seed=1, step0=100, temperature=1.0)      # step, not dispatch order
    np.testing.assert_array_equal(shifted, a[100:])
    c = draw(lg, 200, seed=2, temperature=1.0)
    assert (a != c).mean() > 0.5
    assert len(set(a.tolist())) > 20


# -- non-finite logits (issue 15 item 6) -----------------------------------------------------------

NONFINITE = 0xFFFFFFFF   # what the kernel writes for a row with a NaN or an infinity (kernels/sample.py)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("V,span", [(257, 0), (1000, 256), (5000, 300)])
def test_greedy_flags_a_non_finite_logit(V, span, bad):
    """One NaN / +inf / -inf anywhere in the sampled row (first, last, mid-span) makes the token
    NONFINITE, also where the finite maximum is elsewhere (before: a NaN was skipped by `>` and the
    rest decided; a row of NaNs gave the initial id 0xFFFFFFFF, fed back as a token)."""
    from webdrift.kernels.sample import NONFINITE_TOKEN
    assert NONFINITE_TOKEN == NONFINITE
    rng = np.random.default_rng(V)
    for where in (0, V - 1, V // 2 + 1):
        lg = rng.standard_normal((2, V)).astype(np.float32)
        lg[1, 5 if where != 5 else 6] = 30.0                    # the finite maximum
        lg[1, where] = bad
        lg[0, 7] = np.nan                                       # another row: not sampled
        assert greedy(lg, step=1, span=span)[:2] == (NONFINITE, NONFINITE)
    lg = rng.standard_normal((2, V)).astype(np.float32)
    lg[0, :] = np.nan                                          # only the other row is bad
    assert greedy(lg, span=span)[0] == int(np.argmax(lg[1]))
    assert greedy(np.full((1, V), np.nan, np.float32), span=span)[0] == NONFINITE


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_sampling_flags_a_non_finite_logit(bad):
    lg = _logits(1000, 1.0, 16)
    lg[123] = bad
    for params in ({"temperature": 0.8}, {"temperature": 1.0, "top_k": 5}, {"temperature": 1.0, "top_p": 0.5}):
        assert (draw(lg, 3, **params) == NONFINITE).all(), params


def test_extreme_finite_logits_are_not_flagged():
    """The lowest and highest finite floats are ordinary logits (the flag tests the exponent bits)."""
    f32 = np.finfo(np.float32)
    lg = np.full((1, 300), f32.min, np.float32)
    assert greedy(lg)[0] == 0                                  # all equal to the lowest float: id 0
    lg[0, 200] = f32.max
    assert greedy(lg)[0] == 200
    assert greedy(lg, span=128)[0] == 200


def test_argmax_per_row():
    """per_row (tree verification): every row t < n_tokens gets its spans' maxima at
    part[t * n_parts ..]; the host's reduction of them is numpy's argmax; rows past n_tokens are
    not written."""
    V, span, rows, T = 1000, 256, 6, 5
    rng = np.random.default_rng(11)
    lg = rng.standard_normal((rows, V)).astype(np.float32)
    lg[2, [5, 700]] = 9.0                                     # a tie across spans: lowest id
    d = TensorDesc("logits", V, rows)
    am = ArgmaxKernel(device(), d, V, span=span, per_row=True)
    part = u32_zeros(2 * am.n_parts * rows)
    write_step(T)
    device().submit([am.dispatch({"step": step_buffer(), "logits": upload(d, lg), "part": part}, am.workgroups(rows))])
    p = read_u32(part, 2 * am.n_parts * rows).reshape(rows, am.n_parts, 2)
    for t in range(T):
        vals = p[t, :, 0].view(np.float32)
        best = int(np.argmax(vals))                           # first max: spans are in id order
        assert p[t, best, 1] == np.argmax(lg[t])
    assert (p[T:] == 0xDEADBEEF).all()


@pytest.mark.parametrize("k", [2, 4])
def test_argmax_topk_per_row(k):
    """topk (tree verification's forecast drafts): every span's k largest logits, best first, ties
    by lowest id, against numpy's stable sort; a partial last span, a span with fewer entries
    than k, repeated values inside and across spans, a non-finite logit flagging its span's first
    entry."""
    V, span, rows, T = 1027, 256, 5, 4       # spans of 256, 256, 256, 256 and 3 ids
    rng = np.random.default_rng(20 + k)
    lg = rng.standard_normal((rows, V)).astype(np.float32)
    lg[1, [3, 9, 300, 301]] = 7.0                             # ties inside a span and across spans
    lg[2, :] = np.round(lg[2, :] * 2) / 2                     # many equal values
    lg[3, 600] = np.inf                                       # span 2 of row 3 is non-finite
    d = TensorDesc("logits", V, rows)
    am = ArgmaxKernel(device(), d, V, span=span, per_row=True, topk=k)
    part = u32_zeros(2 * am.n_parts * k * rows)
    write_step(T)
    device().submit([am.dispatch({"step": step_buffer(), "logits": upload(d, lg), "part": part}, am.workgroups(rows))])
    p = read_u32(part, 2 * am.n_parts * k * rows).reshape(rows, am.n_parts, k, 2)
    for t in range(T):
        for s in range(am.n_parts):
            ids = np.arange(s * span, min(V, (s + 1) * span))
            seg = lg[t, ids]
            if not np.isfinite(seg).all():
                assert p[t, s, 0, 1] == 0xFFFFFFFF
                continue
            order = ids[np.argsort(-seg, kind="stable")][:k]   # value descending, then lowest id
            got = p[t, s, :len(order), 1]
            assert list(got) == list(order), (t, s)
            assert np.array_equal(p[t, s, :len(order), 0].view(np.float32), lg[t, order])
            assert (p[t, s, len(order):, 1] == 0xFFFFFFFE).all()   # past the span's size: no token
    assert (p[T:] == 0xDEADBEEF).all()
