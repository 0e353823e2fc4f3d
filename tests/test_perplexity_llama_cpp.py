"""webdrift's perplexity vs llama.cpp's `llama-perplexity` on the same GGUF files and text.

The llama.cpp figures were computed once and recorded, with the command, llama.cpp's commit and
how it was built, in tests/data/llama_cpp_perplexity.json; nothing of llama.cpp is built or run
here. The slice checked here (the first windows of tests/data/alice29.txt, ctx 32) keeps the run
short on lavapipe; the same file holds the figures over longer slices for docs/QUANTIZATION.md.

Two llama.cpp figures per model: on the quantized file as it is, and on its exact float32
dequantization (`llama-quantize --allow-requantize FILE OUT F32`). The second has the weights
webdrift computes with, so it is the like-for-like reference (target: within 1%); the first also
carries llama.cpp's CPU numerics, which quantize every activation to 8 bits before a quantized
dot product (Q8_1 for Q4_1, Q8_0 for Q5_0/Q8_0, Q8_K for the K-quants), and is checked to 1%
where the record says that holds (SmolLM2's Q4_1 file; not Gemma 3's Q4_K_M file, see the
record's note and docs/QUANTIZATION.md).
"""

import json
import pathlib

import pytest

import webdrift
from webdrift.tools.perplexity import perplexity, read_text

DATA = pathlib.Path(__file__).parent / "data"
RECORD = json.loads((DATA / "llama_cpp_perplexity.json").read_text())
TEXT = read_text(DATA / "alice29.txt")


def _test_run(model: str, weights: str) -> dict:
    ctx, chunks = RECORD["test_slice"]["ctx"], RECORD["test_slice"]["chunks"]
    runs = [r for r in RECORD["models"][model]["runs"] if r["ctx"] == ctx and r["chunks"] == chunks
            and r["weights"] == weights]
    assert len(runs) == 1, (model, weights)
    return runs[0]


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def measured(request, smollm2_gguf_path, gemma3_gguf_path):
    path = smollm2_gguf_path if request.param == "smollm2-135m" else gemma3_gguf_path
    rec = RECORD["models"][request.param]
    assert path.name == rec["file"]
    ctx, chunks = RECORD["test_slice"]["ctx"], RECORD["test_slice"]["chunks"]
    eng = webdrift.load(str(path), max_context=ctx, prefill_chunk=ctx // 2)
    return request.param, eng, perplexity(eng, TEXT, ctx, n_chunks=chunks)


def test_tokens_are_llama_cpps(measured):
    """The text tokenizes to llama-tokenize's ids (BOS where the model adds one), at least over
    the slice scored here; over the whole text the record lists where the two differ."""
    name, eng, res = measured
    rec = RECORD["models"][name]
    ids = eng.tokenizer.encode(TEXT)
    head = rec["llama_tokenize"]["head_ids"]
    assert ids[:len(head)] == head
    diffs = rec["llama_tokenize"]["differences"]
    assert len(ids) == rec["llama_tokenize"]["n_tokens"] + sum(len(d["webdrift"]) - len(d["llama_cpp"]) for d in diffs)
    for d in diffs:                     # each recorded difference is where it is said to be
        i = d["webdrift_index"]
        assert ids[i:i + len(d["webdrift"])] == d["webdrift"]
    assert res.n_text_tokens == len(ids) and res.add_bos == (name == "gemma3-270m")


def test_within_1pct_of_llama_cpp_on_the_same_weights(measured):
    name, _, res = measured
    ref = _test_run(name, "f32-dequantized")
    assert res.n_scored == ref["n_scored"]
    assert abs(res.ppl / ref["ppl"] - 1) < 0.01, (name, res.ppl, ref["ppl"])
    for got, want in zip(res.chunk_ppl, ref["chunk_ppl"]):       # each window's running figure too
        assert abs(got / want - 1) < 0.01, (name, res.chunk_ppl, ref["chunk_ppl"])


def test_llama_cpp_on_the_quantized_file(measured):
    """The issue's target, webdrift within 1% of llama.cpp on the quantized file, where llama.cpp's
    own 8-bit activations move its figure by less than 1% (llama.cpp's file figure vs its f32
    one); where they move it more (Gemma 3's K-quants on this slice), llama.cpp's file figure lies
    above both its f32 one and webdrift's, which is what its activation rounding does."""
    name, _, res = measured
    ref = _test_run(name, "file")["ppl"]
    f32 = _test_run(name, "f32-dequantized")["ppl"]
    if abs(ref / f32 - 1) < 0.01:
        assert abs(res.ppl / ref - 1) < 0.01, (name, res.ppl, ref)
    else:
        assert ref > f32 and ref > res.ppl, (name, res.ppl, ref, f32)
