"""Times the integer-dot decode GEMVs of a several-row decode step (the streams, issue 12) on the
Llama-3.2-1B shapes, the way the tuner times kernels (each run after an L2 flush, the median of
5): the candidates the tuner times for a program of T rows (autotune.cols_candidates: every
one-row candidate -- BLK_CANDIDATES, QOUT_CANDIDATES with the quantizing epilogue -- at each
power-of-two column count up to T's, and the one-row kernel). Random q4 weights and activations.
    PYTHONPATH=. python scripts/streams_gemv.py [T ...]        (default 1 4 8)
Prints microseconds per dispatch, the fastest first, per role and T."""
import sys

import numpy as np

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.kernels.convert import allocate_weight
from webdrift.kernels.linear import Epilogue, LinearKernel, QuantOut
from webdrift.kernels.quantize import QuantizeKernel, xq_desc
from webdrift.tensor import TensorDesc

dev = get_device()
rng = np.random.default_rng(0)
FMT = "q4"
# role: (outputs, inputs, gate/up pair, quantizing epilogue)
ROLES = {"o": (2048, 2048, False, True), "gateup": (8192, 2048, True, True), "down": (2048, 8192, False, True),
         "head": (128256, 2048, False, False), "qkv": (3072, 2048, False, False)}


def make_weight(name: str, o: int, i: int):
    """A q4 weight of random nibbles and random small f16 (scale, min) pairs, written in place."""
    w = allocate_weight(dev, name, FMT, o, i)
    for k, b in enumerate(w.buffers):
        n = b.size
        data = (rng.integers(0, 2 ** 32, n // 4, dtype=np.uint32).tobytes() if k == 0
                else rng.uniform(-0.01, 0.01, n // 2).astype(np.float16).tobytes())
        dev.write_buffer(b, data)
    return w


def us(d) -> float:
    """The best of two tuner timings (each the median of 5 L2-cold runs)."""
    return min(A._drive_sync(dev, A._time(dev, d)) for _ in range(2)) / 1000


def int8_rows(i: int, t: int):
    """t random activation rows of i channels, quantized for q4 by QuantizeKernel."""
    xd, q = TensorDesc("xf", i, t), xq_desc("x", i, t)
    xf, xb = dev.create_buffer(xd.nbytes), dev.create_buffer(q.nbytes)
    dev.write_buffer(xf, rng.normal(0, 1, i * t).astype(np.float32).tobytes())
    k = QuantizeKernel(dev, xd, q, FMT)
    dev.submit([k.dispatch({"step": A._step_buffer(dev, 0, t), "x": xf, "xq": xb}, k.workgroups(t))])
    return q, xb


for role, (O, I, dual, qout) in ROLES.items():
    w = make_weight("w", O, I)
    w2 = make_weight("w2", O, I) if dual else None
    for T in [int(a) for a in sys.argv[1:]] or [1, 4, 8]:
        x, xb = int8_rows(I, T)
        y, q = TensorDesc("y", O, T), xq_desc("q", O, T)
        bufs = [dev.create_buffer(d.nbytes) for d in (y, q)] + [dev.create_buffer(4 * O)]
        binds = {"step": A._step_buffer(dev, 0, T), "x": xb, "y": bufs[0], "w": w.buffers} | (
            {"w2": w2.buffers} if dual else {}) | ({"qout": bufs[1], "qnw": bufs[2]} if qout else {})
        res = []
        one_row = A.QOUT_CANDIDATES if qout else A.BLK_CANDIDATES
        for v in dict.fromkeys(c for k in one_row for c in A.cols_candidates(k, T, dual, qout, True, FMT)):
            try:
                k = LinearKernel(dev, "decode", x, y, w, w2, variant=v,
                                 epilogue=Epilogue(qout=QuantOut(q, FMT, 0.0, True) if qout else None))
                res.append((us(k.dispatch(binds, k.workgroups(T))), v))
            except Exception as e:   # noqa: BLE001 (a candidate this adapter cannot take: say so)
                print(f"  {role} {v}: {type(e).__name__}: {str(e)[:100]}")
        res.sort(key=lambda r: r[0])
        print(f"T {T} {role} {O}x{I}{' dual' if dual else ''}{' qout' if qout else ''}: " + "; ".join(
            f"{t:.1f} r{v.rows}w{v.wg}p{v.rps}c{v.cols}" for t, v in res[:8]), flush=True)
