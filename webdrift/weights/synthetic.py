"""Random-weight models in the exact shapes and GGUF storage types of real ones, for speed tables.

`synthetic_source(name, quant)` returns a ModelSource-like object (the duck type GPUModel loads:
`.path`, `.config`, `.tensors[name] -> .name, .shape, .type_name, .raw()`) whose matrices are
random bytes in a GGUF block layout (F16, Q8_0, Q4_1 or Q4_0, or Q4_K_M's mix of Q4_K and Q6_K,
with Q5_0 / Q8_0 where a row is not a multiple of 256) and whose norm weights are F32 ones.
The bytes go through the normal GPU conversion path at load, so the runtime weights are exactly
the formats a real file of that type gives. Decode speed does not depend on the values; they are
only kept finite and small (every f16 scale / value field is set to a small normal number) so no
kernel meets inf or NaN.

Generation is cheap: one pool of random bytes per storage type (a few MiB, block aligned) is
tiled to each tensor's size, so loading an 8B shape costs a memcpy per tensor, not an RNG pass.
Plain Python (no numpy): the browser's bench page makes synthetic models too (the largest
tensor is made in WASM memory before its upload).
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from typing import ClassVar

from ..errors import InvalidArgumentError
from .config import ModelConfig
from .source import expected_tensor_shapes


@dataclass(frozen=True)
class Shape:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    tied: bool
    rope_theta: float = 500000.0
    rope_scaling: dict | None = None
    max_position: int = 131072


_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
_LLAMA32_ROPE = dict(_LLAMA31_ROPE, factor=32.0)

# The shapes of the models ML Drift and friends report on (HF config.json values).
PRESETS: dict[str, Shape] = {
    "tiny": Shape(128, 2, 4, 2, 32, 256, 512, True, 10000.0, None, 4096),   # CI: seconds on lavapipe
    "smollm2-135m": Shape(576, 30, 9, 3, 64, 1536, 49152, True, 100000.0, None, 8192),
    "llama-3.2-1b": Shape(2048, 16, 32, 8, 64, 8192, 128256, True, 500000.0, _LLAMA32_ROPE),
    "llama-3.2-3b": Shape(3072, 28, 24, 8, 128, 8192, 128256, True, 500000.0, _LLAMA32_ROPE),
    "llama-3.1-8b": Shape(4096, 32, 32, 8, 128, 14336, 128256, False, 500000.0, _LLAMA31_ROPE),
}

# --quant -> the GGUF storage type of every matrix (norms stay F32, as in real GGUF files);
# "q4_k_m": llama-quantize's Q4_K_M mix (q4_k_m_type)
QUANTS: dict[str, str] = {"f16": "F16", "q8": "Q8_0", "q4": "Q4_1", "q4_0": "Q4_0", "q4_k_m": "Q4_K_M"}

# GGUF block layouts: (bytes per block, elements per block)
_BLOCK = {"F32": (4, 1), "F16": (2, 1), "Q8_0": (34, 32), "Q4_1": (20, 32), "Q4_0": (18, 32), "Q5_0": (22, 32),
          "Q4_K": (144, 256), "Q6_K": (210, 256)}


def _more_bits(i: int, n: int) -> bool:
    """llama-quantize's use_more_bits: the layers whose attn_v / ffn_down a Q4_K_M file holds in Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, shape: tuple[int, ...], n_layers: int, tied: bool) -> str:
    """The GGUF type llama-quantize gives matrix `name` (numpy-order shape) of a Llama model made
    Q4_K_M (src/llama-quant.cpp, llama_tensor_get_type_impl): the LM head (the token embedding
    where it is tied) Q6_K; attn_v and ffn_down Q6_K in the _more_bits layers; every other matrix
    Q4_K; a row whose length is not a multiple of 256 falls back to Q5_0 for Q4_K and Q8_0 for
    Q6_K (the LM head's to Q8_0)."""
    head = name == "output.weight" or (tied and name == "token_embd.weight")
    more = name.endswith(("attn_v.weight", "ffn_down.weight")) and _more_bits(int(name.split(".")[1]), n_layers)
    want = "Q6_K" if head or more else "Q4_K"
    if shape[-1] % 256:
        return {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[want]
    return want


def check_choice(what: str, value: str, choices) -> None:
    if value not in choices:
        raise InvalidArgumentError(f"{what}={value!r} is not known; choose one of: {', '.join(choices)}")


def synthetic_config(name: str) -> ModelConfig:
    check_choice("synthetic model", name, PRESETS)
    s = PRESETS[name]
    return ModelConfig(arch="llama", vocab_size=s.vocab_size, dim=s.dim, n_layers=s.n_layers, n_heads=s.n_heads,
                       n_kv_heads=s.n_kv_heads, head_dim=s.head_dim, ffn_dim=s.ffn_dim, norm_eps=1e-5,
                       rope_theta=s.rope_theta, rope_style="half", max_position=s.max_position,
                       tied_embeddings=s.tied, bos_token_id=None, eos_token_ids=[], name=f"synthetic-{name}",
                       rope_scaling=s.rope_scaling)


def stored_bytes(type_name: str, shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    bb, be = _BLOCK[type_name]
    return n // be * bb


_POOLS: dict[str, bytes] = {}
_POOL_BLOCKS = 1 << 17       # blocks per pool: 4.3 MiB of Q8_0, 2.6 MiB of Q4_1, 256 KiB of F16


def _f16_high(exponent: int, sign: bool | None) -> bytes:
    """A bytes.translate table: a random byte -> the high byte of an f16 with that exponent field
    (5 bits), the sign bit `sign` (None: the byte's own top bit, random), and the byte's low 2
    bits as the mantissa's top bits."""
    return bytes((b & 0x80 if sign is None else 0x80 if sign else 0) | (exponent << 2) | (b & 0x03)
                 for b in range(256))


def _pool(type_name: str) -> bytes:
    """Random bytes of whole blocks of type_name, every f16 field a small finite number. Plain
    Python (random.randbytes and C-speed slice assignments, ~0.1 s): the browser's bench makes
    synthetic models too, and has no numpy."""
    p = _POOLS.get(type_name)
    if p is not None:
        return p
    rng = random.Random(0x5EED)
    bb, _ = _BLOCK[type_name]
    raw = bytearray(rng.randbytes(_POOL_BLOCKS * bb))
    # an f16 field at byte offset o of each block: raw[o::bb] low bytes (random mantissa bits),
    # raw[o+1::bb] high bytes -> magnitude 2^(exponent-15) * [1, 2)
    if type_name == "F32":          # norm weights: ones
        raw = bytearray(struct.pack("<f", 1.0) * _POOL_BLOCKS)
    elif type_name == "F16":        # values in +-[2^-7, 2^-6)
        raw[1::2] = raw[1::2].translate(_f16_high(8, None))
    elif type_name in ("Q8_0", "Q4_0"):   # d in [2^-12, 2^-11) (Q4_0: [2^-10, 2^-9)), q random
        raw[1::bb] = raw[1::bb].translate(_f16_high(3 if type_name == "Q8_0" else 5, False))
    elif type_name == "Q4_1":       # d in [2^-10, 2^-9), m = -8 d (values centred on 0): exponent + 3, sign set
        raw[1::bb] = raw[1::bb].translate(_f16_high(5, False))
        raw[2::bb] = raw[0::bb]
        raw[3::bb] = raw[1::bb].translate(_f16_high(8, True))
    elif type_name == "Q5_0":       # d in [2^-10, 2^-9), x = d (q - 16)
        raw[1::bb] = raw[1::bb].translate(_f16_high(5, False))
    elif type_name == "Q4_K":       # d, dmin in [2^-14, 2^-13): x = d sc q - dmin m (6-bit sc, m)
        raw[1::bb] = raw[1::bb].translate(_f16_high(1, False))
        raw[3::bb] = raw[3::bb].translate(_f16_high(1, False))
    elif type_name == "Q6_K":       # d (its last two bytes) in [2^-14, 2^-13): x = d sc (q - 32), int8 sc
        raw[bb - 1::bb] = raw[bb - 1::bb].translate(_f16_high(1, False))
    p = bytes(raw)
    _POOLS[type_name] = p
    return p


class SyntheticTensor:
    """One tensor of a synthetic model: canonical name, numpy-order shape, GGUF type, raw bytes."""

    __slots__ = ("name", "shape", "type_name")

    def __init__(self, name: str, shape: tuple[int, ...], type_name: str):
        self.name, self.shape, self.type_name = name, shape, type_name

    @property
    def nbytes(self) -> int:
        return stored_bytes(self.type_name, self.shape)

    def raw(self) -> bytes | bytearray:
        """The bytes: the type's pool repeated to the tensor's size, filled in place (one buffer of
        the tensor's size at a time: the browser's WASM heap stays small for 8B shapes)."""
        n = self.nbytes
        pool = _pool(self.type_name)
        if n <= len(pool):
            return pool[:n]
        out = bytearray(n)
        mv, p = memoryview(out), len(pool)
        for off in range(0, n, p):
            mv[off:off + p] = pool[:min(p, n - off)]
        return out

    def __repr__(self) -> str:
        return f"SyntheticTensor({self.name!r}, {self.shape}, {self.type_name})"


class SyntheticSource:
    """A ModelSource (see weights/source.py) of random weights; no tokenizer (feed token ids)."""

    format = "synthetic"
    tokenizer_info: ClassVar[dict] = {}
    chat_template = None

    def __init__(self, name: str, quant: str):
        check_choice("synthetic model", name, PRESETS)
        check_choice("quant", quant, QUANTS)
        self.name, self.quant = name, quant
        self.path = f"synthetic:{name}:{quant}"
        self.config = synthetic_config(name)
        qt, c = QUANTS[quant], self.config
        self.tensors = {n: SyntheticTensor(n, s, "F32" if len(s) == 1 else qt if qt != "Q4_K_M"
                                           else q4_k_m_type(n, s, c.n_layers, c.tied_embeddings))
                        for n, s in expected_tensor_shapes(c).items()}

    @property
    def n_params(self) -> int:
        total = 0
        for t in self.tensors.values():
            n = 1
            for d in t.shape:
                n *= d
            total += n
        return total

    @property
    def file_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def __repr__(self) -> str:
        return f"SyntheticSource({self.name!r}, {self.quant}, {self.n_params / 1e6:.0f}M params)"


class NullTokenizer:
    """Stands in for a tokenizer when a benchmark feeds token ids: no text, no EOS."""

    eos_token_ids: ClassVar[list[int]] = []

    def encode(self, text, add_special_tokens: bool = True):
        raise InvalidArgumentError("this model has no tokenizer (synthetic weights): pass a list of token ids")

    def stream_decoder(self):
        return _NullDecoder()


class _NullDecoder:
    def push(self, token: int) -> str:
        return ""

    def flush(self) -> str:
        return ""


def synthetic_source(name: str, quant: str = "q4") -> SyntheticSource:
    """A random-weight model with `name`'s shapes (PRESETS) stored as `quant` (QUANTS)."""
    return SyntheticSource(name, quant)
