"""Hugging Face checkpoint folders (config.json + *.safetensors + tokenizer files) for the
Llama family: config -> ModelConfig, HF tensor names -> canonical (GGUF) names.

Pure Python (runs under Pyodide): json + webdrift.weights.safetensors, no numpy, no transformers.
It only describes the folder; it never converts or copies weights (source.py wraps the tensors).

Supported: LlamaForCausalLM (Llama 2/3, SmolLM/SmolLM2, TinyLlama...) and Qwen2ForCausalLM (q/k/v
bias), with MHA/GQA/MQA, any head_dim, tied or untied embeddings, F32/F16/BF16 weights, RoPE
scaling "linear" and "llama3". Both config spellings are read: transformers 4.x (`rope_theta`,
`rope_scaling`) and 5.x (`rope_parameters`). HF checkpoints use rotate-half RoPE (rope_style "half").
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from webdrift.errors import ModelFileError, UnsupportedModelError, shown
from webdrift.weights.config import ModelConfig
from webdrift.weights.safetensors import (
    SUPPORTED_DTYPES,
    SafeTensorInfo,
    SafetensorsFile,
    open_safetensors_folder,
)

__all__ = [
    "SUPPORTED_HF_ARCHITECTURES",
    "SUPPORTED_ROPE_SCALING",
    "HFFolder",
    "hf_config_to_model_config",
    "hf_to_canonical_name",
    "read_hf_folder",
]

# HF `architectures[0]` -> ModelConfig.arch
SUPPORTED_HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
_MODEL_TYPE_TO_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SUPPORTED_ROPE_SCALING = ("linear", "llama3")
# required keys of each rope scaling type (besides rope_type)
_ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}

_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_MAP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# tensors an HF checkpoint may carry that the model does not need
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_to_canonical_name(hf_name: str) -> str | None:
    """`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`; None if not a
    Llama-family weight (the caller decides whether that is an error)."""
    if hf_name in _GLOBAL_MAP:
        return _GLOBAL_MAP[hf_name]
    m = _LAYER_RE.match(hf_name)
    if m and m.group(2) in _LAYER_MAP:
        return f"blk.{int(m.group(1))}.{_LAYER_MAP[m.group(2)]}"
    return None


@dataclass
class HFFolder:
    path: str
    config: ModelConfig
    # canonical name -> (file, entry) for every tensor the model uses
    tensors: dict[str, tuple[SafetensorsFile, SafeTensorInfo]]
    tokenizer_info: dict[
        str, Any
    ]  # {"kind": "hf", "tokenizer_json": path | None, "tokenizer_config": dict | None}
    chat_template: str | None


def _load_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ModelFileError(f"cannot read {what} {path}: {e}") from None
    except ValueError as e:
        raise ModelFileError(f"{what} {path} is not valid JSON: {e}") from None
    except RecursionError:
        raise ModelFileError(f"{what} {path} is JSON nested too deeply") from None


def _ids(v: Any) -> list[int]:
    if v is None:
        return []
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    return []


def _rope_settings(cfg: dict[str, Any], where: str) -> tuple[float, dict | None]:
    """(rope_theta, normalized rope_scaling or None) from either config spelling."""
    params = cfg.get("rope_parameters")
    # transformers 5 may nest per-layer-type parameters ({"full_attention": {...}}); not for llama/qwen2
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        raise UnsupportedModelError(f"{where}: per-layer-type rope_parameters are not supported")
    theta = cfg.get("rope_theta")
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    theta = 10000.0 if theta is None else theta
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise ModelFileError(f"{where}: invalid rope_theta {shown(theta)}")

    scaling = cfg.get("rope_scaling")
    if scaling is None and isinstance(params, dict):
        scaling = params
    if scaling is None:
        return float(theta), None
    if not isinstance(scaling, dict):
        raise ModelFileError(f"{where}: rope_scaling must be an object, got {shown(scaling)}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type in (None, "default"):
        return float(theta), None
    if rope_type not in SUPPORTED_ROPE_SCALING:
        raise UnsupportedModelError(
            f"{where}: rope scaling type {shown(rope_type)} is not supported; supported: "
            + ", ".join(SUPPORTED_ROPE_SCALING)
        )
    out: dict[str, Any] = {"rope_type": rope_type}
    for k, v in scaling.items():
        if k not in ("rope_type", "type", "rope_theta"):
            out[k] = v
    for k in _ROPE_SCALING_KEYS[rope_type]:
        v = out.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise ModelFileError(
                f"{where}: rope scaling {shown(rope_type)} needs a positive number {k!r}, got {shown(v)}"
            )
    return float(theta), out


def _positive_int(cfg: dict[str, Any], key: str, where: str, default: Any = ...) -> int:
    v = cfg.get(key, default)
    if v is ...:
        raise ModelFileError(f"{where}: missing required key {key!r}")
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ModelFileError(f"{where}: {key!r} must be a positive integer, got {shown(v)}")
    return v


def hf_config_to_model_config(
    cfg: dict[str, Any],
    where: str = "config.json",
    generation_config: dict[str, Any] | None = None,
    name: str = "",
) -> ModelConfig:
    """ModelConfig from a parsed config.json (tie_word_embeddings taken as given, default False)."""
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs:
        hf_arch = archs[0]
    else:
        mt = cfg.get("model_type")
        hf_arch = _MODEL_TYPE_TO_ARCH.get(mt, mt) if isinstance(mt, str) else mt
    if not isinstance(hf_arch, str) or hf_arch not in SUPPORTED_HF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{where}: architecture {shown(hf_arch)} is not supported; supported HF architectures: "
            + ", ".join(SUPPORTED_HF_ARCHITECTURES)
        )
    arch = SUPPORTED_HF_ARCHITECTURES[hf_arch]
    if cfg.get("quantization_config"):
        qm = cfg["quantization_config"]
        method = qm.get("quant_method") if isinstance(qm, dict) else qm
        raise UnsupportedModelError(f"{where}: quantized HF checkpoints ({shown(method)}) are not supported")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(
            f"{where}: hidden_act {shown(act)} is not supported for {hf_arch} (only 'silu')"
        )
    if cfg.get("mlp_bias"):
        raise UnsupportedModelError(f"{where}: mlp_bias=true is not supported")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError(f"{where}: partial_rotary_factor != 1 is not supported")
    layer_types = cfg.get("layer_types")
    if cfg.get("use_sliding_window") or (isinstance(layer_types, list) and "sliding_attention" in layer_types):
        raise UnsupportedModelError(f"{where}: sliding-window attention is not supported for {hf_arch}")

    dim = _positive_int(cfg, "hidden_size", where)
    n_layers = _positive_int(cfg, "num_hidden_layers", where)
    n_heads = _positive_int(cfg, "num_attention_heads", where)
    n_kv = cfg.get("num_key_value_heads")
    n_kv = n_heads if n_kv is None else _positive_int(cfg, "num_key_value_heads", where)
    if n_heads % n_kv:
        raise ModelFileError(
            f"{where}: num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv}"
        )
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if dim % n_heads:
            raise ModelFileError(
                f"{where}: hidden_size {dim} is not a multiple of num_attention_heads {n_heads}"
            )
        head_dim = dim // n_heads
    else:
        head_dim = _positive_int(cfg, "head_dim", where)
    if head_dim % 2:
        raise ModelFileError(f"{where}: head_dim {head_dim} must be even for RoPE")
    ffn_dim = _positive_int(cfg, "intermediate_size", where)
    vocab = _positive_int(cfg, "vocab_size", where)
    eps = cfg.get("rms_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
        raise ModelFileError(f"{where}: invalid rms_norm_eps {shown(eps)}")
    theta, scaling = _rope_settings(cfg, where)
    max_pos = cfg.get("max_position_embeddings", 2048)
    if not isinstance(max_pos, int) or isinstance(max_pos, bool) or max_pos <= 0:
        raise ModelFileError(f"{where}: invalid max_position_embeddings {shown(max_pos)}")

    gen = generation_config or {}
    eos = _ids(gen.get("eos_token_id")) or _ids(cfg.get("eos_token_id"))
    bos = _ids(gen.get("bos_token_id")) or _ids(cfg.get("bos_token_id"))
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        ffn_dim=ffn_dim,
        norm_eps=float(eps),
        rope_theta=theta,
        rope_style="half",
        max_position=max_pos,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=list(dict.fromkeys(eos)),
        name=name,
        rope_scaling=scaling,
    )


def _chat_template(folder: str, tok_cfg: dict[str, Any] | None) -> str | None:
    tpl = (tok_cfg or {}).get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict) and isinstance(t.get("name"), str)}
        tpl = named.get("default") or next(iter(named.values()), None)
    if isinstance(tpl, str):
        return tpl
    jinja = os.path.join(folder, "chat_template.jinja")  # transformers >= 4.43 may save it apart
    if os.path.isfile(jinja):
        try:
            with open(jinja, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ModelFileError(f"cannot read the chat template {jinja}: {e}") from None
    js = os.path.join(folder, "chat_template.json")
    if os.path.isfile(js):
        doc = _load_json(js, "chat template")
        tpl = doc.get("chat_template") if isinstance(doc, dict) else None
        if isinstance(tpl, str):
            return tpl
    return None


def _tokenizer_adds_bos(tokenizer_json: str | None, tok_cfg: dict[str, Any] | None) -> bool:
    """tokenizer_config's add_bos_token if set; else whether tokenizer.json's post-processor
    prepends a special token (Llama 3's TemplateProcessing does, SmolLM2's ByteLevel does not)."""
    v = (tok_cfg or {}).get("add_bos_token")
    if isinstance(v, bool):
        return v
    if not tokenizer_json:
        return False
    doc = _load_json(tokenizer_json, "tokenizer file")
    procs = [doc.get("post_processor")] if isinstance(doc, dict) else []
    while procs:
        p = procs.pop()
        if not isinstance(p, dict):
            continue
        if p.get("type") == "Sequence":
            subs = p.get("processors")
            procs.extend(subs if isinstance(subs, list) else [])
        elif p.get("type") == "TemplateProcessing":
            single = p.get("single") or []
            if single and isinstance(single[0], dict) and "SpecialToken" in single[0]:
                return True
    return False


def read_hf_folder(folder: str | os.PathLike) -> HFFolder:
    """Parse an HF checkpoint folder; checks the config and maps tensors (shape checks are
    done by source.py for both formats)."""
    folder = os.fspath(folder)
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg_path):
        raise ModelFileError(f"{folder}: not an HF model folder (no config.json)")
    cfg = _load_json(cfg_path, "model config")
    if not isinstance(cfg, dict):
        raise ModelFileError(f"{cfg_path}: not a JSON object")
    gen_path = os.path.join(folder, "generation_config.json")
    gen = _load_json(gen_path, "generation config") if os.path.isfile(gen_path) else None
    name = os.path.basename(os.path.normpath(folder))
    config = hf_config_to_model_config(cfg, cfg_path, gen if isinstance(gen, dict) else None, name)

    raw_tensors = open_safetensors_folder(folder)
    tensors: dict[str, tuple[SafetensorsFile, SafeTensorInfo]] = {}
    for hf_name, entry in raw_tensors.items():
        canon = hf_to_canonical_name(hf_name)
        if canon is None:
            if hf_name.endswith(_IGNORED_SUFFIXES):
                continue
            if hf_name.endswith("o_proj.bias"):
                raise UnsupportedModelError(
                    f"{folder}: tensor {shown(hf_name)}: attention output bias is not supported"
                )
            continue  # unrelated extra tensor: not used
        tensors[canon] = entry

    # tied embeddings: explicit config wins; an absent key with no lm_head means tied
    if "tie_word_embeddings" not in cfg and "output.weight" not in tensors:
        config.tied_embeddings = True
    if config.tied_embeddings:
        tensors.pop("output.weight", None)
    elif "output.weight" not in tensors:
        raise ModelFileError(
            f"{folder}: tie_word_embeddings is false but the checkpoint has no lm_head.weight"
        )
    if "blk.0.attn_q.bias" in tensors:
        config.qkv_bias = True
    for canon, (sf, info) in tensors.items():
        if info.dtype not in SUPPORTED_DTYPES:
            raise UnsupportedModelError(
                f"{sf.path_or_name}: tensor {shown(info.name)} ({canon}) has dtype {info.dtype}; "
                f"supported: {', '.join(SUPPORTED_DTYPES)}"
            )

    tok_json = os.path.join(folder, "tokenizer.json")
    tok_json = tok_json if os.path.isfile(tok_json) else None
    tc_path = os.path.join(folder, "tokenizer_config.json")
    tok_cfg = _load_json(tc_path, "tokenizer config") if os.path.isfile(tc_path) else None
    if tok_cfg is not None and not isinstance(tok_cfg, dict):
        raise ModelFileError(f"{tc_path}: not a JSON object")
    config.add_bos_token = _tokenizer_adds_bos(tok_json, tok_cfg)
    return HFFolder(
        path=folder,
        config=config,
        tensors=tensors,
        tokenizer_info={"kind": "hf", "tokenizer_json": tok_json, "tokenizer_config": tok_cfg},
        chat_template=_chat_template(folder, tok_cfg),
    )
