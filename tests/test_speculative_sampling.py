"""Speculative sampling keeps the model's distribution: on the tiny GGUF model, the first three
sampled tokens with and without speculation are chi-square consistent with the model's own
distribution, computed here in numpy from teacher-forced logits (softmax of logits / T over the
top-k, then top-p). The third token of the speculative runs (after the likeliest first two) comes
from a verification pass whose candidates include the likeliest token, a less likely one and one
outside the top-k (each accepted or rejected by the rule), so acceptance, rejection and the
residual draw all count. (The first tokens come from plain steps: the engine queues decode steps
behind the prompt before its first token is read, so a pass starts two tokens after the drafter
first has a tree.)"""

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
    """After `prefix` (the prompt and two tokens): a tree of candidates for the next token (and a
    level below them); one token earlier, a root-only tree (which stops the first plain burst)."""

    def __init__(self, prefix, cands, below):
        self.prefix, self.cands, self.below = prefix, cands, below

    def reset(self, context):
        self.ctx = list(context)

    def append(self, token):
        self.ctx.append(token)

    def propose(self, max_nodes, max_depth):
        if self.ctx == self.prefix[:-1]:
            return DraftTree([self.ctx[-1]], [-1])
        if self.ctx != self.prefix:
            return None
        tokens, parents = [self.prefix[-1]], [-1]
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
    b = int(np.argmax(p1))
    p2 = target(eng.logits(PROMPT + [a, b])[-1])
    order = np.argsort(-p2)
    outside = int(np.flatnonzero(p2 == 0)[0])
    drafter = FixedTree(PROMPT + [a, b], [int(order[1]), int(order[0]), outside], [int(order[0]), 3])
    for spec in (None, drafter):
        first, second, third, passes = [], [], [], 0
        for seed in range(N):
            r = eng.generate(PROMPT, max_new_tokens=3, temperature=T, top_k=TOP_K, top_p=TOP_P, seed=seed,
                             stop_at_eos=False, speculative=spec)
            t = r.token_ids
            first.append(t[0])
            if t[0] == a:
                second.append(t[1])
                if t[1] == b:
                    third.append(t[2])
            passes += r.stats.spec_passes
        assert chi2_p(first, p0) > 1e-3, spec
        assert len(second) > 200 and chi2_p(second, p1) > 1e-3, spec
        assert len(third) > 200 and chi2_p(third, p2) > 1e-3, spec
        if spec is not None:
            assert passes == len(third)              # every third token after (a, b) came from a verification pass
