"""LoRA adapters as runtime inputs (issue 12, part 1), against transformers + peft on the CPU.

A random HF Llama-style model (GQA) with random PEFT adapters made by `peft` in the test (all
seven targets, r = 8 and 16, rsLoRA off and on, random non-zero B): teacher-forced logits with
the adapter vs transformers + peft; switching between adapters and back is bit-identical to a
fresh load; lora_scale 0 equals the base model; a GGUF LoRA written with gguf-py from the same
tensors (llama.cpp's layout: q/k rows of B permuted for its RoPE, adapter.lora.alpha) gives the
same logits as the PEFT folder; bad adapters are refused with a WebdriftError naming the file and
the engine stays usable. The SmolLM2 case (a GGUF base: transformers reads it) is in
test_lora_smollm2.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model

import webdrift
from webdrift.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError, WebdriftError

VOCAB = 49152
SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}
ADAPTERS = {"a": {"r": 8, "lora_alpha": 16, "use_rslora": False, "seed": 1},
            "b": {"r": 16, "lora_alpha": 8, "use_rslora": True, "seed": 2}}


@pytest.fixture(scope="module")
def tok_dir(hf_tokenizer_dir):
    return hf_tokenizer_dir       # SmolLM2's tokenizer.json, converted once per session (tests/conftest.py)


def make_base(root, tok_dir, shape=SHAPE, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=512, initializer_range=0.08,
                                   rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
                                   **shape)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.3)
    m.save_pretrained(root, safe_serialization=True)
    for f in tok_dir.iterdir():
        (root / f.name).write_bytes(f.read_bytes())
    return root


def make_peft(base_dir, out, *, r, lora_alpha, use_rslora, seed, targets=SEVEN):
    """A random PEFT LoRA adapter of the model in base_dir, saved to out; returns the peft model
    (the reference)."""
    base = transformers.LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    pm = get_peft_model(base, LoraConfig(r=r, lora_alpha=lora_alpha, use_rslora=use_rslora, target_modules=targets,
                                         lora_dropout=0.0, init_lora_weights=False))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_A" in n:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif "lora_B" in n:   # random, non-zero: the adapter really changes every target
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    pm.save_pretrained(out)
    return pm.eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tok_dir):
    root = tmp_path_factory.mktemp("lora")
    base_dir = make_base(root / "base", tok_dir)
    refs, dirs = {}, {}
    for name, spec in ADAPTERS.items():
        dirs[name] = root / f"adapter_{name}"
        refs[name] = make_peft(base_dir, dirs[name], **spec)
    base_ref = transformers.LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    eng = webdrift.load(str(base_dir), loras={n: str(d) for n, d in dirs.items()}, max_lora_rank=16,
                        lora_pool_rank=48, max_context=256, prefill_chunk=64, autotune=False)
    return {"root": root, "base": base_dir, "dirs": dirs, "refs": refs, "base_ref": base_ref, "eng": eng}


def ids_for(n=80, seed=5):
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def ref_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def decode_tensor(eng, name, dtype, arena=None):
    """Tensor `name` of the engine's decode program as the arena holds it (arena: its bytes, read
    already; else read now)."""
    if arena is None:
        arena = np.frombuffer(eng.dev.read_buffer_sync(eng.arena), np.uint8)
    t = eng.decode.graph.tensors[name]
    return arena[t.offset:t.offset + t.desc.nbytes].view(dtype)


def decode_logits(eng):
    """The logits of the last decode step."""
    return decode_tensor(eng, "logits", np.float32)[:eng.model.cfg.vocab_size].copy()


def assert_matches(got, want, cos_min=0.999, top1_min=0.98):
    cos = (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    assert cos.min() >= cos_min, f"min cosine {cos.min():.6f}"
    assert top1 >= top1_min, f"top-1 agreement {top1:.3f}"


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_logits_match_peft(setup, name):
    ids = ids_for()
    got = setup["eng"].logits(ids, lora=name)
    want = ref_logits(setup["refs"][name], ids)
    base = ref_logits(setup["base_ref"], ids)
    # the adapter changes the model a lot (else this would test nothing) ...
    assert (want.argmax(-1) != base.argmax(-1)).mean() > 0.3
    # ... and webdrift follows it
    assert_matches(got, want)


def test_switch_and_back_is_bit_identical_to_fresh_load(setup):
    eng, ids = setup["eng"], ids_for(70, seed=9)
    a1 = eng.logits(ids, lora="a")
    decode_list = eng.decode.dispatches(1)
    b1 = eng.logits(ids, lora="b")
    a2 = eng.logits(ids, lora="a")
    assert not np.array_equal(a1, b1)
    assert np.array_equal(a1, a2)
    # switching rebuilt nothing: the same prebuilt dispatch list (pipelines, bind groups)
    eng.generate(ids[:4], max_new_tokens=2, lora="b")
    assert eng.decode.dispatches(1) is decode_list
    fresh = webdrift.load(str(setup["base"]), loras={"a": str(setup["dirs"]["a"])}, max_lora_rank=16,
                          max_context=256, prefill_chunk=64, autotune=False)
    assert np.array_equal(fresh.logits(ids, lora="a"), a1)


def test_scale_zero_and_no_adapter_equal_the_base_model(setup):
    eng, ids = setup["eng"], ids_for(40, seed=3)
    plain = webdrift.load(str(setup["base"]), max_context=256, prefill_chunk=64, autotune=False)
    base = plain.logits(ids)
    assert np.array_equal(eng.logits(ids, lora="a", lora_scale=0.0), base)
    assert np.array_equal(eng.logits(ids), base)
    assert_matches(base, ref_logits(setup["base_ref"], ids))


def test_requests_without_an_adapter_run_the_programs_without_slots(setup):
    """An engine with LoRA slots also holds its decode / prefill programs without them (built at
    load, sharing the arena): a request with no adapter, or lora_scale 0, runs those (no shrink
    dispatch, the speed of an engine without LoRA; greedy tokens equal a plain engine's), one with
    an adapter the slotted ones (their logits vs peft: the tests above); switching back and forth
    rebuilds nothing."""
    eng, ids = setup["eng"], ids_for(30, seed=8)
    plain = webdrift.load(str(setup["base"]), max_context=256, prefill_chunk=64, autotune=False)
    want = plain.generate(ids, max_new_tokens=6, stop_at_eos=False).token_ids
    progs = {id(p) for p in (*eng._plain, *eng._slotted)}
    for lora, scale, slotted in ((None, 1.0, False), ("a", 1.0, True), ("a", 0.0, False), (None, 1.0, False)):
        res = eng.generate(ids, max_new_tokens=6, stop_at_eos=False, lora=lora, lora_scale=scale)
        has_shrink = any(".lora_" in d.label for d in eng.decode.dispatches(1))
        assert has_shrink == slotted and (eng.decode, eng.prefill) == (eng._slotted if slotted else eng._plain)
        if not slotted:
            assert res.token_ids == want
    assert {id(p) for p in (*eng._plain, *eng._slotted)} == progs            # nothing rebuilt
    assert plain._plain is None and not any(".lora_" in d.label for d in plain.decode.dispatches(1))


def test_lora_scale_scales_the_adapter(setup):
    """lora_scale s = the adapter with B * s (peft's scaling set to s times its own)."""
    eng, ids = setup["eng"], ids_for(40, seed=4)
    ref = setup["refs"]["a"]
    for mod in ref.modules():
        if hasattr(mod, "scaling") and isinstance(mod.scaling, dict) and "default" in mod.scaling:
            mod.scaling["default"] *= 0.5
    try:
        want = ref_logits(ref, ids)
    finally:
        for mod in ref.modules():
            if hasattr(mod, "scaling") and isinstance(mod.scaling, dict) and "default" in mod.scaling:
                mod.scaling["default"] *= 2.0
    assert_matches(eng.logits(ids, lora="a", lora_scale=0.5), want)


def test_generate_with_lora_follows_peft_greedy(setup):
    eng = setup["eng"]
    ids = ids_for(12, seed=11)
    res = eng.generate(ids, max_new_tokens=8, lora="b", stop_at_eos=False)
    ref = setup["refs"]["b"]
    seq = list(ids)
    with torch.no_grad():
        for _ in range(8):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
    assert res.token_ids == seq[len(ids):]
    # the next request without an adapter is the base model again
    plain = eng.generate(ids, max_new_tokens=8, stop_at_eos=False)
    base = list(ids)
    with torch.no_grad():
        for _ in range(8):
            base.append(int(setup["base_ref"](torch.tensor([base])).logits[0, -1].argmax()))
    assert plain.token_ids == base[len(ids):]


@pytest.mark.parametrize("layout,fuse,kernels", [("sliced", True, "gemv"), ("linear", False, "gemm")])
def test_other_layouts_fusions_and_kernels(setup, layout, fuse, kernels):
    """Sliced activations; separate norm ops (fuse=False) with the tiled prefill GEMM (the score
    program's kernels) and its decode GEMVs."""
    eng = webdrift.load(str(setup["base"]), loras={"b": str(setup["dirs"]["b"])}, max_lora_rank=16, max_context=256,
                        prefill_chunk=64, autotune=False, layout=layout, fuse=fuse, prefill_kernels=kernels)
    ids = ids_for(30, seed=17)
    ref = setup["refs"]["b"]
    if layout == "linear":
        assert_matches(eng.logits(ids, lora="b"), ref_logits(ref, ids))
    res = eng.generate(ids, max_new_tokens=5, lora="b", stop_at_eos=False)
    seq = list(ids)
    with torch.no_grad():
        for _ in range(5):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
    assert res.token_ids == seq[len(ids):]


# -- GGUF LoRA ------------------------------------------------------------------------------------
_GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
               "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute of Q / K rows (for llama.cpp's RoPE)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf_lora(path, adapter_dir, *, r, lora_alpha, use_rslora, heads=4, kv_heads=2, arch="llama"):
    """The PEFT adapter's tensors as llama.cpp's convert_lora_to_gguf.py writes them (gguf-py)."""
    from gguf import GGUFWriter
    from safetensors.numpy import load_file
    t = load_file(str(adapter_dir / "adapter_model.safetensors"))
    w = GGUFWriter(str(path), arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    scale = lora_alpha / math.sqrt(r) if use_rslora else lora_alpha / r
    w.add_float32("adapter.lora.alpha", scale * r)      # llama.cpp's scale is alpha / r
    for name in sorted(t):
        parts = name.split(".")
        layer, module, ab = int(parts[4]), parts[6], parts[7]
        x = t[name].astype(np.float32)
        if ab == "lora_B" and module in ("q_proj", "k_proj"):
            x = llama_cpp_permute(x, heads if module == "q_proj" else kv_heads)
        w.add_tensor(f"blk.{layer}.{_GGUF_NAMES[module]}.weight.{ab.lower()}", x.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_lora_equals_peft(setup):
    spec = ADAPTERS["b"]
    path = write_gguf_lora(setup["root"] / "b.gguf", setup["dirs"]["b"], r=spec["r"], lora_alpha=spec["lora_alpha"],
                           use_rslora=spec["use_rslora"])
    eng, ids = setup["eng"], ids_for(50, seed=7)
    eng.add_lora("b_gguf", str(path))
    try:
        got = eng.logits(ids, lora="b_gguf")
        want = eng.logits(ids, lora="b")
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())
        assert (got.argmax(-1) == want.argmax(-1)).all()
        assert_matches(got, ref_logits(setup["refs"]["b"], ids))
    finally:
        eng.remove_lora("b_gguf")


# -- base formats and the int8 paths ---------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["f16", "q8", "q4"])
def test_formats_and_int8_paths(setup, fmt):
    """The adapter over f16 / q8 / q4 base weights; q8 / q4 also through the integer-dot GEMVs
    with the fused int8 chain. The LoRA term (webdrift with the adapter minus without) vs peft's
    (the base's own quantization error mostly cancels; q4's is large, so its bound is looser);
    and the int8 chain vs the float GEMVs over the same quantized weights."""
    def load(int8):
        return webdrift.load(str(setup["base"]), loras={"a": str(setup["dirs"]["a"])}, max_lora_rank=16,
                             max_context=256, prefill_chunk=64, autotune=False, weight_format=fmt,
                             int8_activations=int8, prefill_kernels="gemv")

    def cos_min(g, w):
        return ((g * w).sum(-1) / (np.linalg.norm(g, axis=-1) * np.linalg.norm(w, axis=-1))).min()
    ids = ids_for(24, seed=13)
    flt = load(False)
    term = flt.logits(ids, lora="a") - flt.logits(ids)
    want = ref_logits(setup["refs"]["a"], ids) - ref_logits(setup["base_ref"], ids)
    assert cos_min(term, want) >= {"f16": 0.99, "q8": 0.9, "q4": 0.8}[fmt]
    if fmt == "f16":
        return
    eng = load(True)
    assert eng.decode.int8_chain
    with_lora = eng.logits(ids, lora="a")
    assert cos_min(with_lora, flt.logits(ids, lora="a")) >= 0.99
    assert cos_min(with_lora - eng.logits(ids), term) >= 0.99
    # decode (the int8 chain's GEMVs over one row, and the int8 LM head) picks tokens the
    # teacher-forced rows rank at the top (within q4 / int8 noise of the best logit)
    res = eng.generate(ids, max_new_tokens=4, lora="a", stop_at_eos=False)
    lg = eng.logits(ids + res.token_ids[:-1], lora="a")[len(ids) - 1:]
    for row, tok in zip(lg, res.token_ids):
        assert row[tok] >= row.max() - 0.02 * (row.max() - row.mean())


def test_int8_combine_writes_both_rows_with_lora(setup, monkeypatch):
    """With LoRA and int8 activations, where the O projection has a shrink dispatch (every program
    but the decode step with lora_fused_shrink), the attention combine writes the O projection's int8 row and the f32
    rows the O shrink reads (no quantize dispatch per layer): decode logits bit-identical to the
    build where the combine writes f32 rows and a quantize dispatch the int8 row (the graph
    builder told the combine cannot quantize; the rest of the int8 chain unchanged)."""
    from webdrift.kernels.attention import AttentionCombineKernel
    from webdrift.models import forward

    class FloatCombine(AttentionCombineKernel):
        @staticmethod
        def quant_supported(head_dim):
            return False

    def load():
        return webdrift.load(str(setup["base"]), loras={"a": str(setup["dirs"]["a"])}, max_lora_rank=16,
                             max_context=128, prefill_chunk=64, autotune=False, weight_format="q8",
                             int8_activations=True)

    def logits_after_generate(eng):
        eng.generate(ids_for(12, seed=21), max_new_tokens=3, lora="a", stop_at_eos=False)
        return decode_logits(eng)
    both = load()
    labels = [d.label for d in both.decode.dispatches(1)]
    assert "L0.attn_combine+quant" in labels and not any("quant_o" in x for x in labels)
    a = logits_after_generate(both)
    monkeypatch.setattr(forward, "AttentionCombineKernel", FloatCombine)
    sep = load()
    sep_labels = [d.label for d in sep.decode.dispatches(1)]
    assert "L0.quant_o" in sep_labels and len(sep_labels) == len(labels) + len(both.model.layers)
    b = logits_after_generate(sep)
    assert np.isfinite(a).all() and np.abs(a).max() > 0
    np.testing.assert_array_equal(a, b)


def small_workgroups(monkeypatch):
    """The chain's GEMVs in shapes like those an H100's tuner picked (2026-11-25): q|k|v 2 rows in
    workgroups of 32 (fewer invocations than its 48 shares per block), the quantizing epilogues
    2 rows per subgroup, and down's the last-workgroup form (qlast: 2 rows; workgroups of 32,
    fewer than the q|k|v shares it writes, so their A words are loaded one share at a time)."""
    from dataclasses import replace

    from webdrift.models import forward
    gemv, qout = forward.choose_gemv, forward.choose_qout

    def choose_gemv(dev, w, w2=None, enabled=True, int8=False, siblings=None):
        v = gemv(dev, w, w2, enabled=enabled, int8=int8, siblings=siblings)
        return replace(v, rows=2, wg=32) if v.variant == "blk" else v

    def choose_qout(dev, w, w2=None, enabled=True, siblings=None):
        v = qout(dev, w, w2, enabled=enabled, siblings=siblings)
        return replace(v, rows=2, wg=32, qlast=True) if w.i > w.o else replace(v, rps=2)
    monkeypatch.setattr(forward, "choose_gemv", choose_gemv)
    monkeypatch.setattr(forward, "choose_qout", choose_qout)


@pytest.mark.parametrize("fmt,name,scale,small,slots", [("q8", "a", 1.0, False, 16), ("q4", "b", 0.5, True, 20)])
def test_fused_shrink_in_the_int8_chain(setup, monkeypatch, fmt, name, scale, small, slots):
    """With lora_fused_shrink, the decode step of the int8 chain (one token row) has no shrink
    dispatch but layer 0's q|k|v: the kernels writing each GEMV's int8 input row (the previous GEMV's quantizing
    epilogue, the attention combine) also write each 32-block's share of x_in A^T, which the GEMV
    sums (kernels/lora.py). Its decode logits vs the build with a shrink dispatch per GEMV
    (the default; the same sums in another order) and vs the float GEMVs' teacher-forced
    logits at the same position (peft's reference for those: test_formats_and_int8_paths).
    Adapter a has rank 8 in slots of 16; b fills them. The int8 rows round each value to 1/127 of
    its block's maximum, so the order of a sum can move a value across a rounding step: on q4 a
    lora_scale 1e-6 away moves these logits by 0.09 (lavapipe, 2026-11-25); a share of the wrong
    rows or adapter moves them by the whole LoRA term (over 4 here). small: small_workgroups;
    slots of rank 20: not a power of two."""
    if small:
        small_workgroups(monkeypatch)

    def load(fused):
        return webdrift.load(str(setup["base"]), loras={name: str(setup["dirs"][name])}, max_lora_rank=slots,
                             max_context=128, prefill_chunk=64, autotune=False, weight_format=fmt,
                             int8_activations=True, lora_fused_shrink=fused)

    def generate(eng):
        res = eng.generate(ids, max_new_tokens=4, lora=name, lora_scale=scale, stop_at_eos=False)
        return res.token_ids, decode_logits(eng)
    ids = ids_for(20, seed=31)
    fused = load(True)
    labels = [d.label for d in fused.decode.dispatches(1)]
    ops = {op.label: op for op in fused.decode.graph.ops}
    assert not small or (ops["L1.qkv+rope_kv"].variant.wg, ops["L0.down+residual+quant"].variant.wg,
                         ops["L0.down+residual+quant"].variant.qlast) == (32, 32, True)
    assert fused.decode.int8_chain and [x for x in labels if ".lora_" in x] == ["L0.lora_qkv"]
    toks, got = generate(fused)
    sep = load(False)
    assert sum(".lora_" in d.label for d in sep.decode.dispatches(1)) == 4 * len(sep.model.layers)
    sep_toks, want = generate(sep)
    assert toks == sep_toks
    np.testing.assert_allclose(got, want, rtol=0, atol=0.05 * np.abs(want).max())
    flt = webdrift.load(str(setup["base"]), loras={name: str(setup["dirs"][name])}, max_lora_rank=16,
                        max_context=128, prefill_chunk=64, autotune=False, weight_format=fmt, int8_activations=False)
    ref = flt.logits(ids + toks[:-1], lora=name, lora_scale=scale)[-1]
    assert (got @ ref) / (np.linalg.norm(got) * np.linalg.norm(ref)) >= 0.99
    # the adapter matters at this position: the LoRA term is far above the two builds' difference
    base = flt.logits(ids + toks[:-1])[-1]
    assert np.abs(ref - base).max() > 20 * np.abs(got - want).max()


@pytest.mark.parametrize("small", [False, True])
def test_fused_shrink_shares_against_the_adapter(setup, monkeypatch, small):
    """Each producer of the one-row int8 chain writes, per 32-block of the int8 row, the block's
    values dotted with the next GEMV's A rows (peft's lora_A of each target): the decode step run
    up to each producer, its shares vs numpy's from the dequantized int8 row it wrote (int8
    rounding: within 2% of the largest share; a wrong row, block or target is off by the whole
    share). The q|k|v shares of layer 1 come from layer 0's down GEMV (with layer 1's norm weight
    in the row), gate|up's from the O projection (the FFN norm's), down's from gate/up, and the O
    projection's from the attention combine. small: small_workgroups."""
    name = "b"
    if small:
        small_workgroups(monkeypatch)
    eng = webdrift.load(str(setup["base"]), loras={name: str(setup["dirs"][name])}, max_lora_rank=16,
                        max_context=128, prefill_chunk=64, autotune=False, weight_format="q8", int8_activations=True,
                        lora_fused_shrink=True)
    eng.generate(ids_for(20, seed=33), max_new_tokens=2, lora=name, stop_at_eos=False)
    disp = eng.decode.dispatches(1)
    labels = [d.label for d in disp]
    params = dict(setup["refs"][name].named_parameters())
    mods = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
            "gateup": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}
    rank = ADAPTERS[name]["r"]
    for producer, group, layer, row in (("L0.attn_combine+quant", "o", 0, "xqo0"),
                                        ("L0.o_proj+residual+quant", "gateup", 0, "xqf0"),
                                        ("L0.gate_up+act+quant", "down", 0, "xqd0"),
                                        ("L0.down+residual+quant", "qkv", 1, "xqa1")):
        eng.dev.submit(disp[:labels.index(producer) + 1])
        arena = np.frombuffer(eng.dev.read_buffer_sync(eng.arena), np.uint8)
        words = decode_tensor(eng, row, np.uint32, arena)
        a = np.stack([params[f"base_model.model.model.layers.{layer}.{m}.lora_A.default.weight"].detach().numpy()
                      for m in mods[group]])                         # (nseg, rank, n_in)
        nseg, n_in = a.shape[0], a.shape[2]
        nb = n_in // 32
        q = words[:8 * nb].view(np.int8).astype(np.float32).reshape(nb, 32)
        x = (q * words[8 * nb:9 * nb].view(np.float32)[:, None]).reshape(-1)   # q8 rows: natural order, then d
        want = np.einsum("bi,srbi->bsr", x.reshape(nb, 32), a.reshape(nseg, rank, nb, 32))
        got = decode_tensor(eng, f"lp_{group}{layer}", np.float32, arena)[:nb * nseg * 16].reshape(nb, nseg, 16)[:, :, :rank]
        np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * np.abs(want).max(), err_msg=f"{group} of L{layer}")


# -- bad adapters -----------------------------------------------------------------------------------
def test_bad_adapters_are_refused_and_the_engine_stays_usable(setup, tmp_path, tok_dir):
    eng = setup["eng"]
    ids = ids_for(10, seed=21)
    before = eng.logits(ids, lora="a")
    # another model's adapter: shapes do not match
    other = make_base(tmp_path / "other", tok_dir, shape=dict(SHAPE, hidden_size=64))
    make_peft(other, tmp_path / "other_ad", r=8, lora_alpha=8, use_rslora=False, seed=3)
    with pytest.raises(InvalidArgumentError, match=r"other_ad.*\(128, 64\).*\(128, 128\)|other_ad.*model's is"):
        eng.add_lora("x", str(tmp_path / "other_ad"))
    # a rank above max_lora_rank
    make_peft(setup["base"], tmp_path / "r32", r=32, lora_alpha=8, use_rslora=False, seed=4, targets=["q_proj"])
    with pytest.raises(InvalidArgumentError, match=r"r32.*rank 32.*max_lora_rank 16"):
        eng.add_lora("x", str(tmp_path / "r32"))
    # an unsupported target (the LM head)
    make_peft(setup["base"], tmp_path / "head", r=4, lora_alpha=8, use_rslora=False, seed=5,
              targets=["q_proj", "lm_head"])
    with pytest.raises(UnsupportedModelError, match=r"head.*lm_head"):
        eng.add_lora("x", str(tmp_path / "head"))
    # a truncated safetensors file
    bad = tmp_path / "trunc"
    bad.mkdir()
    src = setup["dirs"]["a"]
    (bad / "adapter_config.json").write_bytes((src / "adapter_config.json").read_bytes())
    (bad / "adapter_model.safetensors").write_bytes((src / "adapter_model.safetensors").read_bytes()[:5000])
    with pytest.raises(ModelFileError, match="adapter_model.safetensors"):
        eng.add_lora("x", str(bad))
    # a damaged config
    (bad / "adapter_config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="adapter_config.json"):
        eng.add_lora("x", str(bad))
    # DoRA
    cfg = json.loads((src / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps(dict(cfg, use_dora=True)))
    with pytest.raises(UnsupportedModelError, match="DoRA"):
        eng.add_lora("x", str(bad))
    # a GGUF that is not an adapter, and garbage bytes
    with pytest.raises(UnsupportedModelError, match="not a LoRA adapter"):
        eng.add_lora("x", str(setup["smollm2"])) if "smollm2" in setup else eng.add_lora("x", _model_gguf(tmp_path))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(ModelFileError, match="junk.gguf"):
        eng.add_lora("x", str(junk))
    with pytest.raises(WebdriftError, match="no such file"):
        eng.add_lora("x", str(tmp_path / "missing"))
    # names
    with pytest.raises(InvalidArgumentError, match="already loaded"):
        eng.add_lora("a", str(setup["dirs"]["a"]))
    with pytest.raises(InvalidArgumentError, match="no such adapter"):
        eng.generate(ids, max_new_tokens=2, lora="nope")
    with pytest.raises(InvalidArgumentError, match="lora_scale"):
        eng.generate(ids, max_new_tokens=2, lora="a", lora_scale=float("nan"))
    # the pool is full (48 rank rows: a (8) + b (16) + c (16) resident, another 16 does not fit)
    eng.add_lora("c", str(setup["dirs"]["b"]))
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        eng.add_lora("d", str(setup["dirs"]["b"]))
    eng.remove_lora("c")
    assert eng.loras == ["a", "b"]
    assert np.array_equal(eng.logits(ids, lora="a"), before)


def _model_gguf(tmp_path):
    from tests.tiny_model import write_tiny_gguf
    return write_tiny_gguf(tmp_path / "tiny.gguf")


def test_engine_without_lora_slots(setup):
    with pytest.raises(InvalidArgumentError, match="lora_fused_shrink"):
        webdrift.EngineOptions(lora_fused_shrink="yes")
    plain = webdrift.load(str(setup["base"]), max_context=128, prefill_chunk=64, autotune=False)
    with pytest.raises(InvalidArgumentError, match="enable_lora"):
        plain.add_lora("a", str(setup["dirs"]["a"]))
    with pytest.raises(InvalidArgumentError, match="no such adapter"):
        plain.generate(ids_for(5), max_new_tokens=1, lora="a")
    assert plain.loras == []
    # without LoRA the programs have no LoRA op
    assert not any("lora" in op.label for op in plain.decode.graph.ops)


def test_cli_generate_with_lora(setup, capsys):
    """`webdrift generate --lora PATH --lora-scale S` gives the API's tokens."""
    import subprocess
    import sys
    prompt = "The quick brown fox"
    cmd = [sys.executable, "-m", "webdrift", "generate", "--model", str(setup["base"]), "--lora",
           str(setup["dirs"]["b"]), "--lora-scale", "0.75", "--max-lora-rank", "16", "--max-new-tokens", "6",
           "--no-stop-at-eos", "--json", "--quiet", "--prompt", prompt]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)["token_ids"]
    want = setup["eng"].generate(prompt, max_new_tokens=6, lora="b", lora_scale=0.75, stop_at_eos=False).token_ids
    assert got == want
    # a bad adapter path: one line naming it, exit 2
    bad = subprocess.run(cmd[:7] + ["/nonexistent/adapter"] + cmd[8:], check=False,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "/nonexistent/adapter" in bad.stderr
    # -n 2 with --lora twice: one adapter per response, the API's per-stream tokens (in-process)
    from webdrift.tools.cli import main
    two = cmd[3:8] + ["--lora", str(setup["dirs"]["a"]), "-n", "2"] + cmd[8:]
    assert main(two) == 0
    got = [r["token_ids"] for r in json.loads(capsys.readouterr().out)["responses"]]
    want = setup["eng"].generate(prompt, max_new_tokens=6, n=2, lora=["b", "a"], lora_scale=0.75, stop_at_eos=False)
    assert got == [r.token_ids for r in want]
    assert main(two + ["-n", "3"]) == 2 and "--lora given 2 times" in capsys.readouterr().err


def test_damaged_gguf_lora_bytes_give_webdrift_errors(tmp_path):
    """Truncated or byte-flipped GGUF LoRA files: read or refused with a short WebdriftError,
    never another exception (no GPU involved: the reader and the model check)."""
    import random

    from tests.tiny_model import write_tiny_gguf, write_tiny_lora
    from webdrift.weights.gguf import GGUFFile
    from webdrift.weights.lora import read_checked
    from webdrift.weights.source import config_from_gguf
    cfg = config_from_gguf(GGUFFile(write_tiny_gguf(tmp_path / "tiny.gguf")))
    from pathlib import Path
    good = Path(write_tiny_lora(tmp_path / "lora.gguf", rank=4)).read_bytes()
    assert read_checked(good, cfg, 8, "lora.gguf").rank == 4
    rng = random.Random(0)
    for k in range(300):
        data = bytearray(good)
        if k % 3 == 0:
            data = data[:rng.randrange(len(data))]
        else:
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(min(len(data), 2048 if k % 3 == 1 else len(data)))] = rng.randrange(256)
        try:
            read_checked(bytes(data), cfg, 8, "fuzz.gguf")
        except WebdriftError as e:
            assert len(str(e)) <= 1000 and "fuzz.gguf" in str(e), str(e)


def peft_greedy(model, ids, n):
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


def test_lora_with_streams_and_speculative_decoding(setup):
    """The request's adapter applies to every stream of n=3 (first tokens = peft's top 3, each
    continuation = peft's greedy after it) and to the rows of speculative verification (the same
    tokens as peft's greedy decoding; drafts that hide peft's tokens among distractors)."""
    eng, ref = setup["eng"], setup["refs"]["a"]
    ids = ids_for(20, seed=13)
    rs = eng.generate(ids, max_new_tokens=5, n=3, lora="a", stop_at_eos=False)
    with torch.no_grad():
        last = ref(torch.tensor([ids])).logits[0, -1].numpy().astype(np.float64)
    assert [r.token_ids[0] for r in rs] == [int(i) for i in np.argsort(-last, kind="stable")[:3]]
    for r in rs:
        assert r.token_ids[1:] == peft_greedy(ref, ids + [r.token_ids[0]], 4)
    from tests.spec_util import OracleDrafter
    want = peft_greedy(ref, ids, 10)
    drafter = OracleDrafter(ids + want, VOCAB, seed=3)   # trees hiding peft's tokens among distractors
    out = eng.generate(ids, max_new_tokens=10, lora="a", stop_at_eos=False, speculative=drafter)
    assert out.token_ids == want
    assert out.stats.spec_passes > 0 and out.stats.accepted_tokens > 0


@pytest.mark.parametrize("plen,adapters", [(20, ["a", "b", None, "a"]), (70, ["b", None])])
def test_one_adapter_per_stream(setup, plen, adapters):
    """generate(n=K, lora=[...]): each stream decodes with its own adapter in the same steps.
    First tokens: the top ones of each adapter's model (peft a's top 2 for streams 0 and 3:
    distinct within the group); each continuation = that model's greedy after it, and
    bit-identical to a single engine run with that adapter. The 70-token prompt spans two
    attention chunks (each stream's segment holds its own copy of the prompt)."""
    eng, refs, base = setup["eng"], setup["refs"], setup["base_ref"]
    ids = ids_for(plen, seed=17)
    models = {"a": refs["a"], "b": refs["b"], None: base}
    rs = eng.generate(ids, max_new_tokens=5, n=len(adapters), lora=adapters, stop_at_eos=False)
    tops = {}
    for name in set(adapters):
        with torch.no_grad():
            last = models[name](torch.tensor([ids])).logits[0, -1].numpy().astype(np.float64)
        tops[name] = [int(i) for i in np.argsort(-last, kind="stable")[:adapters.count(name)]]
    assert [r.token_ids[0] for r in rs] == [tops[a][adapters[:i].count(a)] for i, a in enumerate(adapters)]
    for r, a in zip(rs, adapters):
        assert len(r.token_ids) == 5
        assert r.token_ids[1:] == peft_greedy(models[a], ids + [r.token_ids[0]], 4)
        single = eng.generate(ids + [r.token_ids[0]], max_new_tokens=4, lora=a, stop_at_eos=False)
        assert r.token_ids[1:] == single.token_ids
    # the request's rows went back to entry 0: a plain request after it is the base model's
    assert eng.generate(ids, max_new_tokens=3, stop_at_eos=False).token_ids == peft_greedy(base, ids, 3)


def test_per_stream_adapters_bad_input(setup):
    eng = setup["eng"]
    with pytest.raises(webdrift.InvalidArgumentError, match="n=3 streams"):
        eng.generate([5, 6], max_new_tokens=2, n=3, lora=["a", "b"])
    with pytest.raises(webdrift.InvalidArgumentError, match="'zz'"):
        eng.generate([5, 6], max_new_tokens=2, n=2, lora=["a", "zz"])
    with pytest.raises(webdrift.InvalidArgumentError, match="n=2 streams"):
        eng.generate([5, 6], max_new_tokens=2, n=2, lora=["a", 3])
    assert eng.generate([5, 6], max_new_tokens=2, n=2, lora=["a", "a"], stop_at_eos=False)[0].token_ids
