"""Decode GEMV choices re-timed in a chain over the model's layers (autotune._chain_best): the
CHAIN_TOP candidates fastest alone are timed again as one pass over the same role's weights of
several layers, and the fastest there is kept; and forward.py handing each layer GEMV its
siblings. The timings are stood in for (lavapipe's would decide nothing reproducible): each
candidate gets a fixed time alone and another in the chain, so the test knows the answer."""

from __future__ import annotations

import pytest

from tests.gpu_util import device, make_weight
from tests.test_kernels_linear import _weights
from webdrift.kernels import autotune


@pytest.fixture
def fake_timings(monkeypatch, tmp_path):
    """Alone: each candidate's index in its list (ns); in a chain: the CHAIN_TOP fastest alone in
    reverse order, and any other candidate faster still (so a chain over one of them shows)."""
    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    made, chains = {}, []
    real = autotune.LinearKernel

    class Recorded(real):
        def __init__(self, *a, variant=None, **k):
            super().__init__(*a, variant=variant, **k)
            made[id(self.pipeline)] = variant

    monkeypatch.setattr(autotune, "LinearKernel", Recorded)

    def alone(v):
        if v.variant != "blk":
            cands = list(autotune.CANDIDATES)
        elif v.rows == 32 or v.qlast:
            cands = list(autotune.QOUT_CANDIDATES + autotune.QLAST_CANDIDATES)
        else:
            cands = list(autotune.BLK_CANDIDATES)
        return 1000 + 10 * cands.index(v)

    def fake_time(dev, d):
        return alone(made[id(d.pipeline)])
        yield  # a generator, like _time

    def fake_seq(dev, ds):
        v = made[id(ds[0].pipeline)]
        chains.append((v, len(ds), {id(d.bind_group) for d in ds}))
        rank = sorted(made.values(), key=alone).index(v)
        return 5000 - rank if rank < autotune.CHAIN_TOP else 1
        yield

    monkeypatch.setattr(autotune, "_time", fake_time)
    monkeypatch.setattr(autotune, "_time_seq", fake_seq)
    return made, chains, alone


@pytest.mark.parametrize("fmt,dual,qout", [("f16", False, False), ("q4", True, False), ("q4", False, True)])
def test_choice_is_the_chains_fastest_of_the_top(fake_timings, fmt, dual, qout):
    made, chains, alone = fake_timings
    dev = device()
    ws = [make_weight(_weights(64, 256, seed=s), fmt, name=f"w{s}")[0] for s in range(3)]
    us = [make_weight(_weights(64, 256, seed=10 + s), fmt, name=f"u{s}")[0] for s in range(3)] if dual else [None] * 3
    sib = list(zip(ws, us))
    if qout:
        def choose(**k):
            return autotune.choose_qout(dev, ws[0], us[0], enabled="force", **k)
    else:
        def choose(**k):
            return autotune.choose_gemv(dev, ws[0], us[0], enabled="force", int8=fmt != "f16", **k)
    plain = choose()                                  # alone only: the fastest alone, no chain timed
    assert not chains and alone(plain) == min(alone(v) for v in made.values())
    got = choose(siblings=sib)
    timed = [v for v, _, _ in chains]
    top = sorted(set(made.values()), key=alone)[:autotune.CHAIN_TOP]
    assert timed == top                               # the top alone, fastest first, each once
    assert got == top[-1] != plain                    # the chain's fastest of them
    assert all(n == 3 and len(groups) == 3 for _, n, groups in chains)   # one dispatch per layer's weights
    n = len(chains)
    assert choose(siblings=sib) == got and len(chains) == n                # cached (under a key of its own)
    assert choose() == plain
    assert choose(siblings=sib[:1]) == plain and len(chains) == n         # one weight: nothing to chain


def test_forward_hands_each_layer_gemv_its_siblings(monkeypatch):
    """Every layer GEMV's choice gets the same role's weights of every layer with its format and
    shape, its own first; the LM head none; a Q4_K_M model's down projections (Q4_K on layer 0,
    Q6_K on layer 1 of the tiny shape) each only itself."""
    from webdrift.gpu.native import get_device
    from webdrift.models import forward
    from webdrift.runtime.loading import EngineOptions, assemble
    from webdrift.weights.synthetic import NullTokenizer, synthetic_source
    seen = []
    for name in ("choose_gemv", "choose_qout"):
        real = getattr(forward, name)
        monkeypatch.setattr(forward, name, lambda dev, w, w2=None, siblings=None, _r=real, **k:
                            seen.append((w, w2, siblings)) or _r(dev, w, w2, siblings=siblings, **k))
    for quant in ("q4", "q4_k_m"):
        seen.clear()
        eng = assemble(synthetic_source("tiny", quant), EngineOptions(max_context=40, autotune=False), get_device(),
                       tokenizer=NullTokenizer())
        layers = eng.model.layers
        roles = {"qkv": [(lw.wqkv, None) for lw in layers], "o": [(lw.wo, None) for lw in layers],
                 "gateup": [(lw.w_gate, lw.w_up) for lw in layers], "down": [(lw.w_down, None) for lw in layers]}
        checked = set()
        for w, w2, sib in seen:
            role = next((r for r, ps in roles.items() if any(p[0] is w for p in ps)), None)
            if role is None:
                assert sib is None                    # the LM head
                continue
            same = [p for p in roles[role] if p[0].fmt == w.fmt]
            assert sib[0] == (w, w2) and {id(p[0]) for p in sib} == {id(p[0]) for p in same}
            checked.add(role)
        assert checked == set(roles)
        if quant == "q4_k_m":
            downs = [sib for w, _, sib in seen if any(w is lw.w_down for lw in layers)]
            assert downs and all(len(s) == 1 for s in downs)
