"""What one model runs on one adapter, decided once at load: int8 activations per GEMV role and
the int8 chain (by measurement where the adapter can time kernels), and which prefill GEMMs
take int8 rows. The decision is a typed
value that models/forward.py copies into the ops it builds; nothing downstream re-derives it.
Per-weight kernel choices (GEMV variant, weight layout, attention kernel) come from
kernels/autotune.py, measured per adapter and shape and cached.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError, UnsupportedModelError
from ..kernels import linear_blk
from ..kernels.attention import AttentionCombineKernel
from ..kernels.autotune import GEMM_TUNE_ROWS, gemm_int8_pays, int8_pays, tunable
from ..kernels.quantize import FORMATS

# what the integer-dot kernels read, for messages: their formats, inputs in whole 32-blocks
# (256-input super-blocks for the K-quants)
INT8_FORMATS = "/".join(FORMATS) + " (whole blocks of inputs)"

ROLES = ("qkv", "o", "gateup", "down", "head")
LAYER_ROLES = ("qkv", "o", "gateup", "down")


@dataclass(frozen=True)
class Int8Choice:
    """roles[r]: the decode GEMV of role r (qkv, o, gateup, down, head) reads int8-quantized
    activations with integer dot products; chain: every layer GEMV writes the next one's int8
    row in its epilogue (no quantize dispatch but layer 0's); unchained: where the adapter is
    timed, the roles without the chain (the engine times a decode step each way and keeps the
    faster: runtime/engine.py, autotune.chain_pays)."""
    roles: dict
    chain: bool = False
    unchained: dict | None = None


def chain_key(model) -> str:
    """What the chain's verdict depends on besides the adapter: the layer shapes and formats."""
    cfg, lw = model.cfg, model.layers[0]
    return (f"{cfg.dim},{cfg.ffn_dim},{cfg.n_layers},{cfg.n_heads},{cfg.n_kv_heads},{cfg.head_dim},{cfg.vocab_size}|"
            + ",".join(w.fmt for w in (lw.wqkv, lw.wo, lw.w_gate, lw.w_down, model.output)) + f"|{model.kv_cache}")


def layer_role_weights(lw) -> dict:
    """A layer's GEMMs by role: (weight, second weight or None) of qkv, o, gateup, down."""
    return {"qkv": (lw.wqkv, None), "o": (lw.wo, None), "gateup": (lw.w_gate, lw.w_up), "down": (lw.w_down, None)}


def _layer_int8(dev, layers) -> tuple[list, bool]:
    """The layers' weight matrices, and whether they can all read int8 rows on this adapter
    (the integer-dot formats, quantize.FORMATS, with whole blocks; packed integer dot products).
    Every layer counts: a file's layers can differ in format (a Q4_K_M file's Q|K|V is row-split
    on the layers whose V is Q6_K, q4k on the others)."""
    mats = [w for lw in layers for w in (lw.wqkv, lw.wo, lw.w_gate, lw.w_up, lw.w_down)]
    return mats, dev.has_dp4a and all(linear_blk.supported(w.fmt, w.i) for w in mats)


def choose_prefill_int8(model, wanted: bool | None, rows: int = GEMM_TUNE_ROWS) -> dict:
    """Per layer role (qkv, o, gateup, down): whether its prefill GEMM reads int8 rows
    (QuantizeKernel + the integer-dot GEMM, wgsl/linear_gemm_i8.wgsl). None (auto): where every
    layer weight is in an integer-dot format (INT8_FORMATS) and the adapter has packed
    integer dot products, never on software adapters, and where the adapter is tuned, per role
    if timing layer 0's GEMM of that role both ways over `rows` tokens (the prefill chunk; the
    int8 one with its quantize dispatch, a matrix-unit QKV / gate-up with its Norm pass) says
    int8 is faster (autotune.gemm_int8_pays: e.g. the matrix-unit float GEMM may win O and
    down while the int8 one wins QKV and gate/up; untimed: int8 everywhere); True: forced
    everywhere (UnsupportedModelError where impossible); False: the float GEMM everywhere.
    `model`: dev, layers[0], autotune (a GPUModel)."""
    dev, lw = model.dev, model.layers[0]
    mats, ok = _layer_int8(dev, model.layers)
    if wanted and not ok:
        raise UnsupportedModelError(
            f"the int8 prefill GEMM needs {INT8_FORMATS} layer weights and WGSL's "
            f"packed_4x8_integer_dot_product (weights: {sorted({w.fmt for w in mats})[:8]}, adapter: {dev.has_dp4a})")
    if wanted is not None or not ok or dev.info.is_cpu:
        return dict.fromkeys(LAYER_ROLES, bool(wanted))
    if tunable(dev, model.autotune):
        return {r: bool(gemm_int8_pays(dev, w, w2, enabled=model.autotune, rows=rows,
                                       normed=r in ("qkv", "gateup"))["int8"])
                for r, (w, w2) in layer_role_weights(lw).items()}
    return dict.fromkeys(LAYER_ROLES, True)


def chain_possible(dev, cfg) -> bool:
    """Whether every layer GEMV can write the next one's int8 row (quantizing epilogues need
    subgroups, 32-multiples and pre-norm blocks; the combine needs head_dim % 32 == 0)."""
    return (dev.has_subgroups and not cfg.post_norms and cfg.dim % 32 == 0 and cfg.ffn_dim % 32 == 0
            and AttentionCombineKernel.quant_supported(cfg.head_dim))


def choose_int8(model, wanted: bool | dict | None) -> Int8Choice:
    """Which decode GEMVs take int8 activations (QuantizeKernel + integer-dot GEMV), by role.
    True/False: all of them (True needs q4/q8 layers); a dict: those roles. Auto (None): on GPUs
    with packed integer dot products, per role where the measured GEMV time saved pays for the
    extra quantize dispatch (kernels/autotune.py int8_pays; unmeasured -- no timestamps, or timed
    asynchronously and not yet tuned --, for
    weights >= 12 MiB); then, where gate/up pays and the layer allows it, every layer GEMV with
    the int8 chain (timed adapters: the per-role choice kept as `unchained`, and the engine keeps
    whichever decode step is faster); never on software adapters.
    `model`: dev, cfg, layers[0], output, autotune (a GPUModel)."""
    dev, cfg, lw = model.dev, model.cfg, model.layers[0]
    roles = {r: (w, w2, r in ("qkv", "gateup")) for r, (w, w2) in layer_role_weights(lw).items()}   # pre-normed?
    roles["head"] = (model.output, None, True)
    mats, ok = _layer_int8(dev, model.layers)
    head_ok = dev.has_dp4a and linear_blk.supported(model.output.fmt, model.output.i)
    possible = chain_possible(dev, cfg)
    if isinstance(wanted, dict):    # per role (unnamed roles: off)
        bad = sorted(set(wanted) - set(roles))
        if bad:
            raise InvalidArgumentError(f"int8_activations: unknown roles {bad}; the roles are {sorted(roles)}")
        out = {r: bool(wanted.get(r, False)) for r in roles}
        if (any(v for r, v in out.items() if r != "head") and not ok) or (out["head"] and not head_ok):
            raise UnsupportedModelError(f"int8 activations for {sorted(r for r, v in out.items() if v)} need "
                                        f"{INT8_FORMATS} weights and packed 4x8 integer dot products")
        return Int8Choice(out, all(out[r] for r in LAYER_ROLES) and possible)
    if wanted is not None:
        if wanted and not ok:
            raise UnsupportedModelError(
                f"int8 activations need {INT8_FORMATS} layer weights and WGSL's "
                f"packed_4x8_integer_dot_product (weights: {sorted({w.fmt for w in mats})[:8]}, "
                f"adapter: {dev.has_dp4a})")
        return Int8Choice({r: bool(wanted) and (r != "head" or head_ok) for r in roles}, bool(wanted) and possible)
    timed = tunable(dev, model.autotune)     # measured now, or (asynchronous timing) queued: the size rule until then
    out = {}
    for r, (w, w2, norm) in roles.items():
        big = w.nbytes + (w2.nbytes if w2 else 0) >= 12 << 20
        if dev.info.is_cpu or not (head_ok if r == "head" else ok):
            out[r] = False
        elif timed:
            fused = r == "o" and AttentionCombineKernel.quant_supported(cfg.head_dim)
            out[r] = bool(int8_pays(dev, w, w2, pre_norm=norm, quantize_dispatch=not fused, enabled=model.autotune,
                                    static=big)["int8"])
        else:
            out[r] = big
    if possible and out["gateup"]:
        # the biggest GEMV pays: every layer GEMV int8, each writing the next one's int8 row itself
        # (no per-layer quantize dispatch); where timed, the engine also times the step without
        return Int8Choice(dict(out, qkv=True, o=True, down=True), True, dict(out) if timed else None)
    return Int8Choice(out, False)

