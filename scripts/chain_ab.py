"""The int8 chain's choice against both forced choices, one process, interleaved: decode tok/s
(the best of 3 generations of 128 tokens) and each decode step timed whole (autotune._time_seq,
what chain_pays times at load) of three engines per synthetic model: the choice the engine
makes ("auto", with the verdict chain_pays returned), the chain, and the step without it.
    PYTHONPATH=. python scripts/chain_ab.py llama-3.2-1b:q4:1024 llama-3.1-8b:q4:1024
(shape:quant:prompt tokens)."""
import sys

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.profile.benchmark import agenerate_ids, build_engine, prompt_ids
from webdrift.runtime import engine as E
from webdrift.runtime.engine import _run
from webdrift.weights.synthetic import synthetic_source

real = E.chain_pays
dev = get_device()
for spec in sys.argv[1:]:
    shape, quant, depth = spec.split(":")
    src = synthetic_source(shape, quant)
    ids = prompt_ids(src.config.vocab_size, int(depth))
    verdict: dict = {}
    E.chain_pays = lambda *a, verdict=verdict, **k: verdict.update(real(*a, **k)) or verdict
    engs = {"auto": build_engine(dev, src, int(depth) + 200)}
    for on in (True, False):
        E.chain_pays = lambda *a, on=on, **k: {"chain": on}
        engs[f"chain={on}"] = build_engine(dev, src, int(depth) + 200)
    E.chain_pays = real
    for e in engs.values():
        _run(agenerate_ids(e, ids, 4))
    us = {k: round(v / 1000, 1) for k, v in verdict.items() if k.endswith("_ns") and v}
    print(f"{spec}: chain_pays {us} chain {verdict.get('chain')}", flush=True)
    tps = {n: [] for n in engs}
    step = {n: [] for n in engs}
    for _ in range(3):
        for n, e in engs.items():
            tps[n].append(_run(agenerate_ids(e, ids, 128)).stats.decode_tokens_per_s)
            step[n].append(A._drive_sync(dev, A._time_seq(dev, e.decode.dispatches(1))) / 1000)
    for n, e in engs.items():
        print(f"  {n:11s} (chain {e.decode.int8_chain!s:5s}) {max(tps[n]):7.1f} tok/s {[round(x, 1) for x in tps[n]]}  "
              f"step timed whole {min(step[n]):7.1f} us", flush=True)
    del engs
