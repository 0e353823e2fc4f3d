"""End-to-end: small random HF models (save_pretrained) through webdrift on the desktop WebGPU
backend vs transformers + PyTorch fp32 on the CPU, on the same token ids.

Covers Llama with GQA, Qwen2 (q/k/v biases), MQA with an unusual head_dim (40, q_dim != dim),
llama3 rope scaling, tied and untied embeddings, f32 / f16 / bf16 safetensors.
"""

import zlib

import numpy as np
import pytest
import torch
import transformers

import webdrift
from webdrift.kernels.linear import GemvVariant

VOCAB = 49152

CASES = {
    "llama_gqa_f32": {
        "arch": "llama",
        "dtype": "float32",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "qwen2_bias_f16": {
        "arch": "qwen2",
        "dtype": "float16",
        "hidden_size": 96,
        "intermediate_size": 200,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
    },
    "llama_mqa_hd40_bf16": {
        "arch": "llama",
        "dtype": "bfloat16",
        "hidden_size": 128,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 40,
        "tie_word_embeddings": False,
        "rope_theta": 5000.0,
    },
    "llama_gqa_hd64_f32": {
        "arch": "llama",
        "dtype": "float32",
        "hidden_size": 256,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "llama_mha_rope_llama3_f32": {
        "arch": "llama",
        "dtype": "float32",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
}


def make_model(case: str, root, tok_dir):
    spec = dict(CASES[case])
    arch, dtype = spec.pop("arch"), spec.pop("dtype")
    torch.manual_seed(zlib.crc32(case.encode()) % 1000)   # the same model in every process
    cfg_cls = transformers.Qwen2Config if arch == "qwen2" else transformers.LlamaConfig
    model_cls = transformers.Qwen2ForCausalLM if arch == "qwen2" else transformers.LlamaForCausalLM
    cfg = cfg_cls(
        vocab_size=VOCAB,
        max_position_embeddings=512,
        initializer_range=0.08,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        **spec,
    )
    m = model_cls(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights and biases, so those paths are really checked
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.3)
            if n.endswith(".bias"):
                p.normal_(0.0, 0.5)
    d = root / case
    m.to(getattr(torch, dtype)).save_pretrained(d, safe_serialization=True)
    for f in tok_dir.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    ref = model_cls.from_pretrained(d, dtype=torch.float32).eval()  # the stored weights, in fp32
    return d, ref


@pytest.fixture(scope="session", params=sorted(CASES))
def hf_case(request, tmp_path_factory, hf_tokenizer_dir):
    d, ref = make_model(request.param, tmp_path_factory.mktemp("hf"), hf_tokenizer_dir)
    eng = webdrift.load(str(d), max_context=320, prefill_chunk=64)
    return request.param, eng, ref


def torch_greedy(ref, ids, n):
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(ref(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(nxt)
            ids.append(nxt)
    return out


def test_logits_match_transformers(hf_case):
    name, eng, ref = hf_case
    rng = np.random.default_rng(1)
    # 150 tokens: several prefill chunks (64), attention across a 256-position split is covered
    # by the SmolLM2 test; here chunk boundaries and pos0 > 0 matter
    ids = rng.integers(3, VOCAB, 150).tolist()
    got = eng.logits(ids)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert got.shape == want.shape == (150, VOCAB)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    top1 = (got.argmax(1) == want.argmax(1)).mean()
    assert cos.min() >= 0.999, (name, cos.min())
    assert top1 >= 0.98, (name, top1)


def test_greedy_matches_transformers(hf_case):
    name, eng, ref = hf_case
    ids = [1, 504, 3458, 314, 260, 6911, 2381, 30]
    out = eng.generate(ids, max_new_tokens=16, temperature=0.0, stop_at_eos=False)
    assert out.token_ids == torch_greedy(ref, ids, 16), name
    assert out.stats.new_tokens == 16 and out.stats.prompt_tokens == len(ids)


def test_speculative_greedy_matches_plain(hf_case):
    """Tree verification (issue 13): random draft trees hiding the true continuation
    (tests/spec_util.py) give the plain greedy tokens on every architecture here (biases, MQA with
    head_dim 40, llama3 rope scaling), and lookup drafts on a repetitive prompt too."""
    from tests.spec_util import OracleDrafter
    name, eng, _ = hf_case
    rng = np.random.default_rng(7)
    accepted = 0
    for k in range(6):
        ids = rng.integers(3, VOCAB, int(rng.integers(1, 60))).tolist()
        plain = eng.generate(ids, max_new_tokens=24, stop_at_eos=False)
        spec = eng.generate(ids, max_new_tokens=24, stop_at_eos=False,
                            speculative=OracleDrafter(ids + plain.token_ids, VOCAB, seed=k))
        assert spec.token_ids == plain.token_ids, (name, k)
        accepted += spec.stats.accepted_tokens
    assert accepted > 20, name
    ids = list(range(100, 130)) * 3
    assert (eng.generate(ids, max_new_tokens=16, stop_at_eos=False, speculative="lookup").token_ids
            == eng.generate(ids, max_new_tokens=16, stop_at_eos=False).token_ids)


def test_sliced_layout_gives_same_logits(tmp_path, hf_tokenizer_dir):
    """Tensor virtualization end to end: the whole model with every activation in ML Drift's
    sliced HSWBC4 storage computes the same logits as with linear storage."""
    d, ref = make_model("llama_mqa_hd40_bf16", tmp_path, hf_tokenizer_dir)
    ids = list(range(5, 45))
    lin = webdrift.load(str(d), max_context=128, prefill_chunk=32)
    sli = webdrift.load(str(d), max_context=128, prefill_chunk=32, layout="sliced")
    a = lin.logits(ids)
    out_lin = lin.generate(ids, max_new_tokens=8, stop_at_eos=False).token_ids
    out_sli = sli.generate(ids, max_new_tokens=8, stop_at_eos=False).token_ids
    assert out_lin == out_sli
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(a - want).max() < 1e-3 * np.abs(want).max()


def test_fusion_changes_nothing(tmp_path, hf_tokenizer_dir):
    """Fused kernels (norm folded into QKV, gate/up and the prefill LM head; the decode LM head
    keeps a separate norm, which its thousands of workgroups would otherwise each recompute) vs
    the unfused graph: the same greedy tokens and logits equal to float rounding; and 2 fewer
    dispatches per layer (3 where RoPE also moves into the QKV GEMV). The kernel variants are the
    static ones (autotune off), so the count does not depend on load-time timing."""
    d, _ = make_model("qwen2_bias_f16", tmp_path, hf_tokenizer_dir)
    ids = list(range(7, 77))
    fused = webdrift.load(str(d), max_context=128, prefill_chunk=32, autotune=False)
    plain = webdrift.load(str(d), max_context=128, prefill_chunk=32, fuse=False, autotune=False)
    a, b = fused.logits(ids), plain.logits(ids)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()
    ga = fused.generate(ids, max_new_tokens=12, stop_at_eos=False).token_ids
    gb = plain.generate(ids, max_new_tokens=12, stop_at_eos=False).token_ids
    assert ga == gb
    n_layers = fused.config.n_layers
    # where the chosen GEMV variant takes it (subgroups), RoPE also moves into the QKV GEMV
    rope_fused = any(d.label.endswith("norm+qkv+rope_kv") for d in fused.decode.dispatches(1))
    assert len(plain.decode.dispatches(1)) - len(fused.decode.dispatches(1)) == (3 if rope_fused else 2) * n_layers


def test_gemm_and_gemv_prefill_agree(tmp_path, hf_tokenizer_dir):
    """Stage-aware kernels: prompts through the tiled GEMM (the default on GPUs) and through the
    GEMV kernels (the default on software adapters like this one) give the same model."""
    d, ref = make_model("qwen2_bias_f16", tmp_path, hf_tokenizer_dir)
    ids = list(range(11, 141))          # 130 tokens: 3 chunks of 64, the last one partial
    gemm = webdrift.load(str(d), max_context=256, prefill_chunk=64, prefill_kernels="gemm")
    gemv = webdrift.load(str(d), max_context=256, prefill_chunk=64, prefill_kernels="gemv")
    assert gemm.prefill.stage == "prefill" and gemv.prefill.stage == "decode"
    # the GEMM prefill's attention is the one-pass kernel (no partials to combine)
    labels = [d.label for d in gemm.prefill.dispatches(64)]
    assert gemm.prefill.forward.flash and not any("combine" in x for x in labels) and not gemv.prefill.forward.flash
    a, b = gemm.logits(ids), gemv.logits(ids)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    scale = np.abs(want).max()
    assert np.abs(a - want).max() < 1e-3 * scale and np.abs(b - want).max() < 1e-3 * scale
    out_a = gemm.generate(ids, max_new_tokens=8, stop_at_eos=False).token_ids
    out_b = gemv.generate(ids, max_new_tokens=8, stop_at_eos=False).token_ids
    assert out_a == out_b == torch_greedy(ref, ids, 8)
    with pytest.raises(webdrift.InvalidArgumentError, match="prefill_kernels"):
        webdrift.load(str(d), prefill_kernels="fast")


def test_float_prefill_gemm_reads_a_normed_input(tmp_path, hf_tokenizer_dir):
    """The float prefill GEMMs of QKV and gate/up read the rows a Norm op wrote (fused, each tile
    re-read its rows whole for their 1/rms); the decode GEMVs keep the norm fused. The graph, and
    its logits against transformers."""
    d, ref = make_model("qwen2_bias_f16", tmp_path, hf_tokenizer_dir)
    ids = list(range(11, 141))
    eng = webdrift.load(str(d), max_context=256, prefill_chunk=64, prefill_kernels="gemm_float")
    labels = [x.label for x in eng.prefill.dispatches(64) if x.label.startswith("L0.")]
    assert labels[:2] == ["L0.attn_norm", "L0.qkv"] and "L0.ffn_norm" in labels and "L0.gate_up+act" in labels
    decode = [x.label for x in eng.decode.dispatches(1) if x.label.startswith("L0.")]
    assert not any(lbl.endswith("norm") for lbl in decode) and any(lbl.startswith("L0.norm+") for lbl in decode)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(eng.logits(ids) - want).max() < 1e-3 * np.abs(want).max()


def test_int8_roles_mixed_graph_and_bad_roles():
    """int8 activations on some GEMV roles only (what the auto choice builds on GPUs where only
    the big matrices repay their quantize dispatch): logits stay close to the float path's on
    the same weights; an unknown role is an InvalidArgumentError; int8_pays measures both paths."""
    from webdrift.gpu.native import get_device
    from webdrift.kernels.autotune import int8_pays
    from webdrift.tools.bench import build_engine
    from webdrift.weights.synthetic import synthetic_source
    dev = get_device()
    src = synthetic_source("tiny", "q4")
    ref = build_engine(dev, src, 48, int8_activations=False)
    mixed = build_engine(dev, src, 48, int8_activations={"gateup": True, "down": True, "head": True})
    assert mixed.model.int8_roles == {"qkv": False, "o": False, "gateup": True, "down": True, "head": True}
    ids = [5, 17, 3, 99, 42, 7, 1, 250]
    a, b = ref.logits(ids), mixed.logits(ids)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.99, cos
    assert not np.array_equal(a, b)                     # the int8 kernels really ran
    with pytest.raises(webdrift.InvalidArgumentError, match="unknown roles"):
        build_engine(dev, src, 48, int8_activations={"attention": True})
    lw = ref.model.layers[0]
    m = int8_pays(dev, lw.w_gate, lw.w_up, pre_norm=True)
    assert m["float_ns"] > 0 and m["int8_ns"] > 0 and isinstance(m["int8"], bool)


def forced_choice(monkeypatch, module, name: str) -> list:
    """module.name, an engine's choice on whole decode steps, measured even on lavapipe
    (enabled="force"); its answers, in order."""
    got, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: got.append(real(*a, **{**k, "enabled": "force"})) or got[-1])
    return got


def timed_programs(monkeypatch) -> list:
    """The variants of every whole-step measurement (autotune._time_programs), in order."""
    from webdrift.kernels import autotune
    calls, real = [], autotune._time_programs

    def timed(dev, make, variants, positions):
        calls.append(variants)
        return (yield from real(dev, make, variants, positions))
    monkeypatch.setattr(autotune, "_time_programs", timed)
    return calls


def test_int8_chain_chosen_by_timing_whole_steps(monkeypatch, tmp_path):
    """Where choose_int8 leaves the int8 chain open (timed adapters: forced here on lavapipe), the
    engine builds the decode step both ways, times each whole (autotune.chain_pays) and keeps the
    faster: the verdict is cached (a second engine measures nothing), the decode program follows
    it, and both kinds of step decode greedy tokens that are the float path's top tokens, or
    within int8 rounding of them, on the same prefixes."""
    from webdrift.gpu.native import get_device
    from webdrift.kernels import autotune
    from webdrift.models import loader
    from webdrift.models.choices import Int8Choice
    from webdrift.runtime import engine as E
    from webdrift.tools.bench import build_engine
    from webdrift.weights.synthetic import synthetic_source
    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    roles = dict.fromkeys(("qkv", "o", "gateup", "down", "head"), True)
    unchained = dict(roles, qkv=False, o=False)
    monkeypatch.setattr(loader, "choose_int8", lambda model, wanted: Int8Choice(roles, True, unchained))
    verdicts, measured = forced_choice(monkeypatch, E, "chain_pays"), timed_programs(monkeypatch)
    dev = get_device()
    src = synthetic_source("tiny", "q4")
    ids = [5, 17, 3, 99, 42, 7, 1, 250]
    eng = build_engine(dev, src, 48)
    got = verdicts[-1]
    assert got["chained_ns"] > 0 and got["separate_ns"] > 0 and got["chain"] == (got["chained_ns"] < got["separate_ns"])
    assert eng.model.int8_chain == eng.decode.int8_chain == got["chain"] and measured == [[True, False]]
    build_engine(dev, src, 48)
    assert verdicts[-1] == got and len(measured) == 1        # cached
    ref = build_engine(dev, src, 48, int8_activations=False)
    for chain in (True, False):
        monkeypatch.setattr(E, "chain_pays", lambda *a, chain=chain, **k: {"chain": chain})
        e = build_engine(dev, src, 48)
        assert e.decode.int8_chain is chain and e.model.int8_roles == (roles if chain else unchained)
        labels = [d.label.split(".", 1)[-1] for d in e.decode.dispatches(1)]
        assert ("quant_down" in labels) is not chain and ("norm+qkv" in labels) is not chain
        out = e.generate(ids, max_new_tokens=10, stop_at_eos=False).token_ids
        want = ref.logits(ids + out[:-1], first=len(ids) - 1)
        gaps = want.max(1) - want[np.arange(len(out)), out]
        assert gaps.max() <= 0.05 * want.std(axis=1).mean() and (gaps == 0).sum() >= 8, gaps


def test_attention_chosen_by_timing_whole_steps(monkeypatch, tmp_path):
    """Where the adapter timed the decode attention kernels, the engine times its fastest few
    again on whole decode steps (autotune.attention_steps; forced here on lavapipe, with three
    candidates standing in for the ranking) and every decode program runs the fastest: the
    verdict is cached (a second engine measures nothing), and each candidate's steps decode the
    float reference's greedy tokens."""
    from webdrift.gpu.native import get_device
    from webdrift.kernels import autotune
    from webdrift.kernels.attention import AttnChoice
    from webdrift.runtime import engine as E
    from webdrift.tools.bench import build_engine
    from webdrift.weights.synthetic import synthetic_source
    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    cands = [AttnChoice("grouped"), AttnChoice("split", 16), AttnChoice("head")]
    monkeypatch.setattr(E, "attention_ranking", lambda *a, **k: cands)
    chosen, measured = forced_choice(monkeypatch, E, "attention_steps"), timed_programs(monkeypatch)
    dev = get_device()
    src = synthetic_source("tiny", "q4")
    ids = [5, 17, 3, 99, 42, 7, 1, 250]
    eng = build_engine(dev, src, 48)
    assert measured == [[c.name for c in cands]] and chosen[-1] in cands
    kernel = next(op.kernel for op in eng.decode.graph.ops if type(op).__name__ == "Attention")
    assert kernel._replace(chunk=0) == chosen[-1]._replace(chunk=0)
    build_engine(dev, src, 48)
    assert len(measured) == 1 and chosen[-1] == chosen[0]        # cached
    ref = build_engine(dev, src, 48, int8_activations=False)
    for c in cands:
        monkeypatch.setattr(E, "attention_steps", lambda *a, c=c, **k: c)
        e = build_engine(dev, src, 48)
        assert next(op.kernel for op in e.decode.graph.ops if type(op).__name__ == "Attention").variant == c.variant
        out = e.generate(ids, max_new_tokens=10, stop_at_eos=False).token_ids
        assert out == ref.generate(ids, max_new_tokens=10, stop_at_eos=False).token_ids


def test_whole_step_attention_candidates_include_the_merge(monkeypatch):
    """The whole-step attention choice times each tiled candidate with at most MERGE_MOST partials
    a row also merging them itself (AttnChoice.fused), after the ranking's own candidates; a tiled
    one with more partials, and the other variants, only as ranked."""
    from webdrift.gpu.native import get_device
    from webdrift.kernels.attention import AttnChoice
    from webdrift.kernels.autotune import MERGE_MOST
    from webdrift.runtime import engine as E
    from webdrift.tools.bench import build_engine
    from webdrift.weights.synthetic import synthetic_source
    ranked = [AttnChoice("tiled", 64, False, 2 * MERGE_MOST), AttnChoice("split", 16),
              AttnChoice("tiled", 64, False, MERGE_MOST)]
    monkeypatch.setattr(E, "attention_ranking", lambda *a, **k: list(ranked))
    seen = []

    def steps(dev, key, build, cands, positions, enabled=None):
        seen.append(cands)
        return AttnChoice("split", 16)
    monkeypatch.setattr(E, "attention_steps", steps)
    eng = build_engine(get_device(), synthetic_source("tiny", "q4"), 48)
    assert seen == [ranked + [AttnChoice("tiled", 64, False, MERGE_MOST, True)]]
    assert next(op.kernel for op in eng.decode.graph.ops if type(op).__name__ == "Attention").name == "split16"


@pytest.mark.parametrize(("fmt", "ggml"), [("q8", "Q8_0"), ("q4", "Q4_1")])
def test_requantized_weights_match_transformers_on_the_same_quantization(tmp_path, hf_tokenizer_dir, fmt, ggml):
    """weight_format q8 / q4 on an f32 checkpoint: the GPU re-quantizes every matrix at load
    (kernels/convert.py). transformers runs the same model with each matrix (embedding included)
    replaced by gguf-py's Q8_0 / Q4_1 quantize-dequantize of it (ggml's rounding); logits agree as
    closely as float vs float (webdrift's q8 keeps the block scale in f32 where Q8_0 rounds it to
    f16: a 2^-11 relative difference)."""
    d, ref = make_model("llama_gqa_f32", tmp_path, hf_tokenizer_dir)
    requantize_reference(ref, ggml)
    eng = webdrift.load(str(d), max_context=128, prefill_chunk=64, weight_format=fmt)
    assert {eng.model.layers[0].wqkv.fmt, eng.model.layers[0].w_down.fmt, eng.model.output.fmt} == {fmt}
    ids = np.random.default_rng(4).integers(3, VOCAB, 70).tolist()
    got = eng.logits(ids)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.999 and (got.argmax(1) == want.argmax(1)).mean() >= 0.98
    out = eng.generate(ids[:8], max_new_tokens=8, temperature=0.0, stop_at_eos=False).token_ids
    assert_greedy_up_to_near_ties(ref, ids[:8], out)


def requantize_reference(ref, ggml: str) -> None:
    """Replace every matrix of the transformers model (embedding included) by gguf-py's
    quantize-dequantize of it in GGML type `ggml` (ggml's rounding)."""
    from gguf import GGMLQuantizationType, quants
    qt = getattr(GGMLQuantizationType, ggml)
    with torch.no_grad():
        for _, p in ref.named_parameters():
            if p.ndim == 2:
                w = p.numpy()
                p.copy_(torch.from_numpy(quants.dequantize(quants.quantize(w, qt), qt).reshape(w.shape)))


def assert_greedy_up_to_near_ties(ref, prompt: list, out: list) -> None:
    """Greedy tokens `out` after `prompt`: each transformers' top along our own continuation, or
    within 0.5% of its logit range (webdrift keeps quantized blocks' scales in f32 where Q8_0
    rounds them to f16: a near tie may flip, then the continuations diverge)."""
    with torch.no_grad():
        path = ref(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1].numpy()
    for k, (row, tok) in enumerate(zip(path, out)):
        assert tok == int(row.argmax()) or row.max() - row[tok] <= 0.005 * (row.max() - row.min()), (k, out)


def assert_matches_transformers(eng, ref, seed: int, n: int):
    """Logits of n random ids within 1e-3 of the largest of transformers', and 10 greedy tokens
    after the first 10 ids equal to transformers' greedy tokens."""
    ids = np.random.default_rng(seed).integers(3, VOCAB, n).tolist()
    got = eng.logits(ids)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(got - want).max() < 1e-3 * np.abs(want).max()
    out = eng.generate(ids[:10], max_new_tokens=10, temperature=0.0, stop_at_eos=False)
    assert out.token_ids == torch_greedy(ref, ids[:10], 10)


@pytest.mark.parametrize("case,variant", [("llama_gqa_f32", v) for v in (
    ("grouped", 0, False), ("head", 0, False), ("split", 16, True), ("split", 64, False), ("split", 16, False, 2))]
    + [("llama_gqa_hd64_f32", ("tiled", 64, False, 3)), ("llama_gqa_hd64_f32", ("tiled", 64, False, 3, True))])
def test_decode_attention_kernels_end_to_end(tmp_path, hf_tokenizer_dir, monkeypatch, case, variant):
    """Every decode attention kernel (one workgroup per query head, one per KV head serving its 4
    query heads, or that with short chunks and subgroup shuffles, also several chunks a workgroup;
    tiled, 3 partials a row, head_dim 64, also merging them itself; GPUs pick by timing,
    kernels/autotune.choose_attention) in the whole model: prompts through the decode kernels
    (prefill_kernels="gemv", so multi-token rows are covered) give transformers' logits, and
    greedy decoding gives transformers' tokens."""
    from webdrift.models import forward

    monkeypatch.setattr(forward, "choose_attention", lambda *a, **k: forward.AttnChoice(*variant))
    d, ref = make_model(case, tmp_path, hf_tokenizer_dir)
    eng = webdrift.load(str(d), max_context=256, prefill_chunk=64, prefill_kernels="gemv")
    assert_matches_transformers(eng, ref, seed=6, n=90)
    eng.decode.dispatches(1)
    kinds = {type(k).__name__: k for _, k, _ in eng.decode.kernels()}
    assert kinds["AttentionKernel"].variant == variant[0]
    assert variant[0] != "split" or kinds["AttentionKernel"].CHUNK == variant[1]
    assert kinds["AttentionKernel"].defines.get("PREFETCH_V", False) is variant[2]
    adapt = variant[3] if len(variant) > 3 else 0
    assert kinds["AttentionKernel"].defines.get("ADAPT", 0) == (adapt if variant[0] == "split" else 0)
    assert variant[0] != "tiled" or kinds["AttentionKernel"].nsplit == adapt
    fused = variant[4] if len(variant) > 4 else False
    assert kinds["AttentionKernel"].fused is fused and ("AttentionCombineKernel" in kinds) is not fused


@pytest.mark.parametrize("case,float_gemv", [("qwen2_bias_f16", GemvVariant("subgroup", rows=8, wg=64)),
                                              ("llama_mqa_hd40_bf16", GemvVariant("subgroup", rows=8, wg=64)),
                                              ("qwen2_bias_f16", GemvVariant("wide", rows=8, wg=64, mrows=4))])
def test_float_qkv_rope_epilogue_end_to_end(tmp_path, hf_tokenizer_dir, monkeypatch, case, float_gemv):
    """Where the float decode GEMV computes rows in subgroups (what GPUs pick), the QKV GEMV
    applies RoPE, the Q relayout and the KV append in its epilogue (one dispatch fewer per
    layer). Forced here (lavapipe's timings pick other variants): prompts through the decode
    kernels and greedy decoding match transformers, with bias (Qwen2) and head_dim 40 (MQA);
    the wide GEMV with four rows (two rotation pairs) per subgroup at a time, as the H100 picks."""
    from webdrift.models import forward

    real = forward.choose_gemv
    monkeypatch.setattr(forward, "choose_gemv", lambda dev, w, w2=None, enabled=True, int8=False, siblings=None: (
        real(dev, w, w2, enabled=enabled, int8=True) if int8 else float_gemv))
    d, ref = make_model(case, tmp_path, hf_tokenizer_dir)
    eng = webdrift.load(str(d), max_context=256, prefill_chunk=64, prefill_kernels="gemv")
    labels = [x.label for x in eng.decode.dispatches(1)]
    n = eng.config.n_layers
    assert sum(lb.endswith("norm+qkv+rope_kv") for lb in labels) == n and not any(lb.endswith(".rope_kv") for lb in labels)
    qkv = [k for op, k, _ in eng.decode.kernels() if op.label.endswith("qkv+rope_kv")]
    assert {k.variant.mrows for k in qkv} == {float_gemv.mrows}
    assert_matches_transformers(eng, ref, seed=8, n=80)


def test_weight_layout_choice_end_to_end(tmp_path, hf_tokenizer_dir, monkeypatch):
    """The weight-layout search may store float weights as 4x4 blocks (OI4O4) instead of rows:
    forced here, every matrix is converted into that order at load, and the model (embedding,
    decode GEMVs, prefill GEMM, LM head) still gives transformers' logits and greedy tokens."""
    from webdrift.kernels.autotune import layout_name
    from webdrift.models import loader

    monkeypatch.setattr(loader, "choose_layout", lambda dev, fmt, o, i, enabled=True:
                        "OI4O4" if fmt in ("f32", "f16") else "OI")
    d, ref = make_model("qwen2_bias_f16", tmp_path, hf_tokenizer_dir)
    eng = webdrift.load(str(d), max_context=256, prefill_chunk=64)
    lw = eng.model.layers[0]
    assert {layout_name(w) for w in (lw.wqkv, lw.wo, lw.w_gate, lw.w_up, lw.w_down, eng.model.output)} == {"OI4O4"}
    assert_matches_transformers(eng, ref, seed=9, n=70)


def test_logits_from_a_row_fill_the_context(tmp_path, hf_tokenizer_dir):
    """The scoring path of `webdrift perplexity`: logits(ids, first) returns rows first.. only
    (earlier chunks skip the LM head), and teacher forcing may fill the whole context, which
    generation may not (it needs room for a new token)."""
    d, ref = make_model("llama_mqa_hd40_bf16", tmp_path, hf_tokenizer_dir)
    ids = list(range(20, 148))          # 128 tokens = max_context: chunks of 32, `first` inside the third
    eng = webdrift.load(str(d), max_context=128, prefill_chunk=32)
    got = eng.logits(ids, first=70)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()[70:]
    assert got.shape == (58, VOCAB)
    assert np.abs(got - want).max() < 1e-3 * np.abs(want).max()
    with pytest.raises(webdrift.InvalidArgumentError, match="first=128"):
        eng.logits(ids, first=128)
    with pytest.raises(webdrift.ContextLengthError):
        eng.generate(ids, max_new_tokens=1)
    with pytest.raises(webdrift.ContextLengthError):
        eng.logits(ids + [5])


def test_prefill_gemm_tile_per_bucket(tmp_path, hf_tokenizer_dir, monkeypatch):
    """A prefill program of more than GEMM_TUNE_ROWS rows takes, per layer, the GEMM chosen at its
    capacity for the token buckets from large_gemm_rows on and the one chosen at GEMM_TUNE_ROWS
    below (here the capacity's choice is forced to another tile: lavapipe is not tuned); a
    400-token prompt runs one chunk of each and matches transformers."""
    from webdrift.kernels.autotune import GEMM_TUNE_ROWS, large_gemm_rows
    from webdrift.kernels.linear import GemmVariant
    from webdrift.models import forward
    from webdrift.models.forward import Linear
    assert (large_gemm_rows(1024), large_gemm_rows(320), large_gemm_rows(4096)) == (512, 320, 1024)
    big = GemmVariant(bm=32, bn=64, tm=4, tn=4, kstep=4)
    real, asked = forward.choose_gemm, []

    def choose(dev, w, w2=None, enabled=True, int8=False, rows=GEMM_TUNE_ROWS):
        asked.append(rows)
        return big if rows != GEMM_TUNE_ROWS else real(dev, w, w2, enabled=enabled, int8=int8)
    monkeypatch.setattr(forward, "choose_gemm", choose)
    d, ref = make_model("qwen2_bias_f16", tmp_path, hf_tokenizer_dir)
    eng = webdrift.load(str(d), max_context=448, prefill_chunk=320, prefill_kernels="gemm_float")
    assert 320 in asked and GEMM_TUNE_ROWS in asked
    layers = [op for op in eng.prefill.graph.ops if isinstance(op, Linear) and not op.head]
    assert len(layers) == 8 and all(op.large == (320, big) and op.variant != big for op in layers)
    small = {x.label: x.pipeline for x in eng.prefill.dispatches(100)}
    large = {x.label: x.pipeline for x in eng.prefill.dispatches(320)}
    assert small.keys() == large.keys()
    assert {lbl for lbl in small if small[lbl] is not large[lbl]} == {op.label for op in layers}
    from webdrift.profile.benchmark import prefill_kernels_used
    assert prefill_kernels_used(eng)[1].endswith(" (>=320 rows: 32x64/4x4/k4)")     # what a bench row says
    # the prompt's first 320 tokens through the capacity's tiles, the other 80 through the small ones
    ids = np.random.default_rng(4).integers(3, VOCAB, 400).tolist()
    assert eng.generate(ids, max_new_tokens=6, stop_at_eos=False).token_ids == torch_greedy(ref, ids, 6)
    # a program of GEMM_TUNE_ROWS rows or fewer has one tile a layer
    short = webdrift.load(str(d), max_context=448, prefill_chunk=64, prefill_kernels="gemm_float")
    assert all(op.large is None for op in short.prefill.graph.ops if isinstance(op, Linear))
