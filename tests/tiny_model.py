"""A tiny but complete GGUF model for the reliability tests: llama architecture, dim 64, 2 layers,
4 query / 2 KV heads, a byte-level ("gpt2") tokenizer of 256 byte tokens + a few merges + the
ChatML special tokens, and SmolLM2's chat template. Written with gguf-py (the reference writer),
so the CLI and webdrift.load open it like any model file; it loads in seconds on lavapipe.

The weights are random (seeded): the text it writes is noise, so tests of what the text *is* use
SmolLM2; these tests check behaviour (errors, interrupts, busy state, memory) and compare the
tools against the Python API. `nan_tensor` fills one tensor with NaN, as a mislabelled tensor
type would (the source of non-finite logits in issue 15).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, quants

from webdrift.tokenizer.pretokenize import BYTE_TO_CHAR

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "Ġ s"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")
DIM, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 64, 2, 4, 2, 128, 512


def tiny_tokens() -> list[str]:
    return SPECIALS + [BYTE_TO_CHAR[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]


def write_tiny_gguf(path, *, seed: int = 0, nan_tensor: str | None = None, nan_row: tuple[str, int] | None = None,
                    eos: bool = True, tokens: list[str] | None = None, quant: dict[str, str] | None = None) -> str:
    """Write the tiny model to `path` (returned as a str). eos=False: no eos id in the metadata
    (and no end-of-generation control tokens: generation always runs to max_new_tokens).
    nan_tensor: that tensor all NaN; nan_row (name, r): row r of that matrix NaN. quant: GGUF
    types of matrices by name ("attn_q", "token_embd", ...: "Q4_0", "Q8_0", ...), quantized by
    gguf-py; the others F32."""
    tokens = tokens or tiny_tokens()
    vocab = len(tokens)
    hd = DIM // HEADS
    w = GGUFWriter(str(path), "llama")
    w.add_name("webdrift-tiny")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    types = [3 if eos and t in SPECIALS else 1 for t in tokens]
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    if eos:
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(seed)
    shapes = {"token_embd.weight": (vocab, DIM), "output_norm.weight": (DIM,)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (DIM,), p + "attn_q.weight": (HEADS * hd, DIM),
                       p + "attn_k.weight": (KV_HEADS * hd, DIM), p + "attn_v.weight": (KV_HEADS * hd, DIM),
                       p + "attn_output.weight": (DIM, HEADS * hd), p + "ffn_norm.weight": (DIM,),
                       p + "ffn_gate.weight": (FFN, DIM), p + "ffn_up.weight": (FFN, DIM),
                       p + "ffn_down.weight": (DIM, FFN)})
    for name, shape in shapes.items():
        a = np.ones(shape, np.float32) if len(shape) == 1 else rng.normal(0, 0.5, shape).astype(np.float32)
        if name == nan_tensor:
            a[:] = np.nan
        if nan_row is not None and name == nan_row[0]:
            a[nan_row[1]] = np.nan
        t = (quant or {}).get(name.split(".")[-2]) if len(shape) == 2 else None
        if t is None:
            w.add_tensor(name, a)
        else:
            qt = getattr(GGMLQuantizationType, t)
            w.add_tensor(name, quants.quantize(a, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def write_tiny_lora(path, *, rank: int = 4, alpha: float = 8.0, seed: int = 1) -> str:
    """A random LoRA adapter of the tiny model on all seven targets, as llama.cpp's GGUF LoRA
    files hold it (gguf-py): general.type "adapter", adapter.lora.alpha, `blk.N.<tensor>.weight.
    lora_a` (rank, in) and `.lora_b` (out, rank) in F16."""
    hd = DIM // HEADS
    shapes = {"attn_q": (HEADS * hd, DIM), "attn_k": (KV_HEADS * hd, DIM), "attn_v": (KV_HEADS * hd, DIM),
              "attn_output": (DIM, HEADS * hd), "ffn_gate": (FFN, DIM), "ffn_up": (FFN, DIM), "ffn_down": (DIM, FFN)}
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for i in range(LAYERS):
        for name, (n_out, n_in) in shapes.items():
            w.add_tensor(f"blk.{i}.{name}.weight.lora_a", rng.normal(0, n_in ** -0.5, (rank, n_in)).astype(np.float16))
            w.add_tensor(f"blk.{i}.{name}.weight.lora_b", rng.normal(0, 0.3, (n_out, rank)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
