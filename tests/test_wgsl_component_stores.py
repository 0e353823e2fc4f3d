"""No kernel stores one component of a vector held in workgroup or storage memory (`v[i][c] = ..`,
`v[i].x = ..`): WGSL lets such a store read and write the whole vector ("Component Reference from
Vector Memory View"), so invocations that each write their own component of one vec4 race, and a
compiler that takes that leave (reported for Apple's) loses their values. lavapipe and SwiftShader
store the one component, so no numeric test can see it; this one reads every kernel the engine
compiles for the tiny model (both activation storages, decode, prefill, streams, tree
verification) and every decode attention variant."""

from __future__ import annotations

import re

import pytest

import webdrift
from tests.gpu_util import device
from tests.tiny_model import write_tiny_gguf
from webdrift.kernels.attention import AttentionKernel, AttentionPrefillKernel
from webdrift.tensor import TensorDesc

_VEC_ARRAY = re.compile(r"var<(?:workgroup|storage[^>]*)>\s+(\w+)\s*:\s*array<\s*vec[234]")


def component_stores(wgsl: str) -> list[str]:
    """The statements of `wgsl` that store one component of a vector array's element."""
    wgsl = re.sub(r"//[^\n]*", "", wgsl)
    out = []
    for name in set(_VEC_ARRAY.findall(wgsl)):
        store = re.compile(rf"\b{name}\[[^\]\n;]*\]\s*(?:\[[^\]\n;]*\]|\.[xyzwrgba])\s*[-+*/]?=(?!=)")
        out += [m.group(0) for m in store.finditer(wgsl)]
    return out


def test_the_check_finds_component_stores():
    src = ("var<workgroup> sc: array<vec4<f32>, 4>;\n@group(0) @binding(0) var<storage, read_write> b: "
           "array<vec4<f32>>;\n// sc[i][j] = in a comment\nfn f(i: u32) { sc[i / 4u][i % 4u] = 1.0; b[i].y += 2.0; let x = sc[0][1] == 0.0; "
           "sc[i] = vec4<f32>(0.0); b[i] = sc[i]; }")
    assert sorted(component_stores(src)) == ["b[i].y +=", "sc[i / 4u][i % 4u] ="]


@pytest.fixture
def recorded(monkeypatch):
    """Every WGSL module the device is asked for during the test (cached pipelines included)."""
    dev = device()
    seen: list[str] = []
    create = dev.create_pipeline

    def record(wgsl, *a, **kw):
        seen.append(wgsl)
        return create(wgsl, *a, **kw)
    monkeypatch.setattr(dev, "create_pipeline", record)
    return seen


@pytest.mark.parametrize("layout", ["linear", "sliced"])
def test_engine_kernels(tmp_path, recorded, layout):
    eng = webdrift.load(write_tiny_gguf(tmp_path / "tiny.gguf"), max_context=256, autotune=False, layout=layout)
    ids = [5, 9, 17, 33, 5, 9, 17, 33, 5, 9]
    eng.generate(ids, max_new_tokens=4, stop_at_eos=False)
    if layout == "linear":
        eng.generate(ids, max_new_tokens=3, n=2, stop_at_eos=False)
        eng.generate(ids, max_new_tokens=6, speculative="lookup", stop_at_eos=False)
    assert len(recorded) > 10
    bad = {s for w in recorded for s in component_stores(w)}
    assert not bad, sorted(bad)


@pytest.mark.parametrize("variant", [{"variant": "head"}, {"variant": "grouped"}, {"variant": "split", "chunk": 16},
                                     {"variant": "split", "chunk": 32, "adapt": 4}, {"variant": "tiled", "adapt": 4},
                                     {"variant": "tiled", "adapt": 2, "fused": True}])
def test_attention_kernels(variant):
    dev = device()
    h, kvh, dh, cap, rows = 8, 2, 64, 256, 4
    q = TensorDesc("q", dh, rows * h // kvh, b=kvh)
    extra = {"out": TensorDesc("o", h * dh, rows)} if variant.get("fused") else {}
    try:
        k = AttentionKernel(dev, q, h, kvh, dh, cap, rows * h // kvh, dh ** -0.5, **variant, **extra)
    except webdrift.UnsupportedModelError:
        pytest.skip(f"{variant} needs what this adapter lacks")
    assert not component_stores(k.source)
    p = AttentionPrefillKernel(dev, q, TensorDesc("o", h * dh, rows), h, kvh, dh, cap, rows * h // kvh, dh ** -0.5)
    assert not component_stores(p.source)
