"""Times the prefill attention of a T-token prompt (pos0 = 0): the split kernel the prefill graph
used before (AttentionKernel "grouped" + AttentionCombineKernel) against the one-pass kernel
(AttentionPrefillKernel) over its knobs (lanes a query row, keys an iteration, invocations a
workgroup), the way the tuner times kernels (each dispatch after an L2 flush, the median of 5),
and checks each one-pass output against the split kernels' (largest difference over every
seventh output):
    PYTHONPATH=. python scripts/prefill_attention.py 32:8:64 32:8:128
(H:KVH:head_dim shapes; random q and caches; T = 1024, cache rows 1088). Prints microseconds."""
import random
import struct
import sys

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.kernels.attention import AttentionCombineKernel, AttentionKernel, AttentionPrefillKernel
from webdrift.tensor import TensorDesc

dev = get_device()
T, CAP = 1024, 1088
rng = random.Random(0)


def timed(d) -> float:
    return A._drive_sync(dev, A._time(dev, d)) / 1000


def rand_buffer(n):
    b = dev.create_buffer(4 * n)
    dev.write_buffer(b, struct.pack(f"<{n}f", *(rng.uniform(-1, 1) for _ in range(n))))
    return b


def read(b, n):
    return struct.unpack(f"<{n}f", dev.read_buffer_sync(b, 0, 4 * n))


for shape in sys.argv[1:] or ["32:8:64", "32:8:128"]:
    H, KVH, DH = map(int, shape.split(":"))
    G = H // KVH
    q, out = TensorDesc("q", DH, T * G, b=KVH), TensorDesc("o", H * DH, T)
    qb, kc, vc = rand_buffer(q.nbytes // 4), rand_buffer(KVH * CAP * DH), rand_buffer(KVH * CAP * DH)
    ob = dev.create_buffer(out.nbytes)
    sb = A._step_buffer(dev, 0, T)
    k = AttentionKernel(dev, q, H, KVH, DH, CAP, T * G, DH ** -0.5, variant="grouped")
    cb = AttentionCombineKernel(dev, out, H, KVH, DH, k.nsplit, T * G)
    pb = dev.create_buffer(KVH * T * G * k.nsplit * (DH + 2) * 4)
    a = timed(k.dispatch({"step": sb, "q": qb, "kc": kc, "vc": vc, "part": pb}, k.workgroups(T)))
    b = timed(cb.dispatch({"step": sb, "part": pb, "out": ob}, cb.workgroups(T)))
    ref = read(ob, T * H * DH)
    scale = max(abs(x) for x in ref)
    res = [f"split {a:.0f}+{b:.0f}"]
    for lanes in (4, 8, 16):
        for keys in (4, 8):
            for rows in (128, 256):
                try:
                    f = AttentionPrefillKernel(dev, q, out, H, KVH, DH, CAP, T * G, DH ** -0.5, lanes=lanes,
                                               keys=keys, rows=rows)
                except Exception as e:   # noqa: BLE001 (a knob this adapter cannot take: say so)
                    res.append(f"l{lanes}k{keys}r{rows} {type(e).__name__}")
                    continue
                d = f.dispatch({"step": sb, "q": qb, "kc": kc, "vc": vc, "out": ob}, f.workgroups(T))
                us = timed(d)
                err = max(abs(x - y) for x, y in zip(read(ob, T * H * DH)[::7], ref[::7])) / scale
                res.append(f"l{lanes}k{keys}r{rows} {us:.0f} ({err:.0e})")
    print(f"H {H} KVH {KVH} head_dim {DH} T {T}:", "; ".join(res), flush=True)
