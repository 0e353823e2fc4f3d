"""What a dispatch family costs in a decode step: decode tok/s of a synthetic model with families
left out of the decode program's dispatch list (timing only: the tokens are wrong), interleaved in
one process, the best of 3 generations of 128 tokens each:
    PYTHONPATH=. python scripts/step_drop.py smollm2-135m:q4:1024 llama-3.1-8b:q4:4096
(shape:quant:prompt tokens; DROPS="f1,f2;f3" for other sets of families left out). Family = a
dispatch label's parts without the layer prefix ("L3.attn_combine+quant" is in families attn_combine and quant)."""
import os
import sys

from webdrift.gpu.native import get_device
from webdrift.models.program import Program
from webdrift.profile.benchmark import agenerate_ids, build_engine, prompt_ids
from webdrift.runtime import engine as E
from webdrift.runtime.engine import _run
from webdrift.weights.synthetic import synthetic_source

DROPS = [(), ("attn_combine",), ("attention", "attn_combine"),
         ("attention", "attn_combine", "qkv", "o_proj", "gate_up", "down")]
if os.environ.get("DROPS"):   # e.g. DROPS="gate_up;down;qkv;o_proj;attention,attn_combine" (and the full step)
    DROPS = [()] + [tuple(v.split(",")) for v in os.environ["DROPS"].split(";")]
drop: set = set()
listed = Program.dispatches


def dispatches(self, t, head=True, draws=1):
    lst = listed(self, t, head, draws)
    if self.stage != "decode" or not drop:
        return lst
    return [d for d in lst if not drop & set(d.label.split(".", 1)[-1].split("+"))]


Program.dispatches = dispatches
# a step without some families makes garbage logits (NaN argmax: a token past the vocabulary);
# only the time counts, so the engine's check of each token is left out
E.Engine._check_token = lambda self, tok, step, prompt_tokens: min(tok, self.config.vocab_size - 1)
dev = get_device()
for spec in sys.argv[1:]:
    shape, quant, depth = spec.split(":")
    src = synthetic_source(shape, quant)
    eng = build_engine(dev, src, int(depth) + 200)
    ids = prompt_ids(src.config.vocab_size, int(depth))
    _run(agenerate_ids(eng, ids, 8))
    print(f"{spec}: int8 chain {eng.decode.int8_chain}, {len(eng.decode.dispatches(1))} dispatches a step", flush=True)
    tps = {v: [] for v in DROPS}
    for _ in range(3):
        for v in DROPS:
            drop.clear()
            drop.update(v)
            tps[v].append(_run(agenerate_ids(eng, ids, 128)).stats.decode_tokens_per_s)
    drop.clear()
    full = len(eng.decode.dispatches(1))
    for v in DROPS:
        drop.clear()
        drop.update(v)
        best = max(tps[v])
        print(f"  without {'+'.join(v) or '-':55s} (-{full - len(eng.decode.dispatches(1)):3d} dispatches): "
              f"{best:8.1f} tok/s {1e3 / best:7.3f} ms a step  runs {[round(x, 1) for x in tps[v]]}", flush=True)
    drop.clear()
    del eng
