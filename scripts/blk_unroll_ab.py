"""Decode of synthetic models with the integer-dot GEMV's unrolled candidates in the tuner and
without (autotune.BLK_CANDIDATES of unroll 1 only, QLAST_CANDIDATES alike), each engine tuned
afresh (a cache folder of its own, the in-memory choices cleared), and a third engine tuned afresh
with all (how far two tunings of the same code differ); one process, interleaved (decode tok/s,
best of 3 generations of 128 tokens after 1024), each engine's GEMVs printed:
    PYTHONPATH=. python scripts/blk_unroll_ab.py llama-3.2-1b:q4_0 llama-3.1-8b:q4_0
Results: docs/BENCHMARKS.md, session 35."""
import sys

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.profile.benchmark import tuner_ab

dev = get_device()
ALL = {"BLK_CANDIDATES": A.BLK_CANDIDATES, "QLAST_CANDIDATES": A.QLAST_CANDIDATES}
U1 = {a: tuple(c for c in v if c.unroll == 1) for a, v in ALL.items()}
for spec in sys.argv[1:]:
    tps = tuner_ab(dev, spec, {"u1 only": U1, "with unroll": ALL, "with unroll, again": ALL})
    for name, v in tps.items():
        print(f"{spec} {max(v):7.1f} tok/s {[round(x, 1) for x in v]}  {name}", flush=True)
