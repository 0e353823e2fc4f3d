"""Normalizers and pre-tokenizers: the text -> words stage before BPE, with HF `tokenizers` semantics.

A pre-tokenizer takes a list of splits and returns a finer list; a split is `(text, at_start)` where
`at_start` says the split begins at offset 0 of the text being encoded (Metaspace's "first" scheme needs
it). Empty splits are dropped, as in HF. Regex splits run on projected text (see `unicode_classes`), so
any llama.cpp / tokenizer.json pattern built from `\\p{..}`, `\\s`, `\\d`, `\\w`, ASCII literals, groups,
look-arounds and quantifiers works, with Oniguruma's matching order.

Named patterns (`GPT2_PATTERN`, `LLAMA3_PATTERN`, `QWEN2_PATTERN`, ...) and `GGUF_PRE_TOKENIZERS`
(llama.cpp's `tokenizer.ggml.pre` names -> pre-tokenizer) live here. Pure standard library; must not
import `regex`, numpy or tokenizers.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

from webdrift.errors import TokenizerError
from webdrift.tokenizer.unicode_classes import compile_pattern, is_numeric, is_whitespace, project

Split = tuple[str, bool]

# --- named split patterns ---------------------------------------------------------------------------

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# --- split helpers ----------------------------------------------------------------------------------

_BEHAVIORS = ("removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous")


def _apply_behavior(text: str, events: list[tuple[int, int, bool]], behavior: str) -> list[str]:
    """HF's SplitDelimiterBehavior over (start, end, is_match) events covering `text`."""
    if behavior == "isolated":
        return [text[s:e] for s, e, _ in events if e > s]
    if behavior == "removed":
        return [text[s:e] for s, e, m in events if not m and e > s]
    spans: list[list[int]] = []
    previous = False
    if behavior == "merged_with_previous":
        for s, e, m in events:
            if m and not previous and spans:
                spans[-1][1] = e
            else:
                spans.append([s, e])
            previous = m
    elif behavior == "merged_with_next":
        for s, e, m in reversed(events):
            if m and not previous and spans:
                spans[-1][0] = s
            else:
                spans.append([s, e])
            previous = m
        spans.reverse()
    elif behavior == "contiguous":
        for s, e, m in events:
            if m == previous and spans:
                spans[-1][1] = e
            else:
                spans.append([s, e])
            previous = m
    else:
        raise TokenizerError(f"unknown split behavior {behavior!r}; expected one of {_BEHAVIORS}")
    return [text[s:e] for s, e in spans if e > s]


def _events_from_spans(length: int, spans, invert: bool) -> list[tuple[int, int, bool]]:
    events = []
    prev = 0
    for s, e in spans:
        if prev != s:
            events.append((prev, s, invert))
        events.append((s, e, not invert))
        prev = e
    if prev != length:
        events.append((prev, length, invert))
    return events


def _split_each(splits: list[Split], fn: Callable[[str], list[str]]) -> list[Split]:
    out: list[Split] = []
    for text, at_start in splits:
        first = at_start
        for piece in fn(text):
            out.append((piece, first))
            first = False
    return out


# --- pre-tokenizers ---------------------------------------------------------------------------------


class PreTokenizer:
    """Base: splits -> finer splits."""

    def __call__(self, splits: list[Split]) -> list[Split]:
        raise NotImplementedError


class RegexSplit(PreTokenizer):
    """HF `Split` with a regex (or a literal string) pattern, a delimiter behavior and `invert`."""

    def __init__(self, pattern: str, behavior: str = "isolated", invert: bool = False, literal: bool = False):
        behavior = _normalize_behavior(behavior)
        self.pattern, self.behavior, self.invert, self.literal = pattern, behavior, invert, literal
        self._regex = re.compile(re.escape(pattern)) if literal else compile_pattern(pattern)
        self._fast = behavior == "isolated" and not invert

    def split_text(self, text: str) -> list[str]:
        subject = text if self.literal else project(text)
        if self._fast:
            out = []
            prev = 0
            for m in self._regex.finditer(subject):
                s, e = m.span()
                if s != prev:
                    out.append(text[prev:s])
                if e != s:
                    out.append(text[s:e])
                prev = e
            if prev != len(text):
                out.append(text[prev:])
            return out
        spans = [m.span() for m in self._regex.finditer(subject)]
        return _apply_behavior(text, _events_from_spans(len(text), spans, self.invert), self.behavior)

    def __call__(self, splits: list[Split]) -> list[Split]:
        return _split_each(splits, self.split_text)


_RUST_EXTRA = re.compile("[\U00011de0-\U00011de9\U00016ff4-\U00016ff6]")
_NUMERIC = compile_pattern(r"\p{N}")


class Digits(PreTokenizer):
    """HF `Digits`: numbers isolated one by one (`individual_digits`) or as runs (Rust `is_numeric`)."""

    def __init__(self, individual_digits: bool = False):
        self.individual_digits = individual_digits

    def split_text(self, text: str) -> list[str]:
        if text.isascii() or not _RUST_EXTRA.search(text):
            spans = [m.span() for m in _NUMERIC.finditer(project(text))]
        else:
            spans = [(i, i + 1) for i, ch in enumerate(text) if is_numeric(ch)]
        if not spans:
            return [text] if text else []
        events = _events_from_spans(len(text), spans, False)
        return _apply_behavior(text, events, "isolated" if self.individual_digits else "contiguous")

    def __call__(self, splits: list[Split]) -> list[Split]:
        return _split_each(splits, self.split_text)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE alphabet)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    )
    mapping = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
# str.translate table: a latin-1 decoded byte string -> its byte-level spelling
_BYTE_LEVEL_TABLE = {b: c for b, c in BYTE_TO_CHAR.items()}


def utf8_bytes(text: str) -> bytes:
    """The UTF-8 bytes of `text`, also where it holds lone surrogates: U+DC80..U+DCFF stand for
    the raw bytes 0x80..0xFF (Python's surrogateescape: how the GGUF reader keeps a vocabulary
    token that is not valid UTF-8), any other lone surrogate becomes U+FFFD's bytes."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    out = bytearray()
    for ch in text:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:
            out.append(o - 0xDC00)
        elif 0xD800 <= o <= 0xDFFF:
            out += "\ufffd".encode()
        else:
            out += ch.encode("utf-8")
    return bytes(out)


def byte_level_spelling(text: str) -> str:
    """UTF-8 bytes of `text`, each written as its GPT-2 byte-level character (a vocabulary token
    holding bytes that are not UTF-8, kept as surrogates, is spelled with those bytes)."""
    return utf8_bytes(text).decode("latin-1").translate(_BYTE_LEVEL_TABLE)


class ByteLevel(PreTokenizer):
    """HF `ByteLevel`: optional prefix space (per split), optional GPT-2 regex split, byte-level spelling."""

    def __init__(self, add_prefix_space: bool = False, use_regex: bool = True):
        self.add_prefix_space = add_prefix_space
        self.use_regex = use_regex
        self._split = RegexSplit(GPT2_PATTERN) if use_regex else None

    def __call__(self, splits: list[Split]) -> list[Split]:
        out: list[Split] = []
        for text, at_start in splits:
            if self.add_prefix_space and not text.startswith(" "):
                text = " " + text
            pieces = self._split.split_text(text) if self._split else [text]
            first = at_start
            for piece in pieces:
                out.append((byte_level_spelling(piece), first))
                first = False
        return out


class Metaspace(PreTokenizer):
    """HF `Metaspace`: spaces -> replacement char, prepend scheme always/first/never, optional split."""

    def __init__(self, replacement: str = "\u2581", prepend_scheme: str = "always", split: bool = True):
        if prepend_scheme not in ("always", "first", "never"):
            raise TokenizerError(f"Metaspace prepend_scheme {prepend_scheme!r} is not always/first/never")
        self.replacement, self.prepend_scheme, self.split = replacement, prepend_scheme, split

    def __call__(self, splits: list[Split]) -> list[Split]:
        out: list[Split] = []
        rep = self.replacement
        for text, at_start in splits:
            text = text.replace(" ", rep)
            if not text.startswith(rep) and (
                self.prepend_scheme == "always" or (self.prepend_scheme == "first" and at_start)
            ):
                text = rep + text
            if not self.split:
                if text:
                    out.append((text, at_start))
                continue
            spans = [(m.start(), m.end()) for m in re.finditer(re.escape(rep), text)]
            pieces = _apply_behavior(text, _events_from_spans(len(text), spans, False), "merged_with_next")
            first = at_start
            for piece in pieces:
                out.append((piece, first))
                first = False
        return out


class SequencePreTokenizer(PreTokenizer):
    def __init__(self, steps: Sequence[PreTokenizer]):
        self.steps = list(steps)

    def __call__(self, splits: list[Split]) -> list[Split]:
        for step in self.steps:
            splits = step(splits)
        return splits


def _normalize_behavior(name: str) -> str:
    key = re.sub(r"(?<!^)(?=[A-Z])", "_", str(name)).lower()
    if key not in _BEHAVIORS:
        raise TokenizerError(f"unknown split behavior {name!r}; expected one of {_BEHAVIORS}")
    return key


def _pattern_of(spec, where: str) -> tuple[str, bool]:
    """A tokenizer.json pattern object {"Regex": ...} / {"String": ...} -> (pattern, is_literal)."""
    if isinstance(spec, dict) and "Regex" in spec:
        return spec["Regex"], False
    if isinstance(spec, dict) and "String" in spec:
        return spec["String"], True
    if isinstance(spec, str):
        return spec, True
    raise TokenizerError(f"{where}: pattern must be {{'Regex': ...}} or {{'String': ...}}, got {spec!r}")


def pre_tokenizer_from_json(spec: dict | None) -> PreTokenizer | None:
    """Build a pre-tokenizer from a tokenizer.json `pre_tokenizer` object."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "ByteLevel":
        return ByteLevel(spec.get("add_prefix_space", True), spec.get("use_regex", True))
    if kind == "Split":
        pattern, literal = _pattern_of(spec.get("pattern"), "pre_tokenizer Split")
        return RegexSplit(pattern, spec.get("behavior", "Isolated"), spec.get("invert", False), literal)
    if kind == "Digits":
        return Digits(spec.get("individual_digits", False))
    if kind == "Metaspace":
        scheme = spec.get("prepend_scheme")
        if scheme is None:
            scheme = "always" if spec.get("add_prefix_space", True) else "never"
        return Metaspace(spec.get("replacement", "\u2581"), scheme, spec.get("split", True))
    if kind == "Whitespace":
        # HF Whitespace: keep the matches of \w+|[^\w\s]+, drop what lies between them.
        return RegexSplit(r"\w+|[^\w\s]+", "removed", invert=True)
    if kind == "WhitespaceSplit":
        return RegexSplit(r"\s+", "removed")
    if kind == "Sequence":
        return SequencePreTokenizer([pre_tokenizer_from_json(s) for s in spec.get("pretokenizers", [])])
    raise TokenizerError(f"unsupported pre_tokenizer type {kind!r} in tokenizer.json")


# llama.cpp `tokenizer.ggml.pre` -> how the text is split before byte-level BPE. Each entry is the list of
# patterns llama.cpp applies in sequence (each later pattern splits the pieces of the earlier ones).
_SMOLLM = [r"\p{N}", GPT2_PATTERN]
GGUF_PRE_TOKENIZERS: dict[str, list[str]] = {
    "default": [GPT2_PATTERN],
    "gpt2": [GPT2_PATTERN],
    "gpt-2": [GPT2_PATTERN],
    "mpt": [GPT2_PATTERN],
    "olmo": [GPT2_PATTERN],
    "jais": [GPT2_PATTERN],
    "trillion": [GPT2_PATTERN],
    "smollm": _SMOLLM,
    "starcoder": _SMOLLM,
    "refact": _SMOLLM,
    "command-r": _SMOLLM,
    "codeshell": _SMOLLM,
    "exaone": _SMOLLM,
    "minerva-7b": _SMOLLM,
    "llama3": [LLAMA3_PATTERN],
    "llama-v3": [LLAMA3_PATTERN],
    "llama-bpe": [LLAMA3_PATTERN],
    "falcon3": [LLAMA3_PATTERN],
    "falcon-h1": [LLAMA3_PATTERN],
    "pixtral": [LLAMA3_PATTERN],
    "dbrx": [LLAMA3_PATTERN],
    "smaug-bpe": [LLAMA3_PATTERN],
    "lfm2": [LLAMA3_PATTERN],
    "qwen2": [QWEN2_PATTERN],
    "deepseek-r1-qwen": [QWEN2_PATTERN],
    "megrez": [QWEN2_PATTERN],
    "tekken": [TEKKEN_PATTERN],
    "gpt-4o": [GPT4O_PATTERN],
    "llama4": [GPT4O_PATTERN],
}


def gguf_byte_level_pre_tokenizer(pre: str | None) -> PreTokenizer:
    """The pre-tokenizer for a byte-level ("gpt2") GGUF vocabulary, from `tokenizer.ggml.pre`.

    The GPT-2 pattern is applied by HF's ByteLevel (regex + byte spelling); any earlier patterns are
    isolating splits, as llama.cpp applies them. E.g. "smollm" = [Digits(individual), ByteLevel], which is
    exactly the pre-tokenizer of SmolLM2's own tokenizer.json.
    """
    name = pre or "default"
    patterns = GGUF_PRE_TOKENIZERS.get(name)
    if patterns is None:
        raise TokenizerError(
            f"tokenizer.ggml.pre = {name!r} is not a known pre-tokenizer; known: {sorted(GGUF_PRE_TOKENIZERS)}"
        )
    steps: list[PreTokenizer] = []
    for pattern in patterns[:-1]:
        steps.append(Digits(True) if pattern == r"\p{N}" else RegexSplit(pattern))
    if patterns[-1] == GPT2_PATTERN:
        steps.append(ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [RegexSplit(patterns[-1]), ByteLevel(add_prefix_space=False, use_regex=False)]
    return steps[0] if len(steps) == 1 else SequencePreTokenizer(steps)


# --- normalizers ------------------------------------------------------------------------------------


class Normalizer:
    def __call__(self, text: str) -> str:
        raise NotImplementedError


class UnicodeNormalizer(Normalizer):
    def __init__(self, form: str):
        self.form = form

    def __call__(self, text: str) -> str:
        return unicodedata.normalize(self.form, text)


class Lowercase(Normalizer):
    def __call__(self, text: str) -> str:
        return text.lower()


class Replace(Normalizer):
    def __init__(self, pattern: str, content: str, literal: bool):
        self.pattern, self.content, self.literal = pattern, content, literal
        self._regex = None if literal else compile_pattern(pattern)

    def __call__(self, text: str) -> str:
        if self.literal:
            return text.replace(self.pattern, self.content)
        out, prev = [], 0
        for m in self._regex.finditer(project(text)):
            out += [text[prev : m.start()], self.content]
            prev = m.end()
        out.append(text[prev:])
        return "".join(out)


class Prepend(Normalizer):
    def __init__(self, prepend: str):
        self.prepend = prepend

    def __call__(self, text: str) -> str:
        return self.prepend + text if text else text


class Strip(Normalizer):
    def __init__(self, left: bool, right: bool):
        self.left, self.right = left, right

    def __call__(self, text: str) -> str:
        start, end = 0, len(text)
        if self.left:
            while start < end and is_whitespace(text[start]):
                start += 1
        if self.right:
            while end > start and is_whitespace(text[end - 1]):
                end -= 1
        return text[start:end]


class SequenceNormalizer(Normalizer):
    def __init__(self, steps: Sequence[Normalizer]):
        self.steps = list(steps)

    def __call__(self, text: str) -> str:
        for step in self.steps:
            text = step(text)
        return text


def normalizer_from_json(spec: dict | None) -> Normalizer | None:
    """Build a normalizer from a tokenizer.json `normalizer` object."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return UnicodeNormalizer(kind)
    if kind == "Lowercase":
        return Lowercase()
    if kind == "Replace":
        pattern, literal = _pattern_of(spec.get("pattern"), "normalizer Replace")
        return Replace(pattern, spec.get("content", ""), literal)
    if kind == "Prepend":
        return Prepend(spec.get("prepend", ""))
    if kind == "Strip":
        return Strip(spec.get("strip_left", True), spec.get("strip_right", True))
    if kind == "Sequence":
        return SequenceNormalizer([normalizer_from_json(s) for s in spec.get("normalizers", [])])
    raise TokenizerError(f"unsupported normalizer type {kind!r} in tokenizer.json")
