"""Several streams decoded in one pass (runtime/streams.py, issue 12): `generate(prompt, n=K)`.

- Each stream's greedy tokens equal a single generation forced to the same first token (exact:
  the streams' cache segments are chunk-aligned so their attention sums what a single sequence's
  does), for prompts that end inside, at and past an attention chunk, on the tiny GGUF and on a
  random HF Llama against transformers (first tokens = transformers' top K, continuations =
  transformers' greedy tokens).
- A stream that ends (EOS) lets the others go on; stream() gives (stream, piece) events.
- "sampled" first tokens: K independent draws, their frequencies against the softmax (chi-square).
- Bad input: n and first_tokens out of range, streams that do not fit the context.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
import torch

import webdrift
from tests.test_engine_hf import VOCAB, make_model, torch_greedy
from tests.tiny_model import write_tiny_gguf
from webdrift.errors import ContextLengthError, InvalidArgumentError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny GGUF without an eos id (streams run to max_new_tokens), context 512."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("streams") / "tiny.gguf", eos=False)
    return webdrift.load(path, max_context=512, autotune=False)


def prompt_of(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 250, n).tolist()


def top_k_ids(row: np.ndarray, k: int) -> list[int]:
    """The k largest entries' ids, ties to the lowest id."""
    return [int(i) for i in np.lexsort((np.arange(len(row)), -row.astype(np.float64)))[:k]]


def assert_top_k(ids: list[int], row: np.ndarray, tol: float) -> None:
    """ids are row's len(ids) largest entries, largest first, up to near-ties within tol (logits
    from another program: the GPU sampler picked from the generation's own)."""
    v = row.astype(np.float64)
    rest = np.delete(v, ids)
    assert len(set(ids)) == len(ids) and all(v[a] >= v[b] - tol for a, b in pairwise(ids)), (ids, v[ids])
    assert v[ids].min() >= rest.max() - tol, (ids, v[ids], top_k_ids(row, len(ids)))


@pytest.mark.parametrize("n,plen", [(2, 1), (3, 63), (3, 64), (4, 70), (5, 130), (8, 5)])
def test_streams_equal_single_runs(tiny, n, plen):
    prompt = prompt_of(plen, plen)
    new = 9 if n < 8 else 4
    rs = tiny.generate(prompt, max_new_tokens=new, n=n)
    assert len(rs) == n
    first = [r.token_ids[0] for r in rs]
    assert first == top_k_ids(tiny.logits(prompt)[-1], n)
    for r in rs:
        assert len(r.token_ids) == new and r.stats.finish_reason == "length" and r.stats.prompt_tokens == plen
        single = tiny.generate(prompt + [r.token_ids[0]], max_new_tokens=new - 1)
        assert r.token_ids[1:] == single.token_ids
        assert r.text == tiny.tokenizer.decode(r.token_ids)


def test_streams_match_transformers(tmp_path, hf_tokenizer_dir):
    """A random Llama with GQA read by transformers: the first tokens are the top 3 of its
    logits after the prompt, each stream continues as its greedy decoding does."""
    d, ref = make_model("llama_gqa_f32", tmp_path, hf_tokenizer_dir)
    eng = webdrift.load(str(d), max_context=512, prefill_chunk=64, autotune=False)
    ids = np.random.default_rng(5).integers(3, VOCAB, 67).tolist()
    rs = eng.generate(ids, max_new_tokens=6, n=3, stop_at_eos=False)
    with torch.no_grad():
        want_first = top_k_ids(ref(torch.tensor([ids])).logits[0, -1].numpy(), 3)
    assert [r.token_ids[0] for r in rs] == want_first
    for r in rs:
        assert r.token_ids[1:] == torch_greedy(ref, ids + [r.token_ids[0]], 5)


def test_a_stream_that_ends_lets_the_others_go_on(tiny, monkeypatch):
    """Stream 1's fourth token made an end-of-sequence token: stream 1 stops there ('eos'), the
    others run to max_new_tokens with the tokens they had."""
    prompt = prompt_of(20, 1)
    rs = tiny.generate(prompt, max_new_tokens=8, n=3)
    stop_tok = rs[1].token_ids[3]
    if any(stop_tok in r.token_ids[:4] for r in (rs[0], rs[2])) or stop_tok in rs[1].token_ids[:3]:
        pytest.fail("pick another prompt: the stop token appears early in another stream")
    monkeypatch.setattr(tiny.tokenizer, "eos_token_ids", [stop_tok])
    got = tiny.generate(prompt, max_new_tokens=8, n=3)
    assert got[1].token_ids == rs[1].token_ids[:3] and got[1].stats.finish_reason == "eos"
    for i in (0, 2):
        cut = rs[i].token_ids.index(stop_tok) if stop_tok in rs[i].token_ids else 8
        assert got[i].token_ids == rs[i].token_ids[:cut]
        assert got[i].stats.finish_reason == ("eos" if cut < 8 else "length")


def test_stream_events_per_stream(tiny):
    prompt = prompt_of(12, 2)
    rs = tiny.generate(prompt, max_new_tokens=7, n=3)
    pieces = {0: [], 1: [], 2: []}
    for i, piece in tiny.stream(prompt, max_new_tokens=7, n=3):
        pieces[i].append(piece)
    assert ["".join(pieces[i]) for i in range(3)] == [r.text for r in rs]


def test_sampled_first_tokens_follow_the_softmax(tiny):
    """16 independent draws per generation, 40 generations (seeds 0..39): the first tokens'
    frequencies against softmax(logits / T) (chi-square, bins with >= 5 expected)."""
    prompt = prompt_of(9, 3)
    temp = 2.5                       # flat enough for many bins
    logits = tiny.logits(prompt)[-1].astype(np.float64) / temp
    p = np.exp(logits - logits.max())
    p /= p.sum()
    counts = np.zeros_like(p)
    for seed in range(40):
        for r in tiny.generate(prompt, max_new_tokens=1, n=16, first_tokens="sampled", temperature=temp, seed=seed):
            counts[r.token_ids[0]] += 1
    total = counts.sum()
    assert total == 640
    big = p * total >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(p[big] * total, p[~big].sum() * total)
    keep = exp > 0
    chi2 = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    # p-value 1e-4 bound: Wilson-Hilferty approximation of the chi-square quantile
    z = 3.719
    bound = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert dof >= 5 and chi2 < bound, (chi2, bound, dof)


def test_sampled_streams_are_reproducible_and_differ(tiny):
    prompt = prompt_of(9, 4)
    a = tiny.generate(prompt, max_new_tokens=6, n=4, first_tokens="sampled", temperature=1.0, seed=11)
    b = tiny.generate(prompt, max_new_tokens=6, n=4, first_tokens="sampled", temperature=1.0, seed=11)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert len({tuple(r.token_ids) for r in a}) == 4


@pytest.mark.parametrize("kw,name", [({"n": 0}, "n="), ({"n": 17}, "n="), ({"n": True}, "n="), ({"n": 2.0}, "n="),
                                     ({"n": 2, "first_tokens": "top"}, "first_tokens=")])
def test_bad_stream_arguments(tiny, kw, name):
    with pytest.raises(InvalidArgumentError, match=name):
        tiny.generate([5, 6], max_new_tokens=3, **kw)


def test_streams_get_what_fits_the_context(tiny):
    """Each stream's cache segment is whole 64-row chunks: 16 streams after a 400-token prompt
    in a 512-token context get the one token that needs no segment, 2 streams after 300 tokens
    get 85 (128-row segments holding the prompt's last 44 rows and 84 processed tokens); the
    engine stays usable after a prompt that fills the context."""
    rs = tiny.generate(prompt_of(400, 5), max_new_tokens=3, n=16)
    assert all(r.stats.finish_reason == "context" and len(r.token_ids) == 1 for r in rs)
    rs = tiny.generate(prompt_of(300, 6), max_new_tokens=500, n=2)
    assert all(r.stats.finish_reason == "context" and len(r.token_ids) == 85 for r in rs)
    with pytest.raises(ContextLengthError):
        tiny.generate(prompt_of(512, 7), max_new_tokens=3, n=2)
    assert len(tiny.generate([5, 6, 7], max_new_tokens=3, n=2)[1].token_ids) == 3


def test_cli_num_responses(tiny, capsys):
    """webdrift generate -n 3 --json: the three responses the engine gives for the same request."""
    import json

    from webdrift.tools.cli import main
    want = tiny.generate("the", max_new_tokens=5, n=3)
    argv = ["generate", "--model", str(tiny.path), "--max-context", "512", "--max-new-tokens", "5", "-n", "3", "the"]
    assert main(argv + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [r["token_ids"] for r in got["responses"]] == [r.token_ids for r in want]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert all(f"--- response {i} of 3" in out for i in (1, 2, 3)) and all(r.text in out for r in want)
    assert main(argv[:-1] + ["-n", "17", "the"]) == 2
