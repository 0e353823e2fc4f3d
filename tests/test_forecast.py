"""DS2D forecast drafts (runtime/speculative.py ForecastDrafter, the forecast rows of a
verification pass): on the tiny GGUF model (tests/tiny_model.py) with seeded random forecast
vectors, every forecast the engine reads back is the top-k of transformers' logits for the same
input (the text before the model's next token, then the vectors as inputs_embeds at the next
positions), greedy output is token for token plain greedy decoding, sampling is reproducible,
and bad forecast files give clear errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

import webdrift
from tests.tiny_model import write_tiny_gguf
from webdrift.errors import InvalidArgumentError, ModelFileError
from webdrift.runtime.speculative import ForecastDrafter
from webdrift.weights.forecast import model_meta, read_forecast, write_forecast

PROMPTS = [[5, 77, 100, 23, 9, 44, 200, 3], [40, 41, 42], list(range(10, 60)), [7]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("forecast")
    path = write_tiny_gguf(d / "tiny.gguf")
    # an f32 KV cache: the forecast rows' logits are checked against torch's f32 forward to 1e-3
    eng = webdrift.load(path, max_context=256, autotune=False, kv_cache="f32")
    ref = __import__("transformers").AutoModelForCausalLM.from_pretrained(
        str(d), gguf_file="tiny.gguf", dtype=torch.float32).eval()
    return d, eng, ref


def forecast_file(d, cfg, branching=(3, 2), seed=0, name="fc.safetensors"):
    """Random vectors of the embeddings' scale, so their logits are spread like a token's."""
    rng = np.random.default_rng(seed)
    vec = rng.standard_normal((len(branching), cfg.dim)).astype(np.float32)
    write_forecast(d / name, vec.ravel().tolist(), branching, model_meta(cfg), model="tiny")
    return d / name


class Recording(ForecastDrafter):
    """Records the text at every observe() and the forecast handed over."""

    def __init__(self, ff):
        super().__init__(ff)
        self.ctx, self.seen = [], []

    def reset(self, context):
        super().reset(context)
        self.ctx = list(context)

    def append(self, token):
        super().append(token)
        self.ctx.append(token)

    def observe(self, forecasts):
        super().observe(forecasts)
        self.seen.append((list(self.ctx), forecasts))


def reference_forecast(ref, ctx, vectors):
    """transformers' logits of the forecast rows after ctx[:-1] (the last accepted node's path;
    ctx[-1] is the model's next token, drafted from): a causal forward over the tokens' embeddings
    then the vectors at the following positions."""
    ids = torch.tensor([ctx[:-1]])
    with torch.no_grad():
        emb = ref.get_input_embeddings()(ids)
        x = torch.cat([emb, torch.tensor(vectors)[None]], dim=1)
        return ref(inputs_embeds=x).logits[0, -len(vectors):].numpy()


def test_forecasts_match_transformers_and_greedy_is_plain(tiny):
    d, eng, ref = tiny
    path = forecast_file(d, eng.config)
    ff = read_forecast(path)
    vec = np.array(ff.vectors, np.float32).reshape(ff.m, -1)
    checked = 0
    for ids in PROMPTS:
        plain = eng.generate(ids, max_new_tokens=40, stop_at_eos=False)
        rec = Recording(read_forecast(path))
        spec = eng.generate(ids, max_new_tokens=40, stop_at_eos=False, speculative=rec)
        assert spec.token_ids == plain.token_ids
        assert rec.seen, "no forecast was observed"
        for ctx, fc in rec.seen:
            lg = reference_forecast(ref, ctx, vec)
            assert [len(c) for c in fc] == list(ff.branching)
            for row, cands in zip(lg, fc):
                top = np.sort(row)[::-1]
                # rank by rank, up to float noise between the GPU and torch (near-ties may swap)
                assert np.allclose(row[cands], top[:len(cands)], atol=1e-3), (ctx, cands, np.argsort(-row)[:4])
            checked += 1
    assert checked >= 20


def test_drafts_are_the_forecast_tree(tiny):
    """The drafter's tree after a forecast: depth-1 children = forecast 1, each with the depth-2
    candidates below it; limited by the node and depth budgets."""
    d, eng, _ = tiny
    dr = ForecastDrafter(read_forecast(forecast_file(d, eng.config)))
    dr.reset([1, 2, 9])
    assert dr.propose(64, 10).tokens == [9]                       # no forecast yet: the root alone
    dr.observe([[4, 5, 6], [7, 8]])
    t = dr.propose(64, 10)
    assert t.tokens == [9, 4, 5, 6, 7, 8, 7, 8, 7, 8]
    assert t.parents == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert dr.propose(5, 10).tokens == [9, 4, 5, 6, 7]            # node budget
    assert dr.propose(64, 1).tokens == [9, 4, 5, 6]               # depth budget
    assert dr.propose(0, 10) is None
    dr.append(4)
    assert dr.propose(64, 10).tokens == [4]                       # a new token: the forecast is stale


def test_widest_tree_fills_the_pass(tiny):
    """Branching (4, 4): 21 nodes, each with 2 forecast rows, 63 of the pass's 64 rows; the output
    stays plain greedy's, and a pass that drafts with room for both levels verifies the full
    tree (random vectors accept little, so the back-off interleaves plain steps and passes of
    the root alone)."""
    d, eng, _ = tiny

    class Sizes(ForecastDrafter):
        sized = False          # the whole room every time (the built-in one shrinks with acceptance)

        def propose(self, max_nodes, max_depth):
            t = super().propose(max_nodes, max_depth)
            if self.next and max_depth >= 2:
                self.full.append(len(t.tokens))
            return t

    path = forecast_file(d, eng.config, branching=(4, 4), seed=3, name="wide.safetensors")
    for ids in PROMPTS[:2]:
        plain = eng.generate(ids, max_new_tokens=48, stop_at_eos=False)
        dr = Sizes(read_forecast(path))
        dr.full = []
        spec = eng.generate(ids, max_new_tokens=48, stop_at_eos=False, speculative=dr)
        assert spec.token_ids == plain.token_ids
        assert len(dr.full) >= 3 and set(dr.full) == {21}, dr.full


def test_trees_shrink_when_little_is_accepted(tiny):
    """ForecastDrafter is sized (BackOff.node_budget): random vectors accept little, so after the
    first verified pass its trees get the floor of 4 nodes (root + 3 at depth 1 of a (3, 2)
    tree), not the 10 of the full tree; the output stays plain greedy's."""
    d, eng, _ = tiny

    class Budgets(ForecastDrafter):
        def propose(self, max_nodes, max_depth):
            if self.next and max_depth >= 2:
                self.budgets.append(max_nodes)
            return super().propose(max_nodes, max_depth)

    dr = Budgets(read_forecast(forecast_file(d, eng.config)))
    dr.budgets = []
    plain = eng.generate(PROMPTS[2], max_new_tokens=48, stop_at_eos=False)
    spec = eng.generate(PROMPTS[2], max_new_tokens=48, stop_at_eos=False, speculative=dr)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted_tokens < spec.stats.spec_passes     # little accepted
    assert len(dr.budgets) >= 3 and dr.budgets[0] >= 10 and min(dr.budgets[1:]) <= 5, dr.budgets


def test_sampling_reproducible_and_valid(tiny):
    d, eng, _ = tiny
    path = forecast_file(d, eng.config)
    kw = {"max_new_tokens": 30, "stop_at_eos": False, "temperature": 0.9, "top_k": 20, "seed": 7, "speculative": f"forecast:{path}"}
    a, b = eng.generate(PROMPTS[0], **kw), eng.generate(PROMPTS[0], **kw)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 30
    assert all(0 <= t < eng.config.vocab_size for t in a.token_ids)


def test_end_of_context(tiny):
    """A prompt that leaves a few slots: the passes shrink (forecast rows included) and the
    output is plain greedy's up to the context's end."""
    d, eng, _ = tiny
    path = forecast_file(d, eng.config)
    ids = [(i * 7) % 250 + 3 for i in range(240)]
    plain = eng.generate(ids, max_new_tokens=40, stop_at_eos=False)
    spec = eng.generate(ids, max_new_tokens=40, stop_at_eos=False, speculative=f"forecast:{path}")
    assert spec.token_ids == plain.token_ids and spec.stats.finish_reason == plain.stats.finish_reason == "context"


def test_bad_forecast_files(tiny, tmp_path):
    _d, eng, _ = tiny
    cfg = eng.config
    with pytest.raises(InvalidArgumentError, match="no such file"):
        eng.generate([5, 6], speculative=f"forecast:{tmp_path / 'missing.safetensors'}")
    with pytest.raises(InvalidArgumentError, match="needs the path"):
        eng.generate([5, 6], speculative="forecast:")
    other = model_meta(cfg) | {"hidden_size": str(cfg.dim * 2)}
    write_forecast(tmp_path / "other.safetensors", [0.5] * (2 * cfg.dim * 2), (3, 2), other, model="a bigger model")
    with pytest.raises(InvalidArgumentError, match="for another model: hidden_size '128'.*a bigger model|"
                                                   "a bigger model.*for another model"):
        eng.generate([5, 6], speculative=f"forecast:{tmp_path / 'other.safetensors'}")
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}" + b"\0" * 8)
    with pytest.raises(ModelFileError, match="junk"):
        eng.generate([5, 6], speculative=f"forecast:{tmp_path / 'junk.safetensors'}")
    good = forecast_file(tmp_path, cfg)
    raw = bytearray(good.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    raw[8 + n:8 + n + 4] = struct.pack("<f", float("nan"))
    (tmp_path / "nan.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ModelFileError, match="NaN"):
        eng.generate([5, 6], speculative=f"forecast:{tmp_path / 'nan.safetensors'}")
    (tmp_path / "cut.safetensors").write_bytes(bytes(raw[:-16]))
    with pytest.raises(ModelFileError, match="truncated"):
        eng.generate([5, 6], speculative=f"forecast:{tmp_path / 'cut.safetensors'}")


def test_root_pass_judged_with_the_tree_pass_after_it(tiny, monkeypatch):
    """A pass of the root alone (after plain steps: it only fetches a forecast) is not judged by
    itself; its token and time count with the next drafting pass's when the back-off decides
    whether drafting pays (counted apart, each pass after one looked paying on an H200 and DS2D
    on SmolLM2 fell to 0.6x of plain decoding)."""
    from webdrift.runtime import speculative
    d, eng, _ = tiny
    events = []
    real_rows, real_verified = speculative.TreeVerifier.argmax_rows, speculative.BackOff.verified

    async def rows(self, tree, pos0, step, sp, nodes=None):
        events.append(("pass", nodes))
        return await real_rows(self, tree, pos0, step, sp, nodes)

    def verified(self, accepted, tokens=0, seconds=0.0):
        events.append(("judged", accepted, tokens, seconds))
        return real_verified(self, accepted, tokens, seconds)

    monkeypatch.setattr(speculative.TreeVerifier, "argmax_rows", rows)
    monkeypatch.setattr(speculative.BackOff, "verified", verified)
    plain = eng.generate(PROMPTS[2], max_new_tokens=64, stop_at_eos=False)
    spec = eng.generate(PROMPTS[2], max_new_tokens=64, stop_at_eos=False,
                        speculative=f"forecast:{forecast_file(d, eng.config)}")
    assert spec.token_ids == plain.token_ids
    roots, after_root = 0, 0
    for e in events:
        if e[0] == "pass":
            roots += e[1] == 1
        else:
            _, accepted, tokens, seconds = e
            assert tokens == accepted + 1 + roots and seconds > 0, (e, roots)
            after_root += roots > 0
            roots = 0
    assert after_root >= 2, events
