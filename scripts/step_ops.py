"""Times every dispatch of a decode step alone, the way the tuner times kernels (after an L2
flush, the median of 5), for one stream (the decode program) and for n streams decoded together
(the streams' program of n rows), after a 1024-token prompt of a synthetic model:
    PYTHONPATH=. python scripts/step_ops.py llama-3.2-1b q4 1 4 8
Prints microseconds per step by dispatch label (the layer prefix dropped, summed over layers)."""
import sys
from collections import defaultdict

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.profile.benchmark import agenerate_ids, build_engine, prompt_ids
from webdrift.runtime.engine import _run
from webdrift.weights.synthetic import synthetic_source

dev = get_device()
model, quant, *ns = sys.argv[1:]
src = synthetic_source(model, quant)
eng = build_engine(dev, src, 4096)
ids = prompt_ids(src.config.vocab_size, 1024)
for n in map(int, ns or ["1", "4", "8"]):
    _run(agenerate_ids(eng, ids, 4, n=n))    # builds (tunes) the program; leaves the Step of its last step
    prog = eng.decode if n == 1 else eng._streams.program(n)
    fam = defaultdict(float)
    for d in prog.dispatches(n):
        fam[d.label.split(".", 1)[-1]] += A._drive_sync(dev, A._time(dev, d)) / 1000
    print(f"{model} {quant} n={n}: {sum(fam.values()):.0f} us: " + ", ".join(
        f"{k} {v:.1f}" for k, v in sorted(fam.items(), key=lambda kv: -kv[1])), flush=True)
