"""The decode attention kernel chosen on whole steps (Engine._choose_attention) against the
kernel-timing choice it starts from and any forced kernels, one process, interleaved: decode
tok/s (the best of 3 generations of 128 tokens) at each depth of the engines per synthetic model.
    PYTHONPATH=. python scripts/attention_ab.py llama-3.2-1b:q4 llama-3.1-8b:q4:tiled64a16,tiled64a16c,split16
(shape:quant[:kernel names, AttnChoice.name, each an engine of its own; a tiled name ending in "c"
merges its partials in the kernel]; depths 1024 and 4096).""" 
import sys

from webdrift.gpu.native import get_device
from webdrift.kernels.autotune import attention_candidates
from webdrift.models import forward as F
from webdrift.profile.benchmark import build_engine, decode_attention, interleaved_decode_tps, prompt_ids
from webdrift.runtime import engine as E
from webdrift.weights.synthetic import synthetic_source

real = E.attention_steps
dev = get_device()


def forced(choice):
    return lambda dev, key, build, cands, *a, **k: choice


for spec in sys.argv[1:]:
    shape, quant, *names = spec.split(":")
    src = synthetic_source(shape, quant)
    cfg = src.config
    ctx = min(4096 + 200, cfg.max_position or 4296)
    engs = {"whole steps": build_engine(dev, src, ctx)}
    E.attention_steps = lambda dev, key, build, cands, *a, **k: cands[0]
    engs["kernel timing"] = build_engine(dev, src, ctx)
    cands = attention_candidates(dev, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, engs["whole steps"].model.cap_stride)
    cands += [c._replace(fused=True) for c in cands if c.variant == "tiled"]   # (the merge in the kernel: "...c")
    by_name = {c.name: c for c in cands}
    plain = F.choose_attention
    for n in (names[0].split(",") if names else []):
        E.attention_steps = forced(by_name[n])
        F.choose_attention = lambda *a, c=by_name[n], **k: c    # where the step choice is not timed
        engs[n] = build_engine(dev, src, ctx)
        engs[n].decode.kernels()
    E.attention_steps, F.choose_attention = real, plain
    for depth in (d for d in (1024, 4096) if d + 128 <= ctx):
        tps = interleaved_decode_tps(engs, prompt_ids(cfg.vocab_size, depth))
        for n, e in engs.items():
            print(f"{spec.split(':')[0]}:{quant} depth {depth} {n:13s} {decode_attention(e)} {max(tps[n]):7.1f} "
                  f"tok/s {[round(x, 1) for x in tps[n]]}", flush=True)
    del engs
