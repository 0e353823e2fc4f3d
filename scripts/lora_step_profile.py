"""Where a decode step with a LoRA adapter goes, against the same engine's step without one:
bench's kernel profile (webdrift.profile.benchmark.akernel_profile: each dispatch timed in its own
pass, then the step timed whole, then the host phases) for a synthetic model with a random
rank-R adapter on all seven targets, after a 1024-token prompt:
    PYTHONPATH=. python scripts/lora_step_profile.py llama-3.2-1b q4 16 - a - a [--fused]
Each '-' profiles a step without the adapter, each 'a' one with it (in that order: alternate
them to see drift on a shared machine). --fused: the engine's lora_fused_shrink option."""
import argparse

from webdrift.gpu.native import get_device
from webdrift.profile import benchmark as B
from webdrift.runtime.engine import _run
from webdrift.runtime.loading import EngineOptions, assemble
from webdrift.tools.bench import random_lora
from webdrift.weights.synthetic import NullTokenizer, synthetic_source

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("quant")
p.add_argument("rank", type=int)
p.add_argument("runs", nargs="+", choices=["-", "a"])
p.add_argument("--fused", action="store_true")
args = p.parse_args()
dev = get_device()
src = synthetic_source(args.model, args.quant)
eng = assemble(src, EngineOptions(max_context=2048, enable_lora=True, max_lora_rank=args.rank,
                                  lora_pool_rank=2 * args.rank, lora_fused_shrink=args.fused), dev,
               tokenizer=NullTokenizer())
eng.add_lora("a", random_lora(src.config, args.rank, 10))
ids = B.prompt_ids(src.config.vocab_size, 1024)
for run in args.runs:
    kp = _run(B.akernel_profile(eng, ids, 64, lora=None if run == "-" else "a"))
    B.log_kernel_profile(print, "no adapter" if run == "-" else f"rank-{args.rank} adapter", kp)
    if kp:
        print(f"    host: {kp['host']}", flush=True)
