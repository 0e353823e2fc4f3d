"""Reading tokenizer descriptions: GGUF metadata and HF tokenizer.json (+ tokenizer_config).

Both produce a `TokenizerParts`, which `Tokenizer` runs. The GGUF path mirrors what `transformers`
builds from a GGUF (our reference), except where llama.cpp's reading of `tokenizer.ggml.pre` recovers the
model's real pre-tokenizer and transformers' does not (e.g. "smollm": digits are split one by one, as in
SmolLM2's own tokenizer.json). Every malformed or unsupported input raises TokenizerError naming the
key at fault. Pure standard library; must not import numpy, gguf or tokenizers.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from webdrift.errors import TokenizerError, shown
from webdrift.tokenizer.added_tokens import AddedToken
from webdrift.tokenizer.bpe import BPE
from webdrift.tokenizer.decode import (
    ByteFallbackStep,
    ByteLevelStep,
    Decoder,
    FuseStep,
    ReplaceStep,
    StripStep,
    decoder_from_json,
)
from webdrift.tokenizer.pretokenize import (
    BYTE_TO_CHAR,
    Metaspace,
    Normalizer,
    PreTokenizer,
    Replace,
    byte_level_spelling,
    gguf_byte_level_pre_tokenizer,
    normalizer_from_json,
    pre_tokenizer_from_json,
)

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Special tokens that end a turn, besides the model's EOS (llama.cpp's end-of-generation list).
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "<|return|>",
        "<|call|>",
    }
)

# llama.cpp pre-tokenizer names whose tokenizer.json has "ignore_merges": true (whole-word vocab hits win).
_IGNORE_MERGES_PRE = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken", "llama4"})

_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})


@dataclass
class TokenizerParts:
    """Everything `Tokenizer` needs, independent of the file format it came from."""

    name: str
    tokens: list[str]  # id -> token text as stored (for id_to_piece / decode)
    vocab: dict[str, int]  # token text -> id (model vocabulary + added tokens)
    model: BPE
    normalizer: Normalizer | None
    pre_tokenizer: PreTokenizer | None
    added: list[AddedToken]
    decoder: Decoder
    prefix_ids: list[int] = field(default_factory=list)  # post-processor: ids put before / after
    suffix_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None
    special_token_strings: dict[str, str | None] = field(default_factory=dict)


def _require(metadata: dict, key: str, kind: type | tuple[type, ...], name: str) -> Any:
    if key not in metadata:
        raise TokenizerError(f"{name}: GGUF metadata has no {key!r}")
    value = metadata[key]
    if not isinstance(value, kind):
        raise TokenizerError(f"{name}: GGUF {key!r} should be {kind}, got {type(value).__name__}")
    return value


def _as_list(value: Any, key: str, name: str, item_type: type) -> list:
    """A GGUF array as a python list of str / int / float (bytes and numpy scalars are accepted)."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TokenizerError(f"{name}: GGUF {key!r} should be a list, got {type(value).__name__}")
    items = list(value)
    kinds = set(map(type, items))
    if kinds <= {item_type}:
        return items
    if item_type is str:
        out = []
        for i, item in enumerate(items):
            if isinstance(item, (bytes, bytearray)):
                try:
                    item = bytes(item).decode("utf-8")
                except UnicodeDecodeError:
                    raise TokenizerError(f"{name}: GGUF {key!r}[{i}] is not UTF-8") from None
            if not isinstance(item, str):
                raise TokenizerError(f"{name}: GGUF {key!r}[{i}] should be a string, got {shown(item)}")
            out.append(item)
        return out
    try:
        if item_type is int:
            return [operator.index(item) for item in items]
        return [float(item) for item in items]
    except (TypeError, ValueError):
        bad = next(i for i, item in enumerate(items) if not isinstance(item, (int, float)))
        raise TokenizerError(
            f"{name}: GGUF {key!r}[{bad}] should be {item_type.__name__}, got {shown(items[bad])}"
        ) from None


def _optional_id(metadata: dict, key: str, n_tokens: int, name: str) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TokenizerError(f"{name}: GGUF {key!r} should be a token id, got {shown(value)}") from None
    if value < 0 or value >= n_tokens:
        # llama.cpp writes -1 / out-of-range for "none" in some files
        return None
    return value


def _end_of_generation_ids(
    tokens: list[str], special_ids: set[int], eos: int | None, extra: Sequence[int | None]
):
    ids = [i for i in [eos, *extra] if i is not None]
    ids += [i for i in sorted(special_ids) if tokens[i] in END_OF_GENERATION_TEXTS]
    return list(dict.fromkeys(ids))


def parts_from_gguf_metadata(metadata: dict) -> TokenizerParts:
    """Build tokenizer parts from GGUF key/value metadata (tokenizer.ggml.* keys, python lists)."""
    if not isinstance(metadata, dict):
        raise TokenizerError(f"GGUF metadata must be a dict, got {type(metadata).__name__}")
    name = next((v[:100] for v in (metadata.get("general.name"), metadata.get("general.basename"))
                 if isinstance(v, str) and v), "GGUF model")
    model_type = _require(metadata, "tokenizer.ggml.model", str, name)
    tokens = _as_list(
        _require(metadata, "tokenizer.ggml.tokens", object, name), "tokenizer.ggml.tokens", name, str
    )
    if not tokens:
        raise TokenizerError(f"{name}: GGUF 'tokenizer.ggml.tokens' is empty")
    n = len(tokens)
    types_raw = metadata.get("tokenizer.ggml.token_type")
    types = _as_list(types_raw, "tokenizer.ggml.token_type", name, int) if types_raw is not None else [1] * n
    if len(types) != n:
        raise TokenizerError(f"{name}: GGUF has {n} tokens but {len(types)} token types")
    arch = str(metadata.get("general.architecture", ""))
    bos = _optional_id(metadata, "tokenizer.ggml.bos_token_id", n, name)
    eos = _optional_id(metadata, "tokenizer.ggml.eos_token_id", n, name)
    unk = _optional_id(metadata, "tokenizer.ggml.unknown_token_id", n, name)
    pad = _optional_id(metadata, "tokenizer.ggml.padding_token_id", n, name)
    eot = _optional_id(metadata, "tokenizer.ggml.eot_token_id", n, name)
    eom = _optional_id(metadata, "tokenizer.ggml.eom_token_id", n, name)
    template = metadata.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{name}: GGUF 'tokenizer.chat_template' should be a string")

    if model_type == "gpt2":
        vocab, model, normalizer, pre, decoder, in_vocab = _gguf_byte_level(metadata, tokens, name)
        default_add_bos = False
    elif model_type == "llama":
        vocab, model, normalizer, pre, decoder, in_vocab = _gguf_sentencepiece(
            metadata, tokens, types, arch, name
        )
        default_add_bos = True
    else:
        raise TokenizerError(
            f"{name}: tokenizer.ggml.model = {shown(model_type)} is not supported (webdrift reads 'gpt2' byte-level "
            "BPE and 'llama' SentencePiece-style BPE)"
        )

    # Control tokens are special added tokens, user-defined ones plain added tokens (as transformers does).
    added: list[AddedToken] = []
    special_ids: set[int] = set()
    for i in [i for i, kind in enumerate(types) if kind == TOKEN_CONTROL or kind == TOKEN_USER_DEFINED]:
        token = tokens[i]
        if types[i] == TOKEN_CONTROL and in_vocab(token, special=True):
            added.append(AddedToken(token, vocab[token], special=True))
            special_ids.add(vocab[token])
        elif types[i] == TOKEN_USER_DEFINED and in_vocab(token, special=False):
            added.append(AddedToken(token, vocab[token], special=False))
    # transformers also registers the named special tokens (bos/eos/unk/pad) as special added tokens
    for tid in (bos, eos, unk, pad):
        if tid is not None and tid not in special_ids and tokens[tid] in vocab and tokens[tid]:
            added.append(AddedToken(tokens[tid], vocab[tokens[tid]], special=True))
            special_ids.add(vocab[tokens[tid]])

    add_bos = metadata.get("tokenizer.ggml.add_bos_token", default_add_bos)
    add_eos = metadata.get("tokenizer.ggml.add_eos_token", False)
    prefix = [bos] if (add_bos and bos is not None) else []
    suffix = [eos] if (add_eos and eos is not None) else []
    strings = {
        "bos_token": tokens[bos] if bos is not None else None,
        "eos_token": tokens[eos] if eos is not None else None,
        "unk_token": tokens[unk] if unk is not None else None,
        "pad_token": tokens[pad] if pad is not None else None,
    }
    return TokenizerParts(
        name=name,
        tokens=tokens,
        vocab=vocab,
        model=model,
        normalizer=normalizer,
        pre_tokenizer=pre,
        added=added,
        decoder=decoder,
        prefix_ids=prefix,
        suffix_ids=suffix,
        bos_token_id=bos,
        eos_token_id=eos,
        eos_token_ids=_end_of_generation_ids(tokens, special_ids, eos, [eot, eom]),
        chat_template=template,
        special_token_strings=strings,
    )


def _gguf_merges(metadata: dict, name: str) -> list[tuple[str, str]] | None:
    raw = metadata.get("tokenizer.ggml.merges")
    if raw is None:
        return None
    merges = []
    for i, merge in enumerate(_as_list(raw, "tokenizer.ggml.merges", name, str)):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise TokenizerError(f"{name}: GGUF tokenizer.ggml.merges[{i}] = {shown(merge)} is not 'left right'")
        merges.append((parts[0], parts[1]))
    return merges


def _gguf_byte_level(metadata: dict, tokens: list[str], name: str):
    alphabet = set(BYTE_TO_CHAR.values())
    # Tokens stored as plain text (not in the byte alphabet) are looked up by their byte-level spelling.
    vocab = {(t if set(t) <= alphabet else byte_level_spelling(t)): i for i, t in enumerate(tokens)}
    merges = _gguf_merges(metadata, name)
    if merges is None:
        raise TokenizerError(f"{name}: GGUF byte-level ('gpt2') tokenizer has no 'tokenizer.ggml.merges'")
    pre_name = metadata.get("tokenizer.ggml.pre")
    try:
        model = BPE(vocab, merges, ignore_merges=pre_name in _IGNORE_MERGES_PRE)
        pre = gguf_byte_level_pre_tokenizer(pre_name)
    except TokenizerError as exc:
        raise TokenizerError(f"{name}: {exc}") from None

    def in_vocab(token: str, special: bool) -> bool:
        # transformers skips control tokens written outside the byte alphabet (llama.cpp mislabels)
        return set(token) <= alphabet and token in vocab

    return vocab, model, None, pre, Decoder([ByteLevelStep()]), in_vocab


def _gguf_sentencepiece(metadata: dict, tokens: list[str], types: list[int], arch: str, name: str):
    merges = _gguf_merges(metadata, name)
    if arch in _GEMMA_ARCHS:
        # Gemma stores multi-space tokens as real spaces; the BPE works on "\u2581" spellings.
        spelled = list(tokens)
        for i in [i for i, t in enumerate(tokens) if " " in t]:
            if not tokens[i].strip():
                spelled[i] = "\u2581" * len(tokens[i])
        vocab = dict(zip(spelled, range(len(spelled))))
        # Merges are ranked by the merged token's position in the file (its score does not follow it).
        priority = list(range(len(tokens)))
        normalizer: Normalizer | None = Replace(" ", "\u2581", literal=True)
        pre: PreTokenizer | None = None
        steps = [ReplaceStep("\u2581", " ", True), ByteFallbackStep(), FuseStep()]
    else:
        vocab = dict(zip(tokens, range(len(tokens))))
        scores_raw = metadata.get("tokenizer.ggml.scores")
        if merges is None and scores_raw is None:
            raise TokenizerError(
                f"{name}: GGUF SentencePiece tokenizer has neither merges nor 'tokenizer.ggml.scores'"
            )
        priority = []
        if merges is None:
            scores = _as_list(scores_raw, "tokenizer.ggml.scores", name, float)
            if len(scores) != len(tokens):
                raise TokenizerError(f"{name}: GGUF has {len(tokens)} tokens but {len(scores)} scores")
            order = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
            priority = [0] * len(tokens)
            for rank, i in enumerate(order):
                priority[i] = rank
        add_space = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        normalizer = None
        pre = Metaspace("\u2581", "first" if add_space else "never", split=False)
        steps = [ReplaceStep("\u2581", " ", True), ByteFallbackStep(), FuseStep()]
        if add_space:
            steps.append(StripStep(" ", 1, 0))
    try:
        if merges is not None:
            model = BPE(
                vocab,
                merges,
                byte_fallback=True,
                fuse_unk=True,
                unk_token="<unk>" if arch in _GEMMA_ARCHS and "<unk>" in vocab else None,
            )
        else:
            unk = "<unk>" if (arch in _GEMMA_ARCHS and "<unk>" in vocab) else None
            model = BPE.from_scores(vocab, priority, byte_fallback=True, unk_token=unk, fuse_unk=True)
    except TokenizerError as exc:
        raise TokenizerError(f"{name}: {exc}") from None

    def in_vocab(token: str, special: bool) -> bool:
        return token in vocab

    return vocab, model, normalizer, pre, Decoder(steps), in_vocab


# --- tokenizer.json ----------------------------------------------------------------------------------


def _token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def parts_from_tokenizer_json(
    tokenizer_json: str | dict, tokenizer_config: dict | None = None, name: str | None = None
) -> TokenizerParts:
    """Build tokenizer parts from an HF tokenizer.json (path or parsed dict) and tokenizer_config."""
    if isinstance(tokenizer_json, str):
        path = tokenizer_json
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as exc:
            raise TokenizerError(f"cannot read tokenizer.json {path!r}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise TokenizerError(f"{path!r} is not valid JSON: {exc}") from exc
        name = name or path
    elif isinstance(tokenizer_json, dict):
        data = tokenizer_json
        name = name or "tokenizer.json"
    else:
        raise TokenizerError(f"tokenizer_json must be a path or a dict, got {type(tokenizer_json).__name__}")
    config = dict(tokenizer_config or {})

    model_spec = data.get("model")
    if not isinstance(model_spec, dict):
        raise TokenizerError(f"{name}: tokenizer.json has no 'model' object")
    model_type = model_spec.get("type", "BPE" if "merges" in model_spec else None)
    if model_type != "BPE":
        raise TokenizerError(
            f"{name}: tokenizer.json model type {shown(model_type)} is not supported (webdrift implements BPE only)"
        )
    vocab = model_spec.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{name}: tokenizer.json model.vocab is missing or empty")
    for token, i in vocab.items():
        if not isinstance(i, int) or i < 0:
            raise TokenizerError(f"{name}: tokenizer.json model.vocab[{shown(token)}] = {shown(i)} is not a token id")
    merges_raw = model_spec.get("merges")
    if not isinstance(merges_raw, list):
        raise TokenizerError(f"{name}: tokenizer.json model.merges is missing")
    merges = []
    for i, merge in enumerate(merges_raw):
        if isinstance(merge, str):
            parts = merge.split(" ")
        elif isinstance(merge, list):
            parts = merge
        else:
            parts = []
        if len(parts) != 2 or not all(isinstance(p, str) for p in parts):
            raise TokenizerError(f"{name}: tokenizer.json model.merges[{i}] = {shown(merge)} is not a pair")
        merges.append((parts[0], parts[1]))
    if model_spec.get("dropout") not in (None, 0, 0.0):
        raise TokenizerError(f"{name}: BPE dropout {shown(model_spec.get('dropout'))} is not supported")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model_spec.get(key):
            raise TokenizerError(f"{name}: BPE {key} {shown(model_spec[key])} is not supported")
    try:
        model = BPE(
            dict(vocab),
            merges,
            byte_fallback=bool(model_spec.get("byte_fallback", False)),
            unk_token=model_spec.get("unk_token"),
            fuse_unk=bool(model_spec.get("fuse_unk", False)),
            ignore_merges=bool(model_spec.get("ignore_merges", False)),
        )
        normalizer = normalizer_from_json(data.get("normalizer"))
        pre = pre_tokenizer_from_json(data.get("pre_tokenizer"))
        decoder = decoder_from_json(data.get("decoder"))
    except TokenizerError as exc:
        raise TokenizerError(f"{name}: {exc}") from None

    full_vocab = dict(vocab)
    added: list[AddedToken] = []
    for i, entry in enumerate(data.get("added_tokens") or []):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("content"), str)
            or not isinstance(entry.get("id"), int)
        ):
            raise TokenizerError(f"{name}: tokenizer.json added_tokens[{i}] needs 'id' and 'content'")
        special = bool(entry.get("special", False))
        added.append(
            AddedToken(
                entry["content"],
                entry["id"],
                special=special,
                lstrip=bool(entry.get("lstrip", False)),
                rstrip=bool(entry.get("rstrip", False)),
                normalized=bool(entry.get("normalized", not special)),
                single_word=bool(entry.get("single_word", False)),
            )
        )
        full_vocab[entry["content"]] = entry["id"]
    size = max(full_vocab.values()) + 1
    tokens = [""] * size
    for token, i in vocab.items():
        tokens[i] = token
    for token in added:
        tokens[token.id] = token.content

    def config_id(key: str) -> int | None:
        content = _token_content(config.get(key))
        if content is None:
            return None
        if content not in full_vocab:
            raise TokenizerError(f"{name}: tokenizer_config {key} {shown(content)} is not a token")
        return full_vocab[content]

    prefix, suffix = _post_processor_ids(data.get("post_processor"), full_vocab, name)
    bos, eos = config_id("bos_token"), config_id("eos_token")
    if "add_bos_token" in config or "add_eos_token" in config or data.get("post_processor") is None:
        # transformers rebuilds the post-processor from these flags
        prefix = [bos] if (config.get("add_bos_token") and bos is not None) else []
        suffix = [eos] if (config.get("add_eos_token") and eos is not None) else []
    if bos is None and prefix:
        bos = prefix[0]
    special_ids = {t.id for t in added if t.special}
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    strings = {
        key: _token_content(config.get(key)) for key in ("bos_token", "eos_token", "unk_token", "pad_token")
    }
    return TokenizerParts(
        name=name,
        tokens=tokens,
        vocab=full_vocab,
        model=model,
        normalizer=normalizer,
        pre_tokenizer=pre,
        added=added,
        decoder=decoder,
        prefix_ids=prefix,
        suffix_ids=suffix,
        bos_token_id=bos,
        eos_token_id=eos,
        eos_token_ids=_end_of_generation_ids(tokens, special_ids, eos, []),
        chat_template=template if isinstance(template, str) else None,
        special_token_strings=strings,
    )


def _post_processor_ids(spec: dict | None, vocab: dict[str, int], name: str) -> tuple[list[int], list[int]]:
    """Ids a post-processor adds around a single sequence: (before, after)."""
    if spec is None:
        return [], []
    kind = spec.get("type")
    if kind == "ByteLevel":
        return [], []
    if kind == "Sequence":
        prefix: list[int] = []
        suffix: list[int] = []
        for sub in spec.get("processors", []):
            p, s = _post_processor_ids(sub, vocab, name)
            prefix, suffix = prefix + p, suffix + s
        return prefix, suffix
    if kind == "TemplateProcessing":
        specials = spec.get("special_tokens", {})
        prefix, suffix, seen_sequence = [], [], False
        for item in spec.get("single", []):
            if "Sequence" in item:
                seen_sequence = True
            elif "SpecialToken" in item:
                key = item["SpecialToken"].get("id")
                ids = specials.get(key, {}).get("ids")
                if ids is None:
                    raise TokenizerError(
                        f"{name}: post_processor template uses {key!r}, which it does not define"
                    )
                (suffix if seen_sequence else prefix).extend(ids)
        return prefix, suffix
    if kind in ("RobertaProcessing", "BertProcessing"):
        cls_token, sep_token = spec.get("cls"), spec.get("sep")
        return [cls_token[1]], [sep_token[1]]
    raise TokenizerError(f"{name}: unsupported post_processor type {shown(kind)}")
