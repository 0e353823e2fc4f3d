"""Speculative sampling keeps the model's distribution: on the tiny GGUF model, the first two
sampled tokens with and without speculation are both chi-square consistent with the model's own
distribution, computed here in numpy from teacher-forced logits (softmax of logits / T over the
top-k, then top-p). The second token of the speculative runs comes from a verification pass
whose candidates include the likeliest token, a less likely one and one outside the top-k (each
accepted or rejected by the rule), so acceptance, rejection and the residual draw all count."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

import webdrift
from tests.tiny_model import write_tiny_gguf
from webdrift.runtime.speculative import Drafter, DraftTree

PROMPT = [40, 41, 42, 43, 44]
T, TOP_K, TOP_P = 1.0, 8, 0.9
N = 1200


def target(logits: np.ndarray) -> np.ndarray:
    """The sampler's distribution, independently: top-k (ties kept), softmax / T, top-p."""
    lg = logits.astype(np.float64)
    keep = lg >= np.sort(lg)[::-1][TOP_K - 1]
    e = np.where(keep, np.exp((lg - lg[keep].max()) / T), 0.0)
    order = np.argsort(-e, kind="stable")
    cum = np.cumsum(e[order])
    thr = e[order][np.searchsorted(cum, TOP_P * e.sum())]
    e = np.where(e >= thr, e, 0.0)
    return e / e.sum()


class FixedTree(Drafter):
    """After PROMPT + [a]: a tree of candidates for the next token (and a level below them)."""

    def __init__(self, a, cands, below):
        self.a, self.cands, self.below = a, cands, below

    def reset(self, context):
        self.ctx = list(context)

    def append(self, token):
        self.ctx.append(token)

    def propose(self, max_nodes, max_depth):
        if self.ctx != PROMPT + [self.a]:
            return None
        tokens, parents = [self.a], [-1]
        for c in self.cands:
            tokens.append(c)
            parents.append(0)
            node = len(tokens) - 1
            for b in self.below:
                tokens.append(b)
                parents.append(node)
        return DraftTree(tokens, parents)


def chi2_p(samples: list[int], p: np.ndarray) -> float:
    counts = np.bincount(samples, minlength=len(p))
    assert counts[p == 0].sum() == 0, "sampled a token the distribution excludes"
    support = np.flatnonzero(p)
    return chisquare(counts[support], p[support] * len(samples)).pvalue


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    return webdrift.load(write_tiny_gguf(tmp_path_factory.mktemp("ss") / "tiny.gguf", eos=False), max_context=64,
                         autotune=False)


def test_distribution_with_and_without_speculation(eng):
    p0 = target(eng.logits(PROMPT)[-1])
    a = int(np.argmax(p0))
    p1 = target(eng.logits(PROMPT + [a])[-1])
    order = np.argsort(-p1)
    outside = int(np.flatnonzero(p1 == 0)[0])
    drafter = FixedTree(a, [int(order[1]), int(order[0]), outside], [int(order[0]), 3])
    for spec in (None, drafter):
        first, second, passes = [], [], 0
        for seed in range(N):
            r = eng.generate(PROMPT, max_new_tokens=2, temperature=T, top_k=TOP_K, top_p=TOP_P, seed=seed,
                             stop_at_eos=False, speculative=spec)
            first.append(r.token_ids[0])
            if r.token_ids[0] == a:
                second.append(r.token_ids[1])
            passes += r.stats.spec_passes
        assert chi2_p(first, p0) > 1e-3, spec
        assert len(second) > 200 and chi2_p(second, p1) > 1e-3, spec
        if spec is not None:
            assert passes == len(second)             # every second token came from a verification pass
