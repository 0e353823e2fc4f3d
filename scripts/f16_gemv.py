"""Times the float decode GEMV candidates (autotune.CANDIDATES) on f16 weights of a model shape,
the way the tuner times kernels (each run after an L2 flush, the median of 5), and prints each
role's candidates fastest first with the weight bytes streamed per second (issue 10: the f16
rows). Random f16 weights and activations; one token row.
    PYTHONPATH=. python scripts/f16_gemv.py [llama-3.1-8b|llama-3.2-1b|llama-3.2-3b ...]
NONORM=1 adds QKV and gate/up without the fused RMS norm, and an LM-head-sized GEMV (no norm)."""
import os
import sys

import numpy as np

from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.kernels.convert import allocate_weight
from webdrift.kernels.linear import Epilogue, LinearKernel, RopeOut, rope_variant
from webdrift.kernels.norm import PreNorm
from webdrift.tensor import TensorDesc

SHAPES = {"llama-3.1-8b": (4096, 14336, 32, 8, 128), "llama-3.2-3b": (3072, 8192, 24, 8, 128),
          "llama-3.2-1b": (2048, 8192, 32, 8, 64)}
dev = get_device()
rng = np.random.default_rng(0)
TOP = int(os.environ.get("TOP", "6"))   # candidates printed per role


def make_weight(name: str, o: int, i: int):
    w = allocate_weight(dev, name, "f16", o, i)
    dev.write_buffer(w.buffers[0], rng.uniform(-0.05, 0.05, o * i).astype(np.float16).tobytes())
    return w


def us(d) -> float:
    """The best of two tuner timings (each the median of 5 L2-cold runs)."""
    return min(A._drive_sync(dev, A._time(dev, d)) for _ in range(2)) / 1000


for shape in sys.argv[1:] or ["llama-3.1-8b"]:
    h, f, nh, nkv, dh = SHAPES[shape]
    # role: (outputs, inputs, gate/up pair, fused norm, residual); qkv+rope: RoPE and the KV append in
    # the epilogue (as models/forward.py runs it: linear.rope_variant)
    roles = {"qkv+rope": ((nh + 2 * nkv) * dh, h, False, True, False),
             "qkv": ((nh + 2 * nkv) * dh, h, False, True, False), "o": (h, nh * dh, False, False, True),
             "gateup": (f, h, True, True, False), "down": (h, f, False, False, True)}
    if os.environ.get("NONORM"):   # what the fused norm's prologue costs: the same roles without it
        roles |= {"qkv-nonorm": ((nh + 2 * nkv) * dh, h, False, False, False),
                  "gateup-nonorm": (f, h, True, False, False), "lmhead": (128256, h, False, False, False)}
    for role, (O, I, dual, norm, res) in roles.items():
        w = make_weight("w", O, I)
        w2 = make_weight("w2", O, I) if dual else None
        x, y = TensorDesc("x", I, 1), TensorDesc("y", O, 1)
        xb, yb, nw = dev.create_buffer(x.nbytes), dev.create_buffer(y.nbytes), dev.create_buffer(4 * I)
        dev.write_buffer(xb, rng.normal(0, 1, I).astype(np.float32).tobytes())
        dev.write_buffer(nw, rng.uniform(0.5, 1.5, I).astype(np.float32).tobytes())
        binds = {"step": A._step_buffer(dev, 0, 1), "x": xb, "y": yb, "w": w.buffers} | (
            {"w2": w2.buffers} if dual else {}) | ({"nw": nw} if norm else {})
        nbytes = 2 * O * I * (2 if dual else 1)
        rope, cands, res_ = None, A.CANDIDATES, []
        if role == "qkv+rope":
            cap = 4096
            rope = RopeOut(TensorDesc("q", dh, nh // nkv, b=nkv), nh, nkv, dh, cap, True)
            binds |= {"q": dev.create_buffer(4 * nh * dh), "kc": dev.create_buffer(4 * nkv * cap * dh),
                      "vc": dev.create_buffer(4 * nkv * cap * dh), "inv_freq": dev.create_buffer(2 * dh)}
            cands = [c for c in dict.fromkeys(map(rope_variant, cands)) if c.variant in ("subgroup", "wide")]
        for v in cands:
            try:
                k = LinearKernel(dev, "decode", x, y, w, w2, variant=v, pre_norm=PreNorm(1e-5) if norm else None,
                                 epilogue=Epilogue(residual=res, rope=rope))
                t = us(k.dispatch(binds, k.workgroups(1)))
                res_.append((t, v))
            except Exception as e:   # noqa: BLE001 (a candidate this adapter cannot take: say so)
                print(f"  {role} {v}: {type(e).__name__}: {str(e)[:100]}")
        res_.sort(key=lambda r: r[0])
        print(f"{shape} {role} {O}x{I}{' dual' if dual else ''}: " + "; ".join(
            f"{t:.1f}us {nbytes / t / 1e6:.2f}TB/s {v.variant[:2]}r{v.rows}w{v.wg}u{v.unroll}m{v.mrows}{'k' * v.ksplit}"
            for t, v in res_[:TOP]), flush=True)
