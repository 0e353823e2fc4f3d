"""The 8B f16 decode GEMV candidates (autotune.CANDIDATES but split / row) timed two ways: alone, as
the tuner times them (after an L2 flush, the median of 5), and in a chain of K dependent
dispatches over K weight copies (one pass timed whole after at least 0.4 s of it, until the
clocks stop rising: autotune._busy; the best of 5; per kernel = total / K), the way a decode
step runs a role layer after layer; fastest in the chain first, with the tuner's pick and the
chain's:
    K=12 PYTHONPATH=. python scripts/gemv_chain.py [gateup] [gatecat] [down] [qkv] [o]
("gatecat": gate and up as one weight of 2 x 14336 rows, one GEMV: the same bytes as gateup's
pair in one stream, what a layout with the two's rows interleaved would read.)
Results: docs/BENCHMARKS.md, session 34."""
import os
import sys

import numpy as np

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.kernels.convert import allocate_weight
from webdrift.kernels.linear import Epilogue, LinearKernel
from webdrift.kernels.norm import PreNorm
from webdrift.tensor import TensorDesc

dev = get_device()
rng = np.random.default_rng(0)
K = int(os.environ.get("K", "12"))
h, f, nh, nkv, dh = 4096, 14336, 32, 8, 128
roles = {"gateup": (f, h, True, True, False), "gatecat": (2 * f, h, False, True, False), "down": (h, f, False, False, True),
         "qkv": ((nh + 2 * nkv) * dh, h, False, True, False), "o": (h, nh * dh, False, False, True)}
only = sys.argv[1:] or list(roles)
for role in only:
    O, I, dual, norm, res = roles[role]
    data = rng.uniform(-0.05, 0.05, O * I).astype(np.float16).tobytes()
    ws = []
    for k in range(K):
        w = allocate_weight(dev, f"w{k}", "f16", O, I); dev.write_buffer(w.buffers[0], data)
        w2 = None
        if dual:
            w2 = allocate_weight(dev, f"u{k}", "f16", O, I); dev.write_buffer(w2.buffers[0], data)
        ws.append((w, w2))
    x, y = TensorDesc("x", I, 1), TensorDesc("y", O, 1)
    xb, yb, nw = dev.create_buffer(x.nbytes), dev.create_buffer(y.nbytes), dev.create_buffer(4 * I)
    dev.write_buffer(xb, rng.normal(0, 1, I).astype(np.float32).tobytes())
    dev.write_buffer(nw, rng.uniform(0.5, 1.5, I).astype(np.float32).tobytes())
    nbytes = 2 * O * I * (2 if dual else 1)
    rows = []
    for v in A.CANDIDATES:
        if v.variant in ("split", "row"):
            continue
        try:
            kern = LinearKernel(dev, "decode", x, y, ws[0][0], ws[0][1], variant=v,
                                pre_norm=PreNorm(1e-5) if norm else None, epilogue=Epilogue(residual=res))
            ds = [kern.dispatch({"step": A._step_buffer(dev, 0, 1), "x": xb, "y": yb, "w": w.buffers}
                                | ({"w2": w2.buffers} if dual else {}) | ({"nw": nw} if norm else {}), kern.workgroups(1))
                  for w, w2 in ws]
            alone = A._drive_sync(dev, A._time(dev, ds[0])) / 1000
            best = A.best_pass_ns(dev, ds, 0.4) / K / 1000
            rows.append((best, alone, v))
        except Exception as e:  # noqa: BLE001
            print(f"  {role} {v}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    rows.sort(key=lambda r: r[0])
    print(f"{role} {O}x{I}{' dual' if dual else ''} ({nbytes / 1e6:.1f} MB), chain us / alone us:", flush=True)
    for c, a, v in rows:
        print(f"   {v.name:28s} chain {c:6.1f} ({nbytes / c / 1e6:.2f} TB/s)  alone {a:6.1f}", flush=True)
    al = min(rows, key=lambda r: r[1])
    print(f"  tuner's pick (alone) {al[2].name}: chain {al[0]:.1f}; chain's pick {rows[0][2].name}: {rows[0][0]:.1f}", flush=True)
    for w, w2 in ws:
        for b in (*w.buffers, *(w2.buffers if w2 else ())):
            dev.release_buffer(b)
