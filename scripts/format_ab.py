"""Weight formats against each other on the same weights, one process, interleaved: decode tok/s
(the best of 3 greedy generations of 128 tokens, the engines taking turns) and the GPU bytes of
each one's weights, for synthetic models or GGUF files.
    PYTHONPATH=. python scripts/format_ab.py llama-3.1-8b:q4_0:q4_0,q4 llama-3.1-8b:q8:q8_0,q8
    PYTHONPATH=. python scripts/format_ab.py /root/lc/llama-3.1-8b-Q4_0.gguf::default,q4
(shape:quant:formats or FILE::formats, `default` = the file's own formats; prompt 1024 tokens,
DEPTH=N to change it). A format named for every matrix converts the LM head too: compare a
synthetic model's formats (every matrix of one GGUF type) rather than a file with a Q6_K head."""
import os
import sys

from webdrift.gpu.native import get_device
from webdrift.profile.benchmark import agenerate_ids, build_engine, interleaved_decode_tps, prompt_ids
from webdrift.runtime.engine import _run
from webdrift.runtime.loading import open_source
from webdrift.weights.synthetic import synthetic_source

depth = int(os.environ.get("DEPTH", "1024"))
dev = get_device()
for spec in sys.argv[1:]:
    what, quant, formats = spec.split(":")
    src = open_source(what, auto_pull=False) if what.endswith(".gguf") else synthetic_source(what, quant)
    ids = prompt_ids(src.config.vocab_size, depth)
    engs = {}
    for f in formats.split(","):
        engs[f] = build_engine(dev, src, depth + 200, weight_format=None if f == "default" else f)
        _run(agenerate_ids(engs[f], ids, 4))        # builds and tunes its programs
    tps = interleaved_decode_tps(engs, ids)
    for f, e in engs.items():
        print(f"{spec} {f:8s} {e.model.weight_bytes / 2**20:9.1f} MiB of weights  {max(tps[f]):7.1f} tok/s "
              f"{[round(x, 1) for x in tps[f]]}", flush=True)
    del engs
