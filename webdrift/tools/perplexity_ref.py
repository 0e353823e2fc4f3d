"""transformers' perplexity on the same windows as `webdrift perplexity`: the f32 reference of
docs/QUANTIZATION.md (desktop tool; needs torch and transformers, like bench_peers.py).

    python -m webdrift.tools.perplexity_ref MODEL.gguf --file TEXT [--ctx 512] [--chunks N] [--json PATH]

transformers reads the GGUF and dequantizes every tensor to float32
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32)`), so this is the
file's model without any runtime re-quantization. The token ids are webdrift's tokenizer's (the
same ids as llama.cpp's on the committed text: tests/test_perplexity_llama_cpp.py), cut into the
same windows, and the second halves are scored by the same `window_nll` (perplexity.py); the
model computes only the scored rows' logits (`logits_to_keep`).
Must not: be imported by the core.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time


def transformers_perplexity(gguf_path, text: str, ctx: int, n_chunks: int | None = None, threads: int | None = None,
                            progress=None) -> dict:
    """exp(mean nll) of transformers' f32 model over the text, with llama-perplexity's windows."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from ..runtime.loading import make_tokenizer, open_source
    from .perplexity import check_ctx, tokenize_windows, window_nll
    t0 = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    p = pathlib.Path(gguf_path)
    source = open_source(str(p))
    check_ctx(ctx, source.config.max_position)
    tokens, wins = tokenize_windows(make_tokenizer(source), text, ctx)
    if n_chunks is not None:
        wins = wins[:n_chunks]
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    first = ctx // 2
    nll_sum = nll2_sum = 0.0
    count = 0
    running = []
    with torch.no_grad():
        for k, w in enumerate(wins):
            out = model(torch.tensor([w]), logits_to_keep=ctx - first)     # rows first .. ctx-1
            logits = out.logits[0].float().numpy()
            nll = window_nll(logits[:ctx - 1 - first], w[first + 1:])
            nll_sum += float(nll.sum())
            nll2_sum += float(np.square(nll).sum())
            count += len(nll)
            running.append(math.exp(nll_sum / count))
            if progress:
                progress(k + 1, len(wins), running[-1])
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    ppl = math.exp(mean)
    import transformers
    return {"model": str(gguf_path), "engine": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                                              "float32, CPU",
            "ctx": ctx, "n_text_tokens": len(tokens), "n_chunks": len(wins), "n_scored": count,
            "ppl": round(ppl, 6), "ppl_stderr": round(ppl * math.sqrt(var / (count - 1)) if var > 0 else 0.0, 6),
            "nll_mean": round(mean, 6), "chunk_ppl": [round(v, 4) for v in running],
            "seconds": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    from ..errors import WebdriftError
    from .perplexity import DEFAULT_CTX, read_text
    ap = argparse.ArgumentParser(prog="python -m webdrift.tools.perplexity_ref",
                                 description="transformers' f32 perplexity with llama-perplexity's windows")
    ap.add_argument("model", help="a .gguf file")
    ap.add_argument("--file", "-f", required=True)
    ap.add_argument("--ctx", "-c", type=int, default=DEFAULT_CTX)
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", metavar="PATH", default=None)
    args = ap.parse_args(argv)

    def show(done, total, ppl):
        sys.stderr.write(f"\rtransformers: window {done}/{total}, running ppl {ppl:.4f}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    try:
        res = transformers_perplexity(args.model, read_text(args.file), args.ctx, args.chunks, args.threads, show)
    except WebdriftError as e:
        sys.stderr.write(f"webdrift: error: {e}\n")
        return 2
    print(f"{res['model']}: PPL = {res['ppl']:.4f} +/- {res['ppl_stderr']:.5f} over {res['n_scored']} tokens "
          f"({res['n_chunks']} windows of {res['ctx']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
