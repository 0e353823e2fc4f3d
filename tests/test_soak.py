"""Soak (issue 15): many generations in one process leave memory where it was.

1,000 short generations on the synthetic tiny q4 model (token ids, no tokenizer), then 200 with
random arguments on the tiny GGUF model (text prompts, chat, streams closed early, logits,
sampling settings, bad arguments, a second caller while a stream is open). After a warm-up that
reaches every prompt bucket and kernel, the process's resident memory and the device's live
buffer bytes stay flat: the device's exactly (no buffer is made or lost per generation), RSS
within a few MiB (Python's allocator keeps freed arenas). Every result is also checked: ids in
the vocabulary, the requested length, greedy runs equal to the first run of the same prompt.
Takes about 1-2 minutes on lavapipe.
"""

from __future__ import annotations

import gc
import os
import random

import pytest

import webdrift
from tests.tiny_model import write_tiny_gguf
from webdrift.errors import EngineBusyError, InvalidArgumentError
from webdrift.runtime.engine import Engine
from webdrift.runtime.loading import EngineOptions
from webdrift.weights.synthetic import NullTokenizer, synthetic_source

RSS_GROWTH_LIMIT = 8 << 20       # bytes of RSS growth tolerated after the warm-up


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settled() -> tuple[int, int]:
    gc.collect()
    from webdrift.gpu.native import get_device
    return rss_bytes(), get_device().bytes_allocated


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from webdrift.gpu.native import get_device
    dev = get_device()
    synth = Engine(dev, synthetic_source("tiny", "q4"), NullTokenizer(), EngineOptions(max_context=160))
    text = webdrift.load(write_tiny_gguf(tmp_path_factory.mktemp("soak") / "tiny.gguf"), max_context=160)
    return synth, text


def test_soak(engines):
    synth, text = engines
    rng = random.Random(15)
    V = synth.config.vocab_size
    for n in (63, 64, 65, 100):                             # warm-up: both prefill buckets
        synth.generate([rng.randrange(V) for _ in range(n)], max_new_tokens=4, stop_at_eos=False)
    prompts = [[rng.randrange(V) for _ in range(n)] for n in (1, 2, 3, 5, 8)]
    ref = {}
    for p in prompts:                                       # greedy references
        ref[tuple(p)] = synth.generate(p, max_new_tokens=4, stop_at_eos=False).token_ids
    for i in range(30):
        _random_generation(text, rng, i)
    rss0, dev0 = settled()
    allocations0 = synth.dev.allocations
    samples = []
    for i in range(1000):
        p = prompts[i % len(prompts)]
        if i % 3:
            out = synth.generate(p, max_new_tokens=4, stop_at_eos=False)
            assert out.token_ids == ref[tuple(p)], i
        else:
            out = synth.generate(p, max_new_tokens=4, temperature=0.9, top_k=50, seed=i, stop_at_eos=False)
            assert len(out.token_ids) == 4 and all(0 <= t < V for t in out.token_ids)
        if i % 250 == 249:
            samples.append(settled())
    for i in range(200):
        _random_generation(text, rng, i)
    samples.append(settled())
    rss1, dev1 = samples[-1]
    print(f"soak: RSS {rss0 >> 10} KiB -> {[s[0] >> 10 for s in samples]} KiB; device bytes {dev0} -> {[s[1] for s in samples]}")
    assert dev1 == dev0, f"device bytes {dev0} -> {dev1}"
    assert synth.dev.allocations == allocations0, "buffers were created after the warm-up"
    assert rss1 - rss0 < RSS_GROWTH_LIMIT, f"RSS grew {(rss1 - rss0) >> 10} KiB: {[s[0] >> 10 for s in samples]}"
    assert not synth.busy and not text.busy


def _random_generation(eng, rng: random.Random, i: int) -> None:
    """One request with random arguments, of one of several kinds; checks what it returns."""
    kind = rng.choice(["generate", "generate", "chat", "stream_closed", "busy", "logits", "bad"])
    prompt = rng.choice(["the cat", "", "a" * rng.choice([1, 5, 30, 70]), "caf\u00e9 \U0001f600 in the hat", "<|im_end|>x"])
    kw = {"max_new_tokens": rng.randrange(0, 12), "temperature": rng.choice([0.0, 0.5, 1.3]),
          "top_k": rng.choice([None, 0, 1, 40, 2**32 - 1]), "top_p": rng.choice([None, 0.1, 0.9, 1.0]),
          "seed": rng.choice([None, i, -i, 2**40 + i]), "stop_at_eos": rng.random() < 0.5}
    if kind == "bad":
        bad = rng.choice([{"top_k": -1}, {"temperature": 1e39}, {"top_p": 0}, {"max_new_tokens": "3"}, {"seed": 1.5}])
        with pytest.raises(InvalidArgumentError):
            eng.generate("x", **bad)
        return
    if kind == "logits":
        ids = eng.tokenizer.encode("the cat in the hat")
        assert eng.logits(ids).shape == (len(ids), eng.config.vocab_size)
        return
    if kind == "chat":
        out = eng.chat([{"role": "system", "content": "s"}, {"role": "user", "content": prompt or "hi"}], **kw)
    elif kind in ("stream_closed", "busy"):
        s = eng.stream(prompt or "x", **dict(kw, max_new_tokens=20, stop_at_eos=False))
        next(s, None)
        if kind == "busy":
            with pytest.raises(EngineBusyError):
                eng.generate("y", max_new_tokens=1)
        s.close()
        assert not eng.busy
        return
    else:
        try:
            out = eng.generate(prompt, **kw)
        except InvalidArgumentError:
            assert prompt == ""                              # the one invalid prompt drawn
            return
    assert len(out.token_ids) <= kw["max_new_tokens"]
    assert all(0 <= t < eng.config.vocab_size for t in out.token_ids)
    assert out.text == eng.tokenizer.decode(out.token_ids)
