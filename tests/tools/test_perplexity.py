"""`webdrift perplexity` without the GPU: llama-perplexity's windows and BOS rule, the log-softmax
against scipy in float64, `-f`-style file reading, and bad input refused with a clear error
before any weight is uploaded. The comparison with llama.cpp on real models is
tests/test_perplexity_llama_cpp.py."""

import numpy as np
import pytest
from scipy.special import log_softmax

from webdrift.errors import InvalidArgumentError
from webdrift.tools.cli import main
from webdrift.tools.perplexity import perplexity, read_text, window_nll, windows


def test_windows_follow_llama_perplexity():
    toks = list(range(100, 100 + 35))
    w = windows(toks, 8, None)                  # 35 // 8 = 4 windows, the 3-token tail dropped
    assert w == [toks[0:8], toks[8:16], toks[16:24], toks[24:32]]
    wb = windows(toks, 8, 7)                    # the model adds BOS: each window starts with it
    assert [x[0] for x in wb] == [7] * 4 and [x[1:] for x in wb] == [x[1:] for x in w]
    assert toks[8] == 108                       # the caller's list is left as it was
    with pytest.raises(InvalidArgumentError, match="needs at least 16"):
        windows(toks[:15], 8, None)


def test_window_nll_matches_scipy():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((6, 5000)) * 4).astype(np.float32)
    logits[2, 17] = 40.0                        # a confident row
    targets = [3, 4999, 17, 0, 2500, 17]
    ref = -log_softmax(logits.astype(np.float64), axis=1)[np.arange(6), targets]
    got = window_nll(logits, targets)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert logits[2, 17] == 40.0                # not modified in place


def test_read_text_like_llama_cpp_f(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(b"one\r\ntwo\n\n")
    assert read_text(p) == "one\r\ntwo\n"      # bytes kept, one trailing newline removed
    p.write_bytes(b"\xff\xfe bad")
    with pytest.raises(InvalidArgumentError, match="not UTF-8"):
        read_text(p)
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        read_text(tmp_path / "missing.txt")


@pytest.mark.parametrize("text,ctx,kw,needle", [
    ("", 512, {}, "empty"),
    ("  \n ", 512, {}, "empty"),
    ("Too short a text.", 64, {}, "needs at least 128"),
    ("word " * 5000, 9000, {}, "exceeds the model's context length 8192"),
    ("word " * 5000, 2, {}, "ctx=2"),
    ("word " * 5000, 64, {"weight_format": "q3"}, "weight_format='q3'"),
    ("word " * 5000, 64, {"layuot": "linear"}, "layuot"),
    ("word " * 5000, 64, {"n_chunks": 0}, "n_chunks=0"),
])
def test_bad_input_is_refused_before_loading(smollm2_gguf_path, text, ctx, kw, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        perplexity(str(smollm2_gguf_path), text, ctx, **kw)


def test_command_bad_input_exits_2(smollm2_gguf_path, tmp_path, capsys):
    f = tmp_path / "short.txt"
    f.write_text("A short text.\n")
    assert main(["perplexity", str(smollm2_gguf_path), "--file", str(f), "--ctx", "64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("webdrift: error:") and "needs at least 128" in err and "Traceback" not in err
    assert main(["perplexity", str(smollm2_gguf_path), "--file", str(f), "--weight-format", "e9m9"]) == 2
    assert "weight_format='e9m9'" in capsys.readouterr().err
    assert main(["perplexity", str(smollm2_gguf_path), "--file", str(tmp_path / "nope.txt")]) == 2
    assert "nope.txt" in capsys.readouterr().err
