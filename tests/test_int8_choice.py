"""GPUModel's choice of int8 activations, as pure logic (fake device and weights): forced,
per-role and automatic, incl. an adapter that cannot time kernels synchronously (the browser),
which takes the size rule and the int8 chain, and software adapters, which never take int8."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest

from webdrift.errors import InvalidArgumentError, UnsupportedModelError
from webdrift.models.choices import choose_int8


def fake_model(fmt="q4", dim=2048, ffn=8192, is_cpu=False, dp4a=True, timed=False, post_norms=False):
    def w(o, i):
        return NS(fmt=fmt, o=o, i=i, nbytes=o * i // (2 if fmt == "q4" else 1))
    lw = NS(wqkv=w(3 * dim, dim), wo=w(dim, dim), w_gate=w(ffn, dim), w_up=w(ffn, dim), w_down=w(dim, ffn))
    dev = NS(has_dp4a=dp4a, has_subgroups=True, has_timestamps=timed, can_time_sync=timed, info=NS(is_cpu=is_cpu))
    return NS(dev=dev, layers=[lw], output=w(128256, dim), autotune=True,
              cfg=NS(post_norms=post_norms, dim=dim, ffn_dim=ffn, head_dim=64))


def test_untimed_gpu_takes_size_rule_and_chain():
    c = choose_int8(fake_model(), None)
    assert c.roles == {"qkv": True, "o": True, "gateup": True, "down": True, "head": True}
    assert c.chain and c.unchained is None      # nothing for the engine to time


def test_timed_gpu_leaves_the_chain_to_the_engine(monkeypatch):
    """A timed adapter: the per-role choice (here only gate/up and the head repay a quantize
    dispatch) is kept as `unchained` beside the chain, for the engine to time a decode step each
    way (runtime/engine.py _choose_chain)."""
    from webdrift.models import choices
    monkeypatch.setattr(choices, "int8_pays", lambda dev, w, w2=None, **k: {"int8": w2 is not None or w.o > 100000})
    c = choose_int8(fake_model(timed=True), None)
    assert c.chain and all(c.roles.values())
    assert c.unchained == {"qkv": False, "o": False, "gateup": True, "down": False, "head": True}


def test_small_layers_stay_float_without_timing():
    c = choose_int8(fake_model(dim=576, ffn=1536), None)
    assert not any(v for r, v in c.roles.items() if r != "head") and c.roles["head"]   # the 49k+ vocab head is big
    assert not c.chain


def test_software_adapter_never_takes_int8():
    assert not any(choose_int8(fake_model(is_cpu=True), None).roles.values())


def test_forced_and_per_role():
    m = fake_model()
    c = choose_int8(m, True)
    assert all(c.roles.values()) and c.chain
    assert not any(choose_int8(m, False).roles.values())
    c = choose_int8(m, {"down": True})
    assert c.roles["down"] and not c.roles["qkv"] and not c.chain
    with pytest.raises(InvalidArgumentError, match="unknown roles"):
        choose_int8(m, {"lm": True})
    with pytest.raises(UnsupportedModelError, match="int8 activations"):
        choose_int8(fake_model(fmt="f16"), True)
    with pytest.raises(UnsupportedModelError, match="int8 activations"):
        choose_int8(fake_model(dp4a=False), True)


def test_post_norm_models_skip_the_chain():
    c = choose_int8(fake_model(post_norms=True), None)   # Gemma's post-norms: no quantizing epilogues; per-role size rule
    assert c.roles["gateup"] and c.roles["head"] and not c.roles["down"] and not c.chain


def test_attention_choice_rules_and_timing(monkeypatch, tmp_path):
    """choose_attention: per-head where it is the only candidate (more than MAX_GQA heads per KV
    head, no subgroups); without timing the rule (split where a GPU has subgroups, grouped on
    software adapters); with timestamps (lavapipe has them, here taken for a GPU's) every
    candidate is timed with its combine on the layer's caches, the fastest kept and cached per
    shape."""
    from tests.gpu_util import device
    from webdrift.kernels import autotune
    from webdrift.kernels.attention import AttnChoice as C
    from webdrift.kernels.autotune import attention_candidates, choose_attention

    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    gpu = NS(has_timestamps=False, can_time_sync=False, has_subgroups=True, min_subgroup=32,
             info=NS(is_cpu=False, adapter="x", backend="y"))
    assert choose_attention(gpu, 8, 2, 64, 512, None, None) == C("split", 32)   # untimed GPU
    assert choose_attention(gpu, 32, 2, 64, 512, None, None) == C()                # 16 > MAX_GQA heads
    plain = NS(has_timestamps=False, can_time_sync=False, has_subgroups=False,
               info=NS(is_cpu=False, adapter="x", backend="y"))
    assert choose_attention(plain, 8, 8, 64, 512, None, None) == C()              # MHA, no subgroups
    assert choose_attention(plain, 8, 2, 64, 512, None, None) == C("grouped")
    assert attention_candidates(gpu, 8, 8, 64, 512) == (
        [C()] + [C("split", c, pf) for c in (16, 32, 64) for pf in (False, True)]
        + [C("split", c, False, a) for c in (16, 32) for a in (32, 64)] + [C("tiled", 64, False, n) for n in (8, 16, 32, 64)])
    assert C("tiled", 64, False, 8) not in attention_candidates(gpu, 8, 8, 80, 512)   # head_dim not a power of two
    dev = device()
    assert dev.info.is_cpu and choose_attention(dev, 8, 2, 64, 512, None, None) == C("grouped")   # the rule
    monkeypatch.setattr(dev.info, "is_cpu", False)      # as a GPU would: measured once, then cached
    kc, vc = (dev.create_buffer(2 * 512 * 64 * 4, label=n) for n in ("k", "v"))
    calls = []
    real = autotune._measure_attention
    monkeypatch.setattr(autotune, "_measure_attention", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(autotune, "_memory", {})
    got = choose_attention(dev, 8, 2, 64, 512, kc, vc)
    assert got in attention_candidates(dev, 8, 2, 64, 512) and calls == [1]
    assert choose_attention(dev, 8, 2, 64, 512, kc, vc) == got and calls == [1]    # cached
    ns = autotune._memory[next(k for k in autotune._memory if "|attn5|" in k)]["ns"]
    assert set(ns) == {c.name for c in attention_candidates(dev, 8, 2, 64, 512)} and min(ns.values()) > 0


def _returns(value):
    """A measurement generator that times nothing and returns value."""
    return value
    yield


def test_weight_layout_search(monkeypatch, tmp_path):
    """choose_layout (ML Drift's weight-layout search for float weights): q4 / q8 and untimed or
    software adapters keep "OI"; on a timed adapter both orders are timed with their fastest
    GEMV variant on a scratch weight (a real measurement here, on lavapipe) and the verdict is
    cached per shape; the GEMV variant cache is per layout."""
    from tests.gpu_util import device, make_weight
    from webdrift.kernels import autotune
    from webdrift.kernels.autotune import LAYOUTS, choose_layout, layout_name

    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    dev = device()
    assert choose_layout(dev, "q4", 64, 128) == "OI"
    assert dev.info.is_cpu and choose_layout(dev, "f16", 64, 128) == "OI"      # software adapter
    gpu = NS(has_timestamps=False, can_time_sync=False, info=NS(is_cpu=False, adapter="x", backend="y"))
    assert choose_layout(gpu, "f16", 64, 128) == "OI"                          # untimed (browser)
    got = autotune._drive_sync(dev, autotune._measure_layout(dev, "f16", 70, 136))   # measurements are generators
    assert got["layout"] in LAYOUTS and all(got[f"{n}_ns"] > 0 for n in LAYOUTS)
    assert got["layout"] == min(LAYOUTS, key=lambda n: got[f"{n}_ns"])
    monkeypatch.setattr(dev.info, "is_cpu", False)      # as a GPU would: measured once, then cached
    calls = []
    monkeypatch.setattr(autotune, "_measure_layout", lambda *a: calls.append(1) or _returns(got))
    assert choose_layout(dev, "f16", 70, 136) == got["layout"] and choose_layout(dev, "f16", 70, 136) == got["layout"]
    assert calls == [1]
    w, _ = make_weight(np.zeros((8, 32), np.float32), "f16", layout="OI4O4")
    assert layout_name(w) == "OI4O4"


def test_attention_ranking_adds_each_variant_near_the_fastest(monkeypatch, tmp_path):
    """attention_ranking: the 3 fastest kernel timings, then the fastest of each variant not
    among them that took at most twice the fastest's time (the whole-step timing's candidates:
    one variant against another, kernels timed alone rank unlike whole steps)."""
    from webdrift.kernels import autotune
    from webdrift.kernels.attention import AttnChoice as C

    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    gpu = NS(has_timestamps=True, can_time_sync=True, has_subgroups=True, min_subgroup=32,
             info=NS(is_cpu=False, adapter="x", backend="y"))
    assert autotune.attention_ranking(gpu, 8, 2, 64, 512) == []                 # nothing timed yet
    ns = {c.name: 1000 for c in autotune.attention_candidates(gpu, 8, 2, 64, 512)}
    ns.update({"split16": 100, "split16pf": 101, "split32": 102, "split64": 103, "tiled64a16": 150,
               "tiled64a32": 160, "grouped": 199, "head": 201})
    autotune._memory[autotune._attn_key(gpu, 8, 2, 64, 512, 0, False)] = {"ns": ns}
    assert autotune.attention_ranking(gpu, 8, 2, 64, 512) == [
        C("split", 16), C("split", 16, True), C("split", 32), C("tiled", 64, False, 16), C("grouped")]
    assert autotune.attention_ranking(gpu, 8, 2, 64, 512, k=1) == [C("split", 16), C("tiled", 64, False, 16),
                                                                   C("grouped")]
