"""The one entry point the engine uses to open a model: `open_model_source(path_or_bytes)`.

It turns a GGUF file (path or in-memory bytes) or an HF checkpoint folder into a ModelSource:
a ModelConfig, the tensors under canonical (GGUF) names with their stored bytes available on
demand, the tokenizer data and the chat template. Every required tensor is checked against the
shape the config implies, so later stages can trust both.

Pure Python at import time (runs under Pyodide). Only SourceTensor.to_numpy() needs numpy, and
imports it (through webdrift.weights.quant) when called. It must not repack or convert weights:
that is the GPU loader's job, from raw().
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from webdrift.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError, shown
from webdrift.weights.config import ModelConfig
from webdrift.weights.gguf import GGUF_MAGIC, GGUFFile

__all__ = [
    "SUPPORTED_GGUF_ARCHS",
    "ModelSource",
    "SourceTensor",
    "config_from_gguf",
    "expected_tensor_shapes",
    "open_model_source",
]

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2", "gemma3")

# Token texts llama.cpp also treats as end-of-generation when they are CONTROL tokens
# (llama-vocab.cpp); GGUF files usually name only one eos id.
_EOG_TEXTS = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "<|return|>", "<|call|>")  # fmt: skip
_TOKEN_TYPE_CONTROL = 3
_GEMMA3_DEFAULT_SLIDING_WINDOW_PATTERN = 6  # every 6th layer is global (llama.cpp hard-codes it)
_GEMMA3_ROPE_LOCAL_THETA = 10000.0


class SourceTensor:
    """One tensor as stored in the model file (canonical name, numpy-order shape)."""

    __slots__ = ("_read", "_where", "name", "shape", "type_name")

    def __init__(
        self, name: str, shape: tuple[int, ...], type_name: str, read: Callable[[], bytes], where: str
    ):
        self.name = name
        self.shape = shape  # numpy order
        self.type_name = type_name  # "F32","F16","BF16","Q8_0","Q4_0","Q4_1","Q4_K","Q6_K",...
        self._read = read
        self._where = where  # file it comes from, for messages

    def __repr__(self) -> str:
        return f"SourceTensor({self.name!r}, shape={self.shape}, {self.type_name})"

    def raw(self) -> bytes:
        """Exact stored bytes (GGUF block layout, or safetensors little-endian row-major)."""
        return self._read()

    def to_numpy(self) -> Any:
        """float32 numpy array of `shape`, dequantized (desktop only: imports numpy)."""
        from webdrift.weights.quant import dequantize

        return dequantize(self._read(), self.type_name, self.shape)


class ModelSource:
    """A model file opened for loading. `tensors` uses canonical names (see weights/config.py)."""

    path: str
    format: str  # "gguf" | "hf"
    config: ModelConfig
    tensors: dict[str, SourceTensor]
    # {"kind": "gguf", "metadata": <GGUF metadata dict>} or
    # {"kind": "hf", "tokenizer_json": path | None, "tokenizer_config": dict | None}
    tokenizer_info: dict[str, Any]
    chat_template: str | None

    def __init__(
        self,
        path: str,
        format: str,
        config: ModelConfig,
        tensors: dict[str, SourceTensor],
        tokenizer_info: dict[str, Any],
        chat_template: str | None,
    ):
        self.path = path
        self.format = format
        self.config = config
        self.tensors = tensors
        self.tokenizer_info = tokenizer_info
        self.chat_template = chat_template

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ModelSource({self.path!r}, {self.format}, arch={c.arch}, dim={c.dim}, "
            f"layers={c.n_layers}, {len(self.tensors)} tensors)"
        )


# ------------------------------------------------------------------------------ shape checks


def expected_tensor_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config requires -> its numpy-order shape."""
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.vocab_size, c.dim),
        "output_norm.weight": (c.dim,),
    }
    if not c.tied_embeddings:
        shapes["output.weight"] = (c.vocab_size, c.dim)
    for i in range(c.n_layers):
        p = f"blk.{i}."
        shapes.update({
            p + "attn_norm.weight": (c.dim,),
            p + "attn_q.weight": (c.q_dim, c.dim),
            p + "attn_k.weight": (c.kv_dim, c.dim),
            p + "attn_v.weight": (c.kv_dim, c.dim),
            p + "attn_output.weight": (c.dim, c.q_dim),
            p + "ffn_norm.weight": (c.dim,),
            p + "ffn_gate.weight": (c.ffn_dim, c.dim),
            p + "ffn_up.weight": (c.ffn_dim, c.dim),
            p + "ffn_down.weight": (c.dim, c.ffn_dim),
        })  # fmt: skip
        if c.qkv_bias:
            shapes.update({p + "attn_q.bias": (c.q_dim,), p + "attn_k.bias": (c.kv_dim,),
                           p + "attn_v.bias": (c.kv_dim,)})  # fmt: skip
        if c.qk_norm:
            shapes.update({p + "attn_q_norm.weight": (c.head_dim,), p + "attn_k_norm.weight": (c.head_dim,)})
        if c.post_norms:
            shapes.update({p + "post_attention_norm.weight": (c.dim,), p + "post_ffw_norm.weight": (c.dim,)})
    return shapes


def _validate(c: ModelConfig, tensors: dict[str, SourceTensor], where: str) -> None:
    for name, shape in expected_tensor_shapes(c).items():
        t = tensors.get(name)
        if t is None:
            raise ModelFileError(f"{where}: required tensor {name!r} is missing (expected shape {shape})")
        # a 1-D vector may be stored as (1, n) by some exporters; accept only the exact shape
        if tuple(t.shape) != shape:
            raise ModelFileError(
                f"{where}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape} from the config"
            )


# ------------------------------------------------------------------------------ GGUF


def _md_int(md: dict[str, Any], key: str, where: str, default: Any = ...) -> int:
    v = md.get(key, default)
    if v is ...:
        raise ModelFileError(f"{where}: missing required metadata key {key!r}")
    if isinstance(v, list):
        raise UnsupportedModelError(f"{where}: per-layer values for {key!r} are not supported")
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ModelFileError(f"{where}: metadata key {key!r} must be a positive integer, got {shown(v)}")
    return v


def _md_float(md: dict[str, Any], key: str, where: str, default: Any = ...) -> float:
    v = md.get(key, default)
    if v is ...:
        raise ModelFileError(f"{where}: missing required metadata key {key!r}")
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        raise ModelFileError(f"{where}: metadata key {key!r} must be a positive number, got {shown(v)}")
    return float(v)


def _md_name(md: dict[str, Any]) -> str:
    """general.name, if it is a string (cut to 100 characters: it is quoted in messages)."""
    v = md.get("general.name", "")
    return v[:100] if isinstance(v, str) else ""


def _sliding_window_pattern(v: Any, n_layers: int, where: str) -> int:
    """GGUF stores it as an int period or as a per-layer bool list (True = sliding)."""
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    if isinstance(v, list) and len(v) == n_layers and all(isinstance(x, bool) for x in v):
        for p in range(1, n_layers + 2):
            if all(v[i] == ((i + 1) % p != 0) for i in range(n_layers)):
                return p
        raise UnsupportedModelError(f"{where}: irregular sliding-window layer pattern {shown(v)} is not supported")
    raise ModelFileError(f"{where}: invalid sliding_window_pattern {shown(v)}")


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    """ModelConfig from GGUF metadata and the tensor table (which decides tied and qkv_bias)."""
    md, where = gf.metadata, gf.path_or_name
    arch = md.get("general.architecture")
    if arch is None:
        raise ModelFileError(f"{where}: missing required metadata key 'general.architecture'")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise UnsupportedModelError(
            f"{where}: architecture {shown(arch)} is not supported; supported GGUF architectures: "
            + ", ".join(SUPPORTED_GGUF_ARCHS)
        )
    dim = _md_int(md, f"{arch}.embedding_length", where)
    n_layers = _md_int(md, f"{arch}.block_count", where)
    n_heads = _md_int(md, f"{arch}.attention.head_count", where)
    n_kv = _md_int(md, f"{arch}.attention.head_count_kv", where, n_heads)
    if n_heads % n_kv:
        raise ModelFileError(f"{where}: head_count {n_heads} is not a multiple of head_count_kv {n_kv}")
    if f"{arch}.attention.key_length" not in md and dim % n_heads:
        raise ModelFileError(f"{where}: embedding_length {dim} is not a multiple of head_count {n_heads}")
    head_dim = _md_int(md, f"{arch}.attention.key_length", where, dim // n_heads)
    v_len = _md_int(md, f"{arch}.attention.value_length", where, head_dim)
    if v_len != head_dim:
        raise UnsupportedModelError(
            f"{where}: value_length {v_len} != key_length {head_dim} is not supported"
        )
    rot = _md_int(md, f"{arch}.rope.dimension_count", where, head_dim)
    if rot != head_dim:
        raise UnsupportedModelError(
            f"{where}: partial RoPE (rope.dimension_count {rot} < head_dim {head_dim}) is not supported"
        )
    if "rope_freqs.weight" in gf.tensors:
        raise UnsupportedModelError(
            f"{where}: per-dimension RoPE frequency factors (rope_freqs.weight) are not supported"
        )
    scaling_type = md.get(f"{arch}.rope.scaling.type", "none")
    if scaling_type == "linear":
        rope_scaling: dict | None = {
            "rope_type": "linear",
            "factor": _md_float(md, f"{arch}.rope.scaling.factor", where),
        }
    elif scaling_type in ("none", None):
        rope_scaling = None
    else:
        raise UnsupportedModelError(f"{where}: RoPE scaling {shown(scaling_type)} is not supported (only linear)")

    tokens = md.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        vocab = len(tokens)
    elif f"{arch}.vocab_size" in md:
        vocab = _md_int(md, f"{arch}.vocab_size", where)
    elif "token_embd.weight" in gf.tensors:
        vocab = gf.tensors["token_embd.weight"].shape[0]
    else:
        raise ModelFileError(
            f"{where}: no tokenizer.ggml.tokens and no token_embd.weight: vocabulary size unknown"
        )

    bos = md.get("tokenizer.ggml.bos_token_id")
    eos_ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = md.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab:
            eos_ids.append(v)
    types = md.get("tokenizer.ggml.token_type")
    if isinstance(tokens, list) and isinstance(types, list) and len(types) == len(tokens):
        for text in _EOG_TEXTS:
            try:
                i = tokens.index(text)
            except ValueError:
                continue
            if types[i] == _TOKEN_TYPE_CONTROL:
                eos_ids.append(i)
    add_bos = md.get("tokenizer.ggml.add_bos_token")
    if not isinstance(add_bos, bool):  # llama.cpp's default: SentencePiece vocabularies add BOS
        add_bos = md.get("tokenizer.ggml.model") == "llama"

    c = ModelConfig(
        arch=arch,
        vocab_size=vocab,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        ffn_dim=_md_int(md, f"{arch}.feed_forward_length", where),
        norm_eps=_md_float(md, f"{arch}.attention.layer_norm_rms_epsilon", where),
        rope_theta=_md_float(md, f"{arch}.rope.freq_base", where, 10000.0),
        # llama.cpp's converter permutes llama Q/K rows for its interleaved (pairs 2i, 2i+1) RoPE;
        # rotating those pairs gives the same attention scores as HF's rotate-half on the original
        # rows. qwen2 and gemma3 are exported unpermuted and use llama.cpp's NEOX (half) RoPE.
        rope_style="interleaved" if arch == "llama" else "half",
        max_position=_md_int(md, f"{arch}.context_length", where),
        tied_embeddings="output.weight" not in gf.tensors,
        qkv_bias="blk.0.attn_q.bias" in gf.tensors,
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
        eos_token_ids=list(dict.fromkeys(eos_ids)),
        add_bos_token=add_bos,
        name=_md_name(md),
        rope_scaling=rope_scaling,
    )
    if arch == "gemma3":
        if f"{arch}.attn_logit_softcapping" in md:
            raise UnsupportedModelError(f"{where}: attention logit soft-capping is not supported")
        c.act = "gelu_tanh"
        c.embed_scale = math.sqrt(dim)
        c.qk_norm = True
        c.post_norms = True
        # llama.cpp's converter stores Gemma RMSNorm weights as (1 + w): use them as they are
        c.norm_weight_offset = 0.0
        qpas = md.get(f"{arch}.attention.query_pre_attn_scalar")
        c.attn_scale = (
            _md_float(md, f"{arch}.attention.query_pre_attn_scalar", where) ** -0.5
            if qpas
            else head_dim**-0.5
        )
        c.sliding_window = _md_int(md, f"{arch}.attention.sliding_window", where)
        c.sliding_window_pattern = _sliding_window_pattern(
            md.get(f"{arch}.attention.sliding_window_pattern", _GEMMA3_DEFAULT_SLIDING_WINDOW_PATTERN),
            n_layers,
            where,
        )
        c.rope_local_theta = _GEMMA3_ROPE_LOCAL_THETA
        cap = md.get(f"{arch}.final_logit_softcapping")
        c.final_logit_softcap = _md_float(md, f"{arch}.final_logit_softcapping", where) if cap else None
    return c


def _open_gguf(source: Any, name: str | None) -> ModelSource:
    gf = GGUFFile(source, name=name)
    config = config_from_gguf(gf)
    tensors = {
        n: SourceTensor(n, ti.shape, ti.type_name, (lambda n=n: gf.raw(n)), gf.path_or_name)
        for n, ti in gf.tensors.items()
    }
    _validate(config, tensors, gf.path_or_name)
    tpl = gf.metadata.get("tokenizer.chat_template")
    return ModelSource(
        path=gf.path_or_name,
        format="gguf",
        config=config,
        tensors=tensors,
        tokenizer_info={"kind": "gguf", "metadata": gf.metadata},
        chat_template=tpl if isinstance(tpl, str) else None,
    )


def _open_hf(folder: str) -> ModelSource:
    from webdrift.weights.hf import read_hf_folder

    hf = read_hf_folder(folder)
    tensors = {
        canon: SourceTensor(
            canon, info.shape, info.dtype, (lambda sf=sf, n=info.name: sf.raw(n)), sf.path_or_name
        )
        for canon, (sf, info) in hf.tensors.items()
    }
    _validate(hf.config, tensors, folder)
    return ModelSource(
        path=folder,
        format="hf",
        config=hf.config,
        tensors=tensors,
        tokenizer_info=hf.tokenizer_info,
        chat_template=hf.chat_template,
    )


def open_model_source(
    path_or_bytes: str | os.PathLike | bytes | bytearray | memoryview, name: str | None = None
) -> ModelSource:
    """Open a GGUF file (path or bytes) or an HF checkpoint folder.

    `name` labels an in-memory source in messages (e.g. the URL it was fetched from).
    """
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return _open_gguf(path_or_bytes, name or "<bytes>")
    if not isinstance(path_or_bytes, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"open_model_source: expected a path or bytes, got {type(path_or_bytes).__name__}"
        )
    path = os.fspath(path_or_bytes)
    if os.path.isdir(path):
        return _open_hf(path)
    if not os.path.isfile(path):
        raise ModelFileError(f"{path}: no such file or folder")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"cannot open {path}: {e}") from e
    if magic == GGUF_MAGIC:
        return _open_gguf(path, name)
    if path.endswith(".safetensors"):
        raise InvalidArgumentError(
            f"{path}: pass the folder holding config.json and the .safetensors files, not one shard"
        )
    raise ModelFileError(f"{path}: not a GGUF file (magic {shown(magic)}) and not an HF model folder")
