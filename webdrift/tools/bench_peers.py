"""PyTorch peers for `webdrift bench`, on the same GPU through CUDA (desktop only).

Two baselines in the shapes of the benchmarked model, fp16, random weights, batch 1, greedy:
  hf_eager    transformers' LlamaForCausalLM(config) with `generate` (PyTorch eager, dynamic KV
              cache, SDPA attention): what most people run;
  cuda_graph  a minimal llama forward written here with a preallocated (static) KV cache, one
              decode step captured in a torch.cuda.CUDAGraph and replayed per token, the sampled
              token and the position updated inside the graph (gpt-fast's recipe without
              torch.compile): what a careful CUDA implementation gets from the same kernels.
Both report prefill tokens/s (prompt / time to first token) and decode tokens/s ((new - 1) /
time after the first token), the definitions webdrift's GenerationStats uses.
Skipped with a note where torch or a CUDA device is missing. A desktop tool (webdrift/tools/).
Must not: be imported by the core; import torch at module level (the bench runs without it).
"""

from __future__ import annotations

import gc
import time


def availability() -> tuple[bool, str]:
    """(True, "torch X, cuda device") or (False, why the peers are skipped)."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the machine
        return False, f"PyTorch is not installed ({type(e).__name__}); peers skipped"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} has no CUDA device here; peers skipped"
    return True, f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}"


def _free() -> None:
    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _hf_config(cfg):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
                       num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                       num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps,
                       rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling,
                       max_position_embeddings=max(cfg.max_position, 4096),
                       tie_word_embeddings=cfg.tied_embeddings, bos_token_id=None, eos_token_id=None,
                       pad_token_id=0)


def hf_eager(cfg, prompt_ids: list[int], protocols: list[tuple[int, int]], device: str = "cuda") -> dict:
    """{(P, M): {"prefill_tps", "decode_tps"}} for transformers generate (fp16, greedy)."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM
    hf = _hf_config(cfg)
    with torch.device(device):
        try:
            model = LlamaForCausalLM._from_config(hf, dtype=torch.float16)
        except TypeError:   # transformers < 4.56 names it torch_dtype
            model = LlamaForCausalLM._from_config(hf, torch_dtype=torch.float16)
    model = model.to(torch.float16).eval()
    out = {}
    try:
        def gen(ids, n):
            gc_ = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                   eos_token_id=None, bos_token_id=None)
            x = torch.tensor([ids], device=device)
            _sync(device)
            t0 = time.perf_counter()
            with torch.inference_mode():
                y = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc_)
            _sync(device)
            assert y.shape[1] == len(ids) + n, y.shape
            return time.perf_counter() - t0

        for p, _ in protocols:                                   # warm-up at every prompt length (cuBLAS
            gen(prompt_ids[:p], 2)                               # picks kernels per shape on first use)
        for p, m in protocols:
            ids = prompt_ids[:p]
            t1 = gen(ids, 1)
            tm = gen(ids, m)
            out[(p, m)] = {"prefill_tps": round(p / t1, 2),
                           "decode_tps": round((m - 1) / (tm - t1), 2) if m > 1 and tm > t1 else 0.0}
    finally:
        model = None
        _free()
    return out


class StaticLlama:
    """A minimal llama forward (fp16) over a preallocated KV cache, for CUDA-graph decode.

    Weights (random, N(0, 0.02)): embed (V, D); per layer wqkv ((H + 2 KVH) * HD, D), wo (D, H * HD),
    w13 (2 F, D) = [gate; up], w2 (D, F), RMSNorm weights (D,); lm_head (V, D) (= embed if tied).
    KV cache: k, v (L, 1, KVH, max_len, HD), written in place at the step's positions.
    """

    def __init__(self, cfg, max_len: int, device: str = "cuda"):
        import torch
        self.cfg, self.max_len = cfg, max_len
        dt, g = torch.float16, torch.Generator(device=device).manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, device=device, dtype=dt, generator=g) * 0.02)

        D, H, KVH, HD, F, V = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.vocab_size
        self.embed = w(V, D)
        self.lm_head = self.embed if cfg.tied_embeddings else w(V, D)
        self.layers = [{"wqkv": w((H + 2 * KVH) * HD, D), "wo": w(D, H * HD), "w13": w(2 * F, D),
                        "w2": w(D, F), "n1": torch.ones(D, device=device, dtype=dt),
                        "n2": torch.ones(D, device=device, dtype=dt)}
                       for _ in range(cfg.n_layers)]
        self.norm = torch.ones(D, device=device, dtype=dt)
        self.k = torch.zeros(cfg.n_layers, 1, KVH, max_len, HD, device=device, dtype=dt)
        self.v = torch.zeros_like(self.k)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, HD, 2, device=device, dtype=torch.float32) / HD))
        f = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = torch.cos(f).to(dt), torch.sin(f).to(dt)       # (max_len, HD/2)
        self.positions = torch.arange(max_len, device=device)
        try:   # GQA inside SDPA (torch >= 2.5); else repeat K/V heads
            import torch.nn.functional as fn
            q = torch.zeros(1, 2, 1, 8, device=device, dtype=dt)
            kv = torch.zeros(1, 1, 1, 8, device=device, dtype=dt)
            fn.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
            self.gqa = True
        except TypeError:
            self.gqa = False

    def _rope(self, x, pos):
        c, s = self.cos[pos][None, :, None, :], self.sin[pos][None, :, None, :]     # (1, T, 1, HD/2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch_cat((x1 * c - x2 * s, x2 * c + x1 * s))

    def _norm(self, x, w):
        import torch
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)).to(x.dtype) * w

    def forward(self, ids, pos, mask):
        """ids (1, T) int64, pos (T,) int64, mask (1, 1, T, max_len) bool -> next token (1, 1)."""
        import torch.nn.functional as fn
        cfg = self.cfg
        H, KVH, HD = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        T = ids.shape[1]
        x = self.embed[ids]                                                    # (1, T, D)
        for li, lw in enumerate(self.layers):
            qkv = self._norm(x, lw["n1"]) @ lw["wqkv"].t()
            q, k, v = qkv.split([H * HD, KVH * HD, KVH * HD], dim=-1)
            q = self._rope(q.view(1, T, H, HD), pos).transpose(1, 2)            # (1, H, T, HD)
            k = self._rope(k.view(1, T, KVH, HD), pos).transpose(1, 2)          # (1, KVH, T, HD)
            self.k[li].index_copy_(2, pos, k)
            self.v[li].index_copy_(2, pos, v.view(1, T, KVH, HD).transpose(1, 2))
            kc, vc = self.k[li], self.v[li]
            if self.gqa:
                a = fn.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
            else:
                rep = H // KVH
                a = fn.scaled_dot_product_attention(q, kc.repeat_interleave(rep, 1), vc.repeat_interleave(rep, 1),
                                                    attn_mask=mask)
            x = x + a.transpose(1, 2).reshape(1, T, H * HD) @ lw["wo"].t()
            gu = self._norm(x, lw["n2"]) @ lw["w13"].t()
            g, u = gu.chunk(2, dim=-1)
            x = x + (fn.silu(g) * u) @ lw["w2"].t()
        logits = self._norm(x[:, -1:], self.norm) @ self.lm_head.t()          # (1, 1, V)
        return logits.argmax(-1)


def torch_cat(parts):
    import torch
    return torch.cat(parts, dim=-1)


def cuda_graph(cfg, prompt_ids: list[int], protocols: list[tuple[int, int]]) -> dict:
    """{(P, M): {"prefill_tps", "decode_tps"}}: eager static-KV prefill, CUDA-graph decode."""
    import torch
    max_len = max(p + m for p, m in protocols)
    model = StaticLlama(cfg, max_len)
    out = {}
    try:
        tok = torch.zeros(1, 1, dtype=torch.long, device="cuda")
        pos = torch.zeros(1, dtype=torch.long, device="cuda")

        def step():
            mask = (model.positions <= pos).view(1, 1, 1, max_len)
            nxt = model.forward(tok, pos, mask)
            tok.copy_(nxt)
            pos.add_(1)

        with torch.inference_mode():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()

            def prefill(ids):
                p = len(ids)
                x = torch.tensor([ids], device="cuda")
                pp = model.positions[:p]
                mask = (model.positions[None, :] <= pp[:, None]).view(1, 1, p, max_len)
                return model.forward(x, pp, mask)

            for p, _ in protocols:                                      # warm-up per prompt length
                prefill(prompt_ids[:p])
            for p, m in protocols:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                first = prefill(prompt_ids[:p])
                tok.copy_(first)
                pos.fill_(p)
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                for _ in range(m - 1):
                    graph.replay()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                out[(p, m)] = {"prefill_tps": round(p / (t1 - t0), 2),
                               "decode_tps": round((m - 1) / (t2 - t1), 2) if m > 1 else 0.0}
    finally:
        model = None
        _free()
    return out


def run_peers(cfg, prompt_ids: list[int], protocols: list[tuple[int, int]]) -> dict:
    """{"hf_eager": {...} | {"error": ...}, "cuda_graph": {...} | {"error": ...}} keyed by "P/M"."""
    res = {}
    for name, fn in (("hf_eager", hf_eager), ("cuda_graph", cuda_graph)):
        try:
            r = fn(cfg, prompt_ids, protocols)
            res[name] = {f"{p}/{m}": v for (p, m), v in r.items()}
        except Exception as e:  # noqa: BLE001 - a peer failing (OOM, version) must not lose webdrift's figures
            res[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            _free()
    return res
