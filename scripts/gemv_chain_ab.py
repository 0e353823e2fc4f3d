"""Decode of synthetic models with the decode GEMVs chosen alone (autotune.CHAIN_LAYERS = 1: the
tuner before session 35) and re-timed in chains over the model's layers (CHAIN_LAYERS = 8),
each engine tuned afresh (a cache folder of its own, the in-memory choices cleared), and the
chained tuning once more (how far two tunings of the same code differ); one process,
interleaved (decode tok/s, best of ROUNDS generations of 128 tokens after 1024), each engine's
decode GEMVs printed:
    ROUNDS=2 PYTHONPATH=. python scripts/gemv_chain_ab.py llama-3.1-8b:f16
Results: docs/BENCHMARKS.md, session 35."""
import os
import sys

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.profile.benchmark import tuner_ab

dev = get_device()
CHAIN = {"CHAIN_LAYERS": A.CHAIN_LAYERS}
for spec in sys.argv[1:]:
    tps = tuner_ab(dev, spec, {"alone": {"CHAIN_LAYERS": 1}, "chain": CHAIN, "chain again": CHAIN},
                   rounds=int(os.environ.get("ROUNDS", "3")))
    for name, v in tps.items():
        print(f"{spec} {max(v):7.1f} tok/s {[round(x, 1) for x in v]}  {name}", flush=True)
