"""Times every dispatch of a decode step alone, the way the tuner times kernels (after an L2
flush, the median of 5), for one stream (the decode program) and for n streams decoded together
(the streams' program of n rows), after a 1024-token prompt of a synthetic model:
    PYTHONPATH=. python scripts/step_ops.py llama-3.2-1b q4 1 4 8
    PYTHONPATH=. python scripts/step_ops.py llama-3.2-1b q4 1 4 --lora 16
    PYTHONPATH=. python scripts/step_ops.py FILE.gguf - 1      (a model file: QUANT ignored)
--lora R: an engine with LoRA slots and a random rank-R adapter on all seven targets, applied to
every stream (the streams each get their own adapter, like `webdrift bench --lora-rank`).
Prints microseconds per step by dispatch label (the layer prefix dropped, summed over layers)."""
import argparse
from collections import defaultdict

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.profile.benchmark import agenerate_ids, build_engine, prompt_ids
from webdrift.runtime.engine import _run
from webdrift.runtime.loading import EngineOptions, assemble
from webdrift.tools.bench import random_lora
from webdrift.weights.synthetic import NullTokenizer, synthetic_source

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("quant")
p.add_argument("n", nargs="*", type=int, default=[1, 4, 8])
p.add_argument("--lora", type=int, default=0, metavar="R")
args = p.parse_args()
dev = get_device()
if args.model.endswith(".gguf") or "/" in args.model:   # a model file or folder, in its own formats
    from webdrift.runtime.loading import open_source
    src = open_source(args.model, auto_pull=False)
else:
    src = synthetic_source(args.model, args.quant)
if args.lora:
    ks = max(args.n)
    eng = assemble(src, EngineOptions(max_context=ks * 1280, enable_lora=True, max_lora_rank=args.lora,
                                      lora_pool_rank=args.lora * max(2, ks)), dev, tokenizer=NullTokenizer())
    names = tuple(f"s{i}" for i in range(ks))
    for i, name in enumerate(names):
        eng.add_lora(name, random_lora(src.config, args.lora, 10 + i))
else:
    eng, names = build_engine(dev, src, 4096), None
ids = prompt_ids(src.config.vocab_size, 1024)
for n in args.n:
    lora = (names[0] if n == 1 else names[:n]) if names else None
    _run(agenerate_ids(eng, ids, 4, n=n, lora=lora))    # builds (tunes) the program; leaves the Step of its last step
    prog = eng.decode if n == 1 else eng._streams.program(n)
    fam = defaultdict(float)
    for d in prog.dispatches(n):
        fam[d.label.split(".", 1)[-1]] += A._drive_sync(dev, A._time(dev, d)) / 1000
    print(f"{args.model} {args.quant} n={n}{f' lora {args.lora}' if args.lora else ''}: {sum(fam.values()):.0f} us: "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(fam.items(), key=lambda kv: -kv[1])), flush=True)
