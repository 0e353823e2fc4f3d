"""Added / special tokens: found in the input text and emitted whole, before any pre-tokenization.

Matches HF `tokenizers`' AddedVocabulary: leftmost-longest, non-overlapping matches; tokens flagged
`normalized=False` are matched on the raw text, the others on the normalized text; `lstrip` / `rstrip`
swallow neighbouring whitespace and `single_word` only matches outside words. Pure standard library.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from webdrift.tokenizer.unicode_classes import is_whitespace, is_word_char


@dataclass(frozen=True)
class AddedToken:
    """One added token, as in a tokenizer.json `added_tokens` entry."""

    content: str
    id: int
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False
    single_word: bool = False


class AddedTokenMatcher:
    """Leftmost-longest matcher over a fixed set of token strings."""

    def __init__(self, tokens: Sequence[AddedToken], normalize: Callable[[str], str] | None = None) -> None:
        self._by_text: dict[str, AddedToken] = {}
        for token in tokens:
            text = normalize(token.content) if (normalize is not None and token.normalized) else token.content
            if text:
                self._by_text[text] = token
        lengths: dict[str, set[int]] = {}
        for text in self._by_text:
            lengths.setdefault(text[0], set()).add(len(text))
        self._lengths = {first: sorted(ls, reverse=True) for first, ls in lengths.items()}
        self._first = (
            re.compile("[" + "".join(re.escape(c) for c in sorted(lengths)) + "]") if lengths else None
        )

    def __bool__(self) -> bool:
        return self._first is not None

    def _find_iter(self, text: str) -> Iterator[tuple[int, int, AddedToken]]:
        search, lengths, by_text = self._first.search, self._lengths, self._by_text  # type: ignore[union-attr]
        pos = 0
        while True:
            m = search(text, pos)
            if m is None:
                return
            i = m.start()
            for length in lengths[text[i]]:
                token = by_text.get(text[i : i + length])
                if token is not None:
                    yield i, i + length, token
                    pos = i + length
                    break
            else:
                pos = i + 1

    def split(self, text: str) -> list[tuple[int, int, AddedToken | None]]:
        """(start, end, token-or-None) pieces covering `text` in order (end may overlap after rstrip)."""
        if self._first is None or not text:
            return [(0, len(text), None)] if text else []
        out: list[tuple[int, int, AddedToken | None]] = []
        offset = 0
        for start, stop, token in self._find_iter(text):
            if token.single_word:
                before_ok = start == 0 or not is_word_char(text[start - 1])
                after_ok = stop == len(text) or not is_word_char(text[stop])
                if not (before_ok and after_ok):
                    continue
            if token.lstrip:
                new_start = start
                while new_start > 0 and is_whitespace(text[new_start - 1]):
                    new_start -= 1
                start = max(new_start, offset)
            if token.rstrip:
                while stop < len(text) and is_whitespace(text[stop]):
                    stop += 1
            if offset < start:
                out.append((offset, start, None))
            out.append((start, stop, token))
            offset = stop
        if offset < len(text):
            out.append((offset, len(text), None))
        return out
