"""GPUModel's choice of int8 activations, as pure logic (fake device and weights): forced,
per-role and automatic, incl. an adapter that cannot time kernels synchronously (the browser),
which takes the size rule and the int8 chain, and software adapters, which never take int8."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest

from webdrift.errors import InvalidArgumentError, UnsupportedModelError
from webdrift.models.transformer import GPUModel


def fake_model(fmt="q4", dim=2048, ffn=8192, is_cpu=False, dp4a=True, timed=False, post_norms=False):
    def w(o, i):
        return NS(fmt=fmt, o=o, i=i, nbytes=o * i // (2 if fmt == "q4" else 1))
    lw = NS(wqkv=w(3 * dim, dim), wo=w(dim, dim), w_gate=w(ffn, dim), w_up=w(ffn, dim), w_down=w(dim, ffn))
    dev = NS(has_dp4a=dp4a, has_subgroups=True, has_timestamps=timed, can_time_sync=timed, info=NS(is_cpu=is_cpu))
    m = GPUModel.__new__(GPUModel)
    m.dev, m.layers, m.output, m.autotune, m.int8_chain = dev, [lw], w(128256, dim), True, False
    m.cfg = NS(post_norms=post_norms, dim=dim, ffn_dim=ffn, head_dim=64)
    return m


def test_untimed_gpu_takes_size_rule_and_chain():
    m = fake_model()
    roles = m._int8_choice(None)
    assert roles == {"qkv": True, "o": True, "gateup": True, "down": True, "head": True}
    assert m.int8_chain


def test_small_layers_stay_float_without_timing():
    m = fake_model(dim=576, ffn=1536)
    roles = m._int8_choice(None)
    assert not any(v for r, v in roles.items() if r != "head") and roles["head"]   # the 49k+ vocab head is big
    assert not m.int8_chain


def test_software_adapter_never_takes_int8():
    m = fake_model(is_cpu=True)
    assert not any(m._int8_choice(None).values())


def test_forced_and_per_role():
    m = fake_model()
    assert all(m._int8_choice(True).values()) and m.int8_chain
    assert not any(m._int8_choice(False).values())
    roles = m._int8_choice({"down": True})
    assert roles["down"] and not roles["qkv"] and not m.int8_chain
    with pytest.raises(InvalidArgumentError, match="unknown roles"):
        m._int8_choice({"lm": True})
    with pytest.raises(UnsupportedModelError, match="int8 activations"):
        fake_model(fmt="f16")._int8_choice(True)
    with pytest.raises(UnsupportedModelError, match="int8 activations"):
        fake_model(dp4a=False)._int8_choice(True)


def test_post_norm_models_skip_the_chain():
    m = fake_model(post_norms=True)    # Gemma's post-norms: no quantizing epilogues; per-role size rule
    roles = m._int8_choice(None)
    assert roles["gateup"] and roles["head"] and not roles["down"] and not m.int8_chain


def test_attention_choice_rules_and_timing(monkeypatch, tmp_path):
    """choose_attention: per-head for MHA, beyond MAX_GQA heads per KV head and without timing
    (browsers); with timestamps (lavapipe has them) both kernels are timed on the layer's caches
    and the verdict is cached per shape."""
    from tests.gpu_util import device
    from webdrift.kernels import autotune
    from webdrift.kernels.autotune import choose_attention

    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    gpu = NS(has_timestamps=False, can_time_sync=False, info=NS(is_cpu=False, adapter="x", backend="y"))
    assert choose_attention(gpu, 8, 2, 64, 512, None, None) is False            # untimed
    dev = device()
    kc, vc = (dev.create_buffer(2 * 512 * 64 * 4, label=n) for n in ("k", "v"))
    calls = []
    real = autotune._measure_attention
    monkeypatch.setattr(autotune, "_measure_attention", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(autotune, "_memory", {})
    assert choose_attention(dev, 8, 8, 64, 512, kc, vc) is False               # MHA: nothing to share
    assert choose_attention(dev, 32, 2, 64, 512, kc, vc) is False              # 16 > MAX_GQA heads
    assert calls == []
    got = choose_attention(dev, 8, 2, 64, 512, kc, vc)
    assert isinstance(got, bool) and calls == [1]
    assert choose_attention(dev, 8, 2, 64, 512, kc, vc) == got and calls == [1]    # cached


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
    got = autotune._measure_layout(dev, "f16", 70, 136)
    assert got["layout"] in LAYOUTS and all(got[f"{n}_ns"] > 0 for n in LAYOUTS)
    assert got["layout"] == min(LAYOUTS, key=lambda n: got[f"{n}_ns"])
    monkeypatch.setattr(dev.info, "is_cpu", False)      # as a GPU would: measured once, then cached
    calls = []
    monkeypatch.setattr(autotune, "_measure_layout", lambda *a: calls.append(1) or got)
    assert choose_layout(dev, "f16", 70, 136) == got["layout"] and choose_layout(dev, "f16", 70, 136) == got["layout"]
    assert calls == [1]
    w, _ = make_weight(np.zeros((8, 32), np.float32), "f16", layout="OI4O4")
    assert layout_name(w) == "OI4O4"
