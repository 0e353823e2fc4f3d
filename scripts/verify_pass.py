"""What a speculative verification pass costs against a plain decode step, by rows: chains of n
draft rows verified at cache slot DEPTH + 76 after a DEPTH-token prompt of a synthetic model
(the tokens do not matter for the time), host wall time of TreeVerifier.argmax_rows (upload,
dispatches in parts, read back: what the speculative loop pays), the median of 20 after 5 warm
passes, best of two rounds (each after 64 plain steps: the GPU is slow for a while after the
programs' build leaves it idle). Repeated passes of one size run the command buffer encoded
during the one before (TreeVerifier.argmax_rows); --no-ahead: each encoded when it runs, in parts
(the code before session 28). --profile: also each kernel family's GPU time (every dispatch in
its own timed pass, best of 3, us summed over layers) for the decode step and each row count.
    PYTHONPATH=. python scripts/verify_pass.py llama-3.2-1b q4 1 2 4 8 16 64 [--depth 1024] [--no-ahead] [--profile]
docs/BENCHMARKS.md session 27 has what it measured on an H200."""
import argparse
import statistics
import time
from collections import defaultdict

from webdrift.gpu.base import Encoded, TimestampRecorder
from webdrift.gpu.native import get_device
from webdrift.kernels.step import pack_step
from webdrift.profile.benchmark import agenerate_ids, build_engine, prompt_ids
from webdrift.runtime.engine import SamplingParams, _run
from webdrift.runtime.speculative import DraftTree
from webdrift.weights.synthetic import synthetic_source

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("quant")
p.add_argument("rows", nargs="*", type=int, default=[1, 2, 4, 8, 16, 64])
p.add_argument("--depth", type=int, default=1024)
p.add_argument("--profile", action="store_true")
p.add_argument("--no-ahead", action="store_true")
p.add_argument("--reps", type=int, default=25)
args = p.parse_args()
dev = get_device()
if args.no_ahead:   # an encoding that never matches the next pass
    dev.encode = lambda d, c=None: Encoded([], [], [])


def families(disp) -> dict:
    best = None
    for _ in range(3):
        rec = TimestampRecorder(len(disp))
        dev.submit(disp, timestamps=rec)
        dev.read_timestamps_sync(rec)
        t = [(b - a) / 1e3 for a, b in rec.ticks_ns]
        best = t if best is None else [min(x, y) for x, y in zip(best, t)]
    fam = defaultdict(float)
    for d, t in zip(disp, best):
        fam[d.label.split(".", 1)[-1]] += t
    return fam


src = synthetic_source(args.model, args.quant)
eng = build_engine(dev, src, args.depth + 400)
ids = prompt_ids(src.config.vocab_size, args.depth)
_run(agenerate_ids(eng, ids, 8))
step_ms = 1e3 / max(_run(agenerate_ids(eng, ids, 128)).stats.decode_tokens_per_s for _ in range(3))
t0 = time.perf_counter()
ver = eng._tree_verifier()
print(f"{args.model} {args.quant}: plain step {step_ms:.3f} ms; verification programs built in "
      f"{time.perf_counter() - t0:.1f} s (capacities {sorted(ver.programs)})", flush=True)
sp = SamplingParams(max_new_tokens=1, temperature=0.0, seed=0)
pos0 = args.depth + 76
chains = {n: DraftTree(list(range(1, n + 1)), [-1] + list(range(n - 1))) for n in args.rows}
best = {}
for _ in range(2):
    _run(agenerate_ids(eng, ids, 64))
    for n, tree in chains.items():
        ts = []
        for _ in range(args.reps):
            a = time.perf_counter()
            _run(ver.argmax_rows(tree, pos0, 0, sp))
            ts.append(time.perf_counter() - a)
        best[n] = min(best.get(n, 1e9), statistics.median(ts[5:]) * 1e3)
for n, ms in best.items():
    print(f"  rows {n:3d}: {ms:7.3f} ms a pass = {ms / step_ms:5.2f} decode steps", flush=True)
if args.profile:
    dev.write_buffer(eng.step_buf, pack_step(1, pos0, 0))
    cols = {"decode": families(eng.decode.dispatches(1))}
    for n, tree in chains.items():
        _run(ver.argmax_rows(tree, pos0, 0, sp))      # the pass's step, tree and ids written
        cols[f"{n} rows"] = families(ver.last.dispatches(n))
    names = list(dict.fromkeys(k for f in cols.values() for k in f))
    print(f"  {'kernel family (us a pass)':32s}" + "".join(f"{c:>11s}" for c in cols))
    for k in [*names, "all"]:
        print(f"  {k:32s}" + "".join(f"{(sum(f.values()) if k == 'all' else f.get(k, 0.0)):11.1f}"
                                      for f in cols.values()))
