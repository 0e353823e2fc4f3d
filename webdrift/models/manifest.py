"""A model's runtime weight inventory: which file tensors become which runtime GPU weight, in
which format. Written once here, iterated by both the footprint (sizes and limits before any
allocation, models/footprint.py) and the loader (allocation and upload, models/loader.py), so
the two can never disagree about what a model holds.

    token_embd                      (vocab, dim)          shardable by rows
    per layer i (prefix blk.i.):
      attn_norm                     (dim)                 f32 vector
      wqkv = attn_q | attn_k | attn_v  (q_dim + 2 kv_dim, dim)   Q, K, V stacked as rows
      bqkv = the three biases       (q_dim + 2 kv_dim)    Qwen2 only, f32
      wo = attn_output              (dim, q_dim)
      ffn_norm                      (dim)
      w_gate, w_up                  (ffn_dim, dim)        one format for both (one dual GEMV)
      w_down                        (dim, ffn_dim)
      attn_q_norm, attn_k_norm      (head_dim)            Gemma 3's QK-norm
      post_attention_norm, post_ffw_norm  (dim)           Gemma 3's post-norms
    output_norm                     (dim)
    output                          (vocab, dim)          absent when tied to token_embd; shardable

The format policy (`runtime_format`) lives here too: a stored type maps to a runtime format
unless the caller asks for one. KV-cache sizes have one formula (`kv_cache_bytes`).
Must not: import numpy or wgpu; read tensor data (only names, shapes and stored types).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError
from ..kernels import linear_blk
from ..kernels.weights import FORMATS, split_format
from ..weights.config import ModelConfig

# stored quantized type -> the runtime format it maps to by default
QUANT_DEFAULT = {"Q8_0": "q8_0", "Q5_0": "q8_0", "Q5_1": "q8", "Q5_K": "q5k", "Q6_K": "q6k",
                 "Q4_0": "q4_0", "Q4_1": "q4", "Q4_K": "q4k", "Q2_K": "q4", "Q3_K": "q4"}
RUNTIME_FORMATS = FORMATS   # f32 f16 q8 q8pc q4 q4g128 q4pc e0m4 (kernels/weights.py)
# mixed policies: the runtime format per matrix role (attn: Q|K|V and O; ffn: gate, up, down;
# embd: the token embedding and the LM head). ML Drift's 8/4/4: int8 per-channel attention,
# int4 per-channel embedding and feed-forward.
MIXED_FORMATS = {"8/4/4": {"attn": "q8pc", "ffn": "q4pc", "embd": "q4pc"}}
# "exact": every stored type in a runtime format that holds its values bit for bit (K-quants:
# Q4_K / Q5_K super-blocks read natively, Q6_K's codes and scales in q6k); a fused Q|K|V of
# several such types keeps each tensor's rows in its own format (a row-split weight,
# kernels/weights.py); the types no quantized format holds exactly (Q5_1, Q2_K, Q3_K) and floats
# mixed with quantized types widen to f32
EXACT = {"F32": "f32", "BF16": "f32", "F16": "f16", "Q8_0": "q8_0", "Q5_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4",
         "Q4_K": "q4k", "Q5_K": "q5k", "Q6_K": "q6k"}
WEIGHT_FORMATS = RUNTIME_FORMATS + tuple(MIXED_FORMATS) + ("exact",)   # what weight_format= accepts


def default_format(src_type: str) -> str:
    """The runtime format a stored type maps to: floats keep their width (BF16 widens to f32);
    Q4_K -> q4k, Q5_K -> q5k, Q6_K -> q6k (every bit kept, read natively); Q8_0/Q5_0 -> q8_0
    (their f16 scale and int8 values as stored, 8.5 bits a weight); Q5_1 -> q8 (re-quantized to
    int8 per 32-block with an f32 scale, an error of at most 1/254 of the block's largest
    magnitude); Q4_0 -> q4_0 (its scale alone, 4.5 bits a weight, without loss); Q4_1/Q2_K/Q3_K ->
    q4 (Q4_1 without loss, Q2_K/Q3_K re-quantized)."""
    if src_type in QUANT_DEFAULT:
        return QUANT_DEFAULT[src_type]
    return {"F32": "f32", "F16": "f16", "BF16": "f32"}.get(src_type, "f32")


def runtime_format(types: list[str], weight_format: str | None = None, role: str | None = None,
                   rows: list[int] | None = None) -> str:
    """The runtime format of one weight made of tensors of these stored types (Q|K|V are fused;
    rows: each tensor's row count, where the weight stacks exactly these tensors):
    weight_format when given (re-quantizing on the GPU where needed; a mixed policy such as
    "8/4/4" picks by the matrix's role: attn, ffn or embd; "exact" with several quantized types and
    their rows: each tensor's rows in its own exact format, "q4k*5120|q6k*1024"); otherwise the types' common
    default (Gemma's Q5_0 Q/K with a Q8_0 V share q8_0); for mixed quantized types with their rows,
    each tensor's rows in its default format where the integer-dot kernels read that mix (a Q4_K_M
    file's Q4_K Q/K with a Q6_K V, a Q5_K_M file's Q5_K Q/K with a Q6_K V), else q8 (Q4_K with
    Q5_K: two int8 row orders); f32 when
    floats are mixed in."""
    if weight_format in MIXED_FORMATS:
        if role not in MIXED_FORMATS[weight_format]:
            raise InvalidArgumentError(f"weight_format={weight_format!r} chooses by a matrix's role "
                                       f"({', '.join(MIXED_FORMATS[weight_format])}); got role {role!r}")
        return MIXED_FORMATS[weight_format][role]
    if weight_format == "exact":
        exact = [EXACT.get(t, "f32") for t in types]
        if len(set(exact)) == 1:
            return exact[0]
        if rows is not None and len(rows) == len(types) and not {"f32", "f16"} & set(exact):
            return split_format(list(zip(exact, rows)))
        return "f32"
    if weight_format:
        return weight_format
    fmts = {default_format(t) for t in types}
    if len(fmts) == 1:
        return fmts.pop()
    if fmts <= {"q4", "q4_0", "q4k"}:   # Q4_K with Q4_0 / Q4_1: q4 holds them all (Q4_K's scales in f16)
        return "q4"
    if fmts <= {"q8", "q8_0", "q4", "q4_0", "q4k", "q5k", "q6k"}:
        # each tensor's rows in its own format where the integer-dot kernels read the mix (its
        # ranges read the int8 input rows in one order: a Q4_K_M file's Q4_K Q / K with a Q6_K V,
        # a Q5_K_M file's Q5_K Q / K with a Q6_K V); otherwise (Q4_K with Q5_K) re-quantized to q8
        if rows is not None and len(rows) == len(types):
            split = split_format([(default_format(t), r) for t, r in zip(types, rows)])
            if linear_blk.supported(split, 256):
                return split
        return "q8"
    return "f32"


@dataclass(frozen=True)
class Matrix:
    """One runtime matrix: the file tensors `names` stacked as rows, in one format."""
    label: str                      # runtime name, e.g. "blk.3.wqkv"
    names: tuple[str, ...]          # file tensors, stacked as rows in this order
    peers: tuple[str, ...] = ()     # tensors whose stored types join the format choice (gate <-> up)
    per_token: bool = True          # read in full by every decode step (False: an untied embedding)
    shardable: bool = False         # may be held as row shards (token embedding, LM head)
    role: str = "embd"              # attn | ffn | embd: what a mixed weight_format ("8/4/4") picks by

    def format(self, tensors: dict, weight_format: str | None) -> str:
        rows = None if self.peers else [tensors[n].shape[0] for n in self.names]
        return runtime_format([tensors[n].type_name for n in self.names + self.peers], weight_format, self.role, rows)


@dataclass(frozen=True)
class LayerManifest:
    """The file tensors of decoder layer `index` (None: the architecture has no such tensor)."""
    index: int
    attn_norm: str
    wqkv: Matrix
    bqkv: tuple[str, str, str] | None      # Q, K, V biases, end to end in one f32 buffer
    wo: Matrix
    ffn_norm: str
    w_gate: Matrix
    w_up: Matrix
    w_down: Matrix
    q_norm: str | None = None
    k_norm: str | None = None
    post_attn_norm: str | None = None
    post_ffn_norm: str | None = None

    @property
    def matrices(self) -> tuple[Matrix, ...]:
        return (self.wqkv, self.wo, self.w_gate, self.w_up, self.w_down)

    @property
    def vectors(self) -> tuple[str, ...]:
        """The f32 vectors (norm weights) in load order."""
        return tuple(v for v in (self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm,
                                 self.post_attn_norm, self.post_ffn_norm) if v is not None)


@dataclass(frozen=True)
class ModelManifest:
    tok_embd: Matrix
    layers: tuple[LayerManifest, ...]
    output_norm: str
    output: Matrix | None                  # None: the LM head is the token embedding (tied)

    def matrices(self):
        """Every runtime matrix, in load order."""
        yield self.tok_embd
        for lm in self.layers:
            yield from lm.matrices
        if self.output is not None:
            yield self.output

    def vectors(self):
        """Every f32 vector, in load order."""
        for lm in self.layers:
            yield from lm.vectors
        yield self.output_norm


def layer_manifest(cfg: ModelConfig, i: int) -> LayerManifest:
    p = f"blk.{i}."
    return LayerManifest(
        index=i,
        attn_norm=p + "attn_norm.weight",
        wqkv=Matrix(p + "wqkv", (p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"), role="attn"),
        bqkv=(p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias") if cfg.qkv_bias else None,
        wo=Matrix(p + "wo", (p + "attn_output.weight",), role="attn"),
        ffn_norm=p + "ffn_norm.weight",
        w_gate=Matrix(p + "w_gate", (p + "ffn_gate.weight",), peers=(p + "ffn_up.weight",), role="ffn"),
        w_up=Matrix(p + "w_up", (p + "ffn_up.weight",), peers=(p + "ffn_gate.weight",), role="ffn"),
        w_down=Matrix(p + "w_down", (p + "ffn_down.weight",), role="ffn"),
        q_norm=p + "attn_q_norm.weight" if cfg.qk_norm else None,
        k_norm=p + "attn_k_norm.weight" if cfg.qk_norm else None,
        post_attn_norm=p + "post_attention_norm.weight" if cfg.post_norms else None,
        post_ffn_norm=p + "post_ffw_norm.weight" if cfg.post_norms else None)


def model_manifest(cfg: ModelConfig, tensors: dict) -> ModelManifest:
    """The runtime weights of a model whose file holds `tensors` (canonical GGUF names)."""
    untied = not cfg.tied_embeddings and "output.weight" in tensors
    return ModelManifest(
        tok_embd=Matrix("token_embd", ("token_embd.weight",), per_token=not untied, shardable=True),
        layers=tuple(layer_manifest(cfg, i) for i in range(cfg.n_layers)),
        output_norm="output_norm.weight",
        output=Matrix("output", ("output.weight",), shardable=True) if untied else None)


def kv_cache_bytes(cfg: ModelConfig, positions: float, layers: int | None = None, value_bytes: int = 4) -> float:
    """Bytes of K and V for `positions` cache rows (n_kv_heads x head_dim values per row each, of
    value_bytes: 4 for f32, 2 for an f16 cache) in `layers` layers (default: every layer). One
    layer's K (or V) buffer is kv_cache_bytes(cfg, rows, 1, value_bytes) / 2."""
    return 2 * (cfg.n_layers if layers is None else layers) * cfg.kv_dim * positions * value_bytes
