"""HF checkpoint folders (webdrift.weights.hf + safetensors + source) against transformers/torch.

Tiny random Llama and Qwen2 models are saved with transformers' save_pretrained; every tensor
we read must equal the torch state dict exactly, and every config field must be right.
"""

from __future__ import annotations

import copy
import json
import math
import struct

import numpy as np
import pytest
import torch
import transformers

from webdrift.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from webdrift.weights.hf import hf_to_canonical_name
from webdrift.weights.safetensors import SafetensorsFile
from webdrift.weights.source import open_model_source

DTYPES = {"f32": (torch.float32, "F32"), "f16": (torch.float16, "F16"), "bf16": (torch.bfloat16, "BF16")}

# name -> (architecture, dtype, config overrides)
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 1024,
}
CASES = {
    "llama_f32_gqa_untied": ("llama", "f32", {"num_attention_heads": 4, "num_key_value_heads": 2}),
    "llama_f16_mqa_tied": (
        "llama",
        "f16",
        {"num_attention_heads": 4, "num_key_value_heads": 1, "tie_word_embeddings": True},
    ),
    "llama_bf16_mha_headdim24": (
        "llama",
        "bf16",
        {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 24},
    ),
    "qwen2_f32_gqa_tied": (
        "qwen2",
        "f32",
        {"num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True},
    ),
    "qwen2_bf16_mqa_untied_sharded": (
        "qwen2",
        "bf16",
        {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 40},
    ),
    "llama_f16_rope_llama3": (
        "llama",
        "f16",
        {
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "rope_scaling": LLAMA3_SCALING,
        },
    ),
}


def _make(arch: str, dtype: str, overrides: dict, folder, shard: bool = False) -> dict:
    base = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 128,
                "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "tie_word_embeddings": False,
                "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
    base.update(copy.deepcopy(overrides))  # transformers edits the dicts it is given
    if arch == "llama":
        cfg, cls = transformers.LlamaConfig(**base), transformers.LlamaForCausalLM
    else:
        base.setdefault("rope_theta", 1e6)
        cfg, cls = transformers.Qwen2Config(**base), transformers.Qwen2ForCausalLM
    torch.manual_seed(hash(str(folder)) % 2**31)
    model = cls(cfg).to(DTYPES[dtype][0])
    with torch.no_grad():  # norms are initialised to ones and biases to zeros: randomise them
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p))
    model.save_pretrained(str(folder), max_shard_size="20KB" if shard else "5GB")
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    out = {}
    for name, (arch, dtype, overrides) in CASES.items():
        folder = tmp_path_factory.mktemp(name)
        out[name] = (folder, _make(arch, dtype, overrides, folder, shard="sharded" in name))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_tensors_equal_state_dict(hf_models, case):
    folder, sd = hf_models[case]
    _arch, dtype, overrides = CASES[case]
    src = open_model_source(folder)
    tied = overrides.get("tie_word_embeddings", False)
    expected = {}
    for hf_name, t in sd.items():
        canon = hf_to_canonical_name(hf_name)
        assert canon is not None, hf_name
        if canon == "output.weight" and tied:
            continue
        expected[canon] = t
    assert set(src.tensors) == set(expected)
    for canon, t in expected.items():
        st = src.tensors[canon]
        assert st.type_name == DTYPES[dtype][1]
        assert st.shape == tuple(t.shape)
        got = st.to_numpy()
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, t.float().numpy())
        # raw bytes are the stored little-endian values
        raw_ref = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        assert st.raw() == raw_ref
    if "sharded" in case:
        assert (folder / "model.safetensors.index.json").exists()


@pytest.mark.parametrize("case", list(CASES))
def test_config_fields(hf_models, case):
    folder, _ = hf_models[case]
    arch, _, o = CASES[case]
    c = open_model_source(str(folder)).config
    heads, kv = o["num_attention_heads"], o["num_key_value_heads"]
    head_dim = o.get("head_dim", 64 // heads)
    assert (c.arch, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size) == (
        arch, 64, 2, heads, kv, head_dim, 96, 128,
    )  # fmt: skip
    assert c.q_dim == heads * head_dim and c.kv_dim == kv * head_dim
    assert c.rope_style == "half"
    assert c.norm_eps == 1e-5
    assert c.rope_theta == (1e6 if arch == "qwen2" else 10000.0)
    assert c.tied_embeddings == o.get("tie_word_embeddings", False)
    assert c.qkv_bias == (arch == "qwen2")
    assert c.bos_token_id == 1 and c.eos_token_ids == [2]
    assert c.max_position == o.get("max_position_embeddings", 512)
    assert c.act == "silu" and not c.qk_norm and c.norm_weight_offset == 0.0
    if "rope_scaling" in o:
        assert c.rope_scaling == o["rope_scaling"]
    else:
        assert c.rope_scaling is None


def test_logits_match_transformers_with_our_tensors(hf_models):
    """A numpy forward over *our* tensors and config reproduces the HF model (GQA + head_dim 40 +
    q/k/v bias + rotate-half RoPE): the name mapping and the config are right, not just the bytes."""
    folder, _ = hf_models["qwen2_bf16_mqa_untied_sharded"]
    src = open_model_source(folder)
    c = src.config
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    ids = np.array([1, 5, 9, 77, 3, 100, 42])
    with torch.no_grad():
        ref = model(torch.from_numpy(ids)[None]).logits[0].numpy()
    w = {n: t.to_numpy() for n, t in src.tensors.items()}
    t = len(ids)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.norm_eps) * g

    def rope(x):
        d = x.shape[-1]
        ang = np.arange(t)[:, None] * (1.0 / c.rope_theta ** (np.arange(0, d, 2) / d))[None]
        cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    x = w["token_embd.weight"][ids]
    for i in range(c.n_layers):
        p = f"blk.{i}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = rope((h @ w[p + "attn_q.weight"].T + w[p + "attn_q.bias"]).reshape(t, c.n_heads, c.head_dim))
        k = rope((h @ w[p + "attn_k.weight"].T + w[p + "attn_k.bias"]).reshape(t, c.n_kv_heads, c.head_dim))
        v = (h @ w[p + "attn_v.weight"].T + w[p + "attn_v.bias"]).reshape(t, c.n_kv_heads, c.head_dim)
        g = c.n_heads // c.n_kv_heads
        s = np.einsum("thd,shd->hts", q, np.repeat(k, g, 1)) / math.sqrt(c.head_dim)
        s = np.where(np.triu(np.ones((t, t), bool), 1)[None], -np.inf, s)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = (
            x
            + np.einsum("hts,shd->thd", a, np.repeat(v, g, 1)).reshape(t, -1) @ w[p + "attn_output.weight"].T
        )
        h = rms(x, w[p + "ffn_norm.weight"])
        gate = h @ w[p + "ffn_gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    logits = rms(x, w["output_norm.weight"]) @ w["output.weight"].T
    np.testing.assert_allclose(logits, ref, atol=1e-4 * np.abs(ref).max(), rtol=1e-4)


# ---------------------------------------------------------------- tokenizer files


def _write_tokenizer(folder, template: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "ab": 5}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
        )
    tok.save(str(folder / "tokenizer.json"))


def test_tokenizer_info_and_chat_template(hf_models, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(hf_models["llama_f32_gqa_untied"][0], folder)
    src = open_model_source(folder)
    assert src.tokenizer_info == {"kind": "hf", "tokenizer_json": None, "tokenizer_config": None}
    assert src.chat_template is None and src.config.add_bos_token is False

    _write_tokenizer(folder, template=True)
    tpl = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": tpl, "bos_token": "<s>"}))
    src = open_model_source(folder)
    assert src.tokenizer_info["tokenizer_json"] == str(folder / "tokenizer.json")
    assert src.tokenizer_info["tokenizer_config"]["bos_token"] == "<s>"
    assert src.chat_template == tpl
    assert src.config.add_bos_token is True  # TemplateProcessing prepends <s>

    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    (folder / "chat_template.jinja").write_text("JINJA")
    src = open_model_source(folder)
    assert src.config.add_bos_token is False and src.chat_template == "JINJA"

    _write_tokenizer(folder, template=False)
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}
        )
    )
    src = open_model_source(folder)
    assert src.config.add_bos_token is False and src.chat_template == "D"

    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7], "bos_token_id": 1}))
    assert open_model_source(folder).config.eos_token_ids == [2, 7]


# ---------------------------------------------------------------- errors


def _copy(hf_models, tmp_path, case="llama_f32_gqa_untied"):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(hf_models[case][0], folder)
    return folder


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def test_unsupported_architecture(hf_models, tmp_path):
    folder = _copy(hf_models, tmp_path)
    _edit_config(folder, architectures=["GPT2LMHeadModel"])
    with pytest.raises(UnsupportedModelError, match="'GPT2LMHeadModel'.*LlamaForCausalLM, Qwen2ForCausalLM"):
        open_model_source(folder)
    _edit_config(folder, architectures=None, model_type="llama")  # falls back to model_type
    assert open_model_source(folder).config.arch == "llama"
    _edit_config(folder, model_type="qwen2")  # a Qwen2 needs q/k/v biases, which this llama lacks
    with pytest.raises(ModelFileError, match="'blk.0.attn_q.bias' is missing"):
        open_model_source(folder)
    _edit_config(
        folder, architectures=["LlamaForCausalLM"], rope_parameters={"rope_type": "yarn", "factor": 4.0}
    )
    with pytest.raises(UnsupportedModelError, match="'yarn'.*linear, llama3"):
        open_model_source(folder)
    _edit_config(folder, rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=5e5)
    c = open_model_source(folder).config
    assert c.rope_scaling == {"rope_type": "linear", "factor": 2.0} and c.rope_theta == 5e5
    _edit_config(folder, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ModelFileError, match="low_freq_factor"):
        open_model_source(folder)
    _edit_config(folder, rope_scaling=None, hidden_act="gelu")
    with pytest.raises(UnsupportedModelError, match="hidden_act 'gelu'"):
        open_model_source(folder)


def test_shape_and_missing_tensor_errors(hf_models, tmp_path):
    folder = _copy(hf_models, tmp_path)
    _edit_config(folder, intermediate_size=100)
    with pytest.raises(
        ModelFileError, match=r"'blk.0.ffn_gate.weight' has shape \(96, 64\), expected \(100, 64\)"
    ):
        open_model_source(folder)
    _edit_config(folder, intermediate_size=96, num_hidden_layers=3)
    with pytest.raises(ModelFileError, match=r"'blk.2.attn_norm.weight' is missing"):
        open_model_source(folder)
    _edit_config(folder, num_hidden_layers=2, tie_word_embeddings=False)
    # drop lm_head from the file: untied but no output weights
    from safetensors.torch import load_file, save_file

    sd = load_file(str(folder / "model.safetensors"))
    del sd["lm_head.weight"]
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelFileError, match="no lm_head.weight"):
        open_model_source(folder)
    _edit_config(folder, tie_word_embeddings=None)  # absent key + no lm_head: tied
    assert open_model_source(folder).config.tied_embeddings
    sd["model.layers.0.mlp.up_proj.weight"] = sd["model.layers.0.mlp.up_proj.weight"].to(torch.int8)
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match="up_proj.weight.*dtype I8"):
        open_model_source(folder)


def test_folder_errors(tmp_path):
    with pytest.raises(ModelFileError, match="no config.json"):
        open_model_source(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="config.json is not valid JSON"):
        open_model_source(tmp_path)
    (tmp_path / "x.safetensors").write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="folder"):
        open_model_source(tmp_path / "x.safetensors")


# ---------------------------------------------------------------- safetensors reader


def test_safetensors_reader_matches_library(tmp_path):
    from safetensors.numpy import save_file

    arrays = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.ones((5,), dtype=np.float16),
        "c": np.array([[1, 2]], dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    p = tmp_path / "t.safetensors"
    save_file(arrays, str(p), metadata={"k": "v"})
    sf = SafetensorsFile(p)
    assert sf.metadata == {"k": "v"}
    assert sf.tensors["a"].shape == (3, 4) and sf.tensors["a"].dtype == "F32"
    assert sf.raw("a") == arrays["a"].tobytes() and sf.raw("b") == arrays["b"].tobytes()
    assert sf.raw("empty") == b""
    with pytest.raises(UnsupportedModelError, match="'c' has dtype I64"):
        sf.raw("c")
    mem = SafetensorsFile(memoryview(p.read_bytes()), name="t-in-memory")
    assert mem.tensors == sf.tensors and mem.raw("a") == sf.raw("a")


def _corrupt_header(path, doc=None, raw_header=None, claimed_len=None, data=b""):
    header = raw_header if raw_header is not None else json.dumps(doc).encode()
    n = len(header) if claimed_len is None else claimed_len
    path.write_bytes(struct.pack("<Q", n) + header + data)


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("short", "not a safetensors file"),
        ("huge_len", "exceeds the file size"),
        ("not_json", "not valid UTF-8 JSON"),
        ("not_object", "not a JSON object"),
        ("bad_dtype", "unknown dtype 'F99'"),
        ("bad_shape", "invalid shape"),
        ("bad_offsets", "invalid data_offsets"),
        ("size_mismatch", "needs 16 bytes"),
        ("past_end", "extends past the end"),
        ("overlap", "overlap"),
    ],
)
def test_safetensors_bad_headers(tmp_path, kind, match):
    p = tmp_path / f"{kind}.safetensors"
    f32 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    if kind == "short":
        p.write_bytes(b"\x01\x02")
    elif kind == "huge_len":
        _corrupt_header(p, {"a": f32}, claimed_len=2**62)
    elif kind == "not_json":
        _corrupt_header(p, raw_header=b"{\xff", data=b"")
    elif kind == "not_object":
        _corrupt_header(p, [1, 2])
    elif kind == "bad_dtype":
        _corrupt_header(p, {"a": dict(f32, dtype="F99")}, data=b"\0" * 16)
    elif kind == "bad_shape":
        _corrupt_header(p, {"a": dict(f32, shape=[-4])}, data=b"\0" * 16)
    elif kind == "bad_offsets":
        _corrupt_header(p, {"a": dict(f32, data_offsets=[16, 0])}, data=b"\0" * 16)
    elif kind == "size_mismatch":
        _corrupt_header(p, {"a": dict(f32, data_offsets=[0, 12])}, data=b"\0" * 16)
    elif kind == "past_end":
        _corrupt_header(p, {"a": f32}, data=b"\0" * 15)
    elif kind == "overlap":
        _corrupt_header(p, {"a": f32, "b": dict(f32, data_offsets=[8, 24])}, data=b"\0" * 24)
    with pytest.raises(ModelFileError, match=match) as ei:
        SafetensorsFile(p)
    assert str(p) in str(ei.value)


def test_sharded_index_errors(hf_models, tmp_path):
    folder = _copy(hf_models, tmp_path, "qwen2_bf16_mqa_untied_sharded")
    idx = json.loads((folder / "model.safetensors.index.json").read_text())
    name = "model.layers.0.mlp.up_proj.weight"
    shard = idx["weight_map"][name]
    other = next(s for s in idx["weight_map"].values() if s != shard)
    idx["weight_map"][name] = other
    (folder / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(ModelFileError, match=f"puts tensor '{name}' in {other}"):
        open_model_source(folder)
    idx["weight_map"][name] = "missing.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(ModelFileError, match="missing.safetensors"):
        open_model_source(folder)
