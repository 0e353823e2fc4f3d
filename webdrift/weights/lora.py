"""LoRA adapter readers: PEFT folders and llama.cpp GGUF LoRA files -> LoraAdapter.

A LoRA adapter changes a projection y = x W^T into y = x W^T + s * (x A^T) B^T, with A (r, in)
and B (out, r) per target module and the scale s = lora_alpha / r (rsLoRA: lora_alpha / sqrt(r)).
The seven targets webdrift reads are the attention and MLP projections of a llama-family layer:

    target  PEFT module   GGUF tensor              W (out, in)
    q       q_proj        blk.N.attn_q.weight      (q_dim, dim)
    k       k_proj        blk.N.attn_k.weight      (kv_dim, dim)
    v       v_proj        blk.N.attn_v.weight      (kv_dim, dim)
    o       o_proj        blk.N.attn_output.weight (dim, q_dim)
    gate    gate_proj     blk.N.ffn_gate.weight    (ffn_dim, dim)
    up      up_proj       blk.N.ffn_up.weight      (ffn_dim, dim)
    down    down_proj     blk.N.ffn_down.weight    (dim, ffn_dim)

PEFT: `adapter_config.json` (peft_type LORA, r, lora_alpha, use_rslora, rank_pattern /
alpha_pattern per module) + `adapter_model.safetensors` with
`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` (r, in) and `...lora_B.weight`
(out, r). GGUF (llama.cpp's convert_lora_to_gguf.py, loaded by llama-adapter.cpp):
general.type = "adapter", adapter.type = "lora", adapter.lora.alpha (scale alpha / r, alpha 0:
scale 1), tensors `blk.N.attn_q.weight.lora_a` with ne (in, r) and `.lora_b` with ne (r, out),
i.e. the same numpy shapes as PEFT's. llama.cpp's llama-architecture export permutes the rows of
W_q and W_k (and so of their B) for its interleaved RoPE; `rows_permuted` records that, and
models/lora.py puts B's rows into the base model's order.

Values are kept as f32 `array('f')` (host memory, plain Python: runs in Pyodide); the per-target
scale is folded into B when the adapter is packed for the GPU (models/lora.py). Every mismatch
is a WebdriftError naming the file: ModelFileError (damaged files), UnsupportedModelError
(LoRA variants webdrift does not run: DoRA, biases, fan_in_fan_out, embedding or LM-head
targets, quantized tensors), InvalidArgumentError (shapes that do not fit the model, a rank above
the engine's maximum).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from array import array
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError, ModelFileError, UnsupportedModelError, WebdriftError, shown
from .gguf import GGUFFile
from .safetensors import SafetensorsFile

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
PEFT_MODULES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
                "down_proj": "down"}
GGUF_MODULES = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate",
                "ffn_up": "up", "ffn_down": "down"}
_PEFT_NAME = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d{1,6})\.(?:self_attn|mlp)\.(\w+)"
                        r"\.lora_([AB])(?:\.[\w-]+)?\.weight$")
_GGUF_NAME = re.compile(r"^blk\.(\d{1,6})\.(\w+)\.weight\.lora_([ab])$")
_MAX_RANK = 4096


@dataclass
class LoraTarget:
    """One adapted projection: a (rank, n_in) and b (n_out, rank), row-major f32; scale s."""
    a: array
    b: array
    rank: int
    n_in: int
    n_out: int
    scale: float


@dataclass
class LoraAdapter:
    """A LoRA adapter as read from its file: targets[(layer, target)] (target in TARGETS)."""
    path: str
    targets: dict[tuple[int, str], LoraTarget] = field(default_factory=dict)
    rows_permuted: bool = False   # B rows of q / k in llama.cpp's interleaved-RoPE order

    @property
    def rank(self) -> int:
        """The largest rank of any target (the rank rows the adapter takes in the GPU pool)."""
        return max((t.rank for t in self.targets.values()), default=0)

    def check(self, cfg, max_rank: int) -> None:
        """Every target fits the model `cfg` and the engine's maximum rank, else
        InvalidArgumentError naming the file, the tensor and the mismatch."""
        want = expected_shapes(cfg)
        for (layer, tgt), t in sorted(self.targets.items()):
            where = f"LoRA adapter {self.path}: layer {layer} {tgt}"
            if layer >= cfg.n_layers:
                raise InvalidArgumentError(f"{where}: the model has {cfg.n_layers} layers")
            n_out, n_in = want[tgt]
            if (t.n_out, t.n_in) != (n_out, n_in):
                raise InvalidArgumentError(f"{where}: the adapter is for a ({t.n_out}, {t.n_in}) weight, the model's "
                                           f"is ({n_out}, {n_in}); is it an adapter of another base model?")
            if t.rank > max_rank:
                raise InvalidArgumentError(f"{where}: rank {t.rank} is above this engine's max_lora_rank "
                                           f"{max_rank} (load with max_lora_rank={t.rank} or more)")


def expected_shapes(cfg) -> dict[str, tuple[int, int]]:
    """(out, in) of each target's base weight in the model `cfg`."""
    return {"q": (cfg.q_dim, cfg.dim), "k": (cfg.kv_dim, cfg.dim), "v": (cfg.kv_dim, cfg.dim),
            "o": (cfg.dim, cfg.q_dim), "gate": (cfg.ffn_dim, cfg.dim), "up": (cfg.ffn_dim, cfg.dim),
            "down": (cfg.dim, cfg.ffn_dim)}


# -- reading ----------------------------------------------------------------------------------
def read_lora(source, name: str | None = None) -> LoraAdapter:
    """A PEFT folder, a GGUF LoRA file path, or a GGUF file's bytes (`name` labels them)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return read_gguf_lora(source, name or "<lora bytes>")
    if not isinstance(source, (str, os.PathLike)):
        raise InvalidArgumentError(f"a LoRA adapter is a PEFT folder, a .gguf path or a GGUF file's bytes, "
                                   f"got {type(source).__name__}")
    path = os.fspath(source)
    if os.path.isdir(path):
        return read_peft_folder(path)
    if not os.path.exists(path):
        raise InvalidArgumentError(f"LoRA adapter {shown(path)}: no such file or folder")
    return read_gguf_lora(path, name or path)


def _floats(raw: bytes | memoryview, dtype: str, n: int, where: str) -> array:
    """f32 values of n stored elements of dtype F32 / F16 / BF16 (little-endian)."""
    if dtype == "F32":
        out = array("f")
        out.frombytes(bytes(raw))
    elif dtype == "F16":
        out = array("f", struct.unpack(f"<{n}e", raw))
    elif dtype == "BF16":
        hi = array("H")
        hi.frombytes(bytes(raw))
        out = array("f")
        out.frombytes(b"".join(struct.pack("<I", h << 16) for h in hi) if n else b"")
        hi = None
    else:
        raise UnsupportedModelError(f"{where}: tensors of type {dtype} are not supported in LoRA adapters "
                                    "(F32, F16, BF16)")
    if sys.byteorder != "little":
        out.byteswap()
    if len(out) != n:
        raise ModelFileError(f"{where}: holds {len(out)} values, its shape says {n}")
    return out


def _pair(found: dict, path: str) -> dict[tuple[int, str], tuple]:
    """{(layer, target): (a, b)} from {(layer, target, "A"|"B"): tensor}; both halves required."""
    out = {}
    for (layer, tgt, ab) in found:
        other = (layer, tgt, "B" if ab == "A" else "A")
        if other not in found:
            raise ModelFileError(f"LoRA adapter {path}: layer {layer} {tgt} has lora_{ab} but no lora_{other[2]}")
        out[(layer, tgt)] = (found[(layer, tgt, "A")], found[(layer, tgt, "B")])
    if not out:
        raise ModelFileError(f"LoRA adapter {path}: no LoRA tensors (lora_A / lora_B) in it")
    return out


def _target(path: str, layer: int, tgt: str, a_shape, b_shape, read_a, read_b, scale: float) -> LoraTarget:
    where = f"LoRA adapter {path}: layer {layer} {tgt}"
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise ModelFileError(f"{where}: lora_A and lora_B must be matrices, shapes {a_shape} and {b_shape}")
    (r, n_in), (n_out, r_b) = a_shape, b_shape
    if r != r_b:
        raise ModelFileError(f"{where}: lora_A has rank {r}, lora_B {r_b}")
    if not 1 <= r <= _MAX_RANK:
        raise UnsupportedModelError(f"{where}: rank {r} (webdrift reads ranks 1 .. {_MAX_RANK})")
    if not (math.isfinite(scale)):
        raise ModelFileError(f"{where}: the scale {scale} is not a finite number")
    return LoraTarget(read_a(r * n_in), read_b(n_out * r), r, n_in, n_out, scale)


def read_peft_folder(folder: str) -> LoraAdapter:
    """A PEFT LoRA folder: adapter_config.json + adapter_model.safetensors."""
    cfg_path = os.path.join(folder, "adapter_config.json")
    st_path = os.path.join(folder, "adapter_model.safetensors")
    for p in (cfg_path, st_path):
        if not os.path.exists(p):
            raise InvalidArgumentError(f"LoRA adapter {folder}: no {os.path.basename(p)} (a PEFT folder has "
                                       "adapter_config.json and adapter_model.safetensors)")
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelFileError(f"LoRA adapter {cfg_path}: not a readable JSON file ({shown(str(e))})") from e
    if not isinstance(cfg, dict):
        raise ModelFileError(f"LoRA adapter {cfg_path}: not a JSON object")

    def bad(what):
        raise UnsupportedModelError(f"LoRA adapter {cfg_path}: {what}")
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        bad(f"peft_type {shown(cfg.get('peft_type'))}; webdrift runs LORA adapters")
    if cfg.get("use_dora"):
        bad("DoRA (use_dora) adapters are not supported")
    if cfg.get("fan_in_fan_out"):
        bad("fan_in_fan_out adapters (GPT-2 Conv1D layers) are not supported")
    if cfg.get("bias", "none") not in ("none", None) or cfg.get("lora_bias"):
        bad(f"bias={shown(cfg.get('bias'))}: adapters with trained biases are not supported")
    if cfg.get("modules_to_save"):
        bad(f"modules_to_save={shown(cfg.get('modules_to_save'))}: fully trained modules are not supported")
    r, alpha = cfg.get("r", 8), cfg.get("lora_alpha", 8)
    if not isinstance(r, int) or isinstance(r, bool) or r < 1 or not isinstance(alpha, (int, float)):
        raise ModelFileError(f"LoRA adapter {cfg_path}: r={shown(r)}, lora_alpha={shown(alpha)} must be numbers")
    rs = bool(cfg.get("use_rslora", False))
    rank_pattern, alpha_pattern = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    if not isinstance(rank_pattern, dict) or not isinstance(alpha_pattern, dict):
        raise ModelFileError(f"LoRA adapter {cfg_path}: rank_pattern / alpha_pattern must be objects")
    tm = cfg.get("target_modules")
    if isinstance(tm, list):
        unknown = [m for m in tm if not isinstance(m, str) or m.split(".")[-1] not in PEFT_MODULES]
        if unknown:
            bad(f"target_modules {shown(unknown)}: webdrift adapts {', '.join(PEFT_MODULES)}")

    st = SafetensorsFile(st_path)
    found = {}
    for tname, info in st.tensors.items():
        m = _PEFT_NAME.match(tname)
        if m is None or m.group(2) not in PEFT_MODULES:
            raise UnsupportedModelError(f"LoRA adapter {st_path}: tensor {shown(tname)} is not a LoRA A / B of "
                                        f"one of {', '.join(PEFT_MODULES)}")
        found[(int(m.group(1)), PEFT_MODULES[m.group(2)], m.group(3))] = (tname, info)

    def pattern(pat: dict, tname: str, default):
        """PEFT's per-module override: the first key that the module's name ends with."""
        module = tname.split(".lora_")[0]
        for k, v in pat.items():
            if module == k or module.endswith("." + k) or re.fullmatch(rf"(.*\.)?{k}", module):
                return v
        return default

    ad = LoraAdapter(folder)
    for (layer, tgt), ((na, ia), (nb, ib)) in sorted(_pair(found, st_path).items()):
        rr = pattern(rank_pattern, na, r)
        aa = pattern(alpha_pattern, na, alpha)
        scale = aa / math.sqrt(rr) if rs else aa / rr
        if ia.shape and ia.shape[0] != rr:
            raise ModelFileError(f"LoRA adapter {st_path}: {shown(na)} has rank {ia.shape[0]}, the config says {rr}")
        ad.targets[(layer, tgt)] = _target(
            st_path, layer, tgt, ia.shape, ib.shape,
            lambda n, na=na, ia=ia: _floats(st.raw(na), ia.dtype, n, f"LoRA adapter {st_path}: {shown(na)}"),
            lambda n, nb=nb, ib=ib: _floats(st.raw(nb), ib.dtype, n, f"LoRA adapter {st_path}: {shown(nb)}"), scale)
    return ad


_GGUF_TYPES = {0: "F32", 1: "F16", 30: "BF16"}


def read_gguf_lora(source, name: str) -> LoraAdapter:
    """A llama.cpp GGUF LoRA file (a path or its bytes)."""
    gf = GGUFFile(source, name=name)
    md = gf.metadata
    path = gf.path_or_name
    if md.get("general.type") != "adapter":
        raise UnsupportedModelError(f"{path}: general.type is {shown(md.get('general.type'))}, not 'adapter': "
                                    "this GGUF file is not a LoRA adapter")
    if md.get("adapter.type", "lora") != "lora":
        raise UnsupportedModelError(f"{path}: adapter.type is {shown(md.get('adapter.type'))}, not 'lora'")
    alpha = md.get("adapter.lora.alpha", 0.0)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise ModelFileError(f"{path}: adapter.lora.alpha is {shown(alpha)}, not a number")
    found = {}
    for tname, ti in gf.tensors.items():
        if tname.endswith("_norm.weight"):
            continue   # llama.cpp ignores these too
        m = _GGUF_NAME.match(tname)
        if m is None or m.group(2) not in GGUF_MODULES:
            raise UnsupportedModelError(f"{path}: tensor {shown(tname)} is not a LoRA a / b of one of "
                                        f"{', '.join(GGUF_MODULES)}")
        if ti.ggml_type not in _GGUF_TYPES:
            raise UnsupportedModelError(f"{path}: tensor {shown(tname)} is {ti.type_name}; webdrift reads LoRA "
                                        "tensors in F32, F16 or BF16")
        found[(int(m.group(1)), GGUF_MODULES[m.group(2)], m.group(3).upper())] = ti
    ad = LoraAdapter(path, rows_permuted=md.get("general.architecture") == "llama")
    for (layer, tgt), (ta, tb) in sorted(_pair(found, path).items()):
        rank = ta.shape[0] if len(ta.shape) == 2 else 0
        scale = alpha / rank if alpha and rank else 1.0
        ad.targets[(layer, tgt)] = _target(
            path, layer, tgt, ta.shape, tb.shape,
            lambda n, ta=ta: _floats(gf.raw(ta.name), _GGUF_TYPES[ta.ggml_type], n, f"{path}: {ta.name}"),
            lambda n, tb=tb: _floats(gf.raw(tb.name), _GGUF_TYPES[tb.ggml_type], n, f"{path}: {tb.name}"), scale)
    return ad


def read_checked(source, cfg, max_rank: int, name: str | None = None) -> LoraAdapter:
    """read_lora + check against the model; any failure that is not already a WebdriftError (a
    damaged file tripping the readers) becomes a ModelFileError naming the file."""
    label = name if name is not None else (os.fspath(source) if isinstance(source, (str, os.PathLike))
                                           else "<lora bytes>")
    if isinstance(source, LoraAdapter):   # made in memory (bench's random adapters)
        source.check(cfg, max_rank)
        return source
    try:
        ad = read_lora(source, name)
    except WebdriftError:
        raise
    except (ValueError, struct.error, OverflowError, MemoryError, OSError) as e:
        raise ModelFileError(f"LoRA adapter {shown(label)}: cannot be read ({shown(str(e))})") from e
    ad.check(cfg, max_rank)
    return ad
