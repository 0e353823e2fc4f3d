"""Decode of synthetic models with the integer-dot GEMV's unrolled candidates in the tuner and
without (autotune.BLK_CANDIDATES of unroll 1 only, QLAST_CANDIDATES alike), each engine tuned
afresh (a cache folder of its own, the in-memory choices cleared), and a third engine tuned afresh
with all (how far two tunings of the same code differ); one process, interleaved (decode tok/s,
best of 3 generations of 128 tokens after 1024), each engine's GEMVs printed:
    PYTHONPATH=. python scripts/blk_unroll_ab.py llama-3.2-1b:q4_0 llama-3.1-8b:q4_0
Results: docs/BENCHMARKS.md, session 35."""
import os
import sys
import tempfile

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.profile.benchmark import build_engine, decode_gemvs, interleaved_decode_tps, prompt_ids
from webdrift.weights.synthetic import synthetic_source

dev = get_device()
ALL_B, ALL_Q = A.BLK_CANDIDATES, A.QLAST_CANDIDATES
OLD_B = tuple(c for c in ALL_B if c.unroll == 1)
OLD_Q = tuple(c for c in ALL_Q if c.unroll == 1)
for spec in sys.argv[1:]:
    shape, quant = spec.split(":")
    src = synthetic_source(shape, quant)
    engs = {}
    for name, b, q in (("u1 only", OLD_B, OLD_Q), ("with unroll", ALL_B, ALL_Q), ("with unroll, again", ALL_B, ALL_Q)):
        A.BLK_CANDIDATES, A.QLAST_CANDIDATES = b, q
        A._memory.clear()
        os.environ["WEBDRIFT_CACHE"] = tempfile.mkdtemp()
        engs[name] = build_engine(dev, src, 1224)
        print(f"{spec} {name}: {decode_gemvs(engs[name])}", flush=True)
    A.BLK_CANDIDATES, A.QLAST_CANDIDATES = ALL_B, ALL_Q
    tps = interleaved_decode_tps(engs, prompt_ids(src.config.vocab_size, 1024))
    for name, v in tps.items():
        print(f"{spec} {max(v):7.1f} tok/s {[round(x, 1) for x in v]}  {name}", flush=True)
    del engs
