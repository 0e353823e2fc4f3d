"""GPU check of the prefill GEMMs (tiles lavapipe cannot hold): every-row logits of a synthetic
model through the int8 GEMM, the float GEMM and the decode GEMVs over the prompt's rows.
    PYTHONPATH=. python scripts/check_gemm_gpu.py llama-3.2-1b:q4 llama-3.2-1b:f16
prints per path the load time, the first tiles used and the cosine / top-1 agreement of every
row's logits with the GEMVs' (the reference here is the engine's own decode path: a check that a
tile computes what the tested kernels compute on this GPU, not an accuracy figure)."""
import sys
import time

import numpy as np

from webdrift.gpu.native import get_device
from webdrift.runtime.loading import EngineOptions, assemble
from webdrift.weights.synthetic import NullTokenizer, synthetic_source

dev = get_device()
for shape in sys.argv[1:]:
    name, quant = shape.split(":")
    src = synthetic_source(name, quant)
    ids = np.random.default_rng(0).integers(3, src.config.vocab_size, 300).tolist()
    out = {}
    for pk in (["gemm_int8"] if quant != "f16" else []) + ["gemm_float", "gemv"]:
        t0 = time.perf_counter()
        eng = assemble(src, EngineOptions(max_context=512, prefill_kernels=pk), dev, tokenizer=NullTokenizer())
        out[pk] = eng.logits(ids)
        tiles = sorted({str(op.variant) for op in eng._score.graph.ops if type(op).__name__ == "Linear" and not op.head})
        print(f"{name} {quant} {pk}: {time.perf_counter() - t0:.1f} s, tiles {tiles[:2]}", flush=True)
        del eng
    ref = out["gemv"].astype(np.float64)
    for pk, v in out.items():
        v = v.astype(np.float64)
        cos = (v * ref).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ref, axis=1)
        top = (v.argmax(1) == ref.argmax(1)).mean()
        print(f"  {pk} vs gemv: cos min {cos.min():.5f} mean {cos.mean():.5f}, top-1 {top:.3f}, finite {np.isfinite(v).all()}")
