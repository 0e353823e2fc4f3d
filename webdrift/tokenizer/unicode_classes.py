"""Unicode character classes for pre-tokenizer regexes, without the `regex` module.

Pre-tokenizer patterns (GPT-2, Llama 3, Qwen2, ...) are written with `\\p{L}`, `\\p{N}` and Oniguruma's
`\\s`, which Python's `re` cannot express. Instead of scanning text character by character in Python,
each text is *projected* onto a small alphabet: ASCII stays itself, a few non-ASCII letters that case-fold
to ASCII stay themselves (so `(?i:'s)` still matches "'\u017f" as in Oniguruma), and every other character
becomes one private-use representative per Unicode general category. A pattern is rewritten once into a
plain `re` pattern over that alphabet (see `translate_pattern`); `re` then matches the projected text in
C, and the match spans are the spans in the original text (the projection is one character to one).

Categories come from `unicodedata` (cached per character). HF `tokenizers` (the reference) uses newer
Unicode tables than CPython 3.11's (14.0): the code points it knows as letters/numbers but Python does not
are listed in `_NEWER_LETTERS_NUMBERS` (measured against tokenizers 0.23 / Oniguruma, Unicode 16), and
the Digits pre-tokenizer (Rust `char::is_numeric`, Unicode 17) adds `_RUST_EXTRA_NUMERIC`. They are used
only when the running Python reports the code point as unassigned ("Cn").

Pure standard library: this runs unchanged under Pyodide. It must not import `regex`, numpy or tokenizers.
"""

from __future__ import annotations

import bisect
import re
import unicodedata

from webdrift.errors import TokenizerError

# Oniguruma's Unicode \s and Rust's char::is_whitespace (the same set): Python's str.isspace() also
# counts U+001C..U+001F, which neither does.
_WHITESPACE_EXTRA = frozenset("\t\n\x0b\x0c\r \x85")

# (first, last, class) for code points unassigned in Unicode 14 that HF tokenizers' Oniguruma classes as
# \p{L} ('L') or \p{N} ('N'). Only consulted when unicodedata says "Cn".
_NEWER_LETTERS_NUMBERS: tuple[tuple[int, int, str], ...] = (
    (0x01C89, 0x01C8A, "L"),
    (0x0A7CB, 0x0A7CD, "L"),
    (0x0A7DA, 0x0A7DC, "L"),
    (0x105C0, 0x105F3, "L"),
    (0x10D40, 0x10D49, "N"),
    (0x10D4A, 0x10D65, "L"),
    (0x10D6F, 0x10D85, "L"),
    (0x10EC2, 0x10EC4, "L"),
    (0x1123F, 0x11240, "L"),
    (0x11380, 0x11389, "L"),
    (0x1138B, 0x1138B, "L"),
    (0x1138E, 0x1138E, "L"),
    (0x11390, 0x113B5, "L"),
    (0x113B7, 0x113B7, "L"),
    (0x113D1, 0x113D1, "L"),
    (0x113D3, 0x113D3, "L"),
    (0x116D0, 0x116E3, "N"),
    (0x11BC0, 0x11BE0, "L"),
    (0x11BF0, 0x11BF9, "N"),
    (0x11F02, 0x11F02, "L"),
    (0x11F04, 0x11F10, "L"),
    (0x11F12, 0x11F33, "L"),
    (0x11F50, 0x11F59, "N"),
    (0x1342F, 0x1342F, "L"),
    (0x13441, 0x13446, "L"),
    (0x13460, 0x143FA, "L"),
    (0x16100, 0x1611D, "L"),
    (0x16130, 0x16139, "N"),
    (0x16D40, 0x16D6C, "L"),
    (0x16D70, 0x16D79, "N"),
    (0x18CFF, 0x18CFF, "L"),
    (0x1B132, 0x1B132, "L"),
    (0x1B155, 0x1B155, "L"),
    (0x1CCF0, 0x1CCF9, "N"),
    (0x1D2C0, 0x1D2D3, "N"),
    (0x1DF25, 0x1DF2A, "L"),
    (0x1E030, 0x1E06D, "L"),
    (0x1E4D0, 0x1E4EB, "L"),
    (0x1E4F0, 0x1E4F9, "N"),
    (0x1E5D0, 0x1E5ED, "L"),
    (0x1E5F0, 0x1E5F0, "L"),
    (0x1E5F1, 0x1E5FA, "N"),
    (0x2B739, 0x2B739, "L"),
    (0x2EBF0, 0x2EE5D, "L"),
    (0x31350, 0x323AF, "L"),
)
_NEWER_STARTS = [r[0] for r in _NEWER_LETTERS_NUMBERS]

# Numeric for Rust's char::is_numeric (HF's Digits pre-tokenizer) but not yet for Oniguruma.
_RUST_EXTRA_NUMERIC: tuple[tuple[int, int], ...] = ((0x11DE0, 0x11DE9), (0x16FF4, 0x16FF6))

_CATEGORIES = (
    "Lu",
    "Ll",
    "Lt",
    "Lm",
    "Lo",
    "Mn",
    "Mc",
    "Me",
    "Nd",
    "Nl",
    "No",
    "Pc",
    "Pd",
    "Ps",
    "Pe",
    "Pi",
    "Pf",
    "Po",
    "Sm",
    "Sc",
    "Sk",
    "So",
    "Zs",
    "Zl",
    "Zp",
    "Cc",
    "Cf",
    "Cs",
    "Co",
    "Cn",
)
# One private-use representative per category, plus one for U+0085 (a control that is whitespace).
_REP = {cat: chr(0xE000 + i) for i, cat in enumerate(_CATEGORIES)}
_REP_NEL = chr(0xE000 + len(_CATEGORIES))
# Non-ASCII characters that Python's `re` and Oniguruma case-fold to an ASCII letter: they keep their
# identity in the projection so case-insensitive groups like (?i:'s|'t) behave as in HF.
_KEEP = ("\u017f", "\u212a")  # LATIN SMALL LETTER LONG S (s), KELVIN SIGN (k)


def category(ch: str) -> str:
    """General category of `ch`, with the newer-Unicode letters/numbers HF knows filled in."""
    cat = unicodedata.category(ch)
    if cat == "Cn":
        cp = ord(ch)
        i = bisect.bisect_right(_NEWER_STARTS, cp) - 1
        if i >= 0:
            first, last, kind = _NEWER_LETTERS_NUMBERS[i]
            if first <= cp <= last:
                return {"L": "Lo", "N": "Nd"}.get(kind, kind)
    return cat


def is_whitespace(ch: str) -> bool:
    """Oniguruma's Unicode `\\s` / Rust's `char::is_whitespace`."""
    return ch in _WHITESPACE_EXTRA or (ch > "\x7f" and unicodedata.category(ch) in ("Zs", "Zl", "Zp"))


def is_numeric(ch: str) -> bool:
    """Rust's `char::is_numeric` (general category N*), as used by HF's Digits pre-tokenizer."""
    if category(ch)[0] == "N":
        return True
    cp = ord(ch)
    return any(first <= cp <= last for first, last in _RUST_EXTRA_NUMERIC)


def is_word_char(ch: str) -> bool:
    """Letters, marks, numbers and connector punctuation (used for single_word added tokens)."""
    return ch == "_" or category(ch)[0] in "LMN"


# --- projection -------------------------------------------------------------------------------------

_PROJECTION: dict[int, str] = {ord(c): c for c in _KEEP}  # ord -> representative, filled as text arrives
_PROJECTION_LIMIT = 1 << 18


def _representative(ch: str) -> str:
    if ch == "\x85":
        return _REP_NEL
    return _REP[category(ch)]


def project(text: str) -> str:
    """Map `text` one character to one onto the projected alphabet (see the module docstring)."""
    if text.isascii():
        return text
    table = _PROJECTION
    if len(table) > _PROJECTION_LIMIT:
        table.clear()
        table.update({ord(c): c for c in _KEEP})
    for ch in set(text):
        if ch > "\x7f" and ord(ch) not in table:
            table[ord(ch)] = _representative(ch)
    return text.translate(table)


def _alphabet() -> list[tuple[str, str, bool]]:
    """Every character a projected text can contain: (char, category, is_whitespace)."""
    out = [(chr(i), unicodedata.category(chr(i)), is_whitespace(chr(i))) for i in range(128)]
    out += [(c, unicodedata.category(c), False) for c in _KEEP]
    out += [(rep, cat, cat in ("Zs", "Zl", "Zp")) for cat, rep in _REP.items()]
    out.append((_REP_NEL, "Cc", True))
    return out


_ALPHABET = _alphabet()

_PROPERTY_ALIASES = {
    "Letter": "L",
    "Mark": "M",
    "Number": "N",
    "Punctuation": "P",
    "Symbol": "S",
    "Separator": "Z",
    "Other": "C",
    "Lowercase_Letter": "Ll",
    "Uppercase_Letter": "Lu",
    "Titlecase_Letter": "Lt",
    "Modifier_Letter": "Lm",
    "Other_Letter": "Lo",
    "Decimal_Number": "Nd",
    "Nonspacing_Mark": "Mn",
    "Spacing_Mark": "Mc",
    "Enclosing_Mark": "Me",
    "Letter_Number": "Nl",
    "Other_Number": "No",
}


def _property_test(name: str, pattern: str):
    name = _PROPERTY_ALIASES.get(name, name)
    if name in ("L", "M", "N", "P", "S", "Z", "C"):
        return lambda cat, ws: cat[0] == name
    if name in _CATEGORIES:
        return lambda cat, ws: cat == name
    raise TokenizerError(f"pre-tokenizer regex {pattern!r}: unsupported Unicode property \\p{{{name}}}")


_SHORTHAND = {
    "s": lambda cat, ws: ws,
    "d": lambda cat, ws: cat == "Nd",
    "w": lambda cat, ws: cat[0] in "LM" or cat in ("Nd", "Pc"),
}
_CONTROL_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\x0c", "v": "\x0b", "a": "\x07", "e": "\x1b"}


def _class_text(chars: set[str]) -> str:
    return "[" + "".join(re.escape(c) for c in sorted(chars)) + "]"


class _PatternTranslator:
    """Rewrites an Oniguruma-syntax pattern into a Python `re` pattern over the projected alphabet."""

    def __init__(self, pattern: str) -> None:
        self.src = pattern
        self.pos = 0

    def fail(self, what: str) -> TokenizerError:
        return TokenizerError(f"pre-tokenizer regex {self.src!r}: {what} (at offset {self.pos})")

    def _escape(self, in_class: bool):
        """Parse the escape at self.pos (just after the backslash). Returns ('test', fn) or ('char', c)."""
        src = self.src
        if self.pos >= len(src):
            raise self.fail("dangling backslash")
        c = src[self.pos]
        self.pos += 1
        if c in "pP":
            negate = c == "P"
            if self.pos < len(src) and src[self.pos] == "{":
                end = src.find("}", self.pos)
                if end < 0:
                    raise self.fail("unterminated \\p{")
                name = src[self.pos + 1 : end]
                self.pos = end + 1
            else:
                name = src[self.pos]
                self.pos += 1
            if name.startswith("^"):
                negate, name = not negate, name[1:]
            test = _property_test(name, self.src)
            return ("test", (lambda cat, ws, t=test: not t(cat, ws)) if negate else test)
        if c in "sdw":
            return ("test", _SHORTHAND[c])
        if c in "SDW":
            t = _SHORTHAND[c.lower()]
            return ("test", lambda cat, ws, t=t: not t(cat, ws))
        if c in _CONTROL_ESCAPES:
            return ("char", _CONTROL_ESCAPES[c])
        if c == "x":
            if src.startswith("{", self.pos):
                end = src.index("}", self.pos)
                code, self.pos = src[self.pos + 1 : end], end + 1
            else:
                code, self.pos = src[self.pos : self.pos + 2], self.pos + 2
            return ("char", chr(int(code, 16)))
        if c == "u":
            code, self.pos = src[self.pos : self.pos + 4], self.pos + 4
            return ("char", chr(int(code, 16)))
        if c.isalnum():
            raise self.fail(f"unsupported escape \\{c}")
        return ("char", c)

    def _char_set(self, item) -> set[str]:
        kind, value = item
        if kind == "test":
            return {ch for ch, cat, ws in _ALPHABET if value(cat, ws)}
        return {self._literal(value)}

    def _literal(self, ch: str) -> str:
        if ch.isascii() or ch in _KEEP:
            return ch
        raise self.fail(f"non-ASCII literal {ch!r} is not supported")

    def _class(self) -> str:
        """Parse a bracket class starting just after '['."""
        src = self.src
        negate = src.startswith("^", self.pos)
        if negate:
            self.pos += 1
        chars: set[str] = set()
        first = True
        while True:
            if self.pos >= len(src):
                raise self.fail("unterminated character class")
            c = src[self.pos]
            if c == "]" and not first:
                self.pos += 1
                break
            first = False
            if c == "[":
                raise self.fail("nested character classes are not supported")
            self.pos += 1
            item = self._escape(True) if c == "\\" else ("char", c)
            if (
                item[0] == "char"
                and src.startswith("-", self.pos)
                and self.pos + 1 < len(src)
                and src[self.pos + 1] != "]"
            ):
                self.pos += 1
                hi = src[self.pos]
                self.pos += 1
                if hi == "\\":
                    kind, hi = self._escape(True)
                    if kind != "char":
                        raise self.fail("bad range in character class")
                lo_ch, hi_ch = item[1], hi
                if not (lo_ch.isascii() and hi_ch.isascii()):
                    raise self.fail("non-ASCII ranges are not supported")
                chars |= {chr(i) for i in range(ord(lo_ch), ord(hi_ch) + 1)}
                continue
            chars |= self._char_set(item)
        if negate:
            chars = {ch for ch, _, _ in _ALPHABET} - chars
        if not chars:
            return "(?!)"
        return _class_text(chars)

    def translate(self) -> str:
        out = []
        src = self.src
        while self.pos < len(src):
            c = src[self.pos]
            self.pos += 1
            if c == "\\":
                item = self._escape(False)
                if item[0] == "test":
                    out.append(_class_text(self._char_set(item)))
                else:
                    out.append(re.escape(self._literal(item[1])))
            elif c == "[":
                out.append(self._class())
            elif c.isascii():
                out.append(c)
            else:
                out.append(re.escape(self._literal(c)))
        return "".join(out)


_COMPILED: dict[str, re.Pattern[str]] = {}


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile an Oniguruma-style pattern (as found in tokenizer.json / llama.cpp) for projected text."""
    compiled = _COMPILED.get(pattern)
    if compiled is None:
        translated = _PatternTranslator(pattern).translate()
        try:
            compiled = re.compile(translated)
        except re.error as exc:
            raise TokenizerError(f"pre-tokenizer regex {pattern!r} cannot be compiled: {exc}") from exc
        _COMPILED[pattern] = compiled
    return compiled
