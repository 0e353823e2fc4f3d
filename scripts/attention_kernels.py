"""Times every decode attention kernel the tuner chooses from (kernels/autotune.attention_candidates:
per head, grouped, split at 16/32/64-key chunks with and without V prefetch, several chunks a
workgroup), phase 1 and its combine, at depths 1024 and 4096, the way the tuner times them (each
dispatch after an L2 flush, the median of 5 runs):
    PYTHONPATH=. python scripts/attention_kernels.py 32:8:128 32:8:64
(H:KVH:head_dim shapes; the cache holds 4352 rows, random-free: timing does not depend on values;
KV=f32 in the environment: f32 caches, else f16 ones as the engine's default; DEPTHS=64,1024: other
depths than 1024 and 4096)
prints per shape and depth `name phase1+combine` in microseconds."""
import os
import sys

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.kernels.attention import AttentionCombineKernel, AttentionKernel
from webdrift.tensor import TensorDesc

dev = get_device()
CAP = 4352
KV16 = os.environ.get("KV", "f16") == "f16"


def timed(d) -> float:
    return A._drive_sync(dev, A._time(dev, d)) / 1000


for shape in sys.argv[1:] or ["32:8:128", "32:8:64"]:
    H, KVH, DH = map(int, shape.split(":"))
    G = H // KVH
    kc, vc = (dev.create_buffer(KVH * CAP * DH * (2 if KV16 else 4), label=n) for n in ("k", "v"))
    q, out = TensorDesc("q", DH, G, b=KVH), TensorDesc("o", H * DH)
    qb, ob = dev.create_buffer(q.nbytes, label="q"), dev.create_buffer(out.nbytes, label="o")
    for depth in [int(d) for d in os.environ.get("DEPTHS", "1024,4096").split(",")]:
        sb = A._step_buffer(dev, depth - 1)
        res = []
        for c in A.attention_candidates(dev, H, KVH, DH, CAP):
            k = AttentionKernel(dev, q, H, KVH, DH, CAP, G, DH ** -0.5, variant=c.variant, chunk=c.chunk or 32,
                                prefetch_v=c.prefetch_v, adapt=c.adapt, kv_f16=KV16)
            cb = AttentionCombineKernel(dev, out, H, KVH, DH, k.nsplit, G)
            pb = dev.create_buffer(KVH * G * k.nsplit * (DH + 2) * 4, label="part")
            a = timed(k.dispatch({"step": sb, "q": qb, "kc": kc, "vc": vc, "part": pb}, k.workgroups(1)))
            b = timed(cb.dispatch({"step": sb, "part": pb, "out": ob}, cb.workgroups(1)))
            res.append(f"{c.name} {a:.1f}+{b:.1f}")
            dev.release_buffer(pb)
        print(f"H {H} KVH {KVH} head_dim {DH} depth {depth} kv {'f16' if KV16 else 'f32'}:", "; ".join(res), flush=True)
