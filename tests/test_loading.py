"""The one assembly path (runtime/loading.py) and the browser's JSON adapter over it: every
engine option is checked in one place and named when bad; the browser maps the same options from
JS names in one table (and the JS module forwards every one); the worker API (`api_*`, driven
here on the desktop's device) answers with exactly what the Engine's own generate / chat give.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

import webdrift
from webdrift import InvalidArgumentError
from webdrift.runtime.loading import EngineOptions, assemble, load_browser, open_source

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("kw, name", [
    ({"max_context": 0}, "max_context"), ({"max_context": True}, "max_context"),
    ({"weight_format": "q5"}, "weight_format"), ({"prefill_chunk": 0}, "prefill_chunk"),
    ({"prefill_chunk": 2.5}, "prefill_chunk"), ({"layout": "tiled"}, "layout"), ({"fuse": "yes"}, "fuse"),
    ({"autotune": None}, "autotune"), ({"prefill_kernels": "fast"}, "prefill_kernels"),
    ({"int8_activations": "on"}, "int8_activations"), ({"int8_activations": {"head": 1}}, "int8_activations"),
    ({"max_binding_bytes": 512}, "max_binding_bytes"), ({"kv_cache": "bf16"}, "kv_cache"),
])
def test_each_bad_option_is_named(kw, name):
    with pytest.raises(InvalidArgumentError, match=f"^{name}="):
        EngineOptions(**kw)


def test_load_checks_options_before_resolving_the_model(monkeypatch):
    from webdrift import hub

    def no_resolve(*a, **k):
        raise AssertionError("the model must not be resolved before the options are checked")
    monkeypatch.setattr(hub, "resolve_model", no_resolve)
    with pytest.raises(InvalidArgumentError, match="layout"):
        webdrift.load("smollm2-135m", layout="tiled")
    with pytest.raises(InvalidArgumentError, match="weight_format"):
        webdrift.load(weight_format="int4")


def test_synthetic_q4_k_m_is_llama_quantizes_mix(gemma3_gguf_path):
    """synthetic "q4_k_m" gives each matrix the GGUF type llama-quantize gives it in a Q4_K_M
    file: every matrix of the real Gemma 3 270M Q4_K_M file (llama-quantize's output, read by
    gguf-py; 18 layers, tied embeddings, 640-wide rows: the Q5_0 / Q8_0 fallbacks) has the type
    q4_k_m_type names; the 8B shape holds V and down in Q6_K on 16 of its 32 layers (as the
    8B Q4_K_M file llama-quantize made, docs/BENCHMARKS.md session 25) and the LM head in Q6_K."""
    import gguf

    from webdrift.weights.synthetic import q4_k_m_type, synthetic_source
    r = gguf.GGUFReader(str(gemma3_gguf_path))
    n_layers = int(r.fields["gemma3.block_count"].parts[-1][0])
    mats = [t for t in r.tensors if len(t.shape) == 2]
    assert n_layers == 18 and len(mats) == 18 * 7 + 1
    got = {t.name: q4_k_m_type(t.name, tuple(int(d) for d in reversed(t.shape)), n_layers, True) for t in mats}
    assert got == {t.name: t.tensor_type.name for t in mats}
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0"} <= set(got.values())
    src = synthetic_source("llama-3.1-8b", "q4_k_m")
    six = [i for i in range(32) if src.tensors[f"blk.{i}.attn_v.weight"].type_name == "Q6_K"]
    assert six == [i for i in range(32) if src.tensors[f"blk.{i}.ffn_down.weight"].type_name == "Q6_K"]
    assert len(six) == 16 and src.tensors["output.weight"].type_name == "Q6_K"
    assert src.tensors["blk.5.attn_q.weight"].type_name == src.tensors["token_embd.weight"].type_name == "Q4_K"


def test_synthetic_k_quant_blocks_are_small_finite_values():
    """The random blocks of the Q4_K_M mix's types, dequantized by gguf-py: finite, small, not all
    equal; a tiny Q4_K_M model loads them in their own formats (Q4_K / Q6_K natively, Q5_0 as
    q8_0) and its logits are finite."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from webdrift.gpu.native import get_device
    from webdrift.weights.synthetic import _BLOCK, NullTokenizer, _pool, synthetic_source
    for t in ("Q4_K", "Q6_K", "Q5_0"):
        bb, be = _BLOCK[t]
        vals = dequantize(np.frombuffer(_pool(t), np.uint8).reshape(-1, bb)[:4096], GGMLQuantizationType[t])
        assert vals.size == 4096 * be and np.isfinite(vals).all(), t
        assert 0 < np.abs(vals).max() < 1.0 and vals.std() > 1e-4, t
    eng = assemble(synthetic_source("tiny", "q4_k_m"), EngineOptions(max_context=40, autotune=False), get_device(),
                   tokenizer=NullTokenizer())
    assert [lw.w_down.fmt for lw in eng.model.layers] == ["q4k", "q6k"]    # layer 1 of 2: "more bits"
    assert eng.model.layers[0].wqkv.fmt == "q8_0"                          # 128-wide rows: Q5_0
    assert np.isfinite(eng.logits([1, 5, 9, 200])).all()


def test_kv_cache_follows_the_adapter(monkeypatch):
    """The KV cache holds f16 where the adapter has shader-f16 (half the bytes of f32), f32
    without it; kv_cache="f16" there is an UnsupportedModelError naming the feature."""
    from webdrift.gpu.base import Device
    from webdrift.gpu.native import get_device
    from webdrift.weights.synthetic import NullTokenizer, synthetic_source
    dev, src = get_device(), synthetic_source("tiny", "q4")
    f16 = assemble(src, EngineOptions(max_context=40, autotune=False), dev, tokenizer=NullTokenizer())
    f32 = assemble(src, EngineOptions(max_context=40, autotune=False, kv_cache="f32"), dev, tokenizer=NullTokenizer())
    assert dev.has_f16 and f16.model.kv_f16 and not f32.model.kv_f16
    assert f16.model.kv_bytes * 2 == f32.model.kv_bytes
    assert f16.model.layers[0].k_cache.size * 2 == f32.model.layers[0].k_cache.size
    monkeypatch.setattr(Device, "has_f16", property(lambda self: False))
    plain = assemble(src, EngineOptions(max_context=40, autotune=False), dev, tokenizer=NullTokenizer())
    assert not plain.model.kv_f16 and plain.model.kv_bytes == f32.model.kv_bytes
    with pytest.raises(webdrift.UnsupportedModelError, match="shader-f16"):
        assemble(src, EngineOptions(max_context=40, autotune=False, kv_cache="f16"), dev, tokenizer=NullTokenizer())


def test_open_source_kinds(tmp_path):
    with pytest.raises(webdrift.ModelNotFoundError, match="not-a-model"):
        open_source(str(tmp_path / "not-a-model"))
    with pytest.raises(webdrift.ModelFileError):
        open_source(b"GGUF" + b"\0" * 8, name="x.gguf")
    with pytest.raises(InvalidArgumentError, match="got int"):
        open_source(3)


def test_assemble_and_engine_take_the_options_object():
    from webdrift.gpu.native import get_device
    from webdrift.runtime.engine import Engine
    from webdrift.weights.synthetic import NullTokenizer, synthetic_source
    dev, src = get_device(), synthetic_source("tiny", "q4")
    opts = EngineOptions(max_context=40, prefill_chunk=16, autotune=False)
    eng = assemble(src, opts, dev, tokenizer=NullTokenizer())
    assert eng.options is opts and eng.max_context == 40 and eng.prefill_chunk == 16
    with pytest.raises(InvalidArgumentError, match="EngineOptions"):
        Engine(dev, src, NullTokenizer(), {"max_context": 40})
    with pytest.raises(InvalidArgumentError, match="exceeds the model's context length"):
        assemble(src, EngineOptions(max_context=1 << 20), dev, tokenizer=NullTokenizer())


def test_prefill_chunk_chosen_where_not_given():
    """EngineOptions(prefill_chunk=None): SOFTWARE_PREFILL_CHUNK on software adapters (this one);
    on GPUs the largest of 1024 / 512 / 256 rows whose activations (bounded from above by 4 bytes
    x rows x (2 dim + 2 ffn + q + 2 kv)) fit the adapter's largest binding; never over max_context."""
    from types import SimpleNamespace as NS

    from webdrift.gpu.native import get_device
    from webdrift.runtime.engine import auto_prefill_chunk
    from webdrift.weights.synthetic import NullTokenizer, synthetic_source
    cfg = NS(dim=4096, ffn_dim=14336, q_dim=4096, kv_dim=1024)     # Llama-3.1-8B: 172032 bytes a row

    def gpu(limit):
        return NS(info=NS(is_cpu=False), max_binding_size=limit)
    assert auto_prefill_chunk(gpu(2 << 30), cfg) == 1024
    assert auto_prefill_chunk(gpu(1024 * 172032), cfg) == 1024
    assert auto_prefill_chunk(gpu(1024 * 172032 - 1), cfg) == 512       # e.g. a browser's 128 MiB
    assert auto_prefill_chunk(gpu(128 << 20), cfg) == 512
    assert auto_prefill_chunk(gpu(16 << 20), cfg) == 256                # none fits: the smallest
    assert auto_prefill_chunk(NS(info=NS(is_cpu=True), max_binding_size=2 << 30), cfg) == 256
    dev, src = get_device(), synthetic_source("tiny", "q4")
    assert EngineOptions().prefill_chunk is None
    eng = assemble(src, EngineOptions(max_context=512, autotune=False), dev, tokenizer=NullTokenizer())
    assert dev.info.is_cpu and eng.prefill_chunk == 256
    eng = assemble(src, EngineOptions(max_context=100, autotune=False), dev, tokenizer=NullTokenizer())
    assert eng.prefill_chunk == 100


def test_browser_option_table_covers_every_engine_option():
    from webdrift.browser_api import ENGINE_OPTION_NAMES, engine_options
    assert sorted(ENGINE_OPTION_NAMES.values()) == sorted(f.name for f in fields(EngineOptions))
    js = (REPO / "web" / "webdrift.js").read_text()
    forwarded = re.search(r"const ENGINE_OPTIONS = \[([^\]]*)\]", js).group(1)
    assert sorted(re.findall(r'"(\w+)"', forwarded)) == sorted(ENGINE_OPTION_NAMES)
    o = engine_options({"maxContext": 256.0, "prefillKernels": "gemv", "int8Activations": False, "fuse": False,
                        "model": {"url": "m.gguf"}, "weightFormat": None, "max_binding_bytes": 4096})
    assert o == EngineOptions(max_context=256, prefill_kernels="gemv", int8_activations=False, fuse=False,
                              max_binding_bytes=4096)
    with pytest.raises(InvalidArgumentError, match="prefill_chunk"):
        engine_options({"prefillChunk": 0})


def test_js_generate_options_take_one_adapter_per_response():
    """generate(p, {numResponses: 3, lora: ["a", null, "b"]}) as the worker hands it over (JSON)."""
    from webdrift.browser_api import sampling_from_options
    sp = sampling_from_options(json.loads('{"numResponses": 3, "lora": ["a", null, "b"], "loraScale": 0.5}'))
    assert (sp.n, sp.lora, sp.lora_scale) == (3, ("a", None, "b"), 0.5)
    assert sampling_from_options({"numResponses": 2, "lora": ["a", "a"]}).lora == "a"
    with pytest.raises(InvalidArgumentError, match="n=3"):
        sampling_from_options({"numResponses": 3, "lora": ["a", "b"]})


@pytest.fixture(scope="module")
def worker_api(tmp_path_factory):
    """webdrift.browser_api's worker functions, with a desktop device in place of the page's (its
    own: api_dispose destroys the engine's device, which must not be the process-wide one the
    tests after this module use). The model is the tiny GGUF (tests/tiny_model.py: 2 layers, byte
    tokenizer, a ChatML template), which loads in seconds: what is checked here, that the worker
    API answers exactly what the same Engine's generate / chat give, does not depend on the model
    (the e2e tests drive these functions in Chromium with SmolLM2)."""
    from tests.tiny_model import LAYERS, write_tiny_gguf
    from webdrift import browser_api
    from webdrift.gpu.native import NativeDevice
    gguf = Path(write_tiny_gguf(tmp_path_factory.mktemp("worker_api") / "tiny.gguf"))

    async def on_desktop(model, options=None, **kw):
        return await load_browser(model, options, device=NativeDevice(), **kw)
    mp = pytest.MonkeyPatch()
    mp.setattr(browser_api, "load_browser", on_desktop)
    run = asyncio.run
    opened = json.loads(run(browser_api.api_open(gguf.read_bytes(), "tiny.gguf")))
    assert opened["ok"] and opened["tensors"] > 0 and opened["model"]["layers"] == LAYERS
    ticks = []
    loaded = json.loads(run(browser_api.api_load(json.dumps({"maxContext": 96, "model": {"url": "x"}}),
                                                 lambda done, total, name: ticks.append(done))))
    assert loaded["ok"] and loaded["info"]["maxContext"] == 96 and ticks and ticks[-1] == opened["tensors"]
    steps = loaded["info"]["loadStepsS"]       # load_browser's own timeline (node_bench --ready reports it)
    assert set(steps) == {"tokenizer", "device", "engine", "check"} and min(steps.values()) >= 0 < steps["engine"]
    yield browser_api
    browser_api.api_dispose()
    mp.undo()


def test_worker_api_is_the_engines_generate_and_chat(worker_api):
    eng = worker_api._engine()
    pieces = []
    out = json.loads(asyncio.run(worker_api.api_generate(
        json.dumps("The capital of France is"), json.dumps({"maxNewTokens": 5, "stopAtEos": False}), pieces.append)))
    ref = eng.generate("The capital of France is", max_new_tokens=5, stop_at_eos=False)
    r = out["result"]
    assert r["tokenIds"] == ref.token_ids and r["text"] == ref.text == "".join(pieces)
    assert r["stats"]["newTokens"] == 5 and r["stats"]["finishReason"] == "length"
    msgs = [{"role": "user", "content": "Hi"}]
    chat = json.loads(asyncio.run(worker_api.api_chat(json.dumps(msgs), json.dumps({"maxNewTokens": 4}))))
    assert chat["result"]["tokenIds"] == eng.chat(msgs, max_new_tokens=4).token_ids
    assert eng.chat_prompt(msgs) == eng.tokenizer.encode(
        eng.tokenizer.apply_chat_template(msgs, add_generation_prompt=True), add_special_tokens=False)
    bad = json.loads(asyncio.run(worker_api.api_chat(json.dumps("hi"), "{}")))
    assert bad["error"]["name"] == "InvalidArgumentError" and "messages" in bad["error"]["message"]
    bad = json.loads(asyncio.run(worker_api.api_generate(json.dumps("hi"), json.dumps({"topP": 2}))))
    assert bad["error"]["name"] == "InvalidArgumentError" and "top_p" in bad["error"]["message"]


def test_synthetic_tensor_bytes_repeat_the_pool():
    """A synthetic tensor larger than its type's pool is the pool repeated (block aligned), made
    in one buffer of the tensor's size (the browser's WASM heap holds 8B shapes' tensors)."""
    from webdrift.weights.synthetic import SyntheticTensor, _pool
    for type_name, shape in (("Q8_0", (4096, 4096)), ("Q4_1", (1000, 4096)), ("F16", (3, 7))):
        t = SyntheticTensor("w", shape, type_name)
        raw, pool = t.raw(), _pool(type_name)
        assert len(raw) == t.nbytes
        for off in (0, len(pool) - 2, len(pool), t.nbytes - 40):
            if 0 <= off < t.nbytes:
                assert raw[off:off + 40] == (pool * 2)[off % len(pool):off % len(pool) + 40][:len(raw[off:off + 40])]
