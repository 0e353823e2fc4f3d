"""Row shards of the token embedding / LM head (a table larger than one storage binding):
loaded with a low `max_binding_bytes` cap, small models must still give transformers' logits
and greedy tokens, with one embedding and one LM head dispatch per shard.

References: transformers + PyTorch fp32 on the CPU (random HF Llama / Qwen2 models, f32 / f16,
tied and untied; SmolLM2's Q8_0 GGUF for q8). The q4 and int8-head cases compare with the same
weights loaded unsharded (transformers has no float model that stores our q4 bytes losslessly).
"""

import numpy as np
import pytest
import torch

import webdrift
from tests.test_engine_hf import VOCAB, make_model, torch_greedy


def _cos_top1(got, want):
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    return cos.min(), (got.argmax(1) == want.argmax(1)).mean()


def _ids(n: int, seed: int = 3) -> list[int]:
    """Random ids plus the first and last id of the vocabulary and ids around every shard edge
    of the caps used here."""
    ids = np.random.default_rng(seed).integers(3, VOCAB, n).tolist()
    return ids[: n // 2] + [0, VOCAB - 1, 20479, 20480, 21823, 21824, 40959, 40960, 43647, 43648] + ids[n // 2:]


def _count(program, label: str) -> int:
    return [d.label for d in program.dispatches(1)].count(label)


# case, cap (bytes per weight buffer), expected shard rows, engine options
SHARD_CASES = {
    # tied f32 embedding (49152 x 128 x 4 = 24 MiB) in 10 MiB: 20480 + 20480 + 8192 rows
    "llama_gqa_f32": (10 << 20, [20480, 20480, 8192], {}),
    # untied f16 (49152 x 96 x 2 = 9 MiB each) in 4 MiB: 21824 + 21824 + 5504; prompts through
    # the tiled GEMM (the GPU default) instead of lavapipe's GEMV prefill
    "qwen2_bias_f16": (4 << 20, [21824, 21824, 5504], {"prefill_kernels": "gemm"}),
}


@pytest.mark.parametrize("case", sorted(SHARD_CASES))
def test_sharded_hf_model_matches_transformers(case, tmp_path, hf_tokenizer_dir):
    cap, rows, opts = SHARD_CASES[case]
    d, ref = make_model(case, tmp_path, hf_tokenizer_dir)
    eng = webdrift.load(str(d), max_context=192, prefill_chunk=64, max_binding_bytes=cap, **opts)
    m = eng.model
    assert [w.o for w in m.tok_embd_shards] == rows and [w.o for w in m.output_shards] == rows
    assert [w.row0 for w in m.output_shards] == [0, rows[0], rows[0] + rows[1]]
    assert all(b.size <= cap for w in m.tok_embd_shards + m.output_shards for b in w.buffers)
    assert (m.output_shards is m.tok_embd_shards) == eng.config.tied_embeddings
    for prog in (eng.decode, eng.prefill):   # one embedding and one LM head dispatch per shard
        assert _count(prog, "embedding") == 3
        assert _count(prog, "lm_head") + _count(prog, "norm+lm_head") == 3
    ids = _ids(90)
    got = eng.logits(ids)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert got.shape == want.shape == (len(ids), VOCAB)
    cos, top1 = _cos_top1(got, want)
    assert cos >= 0.999 and top1 >= 0.98, (case, cos, top1)
    prompt = [1, 504, 3458, 314, 260, 6911, 2381, 30, VOCAB - 2, 20480]
    out = eng.generate(prompt, max_new_tokens=12, temperature=0.0, stop_at_eos=False)
    assert out.token_ids == torch_greedy(ref, prompt, 12), case


def test_sharded_sliced_layout_matches_transformers(tmp_path, hf_tokenizer_dir):
    """Sliced (HSWBC4) activations: each LM head shard writes its columns of the logits through
    a column view whose slices start at the shard's row0 / 4."""
    d, ref = make_model("llama_gqa_f32", tmp_path, hf_tokenizer_dir)
    eng = webdrift.load(str(d), max_context=64, prefill_chunk=32, layout="sliced", max_binding_bytes=10 << 20)
    assert len(eng.model.output_shards) == 3
    prompt = [1, 504, 3458, 314, 260, 6911, 2381, 30, 43648, 20479]
    out = eng.generate(prompt, max_new_tokens=10, temperature=0.0, stop_at_eos=False)
    assert out.token_ids == torch_greedy(ref, prompt, 10)


def test_sharded_q8_embedding_smollm2_matches_transformers(smollm2_gguf_path, smollm2_hf):
    """SmolLM2's tied Q8_0 embedding (49152 x 576: 27 MiB of int8 + 1.7 MiB of f16 scales) in 12 MiB
    bindings: q8_0 shards of 21824 + 21824 + 5504 rows (data and scale buffers split alike)."""
    eng = webdrift.load(str(smollm2_gguf_path), max_context=96, prefill_chunk=64, max_binding_bytes=12 << 20)
    shards = eng.model.output_shards
    assert [(w.fmt, w.row0, w.o) for w in shards] == [("q8_0", 0, 21824), ("q8_0", 21824, 21824), ("q8_0", 43648, 5504)]
    assert [b.size for b in shards[2].buffers] == [5504 * 576, 5504 * 18 * 2]   # q8_0: two f16 scales a word
    assert _count(eng.decode, "lm_head") == 3 and _count(eng.decode, "embedding") == 3
    smollm2_ref = smollm2_hf[0]
    rng = np.random.default_rng(5)
    ids = [1] + rng.integers(10, 49152, 30).tolist() + [21823, 21824, 43647, 43648, 49151]
    got = eng.logits(ids)
    with torch.no_grad():
        want = smollm2_ref(torch.tensor([ids])).logits[0].numpy()
    cos, top1 = _cos_top1(got, want)
    assert cos >= 0.999 and top1 >= 0.98, (cos, top1)
    prompt = eng.encode_prompt("The capital of France is")
    out = eng.generate(prompt, max_new_tokens=8, temperature=0.0, stop_at_eos=False)
    with torch.no_grad():
        g = smollm2_ref.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out.token_ids == g[0, len(prompt):].tolist()


@pytest.mark.parametrize("quant", ["q4", "q8"])
def test_sharded_equals_unsharded_q4_q8_int8_head(quant, monkeypatch):
    """Synthetic q4 (Q4_1) / q8 (Q8_0) model with a 5000-row tied table: 3 shards of 1984 + 1984
    + 1032 rows give bit-identical logits and tokens to the one-buffer table, with the float and
    the integer-dot (int8 activations) decode LM head. The kernel variants are the static ones
    (autotune off): timed choices differ per shard shape, and with them the summation order."""
    from webdrift.runtime.engine import Engine
    from webdrift.runtime.loading import EngineOptions
    from webdrift.weights import synthetic
    from webdrift.weights.synthetic import NullTokenizer, Shape, synthetic_source
    monkeypatch.setitem(synthetic.PRESETS, "tiny", Shape(128, 2, 4, 2, 32, 256, 5000, True, 10000.0, None, 4096))
    from webdrift.gpu.native import get_device
    dev = get_device()
    src = synthetic_source("tiny", quant)
    cap = (5000 * 128 // (2 if quant == "q4" else 1)) * 2 // 5
    ids = [5, 17, 3, 99, 42, 7, 1, 250, 1983, 1984, 3967, 3968, 4999]
    for head in (False, True):
        kw = {"int8_activations": {"head": True}} if head else {"int8_activations": False}
        kw["autotune"] = False
        if head and not dev.has_dp4a:
            continue
        one = Engine(dev, src, NullTokenizer(), EngineOptions(max_context=48, **kw))
        sh = Engine(dev, src, NullTokenizer(), EngineOptions(max_context=48, max_binding_bytes=cap, **kw))
        assert len(one.model.output_shards) == 1
        assert [(w.row0, w.o) for w in sh.model.output_shards] == [(0, 1984), (1984, 1984), (3968, 1032)]
        assert np.array_equal(one.logits(ids), sh.logits(ids))
        labels = [d.label for d in sh.decode.dispatches(1)]
        assert labels.count("lm_head") == 3 and ("norm+quant_head" in labels) == head
        a = one.generate(ids, max_new_tokens=6, stop_at_eos=False).token_ids
        b = sh.generate(ids, max_new_tokens=6, stop_at_eos=False).token_ids
        assert a == b
        # the decode step's last-row logits, from the sharded LM head, equal the unsharded ones
        lt = sh.decode.graph.tensors["logits"]
        lo = one.decode.graph.tensors["logits"]
        va = np.frombuffer(dev.read_buffer_sync(one.arena, lo.offset, 5000 * 4), np.float32)
        vb = np.frombuffer(dev.read_buffer_sync(sh.arena, lt.offset, 5000 * 4), np.float32)
        assert np.array_equal(va, vb)


# Gemma 3 270M's prompt: "The capital of France is Paris, and the capital of Germany is" (BOS
# first), with two ids from the second row shard of its 262144-row table spliced in
GEMMA_IDS = [2, 818, 5279, 529, 7001, 563, 231000, 9079, 236764, 532, 506, 258000, 5279, 529, 9405, 563]


@pytest.mark.slow
def test_gemma3_on_lavapipe_sized_bindings_matches_transformers(gemma3_gguf_path, gemma3_hf):
    """Gemma 3 270M (Q4_K_M GGUF) with bindings capped at 128 MiB (lavapipe's own limit, and
    some browsers'): its tied 262144 x 640 Q8_0 embedding / LM head (160 MiB of int8 values) is held as
    two q8_0 shards (209664 + 52480 rows), and webdrift's logits match transformers' on the same
    GGUF. The layers load as the GPU converts them (Q5_0 / Q8_0 -> q8_0 keeping the integers, Q4_K
    -> q4 with its scales rounded to f16, Q6_K re-quantized to q8), transformers dequantizes them
    to f32. Measured (lavapipe, 2026-11-21): cosine >= 0.99996 at every position (it was
    0.9999999 with the layers dequantized to f32 on the host), top-1 16/16, max |diff| 0.16 of
    logits up to 22.4; the 5 greedy tokens (" Berlin", ".", "\n\n", "The", " capital") are
    transformers' top tokens. transformers' GGUF load (most of the time) is shared with
    test_gguf.py's Gemma test (the session fixture gemma3_hf).
    Thresholds: cosine 0.999, top-1 0.9; a greedy token that differs must be within 2% of the
    logit range of transformers' top token."""
    p = gemma3_gguf_path
    eng = webdrift.load(str(p), max_context=48, prefill_chunk=32, max_binding_bytes=128 << 20)
    shards = eng.model.output_shards
    assert eng.model.tok_embd_shards is shards
    assert [(w.fmt, w.row0, w.o) for w in shards] == [("q8_0", 0, 209664), ("q8_0", 209664, 52480)]
    assert all(b.size <= 128 << 20 for w in shards for b in w.buffers)
    assert _count(eng.decode, "lm_head") == 2 and _count(eng.decode, "embedding") == 2
    got = eng.logits(GEMMA_IDS)
    prompt = GEMMA_IDS[:6] + GEMMA_IDS[7:11] + GEMMA_IDS[12:]
    out = eng.generate(prompt, max_new_tokens=5, temperature=0.0, stop_at_eos=False).token_ids
    del eng
    ref = gemma3_hf
    with torch.no_grad():
        want = ref(torch.tensor([GEMMA_IDS])).logits[0].numpy()
        path = ref(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1].numpy()   # along our tokens
    assert got.shape == want.shape == (len(GEMMA_IDS), 262144)
    cos, top1 = _cos_top1(got, want)
    assert cos >= 0.999 and top1 >= 0.9, (cos, top1)
    for k, tok in enumerate(out):   # each token ours chose: transformers' top, or within a small margin
        row = path[k]
        assert tok == int(row.argmax()) or row.max() - row[tok] <= 0.02 * (row.max() - row.min()), (k, out)
