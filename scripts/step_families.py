"""Synthetic models' decode steps timed from their own dispatches (one pass each, the best of 7
after the clocks rise: autotune.best_pass_ns): the step in its order, the same dispatches
grouped by family (the same bytes), each family alone (its layers back to back: what the family
costs a layer in the step, against a streaming read of its bytes), gate/up + down alternating
against grouped, and the step without attention; with several models, first their decode
tok/s, interleaved in one process (best of 3 generations of 128 tokens after 1024), and each
engine's decode GEMVs:
    PYTHONPATH=. python scripts/step_families.py llama-3.1-8b:f16
    PYTHONPATH=. python scripts/step_families.py llama-3.1-8b:q4_0 llama-3.1-8b:q4_k_m
(shape:quant; the step at depth 1024 + 8 tokens). Results: docs/BENCHMARKS.md, session 35."""
import sys

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.profile.benchmark import (
    agenerate_ids,
    build_engine,
    decode_gemvs,
    interleaved_decode_tps,
    prompt_ids,
)
from webdrift.runtime.engine import _run
from webdrift.weights.synthetic import synthetic_source

dev = get_device()
engs, vocab = {}, None
for spec in sys.argv[1:] or ["llama-3.1-8b:f16"]:
    shape, quant = spec.split(":")
    src = synthetic_source(shape, quant)
    vocab = src.config.vocab_size
    engs[spec] = build_engine(dev, src, 1224)
    print(f"{spec}: int8 chain {engs[spec].decode.int8_chain}, {decode_gemvs(engs[spec])}", flush=True)
ids = prompt_ids(vocab, 1024)
if len(engs) > 1:
    for spec, v in interleaved_decode_tps(engs, ids).items():
        print(f"{spec} {max(v):7.1f} tok/s {[round(x, 1) for x in v]}", flush=True)


def fam(d):
    return d.label.split(".", 1)[-1]


def t(lst):
    return A.best_pass_ns(dev, lst, 0.3, passes=7) / 1000


for spec, eng in engs.items():
    _run(agenerate_ids(eng, ids, 8))
    ds = eng.decode.dispatches(1)
    fams = list(dict.fromkeys(fam(d) for d in ds))
    order = {f: k for k, f in enumerate(fams)}
    each = {f: t([d for d in ds if fam(d) == f]) for f in fams}
    print(f"{spec}: {len(ds)} dispatches; step in order {t(ds):8.1f} us; grouped by family "
          f"{t(sorted(ds, key=lambda d: order[fam(d)])):8.1f} us; families alone summed {sum(each.values()):8.1f}",
          flush=True)
    print("  " + "; ".join(f"{f} {v:.1f} ({sum(fam(d) == f for d in ds)})" for f, v in each.items()), flush=True)
    gu = [d for d in ds if "gate_up" in d.label]
    dn = [d for d in ds if fam(d).startswith("down")]
    alt = [x for p in zip(gu, dn) for x in p]
    print(f"  gate_up + down alternating {t(alt):.1f}; grouped {t(gu + dn):.1f}", flush=True)
    rest = [d for d in ds if "attn" not in d.label and "attention" not in d.label]
    print(f"  step without attention {t(rest):.1f}", flush=True)
