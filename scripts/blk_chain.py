"""The 8B integer-dot decode GEMVs (autotune.BLK_CANDIDATES, and with the quantizing epilogue
QOUT_CANDIDATES / QLAST_CANDIDATES), each at unroll 1 / 2 / 4 (US=), in chains of K dependent
dispatches over K random weights (one pass timed whole after the clocks rise, the best of 5, per
kernel), as the engine runs them: gate/up + SiLU (-> the down projection's int8 row); down / O +
residual (-> the next norm's int8 row); Q|K|V plain. The fastest six, then the fastest of the
quantizing forms, against a streaming read of the bytes (3.04 us + bytes / 4357 GB/s, session 34):
    K=16 FMT=q4_0 PYTHONPATH=. python scripts/blk_chain.py [gateup] [down] [o] [qkv]
Results: docs/BENCHMARKS.md, session 35."""
import os
import sys
from dataclasses import replace

import numpy as np

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.kernels.convert import allocate_weight
from webdrift.kernels.linear import Epilogue, LinearKernel, QuantOut
from webdrift.kernels.quantize import xq_desc
from webdrift.tensor import TensorDesc

dev = get_device()
K = int(os.environ.get("K", "16"))
FMT = os.environ.get("FMT", "q4_0")
US = [int(u) for u in os.environ.get("US", "1,2,4").split(",")]
h, f, nh, nkv, dh = 4096, 14336, 32, 8, 128
roles = {"gateup": (f, h, True, False, True), "down": (h, f, False, True, True), "o": (h, nh * dh, False, True, True),
         "qkv": ((nh + 2 * nkv) * dh, h, False, False, False)}
rng = np.random.default_rng(0)
for role in sys.argv[1:] or list(roles):
    O, I, dual, res, qo = roles[role]
    ws = []
    for k in range(K):
        pair = []
        for n in ("w", "u")[: 2 if dual else 1]:
            w = allocate_weight(dev, f"{n}{k}", FMT, O, I)
            for b in w.buffers:
                dev.write_buffer(b, (rng.integers(0, 255, b.size, dtype=np.uint8) & 0x3B).tobytes())
            pair.append(w)
        ws.append(pair)
    x, y, q = xq_desc("x", I, 1), TensorDesc("y", O, 1), xq_desc("q", O, 1)
    bufs = {"step": A._step_buffer(dev), "x": dev.create_buffer(x.nbytes), "y": dev.create_buffer(y.nbytes),
            **A._qout_buffers(dev, ws[0][0])}
    nbytes = sum(b.size for p in ws[0] for b in p.buffers)
    base = list(A.BLK_CANDIDATES) + (list(A.QOUT_CANDIDATES) + list(A.QLAST_CANDIDATES) if qo else [])
    rows = []
    for v0 in base:
        for u in US:
            v = replace(v0, unroll=u)
            try:
                ep = Epilogue(residual=res, act="silu" if dual else None,
                              qout=QuantOut(q, FMT, 0.0 if res else None, res) if (qo and (v.rows == 32 or v.qlast)) else None)
                kern = LinearKernel(dev, "decode", x, y, ws[0][0], ws[0][1] if dual else None, variant=v, epilogue=ep)
                ds = [kern.dispatch(A._declared(kern, {**bufs, "w": p[0].buffers} | ({"w2": p[1].buffers} if dual else {})),
                                    kern.workgroups(1)) for p in ws]
                best = A.best_pass_ns(dev, ds, 0.3) / K / 1000
                rows.append((best, v))
            except Exception as e:  # noqa: BLE001
                print(f"  {role} {v.name}: {type(e).__name__}: {str(e)[:150]}", flush=True)
    rows.sort(key=lambda r: r[0])
    stream = 3.04 + nbytes / 4357e3
    print(f"{role} {O}x{I}{' dual' if dual else ''} {FMT} ({nbytes / 1e6:.1f} MB, a streaming read {stream:.1f} us), chain us:", flush=True)
    for c, v in rows[:6] + [r for r in rows[6:] if r[1].qlast or r[1].rows == 32][:14]:
        print(f"   {v.name:32s} {c:6.1f} ({nbytes / c / 1e6:.2f} TB/s)", flush=True)
    for u in US:
        bu = [r for r in rows if r[1].unroll == u]
        if bu:
            print(f"  best u{u}: {bu[0][1].name} {bu[0][0]:.1f}", flush=True)
    for p in ws:
        for w in p:
            for b in w.buffers:
                dev.release_buffer(b)
