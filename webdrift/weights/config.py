"""ModelConfig: what a model *is* (shapes, norms, RoPE), independent of its file format.

Readers in webdrift/weights/ fill it from GGUF metadata or an HF config.json; graph builders in
webdrift/models/ read it. Pure Python (runs under Pyodide).

Canonical tensor names are GGUF's (llama.cpp's) names, whatever the source format:
    token_embd.weight            (vocab, dim)
    blk.{i}.attn_norm.weight     (dim,)
    blk.{i}.attn_q.weight        (n_heads * head_dim, dim)      [+ .bias for Qwen2]
    blk.{i}.attn_k.weight        (n_kv_heads * head_dim, dim)   [+ .bias]
    blk.{i}.attn_v.weight        (n_kv_heads * head_dim, dim)   [+ .bias]
    blk.{i}.attn_output.weight   (dim, n_heads * head_dim)
    blk.{i}.ffn_norm.weight      (dim,)
    blk.{i}.ffn_gate.weight      (ffn_dim, dim)
    blk.{i}.ffn_up.weight        (ffn_dim, dim)
    blk.{i}.ffn_down.weight      (dim, ffn_dim)
    output_norm.weight           (dim,)
    output.weight                (vocab, dim)   absent when embeddings are tied
  Gemma 3 adds: blk.{i}.attn_q_norm.weight, blk.{i}.attn_k_norm.weight (head_dim,),
    blk.{i}.post_attention_norm.weight, blk.{i}.post_ffw_norm.weight (dim,).
Shapes above are numpy order (rows, cols) = (out, in); GGUF's ne[] lists them reversed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    arch: str                      # "llama" (also SmolLM, Mistral-like), "qwen2", "gemma3"
    vocab_size: int
    dim: int                       # hidden size
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # "interleaved": rotate pairs (2i, 2i+1) -- llama.cpp's convention, which GGUF llama files
    # need because the exporter permuted Q/K rows for it. "half": rotate pairs (i, i + d/2),
    # HF transformers' rotate_half (HF folders, Gemma GGUF, Qwen2 GGUF).
    rope_style: str = "half"
    max_position: int = 2048       # the model's trained context
    tied_embeddings: bool = False
    qkv_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    add_bos_token: bool = False
    name: str = ""
    # --- Gemma-family options (defaults are llama behaviour) ---
    act: str = "silu"              # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0       # Gemma multiplies embeddings by sqrt(dim)
    qk_norm: bool = False          # RMSNorm over head_dim on q and k (Gemma 3)
    post_norms: bool = False       # post-attention and post-FFN RMSNorm (Gemma 2/3)
    norm_weight_offset: float = 0.0  # 1.0 when stored norm weights w mean (1 + w) (HF Gemma)
    attn_scale: float | None = None  # None -> 1/sqrt(head_dim); Gemma: query_pre_attn_scalar**-0.5
    sliding_window: int | None = None
    # layer i uses the sliding window (and rope_local_theta) unless (i + 1) % sliding_window_pattern == 0
    sliding_window_pattern: int | None = None
    rope_local_theta: float | None = None
    final_logit_softcap: float | None = None
    rope_scaling: dict | None = None  # HF rope_scaling (llama3 / linear), None for plain RoPE

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def layer_is_sliding(self, i: int) -> bool:
        if not self.sliding_window or not self.sliding_window_pattern:
            return False
        return (i + 1) % self.sliding_window_pattern != 0
