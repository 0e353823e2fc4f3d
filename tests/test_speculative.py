"""Speculative decoding (runtime/speculative.py): greedy output with tree verification is token
for token the plain greedy output, on the tiny GGUF model (tests/tiny_model.py) over many prompts
and trees (tests/spec_util.py), with EOS inside a tree, drafts that are never accepted, trees
near the end of the context and max_new_tokens reached inside a tree; the lookup drafter and the
greedy walk against hand-worked examples; bad input. The reference is always the same engine's
plain greedy decoding (itself checked against transformers in test_engine_hf.py)."""

from __future__ import annotations

import random

import pytest

import webdrift
from tests.spec_util import AlternatingDrafter, OracleDrafter, WrongDrafter
from tests.tiny_model import write_tiny_gguf
from webdrift.errors import InvalidArgumentError
from webdrift.runtime.speculative import (
    MAX_TREE,
    BackOff,
    Drafter,
    DraftTree,
    ForecastDrafter,
    LookupDrafter,
    greedy_walk,
)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("spec") / "tiny.gguf")


@pytest.fixture(scope="module")
def eng(tiny_path):
    return webdrift.load(tiny_path, max_context=256, autotune=False)


def prompts(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 266) for _ in range(rng.randint(1, 40))] for _ in range(n)]


def check_same(eng, ids, drafter_cls=OracleDrafter, seed=0, **kw):
    plain = eng.generate(ids, **kw)
    spec = eng.generate(ids, speculative=drafter_cls(ids + plain.token_ids, eng.config.vocab_size, seed), **kw)
    assert spec.token_ids == plain.token_ids, (ids, plain.token_ids, spec.token_ids)
    assert spec.text == plain.text
    assert (spec.stats.finish_reason, spec.stats.new_tokens) == (plain.stats.finish_reason, plain.stats.new_tokens)
    return plain, spec


def test_greedy_identical_many_prompts(eng):
    """20 prompts x random trees (sizes 2..64, chains, stars, random shapes; true paths of 0..10
    tokens placed after the distractors, so every accepted path is compacted)."""
    passes = accepted = 0
    for k, ids in enumerate(prompts(20)):
        _, spec = check_same(eng, ids, seed=k, max_new_tokens=48, stop_at_eos=False)
        s = spec.stats
        assert s.spec_passes + s.plain_steps > 0
        assert s.drafted_tokens >= s.accepted_tokens
        passes, accepted = passes + s.spec_passes, accepted + s.accepted_tokens
    assert passes > 100 and accepted > 200            # trees were really verified and accepted


def test_eos_inside_a_tree(eng):
    """Prompts whose plain greedy output ends at EOS: the speculative run stops at the same token
    (EOS on an accepted path, or as the bonus token) with finish_reason "eos"."""
    found = 0
    for k, ids in enumerate(prompts(150, seed=1)):
        plain = eng.generate(ids, max_new_tokens=60)
        if plain.stats.finish_reason != "eos":
            continue
        found += 1
        for seed in range(3):
            d = OracleDrafter(ids + plain.token_ids + [2] + [5] * 20, eng.config.vocab_size, seed)
            spec = eng.generate(ids, max_new_tokens=60, speculative=d)
            assert spec.token_ids == plain.token_ids and spec.stats.finish_reason == "eos"
            assert spec.stats.new_tokens == plain.stats.new_tokens
        if found == 3:
            break
    assert found >= 1, "no prompt of the tiny model reached EOS"


def test_nothing_ever_accepted(eng):
    """Drafts that never match: the same tokens, no draft token accepted, and the back-off runs
    plain decode steps between the (failing) verification passes."""
    for k, ids in enumerate(prompts(4, seed=2)):
        _, spec = check_same(eng, ids, WrongDrafter, seed=k, max_new_tokens=40, stop_at_eos=False)
        s = spec.stats
        assert s.accepted_tokens == 0 and s.spec_passes > 0 and s.plain_steps > s.spec_passes


@pytest.mark.parametrize("max_new", [1, 2, 5, 13])
def test_max_new_tokens_inside_a_tree(eng, max_new):
    for k, ids in enumerate(prompts(3, seed=3)):
        _, spec = check_same(eng, ids, seed=k, max_new_tokens=max_new, stop_at_eos=False)
        assert len(spec.token_ids) == max_new and spec.stats.finish_reason == "length"


def test_context_end(tiny_path):
    """A 64-token context: trees shrink to the rows left in the cache; the output stops at the
    context like plain decoding ("context")."""
    small = webdrift.load(tiny_path, max_context=64, autotune=False)
    for k, n in enumerate([20, 50, 62, 63]):
        ids = [(7 * i + k) % 260 + 3 for i in range(n)]
        plain, _ = check_same(small, ids, seed=k, max_new_tokens=100, stop_at_eos=False)
        assert plain.stats.finish_reason == "context" and len(plain.token_ids) == 64 - n


def test_gemm_verification_pass(tiny_path):
    """The verification pass through the tiled GEMM kernels (the GPU's prefill stage)."""
    e = webdrift.load(tiny_path, max_context=256, autotune=False, prefill_kernels="gemm")
    for k, ids in enumerate(prompts(4, seed=4)):
        check_same(e, ids, seed=k, max_new_tokens=32, stop_at_eos=False)


@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_int8_verification_runs_the_decode_kernels(tiny_path, fmt):
    """With int8 activations (the GPU default for q4 / q8) the tree runs the decode kernels and
    keeps the int8 LM head on every row, whatever the prefill kernels, and its attention reads
    keys in path order: a float head there rounded differently from the single-token steps
    (lavapipe, q4: the speculative context left the plain greedy output on the first prompt),
    and so did the attention's slot order (q4: 5 of 6 prompts the same before it read keys in
    path order). Now every prompt gives plain greedy's tokens. Its integer-dot QKV GEMVs apply
    RoPE and the KV append themselves, each row rotated by its tree record's position, as the
    decode steps' do (no RoPE dispatch)."""
    from webdrift.models.forward import Linear, RopeKV
    e = webdrift.load(tiny_path, max_context=256, autotune=False, weight_format=fmt, int8_activations=True,
                      prefill_kernels="gemm")
    for k, ids in enumerate(prompts(6, seed=9)):
        check_same(e, ids, seed=k, max_new_tokens=24, stop_at_eos=False)
    prog = e._verifier.program
    heads = [op for op in prog.graph.ops if isinstance(op, Linear) and op.head]
    assert prog.stage == "decode" and heads and all(op.int8_input and op.variant.cols > 1 for op in heads)
    for p in e._verifier.programs.values():
        rope = [op for op in p.graph.ops if isinstance(op, Linear) and op.rope is not None]
        assert len(rope) == e.config.n_layers and all(op.rope.tree and op.int8_input for op in rope)
        assert not any(isinstance(op, RopeKV) for op in p.graph.ops)


@pytest.mark.parametrize("fmt,variant", [("f16", "subgroup"), ("q4", "wide")])
def test_float_cols_verification_identical(tiny_path, monkeypatch, fmt, variant):
    """The GPU's float GEMVs (subgroup, wide) in the tree program read each weight slice once for
    up to 8 rows (NCOL columns, autotune.gemv_cols); every column sums as the one-row kernel of
    the decode steps, so speculative greedy is still plain greedy token for token. The tiny QKV
    takes the RoPE epilogue there as in the decode steps (one row per workgroup, each rotated by
    its tree record's position: forward.TREE_ROPE_BYTES)."""
    from webdrift.kernels import autotune
    from webdrift.kernels.linear import GemvVariant
    from webdrift.models.forward import Linear
    chosen = {"subgroup": GemvVariant("subgroup", rows=8, wg=128, unroll=4),
              "wide": GemvVariant("wide", rows=16, wg=128, mrows=2)}[variant]
    real = autotune.static_choice
    monkeypatch.setattr(autotune, "static_choice", lambda dev, int8=False: real(dev, int8) if int8 else chosen)
    e = webdrift.load(tiny_path, max_context=256, autotune=False, weight_format=fmt, int8_activations=False,
                      prefill_kernels="gemm")
    for k, ids in enumerate(prompts(5, seed=11)):
        check_same(e, ids, seed=k, max_new_tokens=24, stop_at_eos=False)
    lin = [op for op in e._verifier.program.graph.ops if isinstance(op, Linear)]
    rope = [op for op in lin if op.rope is not None]
    assert len(rope) == e.config.n_layers and all(op.rope.tree and op.variant.cols == 1 for op in rope)
    assert all(op.variant.variant == variant and op.variant.cols > 1 for op in lin if op.rope is None)
    assert all(op.variant.cols == 1 for op in e.decode.graph.ops if isinstance(op, Linear))


def test_pass_submitted_in_parts(eng, monkeypatch):
    """A verification pass not encoded ahead goes to the GPU in submits of PASS_PART dispatches
    (the GPU starts on the first while the host encodes the rest): in parts of 3 and of 1 (every
    kernel its own submit) the tokens are still plain greedy's."""
    from webdrift.gpu.base import Encoded
    from webdrift.runtime import speculative
    subs = []
    real = eng.dev.submit
    monkeypatch.setattr(eng.dev, "submit", lambda d, *a, **k: subs.append(len(d)) or real(d, *a, **k))
    monkeypatch.setattr(eng.dev, "encode", lambda d, c=None: Encoded([], [], []))   # never the next pass's
    for part in (3, 1):
        monkeypatch.setattr(speculative, "PASS_PART", part)
        for k, ids in enumerate(prompts(3, seed=9)):
            subs.clear()
            _, spec = check_same(eng, ids, seed=k, max_new_tokens=24, stop_at_eos=False)
            assert spec.stats.spec_passes > 0 and subs.count(part) > spec.stats.spec_passes


@pytest.mark.parametrize("grain", [8, MAX_TREE])
def test_pass_encoded_ahead(eng, monkeypatch, grain):
    """While the GPU runs a pass the host encodes the next one for the rows that followed this
    pass's rows last time (speculative.encoded_rows: the small program's capacity, else the rows
    rounded up to ENCODE_GRAIN), and a next pass whose rows round that way runs that command
    buffer, its tree, ids and step written after it was encoded: the tokens are still plain
    greedy's. A pass is encoded for more rows than it has (the kernels stop at the step's row
    count): with a grain of MAX_TREE every pass of the large program is encoded for 64 rows."""
    from webdrift.runtime import speculative
    monkeypatch.setattr(speculative, "ENCODE_GRAIN", grain)
    ahead, fresh = [], []
    real_sub, real_enc = eng.dev.submit_encoded, eng.dev.encode
    monkeypatch.setattr(eng.dev, "submit_encoded", lambda e: ahead.append(len(e.dispatches)) or real_sub(e))
    monkeypatch.setattr(eng.dev, "encode", lambda d, c=None: fresh.append(len(d)) or real_enc(d, c))
    passes = 0
    for k, ids in enumerate(prompts(6, seed=21)):
        _, spec = check_same(eng, ids, seed=k, max_new_tokens=32, stop_at_eos=False)
        passes += spec.stats.spec_passes
    assert len(ahead) <= len(fresh) <= passes and 0 < len(ahead) < passes, (len(ahead), len(fresh), passes)
    assert [speculative.encoded_rows(n) for n in (1, 4, 5, 8, 9, 63, 64)] == \
        [4, 4, *(min(MAX_TREE, -(-n // grain) * grain) for n in (5, 8, 9, 63, 64))]


def test_pass_encoded_ahead_follows_alternating_sizes(eng, monkeypatch):
    """A drafter whose passes alternate between the small and the large program (as DS2D's root
    passes and trees do): after each size has been seen followed by the other, every pass runs
    the command buffer encoded during the one before (all but the first three, and the last whose
    size the token budget cuts)."""
    ids = prompts(1, seed=5)[0]
    plain = eng.generate(ids, max_new_tokens=60, stop_at_eos=False)
    ahead = []
    real_sub = eng.dev.submit_encoded
    monkeypatch.setattr(eng.dev, "submit_encoded", lambda e: ahead.append(len(e.dispatches)) or real_sub(e))
    ver = eng._tree_verifier()
    ver.after.clear()
    ver.prev_rows = None
    spec = eng.generate(ids, max_new_tokens=60, stop_at_eos=False,
                        speculative=AlternatingDrafter(ids + plain.token_ids, (2, 12)))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.spec_passes >= 8 and len(ahead) >= spec.stats.spec_passes - 4, (len(ahead), spec.stats.spec_passes)


def test_top_k_orders_logit_bits_as_floats():
    """The pass's top-k compares the spans' f32 bits as integers (speculative._order): the same
    order as the floats themselves, -0.0 equal to 0.0, over signs, subnormals and extremes."""
    import struct

    from webdrift.runtime.speculative import _order
    rng = random.Random(5)
    vals = [0.0, -0.0, 1.0, -1.0, 3.4e38, -3.4e38, 1e-45, -1e-45, 1.17e-38, -1.17e-38, 2.5, -2.5]
    vals += [rng.uniform(-50, 50) for _ in range(300)] + [rng.choice((-1, 1)) * rng.random() * 1e-38 for _ in range(50)]
    bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in vals]
    f32 = [struct.unpack("<f", struct.pack("<I", b))[0] for b in bits]
    for i in range(len(bits)):
        for j in range(len(bits)):
            assert (_order(bits[i]) < _order(bits[j])) == (f32[i] < f32[j]), (f32[i], f32[j])
            assert (_order(bits[i]) == _order(bits[j])) == (f32[i] == f32[j]), (f32[i], f32[j])


def test_stop_during_the_prompt(eng, monkeypatch):
    """A stop requested while the prompt runs ends a speculative generation after its first token,
    as it ends plain decoding (the first token comes from the plain burst queued behind the
    prompt, not from a read before it)."""
    real = eng._submit_prompt

    def then_stop(*a, **k):
        yield from real(*a, **k)
        eng.stop()

    ids = prompts(1, seed=11)[0]
    want = eng.generate(ids, max_new_tokens=1).token_ids
    monkeypatch.setattr(eng, "_submit_prompt", then_stop)
    for spec in (None, OracleDrafter(ids + want, eng.config.vocab_size, 0)):
        r = eng.generate(ids, max_new_tokens=20, stop_at_eos=False, speculative=spec)
        assert r.token_ids == want and r.stats.finish_reason == "stopped", (spec, r.token_ids, r.stats.finish_reason)


def test_lookup_mode_identical(eng):
    """speculative="lookup" on prompts that repeat themselves: the same tokens as plain decoding."""
    for k, ids in enumerate(prompts(5, seed=5)):
        ids = ids + ids[: len(ids) // 2] + ids
        plain = eng.generate(ids, max_new_tokens=40, stop_at_eos=False)
        spec = eng.generate(ids, max_new_tokens=40, stop_at_eos=False, speculative="lookup")
        assert spec.token_ids == plain.token_ids


def test_stream_and_chat_take_speculative(eng):
    msgs = [{"role": "user", "content": "the cat the cat the cat"}]
    assert eng.chat(msgs, max_new_tokens=12, speculative="lookup").token_ids == eng.chat(msgs, max_new_tokens=12).token_ids
    ids = prompts(1, seed=6)[0]
    assert "".join(eng.stream(ids, max_new_tokens=10, speculative="lookup")) == eng.generate(ids, max_new_tokens=10).text


# -- the parts, by hand ------------------------------------------------------------------------
def test_greedy_walk():
    tree = DraftTree([9, 5, 6, 7, 8, 7], [-1, 0, 0, 1, 2, 2])
    # the model after the root says 6 (node 2), after node 2 says 7 (node 5), after node 5 says 4
    assert greedy_walk(tree, [6, 0, 7, 0, 0, 4]) == ([6, 7, 4], [0, 2, 5])
    assert greedy_walk(tree, [3, 0, 0, 0, 0, 0]) == ([3], [0])           # nothing accepted: one token
    with pytest.raises(ValueError):
        DraftTree([1, 2], [-1, 1])                                        # a parent after its child


def test_lookup_drafter():
    d = LookupDrafter(min_ngram=2, max_ngram=3, depth=4, branches=3)
    d.reset([1, 2, 3, 4, 5, 6, 1, 2, 3, 9, 9, 1, 2])
    t = d.propose(64, 10)
    # "1 2" matched twice (3-gram "x 1 2" not followed by the same x): continuations 3 9 9 1 and 3 4 5 6
    assert t.tokens == [2, 3, 9, 9, 1, 4, 5, 6] and t.parents == [-1, 0, 1, 2, 3, 1, 5, 6]
    assert d.propose(4, 10).tokens == [2, 3, 9, 9]                       # node limit
    assert d.propose(64, 1).tokens == [2, 3]                             # depth limit
    d.append(7)
    assert d.propose(64, 10) is None                                     # "2 7" never seen
    d.reset([5, 5, 5, 5])
    assert d.propose(64, 3).tokens == [5, 5, 5, 5]


def test_bad_input(eng):
    with pytest.raises(InvalidArgumentError, match="speculative='medusa'"):
        eng.generate([5, 6], speculative="medusa")
    with pytest.raises(InvalidArgumentError, match="forecast"):
        eng.generate([5, 6], speculative="forecast:/nonexistent.bin")
    with pytest.raises(InvalidArgumentError, match="speculative=3"):
        eng.generate([5, 6], speculative=3)

    class TooBig(Drafter):
        def reset(self, context): self.last = context[-1]
        def append(self, token): self.last = token
        def propose(self, max_nodes, max_depth):
            return DraftTree([self.last] + [4] * MAX_TREE, [-1] + list(range(MAX_TREE)))

    with pytest.raises(InvalidArgumentError, match=f"tree of {MAX_TREE + 1} nodes"):
        eng.generate([5, 6], max_new_tokens=8, speculative=TooBig())

    class WrongRoot(TooBig):
        def propose(self, max_nodes, max_depth):
            return DraftTree([self.last + 1, 4], [-1, 0])

    with pytest.raises(InvalidArgumentError, match="rooted at the last token"):
        eng.generate([5, 6], max_new_tokens=8, speculative=WrongRoot())
    assert eng.generate([5, 6], max_new_tokens=4).token_ids                # still usable


def test_backoff_by_throughput():
    """Misses: a pass accepting nothing, and once plain steps are timed, a pass whose tokens/s are
    below the plain steps' (accepting a little but costing more); a paying pass resets; the waits
    double up to the cap."""
    b = BackOff(cap=4)
    b.verified(0, 1, 0.01)                                 # nothing accepted: a miss
    assert (b.misses, b.wait) == (1, 1) and not b.may_draft()
    b.plain_step()
    assert b.may_draft()
    b.verified(2, 3, 0.01)                                 # no plain rate yet: accepting pays
    assert (b.misses, b.wait) == (0, 0)
    b.plain_burst(10, 0.01)                                # 1000 tok/s plain
    b.plain_burst(2, 0.001)                                # 2000 tok/s: the average moves to 1300
    assert abs(b.plain_rate - 1300) < 1e-6
    b.verified(1, 2, 0.01)                                 # 200 tok/s: below plain
    assert b.misses == 1 and b.wait == 1
    b.wait = 0
    for _ in range(3):
        b.verified(1, 2, 0.01)
    assert b.misses == 4 and b.wait == 4                   # 1, 2, 4, then the cap
    b.wait = 0
    b.verified(9, 10, 0.002)                               # 5000 tok/s: pays
    assert b.misses == 0 and b.wait == 0


def test_node_budget_follows_acceptance():
    """A sized drafter's trees: the whole room until a pass is verified, then 2 x the average
    accepted drafts per pass (weight 0.3 for the newest) + 4, at least 4, at most the room."""
    b = BackOff()
    assert b.node_budget(64) == 64 and b.node_budget(7) == 7
    b.verified(10, 11, 0.01)
    assert b.node_budget(64) == 24 and b.node_budget(20) == 20
    for _ in range(20):
        b.verified(0, 1, 0.01)
    assert b.node_budget(64) == 4 and b.node_budget(3) == 3
    b.accepted = 3.45                                       # the chat task's average on the H100
    assert b.node_budget(64) == 10
    assert ForecastDrafter.sized and not LookupDrafter.sized and not Drafter.sized   # the others: the room



def test_stream_closed_inside_a_plain_burst(eng, caplog):
    """A caller that stops reading during the plain steps between passes: the burst is closed
    (its steps in flight drained) with the generation, not left for the garbage collector (which
    logged asyncio's "Task was destroyed but it is pending" for each such stop); the engine then
    gives the same tokens as before."""
    import gc
    import logging
    ids = [5, 6, 7]
    before = eng.generate(ids, max_new_tokens=8).token_ids
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for k in (2, 3, 5, 9):
            s = eng.stream(ids, max_new_tokens=40, speculative="lookup", stop_at_eos=False)
            for i, _ in enumerate(s):
                if i == k:
                    break
            s.close()
            gc.collect()
    assert not [r for r in caplog.records if "destroyed" in r.getMessage()]
    assert eng.generate(ids, max_new_tokens=8).token_ids == before
