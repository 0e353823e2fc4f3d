"""Issue 15, reliability: the engine survives bad input, a second caller and damaged files.

Each test is one item of the issue and failed before its fix (the failure it saw is in the
docstring). Engines are the tiny GGUF model (tests/tiny_model.py) on the process's device; the
expected values come from independent sources: struct's own limits for the Step uniform, Python's
UTF-8 codec, gguf-py's writer for the files.
"""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest

import webdrift
from tests.tiny_model import write_tiny_gguf
from webdrift.errors import (
    EngineBusyError,
    InvalidArgumentError,
    InvalidTextError,
    ModelFileError,
    TokenizerError,
    WebdriftError,
)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="module")
def eng(tiny_path):
    return webdrift.load(tiny_path, max_context=128)


# -- item 2: one busy guard for every entry point ----------------------------------------------

def test_logits_while_a_stream_is_open_is_refused(eng):
    """Before: logits() skipped the busy check; with a stream open it destroyed the arena the
    stream was using ("Buffer is destroyed", exit 134) or the stream went on with wrong tokens."""
    ref = eng.generate("abc", max_new_tokens=12, stop_at_eos=False).token_ids
    ref_logits = eng.logits([5, 6, 7])
    stream = eng.stream("abc", max_new_tokens=12, stop_at_eos=False)
    next(stream)
    assert eng.busy
    with pytest.raises(EngineBusyError, match="logits: this engine is busy"):
        eng.logits([5, 6, 7])
    with pytest.raises(EngineBusyError, match="busy"):
        eng.generate("abc", max_new_tokens=2)
    with pytest.raises(EngineBusyError):
        eng.chat([{"role": "user", "content": "hi"}], max_new_tokens=2)
    list(stream)                                   # the open stream finishes undisturbed
    assert not eng.busy
    out = eng.generate("abc", max_new_tokens=12, stop_at_eos=False)
    assert out.token_ids == ref
    assert (eng.logits([5, 6, 7]) == ref_logits).all()


def test_a_closed_stream_frees_the_engine(eng):
    stream = eng.stream("abc", max_new_tokens=50, stop_at_eos=False)
    next(stream)
    stream.close()
    assert not eng.busy
    assert len(eng.generate("abc", max_new_tokens=3, stop_at_eos=False).token_ids) == 3


def test_two_threads_one_engine(eng):
    """Two threads generating on one engine: each call either completes with the tokens a lone
    call gives, or gets EngineBusyError at once; none sees another's tokens."""
    ref = eng.generate("the cat", max_new_tokens=20, stop_at_eos=False).token_ids
    results, errors = [], []
    start = threading.Barrier(4)

    def work():
        start.wait()
        for _ in range(5):
            try:
                results.append(eng.generate("the cat", max_new_tokens=20, stop_at_eos=False).token_ids)
            except EngineBusyError as e:
                errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert len(results) + len(errors) == 20 and results
    assert all(r == ref for r in results)
    assert not eng.busy


# -- item 4: parameters the Step uniform cannot hold ---------------------------------------------

@pytest.mark.parametrize("kw,name", [
    ({"top_k": 10**12}, "top_k"), ({"top_k": 2**32}, "top_k"), ({"top_k": -1}, "top_k"),
    ({"temperature": 1e39}, "temperature"), ({"temperature": 1e-45}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"temperature": 10**400}, "temperature"),
    ({"temperature": "0.5"}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_p": 1e-300}, "top_p"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"max_new_tokens": 2.0}, "max_new_tokens"), ({"seed": 1.5}, "seed"), ({"stop_at_eos": None}, "stop_at_eos"),
])
def test_sampling_values_the_uniform_cannot_hold(eng, kw, name):
    """Before: top_k=10**12 passed validation and crashed packing the uniform (struct.error),
    temperature=1e39 likewise (OverflowError), top_p=1e-300 packed as 0."""
    with pytest.raises(InvalidArgumentError, match=name):
        eng.generate([1, 2], **{"max_new_tokens": 2, **kw})
    assert not eng.busy


def test_sampling_extremes_that_fit_run(eng):
    """The edges of each range pack exactly (struct: u32 and f32) and generate."""
    from webdrift.runtime.engine import F32_MAX, F32_MIN_NORMAL, U32_MAX, SamplingParams
    assert struct.unpack("<I", struct.pack("<I", U32_MAX))[0] == U32_MAX
    assert struct.unpack("<f", struct.pack("<f", F32_MAX))[0] == F32_MAX
    assert struct.unpack("<f", struct.pack("<f", F32_MIN_NORMAL))[0] == F32_MIN_NORMAL
    with pytest.raises(OverflowError):      # the next double up is not a float32: the bound is tight
        struct.pack("<f", F32_MAX * (1 + 2**-23))
    for kw in ({"top_k": U32_MAX, "temperature": 0.7}, {"temperature": F32_MAX}, {"temperature": F32_MIN_NORMAL},
               {"top_p": F32_MIN_NORMAL, "temperature": 1.0}, {"seed": -1}, {"seed": 2**80}):
        sp = SamplingParams.make(4, **{k: v for k, v in kw.items()})
        out = eng.generate([1, 2], max_new_tokens=4, stop_at_eos=False, **kw)
        assert len(out.token_ids) == 4 and all(0 <= t < eng.config.vocab_size for t in out.token_ids)
        assert 0 <= sp.seed <= U32_MAX


# -- item 3: text that is not valid Unicode ------------------------------------------------------

@pytest.mark.parametrize("text,pos,cp", [("caf\udcff", 3, "DCFF"), ("\ud800x", 0, "D800"), ("ok \udfff", 3, "DFFF")])
def test_lone_surrogates_name_their_position(eng, text, pos, cp):
    """Before: a raw UnicodeEncodeError from the pre-tokenizer."""
    with pytest.raises(UnicodeEncodeError):      # what Python says of the same text: not UTF-8
        text.encode("utf-8")
    with pytest.raises(InvalidTextError, match=f"prompt is not valid Unicode: character {pos} is U\\+{cp}"):
        eng.generate(text, max_new_tokens=2)
    with pytest.raises(InvalidTextError, match=rf"messages\[1\]\['content'\].*character {pos}"):
        eng.chat([{"role": "system", "content": "x"}, {"role": "user", "content": text}], max_new_tokens=2)
    e = InvalidTextError("x")
    assert isinstance(e, TokenizerError) and isinstance(e, InvalidArgumentError)


def test_chat_messages_of_the_wrong_shape(eng):
    for bad, needle in [("hi", "list"), ([{"role": "user"}], r"messages\[0\]\['content'\]"),
                        ([{"role": 1, "content": "x"}], r"messages\[0\]\['role'\]"), ([["user", "x"]], r"messages\[0\]")]:
        with pytest.raises(InvalidArgumentError, match=needle):
            eng.chat(bad, max_new_tokens=2)


def test_vocabulary_token_that_is_not_utf8(tmp_path):
    """A GGUF vocabulary token whose bytes are not UTF-8 (gguf-py writes the raw bytes): the
    reader keeps them (surrogateescape); building the tokenizer raised UnicodeEncodeError in
    byte_level_spelling, and decoding it printed surrogates. Now: it loads, encodes plain text
    as before, and decodes to U+FFFD as UTF-8 decoding with errors="replace" does."""
    from tests.tiny_model import tiny_tokens
    from webdrift.runtime.loading import make_tokenizer, open_source

    toks = [*tiny_tokens(), "placeholder"]
    path = tmp_path / "bad_vocab.gguf"
    bad = b"x\xff\xfe"
    import gguf
    real_add = gguf.GGUFWriter.add_token_list
    try:   # gguf-py writes str tokens as UTF-8; give it bytes for the last one
        gguf.GGUFWriter.add_token_list = lambda self, t: real_add(self, t[:-1] + [bad])
        write_tiny_gguf(path, tokens=toks)
    finally:
        gguf.GGUFWriter.add_token_list = real_add
    with open(path, "rb") as f:
        assert bad in f.read()
    tok = make_tokenizer(open_source(str(path)))
    bad_id = len(toks) - 1
    assert tok.id_to_piece(bad_id) == bad.decode("utf-8", "surrogateescape")
    assert tok.decode([bad_id]) == bad.decode("utf-8", "replace") == "x\ufffd\ufffd"
    dec = tok.stream_decoder()
    assert dec.push(bad_id) + dec.flush() == "x\ufffd\ufffd"
    good = make_tokenizer(open_source(write_tiny_gguf(tmp_path / "good.gguf")))
    assert tok.encode("the cat in the hat") == good.encode("the cat in the hat")


# -- item 5: damaged lengths in model files --------------------------------------------------------

def _name_length_offset(path) -> int:
    """Offset of tensor #0's name length (u64) in a GGUF file, from gguf-py's reader."""
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    return r.tensors[0].field.offset


def test_damaged_tensor_name_length_gives_a_short_message(tiny_path, tmp_path):
    """Before: a name length of tens of MB read tens of MB as the name and quoted it: the
    ModelFileError message was as long as the damage (the CLI printed it)."""
    with open(tiny_path, "rb") as f:
        data = bytearray(f.read())
    off = _name_length_offset(tiny_path)
    name_len = struct.unpack_from("<Q", data, off)[0]
    assert data[off + 8: off + 8 + name_len] == b"token_embd.weight"
    for damaged in (len(data) // 2, 40_000, 300):       # less than the bytes left: the old reader read them
        data2 = bytearray(data)
        struct.pack_into("<Q", data2, off, damaged)
        with pytest.raises(ModelFileError) as ei:
            webdrift.weights.source.open_model_source(bytes(data2), name="damaged.gguf")
        msg = str(ei.value)
        assert len(msg) < 300 and "damaged.gguf" in msg and "name of tensor #0" in msg, msg
        assert f"length {damaged} exceeds the 256-byte limit" in msg


def test_error_messages_are_capped_everywhere():
    """The backstop: any WebdriftError message is cut to MAX_MESSAGE characters, head and tail kept."""
    from webdrift.errors import MAX_MESSAGE, shown
    e = ModelFileError("head " + "x" * 10**7 + " tail")
    assert len(str(e)) <= MAX_MESSAGE and str(e).startswith("head ") and str(e).endswith(" tail")
    assert "characters cut" in str(e)
    assert len(shown("y" * 10**6)) < 120 and "1000000 characters" in shown("y" * 10**6)
    assert shown("short") == "'short'"


def test_safetensors_header_damage(tmp_path):
    """Damaged safetensors headers: long names / shapes are cut, type confusion is a ModelFileError
    (before: `dtype` a list raised TypeError: unhashable type)."""
    import json

    from webdrift.weights.safetensors import SafetensorsFile

    def file(header: dict, data: bytes = b"") -> bytes:
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data

    cases = [
        {"x" * 10**6: {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}},
        {"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}},
        {"w": {"dtype": "F32", "shape": [1] * 10**5, "data_offsets": [0, 8]}},
    ]
    for header in cases:
        with pytest.raises(ModelFileError) as ei:
            SafetensorsFile(file(header, b"\0" * 8), name="st")
        assert len(str(ei.value)) < 400
    deep = b"[" * 100000 + b"]" * 100000
    with pytest.raises(ModelFileError, match="nested too deeply"):
        SafetensorsFile(struct.pack("<Q", len(deep)) + deep, name="st")


def test_every_webdrift_error_is_one(eng):
    assert issubclass(EngineBusyError, WebdriftError)


# -- item 10: no kernel timing on a software adapter -----------------------------------------------

def test_software_adapter_takes_the_static_rules(tiny_path, monkeypatch, tmp_path):
    """Before: a first load on lavapipe timed every GEMV candidate per shape and the attention
    kernels (SmolLM2 on a 2-core machine: 52 timings, ~210 s of a 221 s load), and a cached
    verdict from an earlier run decided later loads. Now a software adapter never times and
    takes the static rules, whatever the cache holds: the same kernels every run."""
    from webdrift.gpu.native import get_device
    from webdrift.kernels import autotune

    dev = get_device()
    assert dev.info.is_cpu, "the test adapter is lavapipe"

    def no_timing(*a, **k):
        raise AssertionError("a kernel was timed on a software adapter")

    class Poisoned(dict):        # a cache that claims a (different) verdict for every key
        def __contains__(self, key):
            return True

        def __getitem__(self, key):
            if "|attn3|" in key:
                return {"variant": "head", "chunk": 0, "prefetch_v": False}
            if "|layout|" in key:
                return {"layout": "OI4O4"}
            return {"variant": "split", "rows": 4, "wg": 64}
    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_time", no_timing)
    monkeypatch.setattr(autotune, "_memory", Poisoned())
    monkeypatch.setattr(autotune, "_load_file", lambda: Poisoned())
    eng = webdrift.load(tiny_path, max_context=64, autotune=True)
    out = eng.generate("the cat", max_new_tokens=4, stop_at_eos=False)
    assert len(out.token_ids) == 4
    static = autotune.static_choice(dev)
    assert static.variant == "row"
    linear = [k for _, k, _ in eng.decode.kernels() if type(k).__name__ == "LinearKernel"]
    assert linear and all(k.variant == static for k in linear)
    attn = [k for _, k, _ in eng.decode.kernels() if type(k).__name__ == "AttentionKernel"]
    assert attn and all(k.variant == "grouped" for k in attn)   # the rule for software adapters (GQA 4:2)
    from webdrift.kernels.autotune import layout_name
    assert {layout_name(w) for w in (eng.model.layers[0].wqkv, eng.model.output)} == {"OI"}


# -- item 6: non-finite logits ------------------------------------------------------------------------

def test_nan_logits_raise_numerical_error(tmp_path, eng):
    """A model whose logits are NaN (its final norm weight NaN, as a tensor of the wrong type
    gives): before, the sampler returned 0xFFFFFFFF, fed back as the next token id, and the
    caller got a misleading InvalidArgumentError from the detokenizer. Now NumericalError naming
    the step, for greedy and sampled generation, and the engine is free afterwards."""
    from webdrift.errors import NumericalError
    bad = webdrift.load(write_tiny_gguf(tmp_path / "nan.gguf", nan_tensor="output_norm.weight"), max_context=64)
    for kw in ({}, {"temperature": 0.8, "seed": 1}, {"temperature": 1.0, "top_k": 5, "top_p": 0.9}):
        with pytest.raises(NumericalError, match=r"generation step 0 \(the logits after the 3-token prompt\).*NaN"):
            bad.generate("abc", max_new_tokens=5, **kw)
        assert not bad.busy
    with pytest.raises(NumericalError):
        list(bad.stream("abc", max_new_tokens=5))
    logits = bad.logits([5, 6, 7])                  # the independent check: teacher-forced logits are NaN
    assert np.isnan(logits).all()
    assert len(eng.generate("abc", max_new_tokens=5, stop_at_eos=False).token_ids) == 5


def test_one_nan_logit_is_enough(tmp_path):
    """One NaN logit among finite ones (the row of token "Q" in the tied embedding / LM head):
    greedy argmax skipped it (NaN compares false) and went on; now it is reported. The prompt
    does not use that token, so every other logit is finite."""
    from webdrift.errors import NumericalError
    q = 3 + ord("Q")                                   # 3 special tokens, then the 256 bytes
    bad = webdrift.load(write_tiny_gguf(tmp_path / "nanrow.gguf", nan_row=("token_embd.weight", q)), max_context=64)
    assert bad.tokenizer.id_to_piece(q) == "Q"
    ids = bad.tokenizer.encode("the cat")
    assert q not in ids
    lg = bad.logits(ids)
    assert np.isnan(lg[:, q]).all() and np.isfinite(np.delete(lg, q, axis=1)).all()
    with pytest.raises(NumericalError, match="generation step 0"):
        bad.generate(ids, max_new_tokens=3)


@pytest.mark.parametrize("argv, option", [
    (["bench", "--quick", "--quant", "q4", "--no-peers", "--json", "{bad}/r.json"], "--json"),
    (["bench", "--quick", "--quant", "q4", "--no-peers", "--markdown", "{bad}/b.md"], "--markdown"),
    (["bench", "--quick", "--quant", "q4", "--no-peers", "--json", "{dir}"], "--json"),
    (["profile", "--synthetic", "tiny", "--prompt-tokens", "8", "--new-tokens", "4", "--trace", "{bad}/t.json"], "--trace"),
    (["perplexity", "{tiny}", "--file", "{text}", "--ctx", "32", "--json", "{bad}/p.json"], "--json"),
])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_work(tmp_path, tiny_path, capsys, monkeypatch,
                                                                          argv, option):
    """bench / profile / perplexity wrote --json, --markdown, --trace after their run, and a path
    that could not be written ended minutes of work in a traceback (bench --json /proc/x/r.json:
    FileNotFoundError from os.makedirs); now it is one error line, exit 2, before anything runs."""
    from webdrift.tools import bench, perplexity, profile
    from webdrift.tools.cli import main
    ran = []
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: ran.append("bench"))
    monkeypatch.setattr(profile, "run_profile", lambda *a, **k: ran.append("profile"))
    monkeypatch.setattr(perplexity, "perplexity", lambda *a, **k: ran.append("perplexity"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    text = tmp_path / "t.txt"
    text.write_text("Some text to score. " * 40)
    args = [a.format(bad=blocker, dir=tmp_path, tiny=tiny_path, text=text) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"webdrift: error: {option} ") and err.count("\n") == 1, err
    assert ("cannot write it" in err) or ("is a folder" in err)
    assert ran == []
