"""Decoders (token strings -> text) with HF `tokenizers` semantics, and the streaming decoder.

`Decoder` is HF's decoder chain: each step maps a list of token strings to a list of strings, and the
result is their concatenation. Supported steps: ByteLevel, ByteFallback, Replace, Fuse, Strip, Metaspace
and Sequence of these.

`StreamDecoder` turns token ids into text as they arrive, holding back what the next token could still
change (an incomplete UTF-8 sequence, a run of `<0xXX>` byte tokens, a leading space that `Strip` may
remove), so that the concatenation of everything it returns equals `Decoder.decode` of all the ids.
Pure standard library; must not import numpy or tokenizers.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Sequence

from webdrift.errors import TokenizerError
from webdrift.tokenizer.pretokenize import CHAR_TO_BYTE, utf8_bytes
from webdrift.tokenizer.unicode_classes import compile_pattern, project

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_token_value(token: str) -> int | None:
    """The byte a `<0xXX>` byte-fallback token stands for, else None (HF: 6 chars, hex)."""
    if len(token) == 6:
        m = _BYTE_TOKEN.fullmatch(token)
        if m:
            return int(m.group(1), 16)
    return None


def byte_level_bytes(token: str) -> bytes:
    """HF ByteLevel decoding of one token: its byte-level characters as bytes, or its UTF-8 if it has
    a character outside the byte alphabet (e.g. an added token with a space)."""
    try:
        return bytes([CHAR_TO_BYTE[c] for c in token])
    except KeyError:
        return utf8_bytes(token)


def valid_text(text: str) -> str:
    """`text` with every lone surrogate replaced as UTF-8 decoding with errors="replace" would
    (a surrogate-escaped byte -> U+FFFD): what a vocabulary token that is not UTF-8 decodes to,
    so decoded text is always valid Unicode (printable, encodable)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return utf8_bytes(text).decode("utf-8", errors="replace")


class Step:
    kind = ""

    def __call__(self, tokens: list[str]) -> list[str]:
        raise NotImplementedError


class ByteLevelStep(Step):
    kind = "ByteLevel"

    def __call__(self, tokens: list[str]) -> list[str]:
        data = b"".join(byte_level_bytes(t) for t in tokens)
        return [data.decode("utf-8", errors="replace")]


class ByteFallbackStep(Step):
    kind = "ByteFallback"

    def __call__(self, tokens: list[str]) -> list[str]:
        out: list[str] = []
        run = bytearray()
        for token in tokens:
            b = byte_token_value(token)
            if b is not None:
                run.append(b)
                continue
            if run:
                out += _resolve_byte_run(run)
                run.clear()
            out.append(token)
        if run:
            out += _resolve_byte_run(run)
        return out


def _resolve_byte_run(run: bytes) -> list[str]:
    try:
        return [bytes(run).decode("utf-8")]
    except UnicodeDecodeError:
        return ["\ufffd"] * len(run)


class ReplaceStep(Step):
    kind = "Replace"

    def __init__(self, pattern: str, content: str, literal: bool):
        self.pattern, self.content, self.literal = pattern, content, literal
        self._regex = None if literal else compile_pattern(pattern)

    def apply(self, token: str) -> str:
        if self.literal:
            return token.replace(self.pattern, self.content)
        out, prev = [], 0
        for m in self._regex.finditer(project(token)):  # type: ignore[union-attr]
            out += [token[prev : m.start()], self.content]
            prev = m.end()
        out.append(token[prev:])
        return "".join(out)

    def __call__(self, tokens: list[str]) -> list[str]:
        return [self.apply(t) for t in tokens]


class FuseStep(Step):
    kind = "Fuse"

    def __call__(self, tokens: list[str]) -> list[str]:
        return ["".join(tokens)]


class StripStep(Step):
    kind = "Strip"

    def __init__(self, content: str, start: int, stop: int):
        self.content, self.start, self.stop = content, start, stop

    def apply(self, token: str) -> str:
        begin = 0
        while begin < min(self.start, len(token)) and token[begin] == self.content:
            begin += 1
        end = len(token)
        while len(token) - end < self.stop and end > begin and token[end - 1] == self.content:
            end -= 1
        return token[begin:end]

    def __call__(self, tokens: list[str]) -> list[str]:
        return [self.apply(t) for t in tokens]


class MetaspaceStep(Step):
    """HF Metaspace decoder: replacement -> ' ', and the first token loses its replacement chars unless
    the prepend scheme is "never"."""

    kind = "Metaspace"

    def __init__(self, replacement: str, prepend_scheme: str):
        self.replacement, self.prepend_scheme = replacement, prepend_scheme

    def apply(self, token: str, first: bool) -> str:
        if first and self.prepend_scheme != "never":
            return token.replace(self.replacement, "")
        return token.replace(self.replacement, " ")

    def __call__(self, tokens: list[str]) -> list[str]:
        return [self.apply(t, i == 0) for i, t in enumerate(tokens)]


class Decoder:
    """A decoder chain; `decode(tokens)` == HF `decoder.decode(tokens)`."""

    def __init__(self, steps: Sequence[Step]):
        self.steps = list(steps)

    def decode(self, tokens: list[str]) -> str:
        for step in self.steps:
            tokens = step(tokens)
        return valid_text("".join(tokens))


def decoder_from_json(spec: dict | None) -> Decoder:
    """Build a Decoder from a tokenizer.json `decoder` object (None: tokens joined with spaces is HF's
    default; webdrift rejects it because no LLM tokenizer wants it)."""
    if spec is None:
        raise TokenizerError(
            "tokenizer.json has no decoder; webdrift needs ByteLevel or a SentencePiece chain"
        )
    return Decoder(_steps_from_json(spec))


def _steps_from_json(spec: dict) -> list[Step]:
    kind = spec.get("type")
    if kind == "Sequence":
        steps: list[Step] = []
        for sub in spec.get("decoders", []):
            steps += _steps_from_json(sub)
        return steps
    if kind == "ByteLevel":
        return [ByteLevelStep()]
    if kind == "ByteFallback":
        return [ByteFallbackStep()]
    if kind == "Fuse":
        return [FuseStep()]
    if kind == "Strip":
        return [StripStep(spec.get("content", " "), int(spec.get("start", 0)), int(spec.get("stop", 0)))]
    if kind == "Replace":
        pattern = spec.get("pattern")
        if isinstance(pattern, dict) and "String" in pattern:
            return [ReplaceStep(pattern["String"], spec.get("content", ""), True)]
        if isinstance(pattern, dict) and "Regex" in pattern:
            return [ReplaceStep(pattern["Regex"], spec.get("content", ""), False)]
        raise TokenizerError(f"decoder Replace: bad pattern {pattern!r}")
    if kind == "Metaspace":
        scheme = spec.get("prepend_scheme")
        if scheme is None:
            scheme = "always" if spec.get("add_prefix_space", True) else "never"
        return [MetaspaceStep(spec.get("replacement", "\u2581"), scheme)]
    raise TokenizerError(f"unsupported decoder type {kind!r} in tokenizer.json")


# --- streaming ---------------------------------------------------------------------------------------


class StreamDecoder:
    """Incremental detokenizer: `push(id)` returns the new text, `flush()` the held-back rest.

    "".join(push(i) for i in ids) + flush() == tokenizer.decode(ids) (with the same skip_special_tokens).
    Byte-level decoders stream through an incremental UTF-8 decoder (O(1) per token); SentencePiece
    chains hold back byte-fallback runs and a leading space `Strip` may remove. Any other decoder chain
    re-decodes the whole stream per token (exact for prefix-stable decoders, O(n) per token). `flush()`
    ends the stream; the decoder can then be reused for a new one.
    """

    def __init__(
        self,
        decoder: Decoder,
        token_text: Callable[[int], str | None],
        full_decode: Callable[[list[int]], str],
    ) -> None:
        self._token_text = token_text  # id -> token string, or None to skip it (special + skip)
        self._full_decode = full_decode
        self._mode = _stream_mode(decoder)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._byte_run = bytearray()
        self._first_token = True
        self._strip_left = 0
        self._string_strip: StripStep | None = None
        self._per_token: list[Step] = []
        self._fallback_ids: list[int] = []
        self._emitted = 0
        if self._mode == "pieces":
            self._setup_pieces(decoder)

    def _setup_pieces(self, decoder: Decoder) -> None:
        fused = False
        for step in decoder.steps:
            if isinstance(step, FuseStep):
                fused = True
            elif isinstance(step, StripStep) and fused:
                self._string_strip = step
                self._strip_left = step.start
            elif not isinstance(step, ByteFallbackStep):
                self._per_token.append(step)
        self._has_byte_fallback = any(isinstance(s, ByteFallbackStep) for s in decoder.steps)

    def push(self, token_id: int) -> str:
        """Feed one token id; returns the text that is now final (possibly "")."""
        token = self._token_text(token_id)
        if token is None:
            return ""
        if self._mode == "bytes":
            return self._utf8.decode(byte_level_bytes(token))
        if self._mode == "pieces":
            return valid_text(self._push_piece(token))
        return self._push_fallback(token_id)

    def flush(self) -> str:
        """End of stream: return whatever was held back, and reset."""
        if self._mode == "bytes":
            out = self._utf8.decode(b"", final=True)
            self._utf8.reset()
            return out
        if self._mode == "pieces":
            out = ""
            if self._byte_run:
                out = self._emit("".join(_resolve_byte_run(self._byte_run)))
                self._byte_run.clear()
            self._first_token = True
            self._strip_left = self._string_strip.start if self._string_strip else 0
            return valid_text(out)
        full = self._full_decode(self._fallback_ids)
        out = full[self._emitted :]
        self._fallback_ids, self._emitted = [], 0
        return out

    # SentencePiece-style chains: per-token steps, byte-fallback runs, one leading Strip after Fuse.
    def _push_piece(self, token: str) -> str:
        if self._has_byte_fallback:
            b = byte_token_value(token)
            if b is not None:
                self._byte_run.append(b)
                self._first_token = False
                return ""
        text = token
        for step in self._per_token:
            text = (
                step.apply(text, self._first_token) if isinstance(step, MetaspaceStep) else step.apply(text)
            )
        self._first_token = False
        out = ""
        if self._byte_run:
            out = "".join(_resolve_byte_run(self._byte_run))
            self._byte_run.clear()
        return self._emit(out + text)

    def _emit(self, text: str) -> str:
        if self._strip_left and text:
            content = self._string_strip.content  # type: ignore[union-attr]
            i = 0
            while i < len(text) and self._strip_left and text[i] == content:
                i += 1
                self._strip_left -= 1
            if i < len(text):
                self._strip_left = 0
            text = text[i:]
        return text

    def _push_fallback(self, token_id: int) -> str:
        self._fallback_ids.append(token_id)
        full = self._full_decode(self._fallback_ids)
        if full.endswith("\ufffd") or len(full) <= self._emitted:
            return ""
        out = full[self._emitted :]
        self._emitted = len(full)
        return out


def _stream_mode(decoder: Decoder) -> str:
    kinds = [s.kind for s in decoder.steps]
    if kinds == ["ByteLevel"]:
        return "bytes"
    fused = False
    for step in decoder.steps:
        if isinstance(step, ByteLevelStep):
            return "fallback"
        if isinstance(step, FuseStep):
            fused = True
        elif fused and not (isinstance(step, StripStep) and not step.stop):
            return "fallback"  # after Fuse only a leading Strip can be streamed exactly
    return "pieces"
