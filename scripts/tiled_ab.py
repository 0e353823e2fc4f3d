"""The tiled decode attention's knobs on whole decode steps: engines of one synthetic model with
the attention forced to tiled (TILE keys a tile, LANES lanes a K row and a V run, N partials a
row) or to another kernel, one process, interleaved: decode tok/s (best of 3 generations of 128
tokens) at depths 1024 and 4096.
    PYTHONPATH=. python scripts/tiled_ab.py llama-3.1-8b:q4 64:8:32 128:8:32 64:16:32 split16
(shape:quant, then TILE:LANES:N[:WG] or an AttnChoice name)."""
import sys

from webdrift.gpu.native import get_device
from webdrift.kernels.attention import AttentionKernel, AttnChoice
from webdrift.kernels.autotune import attention_candidates
from webdrift.models import forward as F
from webdrift.profile.benchmark import build_engine, decode_attention, interleaved_decode_tps, prompt_ids
from webdrift.runtime import engine as E
from webdrift.weights.synthetic import synthetic_source

dev = get_device()
shape, quant = sys.argv[1].split(":")
src = synthetic_source(shape, quant)
cfg = src.config
ctx = min(4096 + 200, cfg.max_position or 4296)
engs = {}
for spec in sys.argv[2:]:
    if spec[0].isdigit():
        tile, lanes, n, *wg = map(int, spec.split(":"))
        AttentionKernel.TILE, AttentionKernel.TILED_WG = tile, (wg or [256])[0]
        AttentionKernel.tiled_lanes = classmethod(lambda cls, dev, lanes=lanes: lanes)
        choice = AttnChoice("tiled", tile, False, n)
    else:
        choice = {c.name: c for c in attention_candidates(dev, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, 4352)}[spec]
    E.attention_steps = lambda dev, key, build, cands, *a, c=choice, **k: c    # the whole-step choice's answer
    F.choose_attention = lambda *a, c=choice, **k: c                          # where there is none (untimed)
    engs[spec] = build_engine(dev, src, ctx)
    engs[spec].decode.kernels()     # built now, with these knobs (else at the first generation)
for depth in (1024, 4096):
    tps = interleaved_decode_tps(engs, prompt_ids(cfg.vocab_size, depth))
    for n, e in engs.items():
        print(f"{sys.argv[1]} depth {depth} {n:10s} {decode_attention(e)} {max(tps[n]):7.1f} tok/s "
              f"{[round(x, 1) for x in tps[n]]}", flush=True)
