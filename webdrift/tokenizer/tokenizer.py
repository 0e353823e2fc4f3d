"""`Tokenizer`: text <-> token ids for the models webdrift runs, equal to HF `tokenizers` id for id.

Pipeline of `encode` (HF's order): split out added/special tokens on the raw text -> normalize the rest
-> split out normalized added tokens -> pre-tokenize into words -> BPE each word -> add BOS/EOS.
`decode` maps ids to token strings and runs the model's decoder chain; `stream_decoder` does the same
incrementally. Pure standard library (+ jinja2 for chat templates): runs unchanged in Pyodide.
"""

from __future__ import annotations

from typing import Any

from webdrift.errors import InvalidArgumentError, InvalidTextError, TokenizerError
from webdrift.tokenizer.added_tokens import AddedTokenMatcher
from webdrift.tokenizer.chat import ChatTemplate
from webdrift.tokenizer.decode import StreamDecoder
from webdrift.tokenizer.loaders import TokenizerParts, parts_from_gguf_metadata, parts_from_tokenizer_json


class Tokenizer:
    """A model's tokenizer. Build it with `from_gguf_metadata` or `from_tokenizer_json`."""

    def __init__(self, parts: TokenizerParts) -> None:
        self.name = parts.name
        self._tokens = parts.tokens
        self._vocab = parts.vocab
        self._model = parts.model
        self._normalizer = parts.normalizer
        self._pre_tokenizer = parts.pre_tokenizer
        self._decoder = parts.decoder
        self._raw_added = AddedTokenMatcher([t for t in parts.added if not t.normalized])
        self._normalized_added = AddedTokenMatcher([t for t in parts.added if t.normalized], parts.normalizer)
        self._special_ids = frozenset(t.id for t in parts.added if t.special)
        self._added_text = {t.id: t.content for t in parts.added}
        self._prefix_ids = list(parts.prefix_ids)
        self._suffix_ids = list(parts.suffix_ids)
        self.vocab_size: int = len(parts.tokens)
        self.bos_token_id: int | None = parts.bos_token_id
        self.eos_token_id: int | None = parts.eos_token_id
        self.eos_token_ids: list[int] = list(parts.eos_token_ids)
        self.chat_template: str | None = parts.chat_template
        self._special_token_strings = parts.special_token_strings
        self._compiled_template: ChatTemplate | None = None

    # -- construction -----------------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: dict) -> Tokenizer:
        """From a GGUF file's key/value metadata (tokenizer.ggml.* keys; values as python lists/scalars)."""
        return cls(parts_from_gguf_metadata(metadata))

    @classmethod
    def from_tokenizer_json(
        cls, tokenizer_json: str | dict, tokenizer_config: dict | None = None, *, name: str | None = None
    ) -> Tokenizer:
        """From an HF tokenizer.json (path or parsed dict) and optionally its tokenizer_config.json dict.

        BOS/EOS come from tokenizer.json's post-processor, unless tokenizer_config sets add_bos_token /
        add_eos_token explicitly (then those win, with its bos_token / eos_token). The config also gives
        bos/eos token ids and the chat template."""
        return cls(parts_from_tokenizer_json(tokenizer_json, tokenizer_config, name))

    # -- BOS -------------------------------------------------------------------------------------------

    @property
    def add_bos(self) -> bool:
        """Whether encode(add_special_tokens=True) prepends BOS (the model's own setting)."""
        return self.bos_token_id is not None and self._prefix_ids[:1] == [self.bos_token_id]

    @add_bos.setter
    def add_bos(self, value: bool) -> None:
        if value and not self.add_bos:
            if self.bos_token_id is None:
                raise InvalidArgumentError(f"add_bos: {self.name} has no BOS token")
            self._prefix_ids.insert(0, self.bos_token_id)
        elif not value and self.add_bos:
            del self._prefix_ids[0]

    # -- encode ------------------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special-token text in `text` (e.g. "<|im_end|>") becomes its single id."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"encode: text must be a str, got {type(text).__name__}")
        check_text(text, "encode: the text")
        ids: list[int] = list(self._prefix_ids) if add_special_tokens else []
        for start, end, token in self._raw_added.split(text):
            if token is not None:
                ids.append(token.id)
                continue
            segment = text[start:end]
            if self._normalizer is not None:
                segment = self._normalizer(segment)
            if self._normalized_added:
                for s, e, tok in self._normalized_added.split(segment):
                    if tok is not None:
                        ids.append(tok.id)
                    else:
                        self._encode_plain(segment[s:e], start == 0 and s == 0, ids)
            else:
                self._encode_plain(segment, start == 0, ids)
        if add_special_tokens:
            ids += self._suffix_ids
        return ids

    def _encode_plain(self, text: str, at_start: bool, out: list[int]) -> None:
        if not text:
            return
        tokenize = self._model.tokenize
        if self._pre_tokenizer is None:
            out.extend(tokenize(text))
            return
        for word, _ in self._pre_tokenizer([(text, at_start)]):
            out.extend(tokenize(word))

    # -- decode ------------------------------------------------------------------------------------------

    def _check_id(self, token_id: Any, what: str) -> int:
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            try:
                import operator

                token_id = operator.index(token_id)  # numpy integers
            except TypeError:
                raise InvalidArgumentError(f"{what}: token id {token_id!r} is not an int") from None
        if not 0 <= token_id < self.vocab_size:
            raise InvalidArgumentError(
                f"{what}: token id {token_id} is out of range for {self.name} (vocab_size {self.vocab_size})"
            )
        return token_id

    def _token_text(self, token_id: int, skip_special_tokens: bool) -> str | None:
        if skip_special_tokens and token_id in self._special_ids:
            return None
        text = self._added_text.get(token_id)
        return text if text is not None else self._tokens[token_id]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids` (HF `tokenizer.decode`; invalid UTF-8 becomes U+FFFD as in HF)."""
        if isinstance(ids, (str, bytes)):
            raise InvalidArgumentError(f"decode: ids must be a list of ints, got {type(ids).__name__}")
        tokens = []
        for i in ids:
            text = self._token_text(self._check_id(i, "decode"), skip_special_tokens)
            if text is not None:
                tokens.append(text)
        return self._decoder.decode(tokens)

    def stream_decoder(self, skip_special_tokens: bool = False) -> StreamDecoder:
        """An incremental decoder: pieces it returns concatenate to `decode(all ids)`."""

        def token_text(token_id: int) -> str | None:
            return self._token_text(self._check_id(token_id, "stream_decoder.push"), skip_special_tokens)

        return StreamDecoder(self._decoder, token_text, lambda ids: self.decode(ids, skip_special_tokens))

    # -- vocabulary -----------------------------------------------------------------------------------------

    def id_to_piece(self, i: int) -> str:
        """The token's text as stored in the vocabulary (e.g. "Ġthe", "▁the", "<0x0A>")."""
        i = self._check_id(i, "id_to_piece")
        return self._tokens[i]

    def token_to_id(self, s: str) -> int | None:
        """Id of a token given its vocabulary text, or None."""
        if not isinstance(s, str):
            raise InvalidArgumentError(f"token_to_id: expected a str, got {type(s).__name__}")
        return self._vocab.get(s)

    # -- chat ----------------------------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kw: Any) -> str:
        """Render `messages` with the model's chat template (as transformers' apply_chat_template with
        tokenize=False). Extra keyword arguments become template variables."""
        if self.chat_template is None:
            raise TokenizerError(f"{self.name} has no chat template; use plain-text prompts with this model")
        check_messages(messages)
        if self._compiled_template is None:
            if not _is_valid(self.chat_template):
                raise TokenizerError(f"{self.name}: the chat template in the model file is not valid UTF-8 text")
            self._compiled_template = ChatTemplate(self.chat_template, self.name, self._special_token_strings)
        return self._compiled_template.render(messages, add_generation_prompt=add_generation_prompt, **kw)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, add_bos={self.add_bos})"


def _is_valid(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def check_text(text: str, what: str) -> None:
    """InvalidTextError naming the first lone surrogate of `text` (a str that is not valid Unicode:
    argv or a file decoded with surrogateescape from bytes that were not UTF-8, or a JSON "\\udXXX"
    escape). Every other str tokenizes."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidTextError(
            f"{what} is not valid Unicode: character {e.start} is U+{ord(text[e.start]):04X}, a lone surrogate "
            "(text decoded from bytes that are not UTF-8?)") from None


def check_messages(messages: Any) -> None:
    """A conversation: a list of {"role": str, "content": str, ...} dicts of valid text, else
    InvalidArgumentError (InvalidTextError for invalid text) naming the message and the field."""
    if not isinstance(messages, (list, tuple)):
        raise InvalidArgumentError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, "
                                   f"got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidArgumentError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        for key in ("role", "content"):
            v = m.get(key)
            if not isinstance(v, str):
                raise InvalidArgumentError(f"messages[{i}][{key!r}] must be a str, got {type(v).__name__}")
            check_text(v, f"messages[{i}][{key!r}]")
