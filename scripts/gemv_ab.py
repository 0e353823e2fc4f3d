"""Decode GEMV variants compared on whole decode steps: an engine of one synthetic model with the
tuner's choices, and one engine per forced set of variants (by role: qkv, o, gateup, down, head),
one process, interleaved (decode tok/s, the best of 3 generations of 128 tokens after 1024):
    PYTHONPATH=. python scripts/gemv_ab.py llama-3.1-8b:f16 "gateup=wide r16 wg128 m4" \\
        "gateup=wide r2 wg256 u4 m2 ksplit;down=wide r2 wg128 m2 ksplit"
(each argument after the model one engine; a variant as bench reports name it, GemvVariant.name).
Each engine's decode GEMVs are printed by op family (what bench's `decode_gemv` reports). A
forced variant replaces the tuner's for the float and the integer-dot GEMVs of its role alike;
the int8 chain's quantizing GEMVs are not forced. For issue 10's question (docs/BENCHMARKS.md,
session 34): does the tuner pick what runs the step fastest."""
import sys

from webdrift.gpu.native import get_device
from webdrift.kernels.linear import GemvVariant
from webdrift.models import forward as F
from webdrift.profile.benchmark import build_engine, decode_gemvs, interleaved_decode_tps, prompt_ids
from webdrift.weights.synthetic import synthetic_source

real = F.choose_gemv


def role_of(cfg, w, w2) -> str:
    if w2 is not None:
        return "gateup"
    if w.o == cfg.vocab_size:
        return "head"
    if w.i == cfg.ffn_dim:
        return "down"
    return "o" if w.o == cfg.dim else "qkv"


def forcing(cfg, forced: dict):
    def choose(dev, w, w2=None, enabled=True, int8=False, **kw):
        return forced.get(role_of(cfg, w, w2)) or real(dev, w, w2, enabled=enabled, int8=int8, **kw)
    return choose


dev = get_device()
shape, quant = sys.argv[1].split(":")
src = synthetic_source(shape, quant)
cfg = src.config
engs = {"tuned": build_engine(dev, src, 1224)}
for spec in sys.argv[2:]:
    forced = {}
    for part in spec.split(";"):
        role, name = part.split("=", 1)
        if role not in ("qkv", "o", "gateup", "down", "head"):
            raise SystemExit(f"{spec!r}: unknown role {role!r}")
        forced[role] = GemvVariant.from_name(name.strip())
    F.choose_gemv = forcing(cfg, forced)
    try:
        engs[spec] = build_engine(dev, src, 1224)
    finally:
        F.choose_gemv = real
for name, e in engs.items():
    print(f"{name}: {decode_gemvs(e)}", flush=True)
tps = interleaved_decode_tps(engs, prompt_ids(cfg.vocab_size, 1024))
for name, v in tps.items():
    print(f"{sys.argv[1]} {max(v):7.1f} tok/s {[round(x, 1) for x in v]}  {name}", flush=True)
