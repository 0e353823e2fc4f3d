"""Several streams through the integer-dot GEMV with several token rows per workgroup
(GemvVariant.cols, tests/test_kernels_blk_cols.py): with int8 activations, the streams' decode
program and the prefill over decode kernels (lavapipe) read each weight block once for 8 rows,
the one-row decode program keeps the one-row kernel, and each stream's greedy tokens still
equal a single generation forced to the same first token (exact: a column sums in the one-row
kernel's order). q8 and q4 on the tiny GGUF (RoPE epilogue, separate quantize dispatches); the
int8 chain (quantizing epilogues) on a random HF Llama with 32-wide heads, whose first tokens
and continuations are also checked against transformers' greedy decoding; and a request's LoRA
adapter through the K-column GEMVs (q4, the int8 chain); tree verification (speculative
decoding) through them on the software adapter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import webdrift
from tests.test_engine_hf import CASES, VOCAB, make_model, torch_greedy
from tests.test_lora import tok_dir  # noqa: F401 (fixture)
from tests.test_streams import assert_top_k, prompt_of, top_k_ids
from tests.tiny_model import write_tiny_gguf
from webdrift.models.forward import Linear


def blk_cols(program) -> dict:
    """{label: cols} of a program's integer-dot GEMVs."""
    return {op.label: op.variant.cols for op in program.graph.ops if isinstance(op, Linear) and op.int8_input}


@pytest.fixture(scope="module", params=["q8", "q4"])
def tiny_int8(request, tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("cols") / "tiny.gguf", eos=False)
    return webdrift.load(path, max_context=512, autotune=False, weight_format=request.param, int8_activations=True)


def test_programs_pick_columns(tiny_int8):
    """The one-row decode program: one column everywhere; the streams' programs (one per stream
    count rounded up to a power of two, built on first use): that many columns, at most 8
    (autotune.blk_cols); the prefill over decode kernels (64 rows): 8, but for the prefill's LM
    head, which reads the last row only."""
    eng = tiny_int8
    one = blk_cols(eng.decode)
    assert one and set(one.values()) == {1} and "L0.qkv+rope_kv" in one
    eng.generate([5, 6, 7], max_new_tokens=2, n=2)          # builds the 2-row program
    assert set(eng._streams.programs) == {2}
    two = blk_cols(eng._streams.program(2))
    assert one.keys() <= two.keys()       # and the LM head, which runs on every stream's row
    assert set(two.values()) == {2}
    for n, rows, cols in ((3, 4, 4), (5, 8, 8), (16, 16, 8)):
        eng.generate([5, 6, 7], max_new_tokens=2, n=n)
        assert eng._streams.program(n) is eng._streams.programs[rows]
        assert set(blk_cols(eng._streams.programs[rows]).values()) == {cols}
    assert set(eng._streams.programs) == {2, 4, 8, 16}
    pre = blk_cols(eng.prefill)
    assert pre.pop("lm_head", 1) == 1 and set(pre.values()) == {8}   # the head: the prompt's last row only


@pytest.mark.parametrize("n,plen", [(3, 63), (5, 70), (8, 5)])
def test_int8_streams_equal_single_runs(tiny_int8, n, plen):
    eng = tiny_int8
    prompt = prompt_of(plen, plen)
    rs = eng.generate(prompt, max_new_tokens=6, n=n)
    # the first tokens: the prompt's top n (eng.logits is the scoring program's forward: the int8
    # rows after an f16 K/V can swap near-ties, 0.011 apart on q8 5/70 at 2026-11-25)
    assert_top_k([r.token_ids[0] for r in rs], eng.logits(prompt)[-1], 0.05)
    for r in rs:
        assert len(r.token_ids) == 6
        assert r.token_ids[1:] == eng.generate(prompt + [r.token_ids[0]], max_new_tokens=5).token_ids


def test_int8_chain_streams(tmp_path, hf_tokenizer_dir, monkeypatch):
    """The int8 chain (each layer GEMV writes the next one's int8 row, per column): streams equal
    single runs, and transformers' greedy tokens (q8 weights, int8 activations: the random
    model's top tokens are far apart, as test_engine_smollm2's int8 greedy test relies on)."""
    monkeypatch.setitem(CASES, "llama_hd32_f32", {"arch": "llama", "dtype": "float32", "hidden_size": 128,
                                                  "intermediate_size": 256, "num_hidden_layers": 2,
                                                  "num_attention_heads": 4, "num_key_value_heads": 2,
                                                  "tie_word_embeddings": True})
    d, ref = make_model("llama_hd32_f32", tmp_path, hf_tokenizer_dir)
    # (an f32 KV cache: the top-3 vs transformers' below needs the f32 forward's margins)
    eng = webdrift.load(str(d), max_context=512, prefill_chunk=64, autotune=False, weight_format="q8",
                        int8_activations=True, kv_cache="f32")
    eng.generate([5, 6], max_new_tokens=2, n=8)
    assert eng._streams.program(8).int8_chain
    labels = blk_cols(eng._streams.program(8))
    assert labels["L0.gate_up+act+quant"] == 8 and labels["L0.down+residual+quant"] == 8
    ids = np.random.default_rng(5).integers(3, VOCAB, 67).tolist()
    rs = eng.generate(ids, max_new_tokens=5, n=3, stop_at_eos=False)
    for r in rs:
        assert r.token_ids[1:] == eng.generate(ids + [r.token_ids[0]], max_new_tokens=4, stop_at_eos=False).token_ids
    with torch.no_grad():
        want_first = top_k_ids(ref(torch.tensor([ids])).logits[0, -1].numpy(), 3)
    agree = sum(a == b for a, b in zip([r.token_ids[0] for r in rs], want_first))
    assert agree >= 2, ([r.token_ids[0] for r in rs], want_first)
    assert rs[0].token_ids[1:3] == torch_greedy(ref, ids + [rs[0].token_ids[0]], 2)


def test_int8_streams_with_lora(tmp_path, tok_dir):  # noqa: F811
    """A request's LoRA adapter through the K-column GEMVs (each column adds its own row's
    u B^T; the int8 chain with LoRA writes act too): streams equal single runs with the adapter."""
    from tests.test_lora import make_base, make_peft
    base = make_base(tmp_path / "base", tok_dir)
    make_peft(base, tmp_path / "a", r=8, lora_alpha=16, use_rslora=False, seed=1)
    eng = webdrift.load(str(base), loras={"a": str(tmp_path / "a")}, max_lora_rank=16, max_context=256,
                        prefill_chunk=64, autotune=False, weight_format="q4", int8_activations=True)
    ids = np.random.default_rng(13).integers(3, VOCAB, 20).tolist()
    rs = eng.generate(ids, max_new_tokens=5, n=4, lora="a", stop_at_eos=False)
    assert eng._streams.program(4).int8_chain and set(blk_cols(eng._streams.program(4)).values()) == {4}
    for r in rs:
        single = eng.generate(ids + [r.token_ids[0]], max_new_tokens=4, lora="a", stop_at_eos=False)
        assert r.token_ids[1:] == single.token_ids


@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_int8_speculative_verification(tmp_path, fmt):
    """Tree verification through the decode kernels (the software adapter's prefill stage: K-column
    GEMVs over the tree's rows, the separate RoPE kernel): the same tokens as plain greedy. The LM
    head stays float: a verification pass computes every row's logits, which the int8 head does
    not (with an int8 head in plain decoding the two heads' logits differ in the last bits, and
    q4's near-ties then pick other tokens; that is the heads, not the columns)."""
    from tests.spec_util import OracleDrafter
    path = write_tiny_gguf(tmp_path / "tiny.gguf", eos=False)
    eng = webdrift.load(path, max_context=512, autotune=False, weight_format=fmt,
                        int8_activations={"qkv": True, "o": True, "gateup": True, "down": True})
    ids = prompt_of(30, 8)
    plain = eng.generate(ids, max_new_tokens=24)
    spec = eng.generate(ids, max_new_tokens=24, speculative=OracleDrafter(ids + plain.token_ids, eng.config.vocab_size, 4))
    assert spec.token_ids == plain.token_ids and spec.stats.accepted_tokens > 0
    assert set(blk_cols(eng._verifier.program).values()) == {8}


@pytest.mark.parametrize("fmt", ["q4", "f16"])
def test_verification_buckets(tmp_path, monkeypatch, fmt):
    """A verification pass runs the smallest program that holds its rows (speculative.TREE_BUCKETS),
    whose K-column GEMVs are chosen for that many rows (the static rule: at most 4 columns in the
    4-row program, up to 8 in MAX_TREE's); with passes of both sizes in one generation the tokens are still
    plain greedy's (the columns sum each row as the one-row kernels do, whatever the program)."""
    from tests.spec_util import OracleDrafter
    from webdrift.kernels import autotune
    from webdrift.kernels.linear import GemvVariant
    from webdrift.runtime import speculative
    if fmt == "f16":   # the GPU's float GEMV (lavapipe's static choice is the one-row "row" kernel)
        real_static = autotune.static_choice
        monkeypatch.setattr(autotune, "static_choice", lambda dev, int8=False: real_static(dev, int8) if int8
                            else GemvVariant("subgroup", rows=8, wg=128, unroll=4))
    path = write_tiny_gguf(tmp_path / "tiny.gguf", eos=False)
    eng = webdrift.load(path, max_context=512, autotune=False, weight_format=fmt, int8_activations=fmt == "q4")
    used = []
    real = speculative.TreeVerifier.argmax_rows

    async def spy(self, tree, *args, **kwargs):
        out = await real(self, tree, *args, **kwargs)
        used.append((len(tree.tokens), self.last.capacity))
        return out

    monkeypatch.setattr(speculative.TreeVerifier, "argmax_rows", spy)
    ids = prompt_of(30, 8)
    plain = eng.generate(ids, max_new_tokens=40)
    spec = eng.generate(ids, max_new_tokens=40, speculative=OracleDrafter(ids + plain.token_ids, eng.config.vocab_size, 3))
    assert spec.token_ids == plain.token_ids and spec.stats.accepted_tokens > 0
    assert {cap for _, cap in used} == set(speculative.TREE_BUCKETS), used
    assert all(speculative.tree_bucket(n) == cap for n, cap in used)
    programs = eng._verifier.programs
    for cap, want in ((4, 4), (speculative.MAX_TREE, 8)):
        cols = [op.variant.cols for op in programs[cap].graph.ops if isinstance(op, Linear) and not op.head
                and op.variant.variant in ("blk", "subgroup")]
        assert cols and max(cols) == want, (cap, cols)
