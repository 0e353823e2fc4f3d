"""LinearKernel: y = x W^T with its fusions, stage-aware, one template per algorithm:
  prefill  wgsl/linear_gemm.wgsl       tiled GEMM, register blocks per invocation (linear_gemm.py)
           wgsl/linear_gemm_i8.wgsl    the same on int8 input rows x q8 / q4 weights (dot4I8Packed)
  decode   wgsl/linear_split.wgsl      a workgroup splits the inputs of ROWS outputs
           wgsl/linear_row.wgsl        one output per invocation, no barriers (CPU adapters)
           wgsl/linear_subgroup.wgsl   one subgroup per output, 4-channel slices
           wgsl/linear_wide.wgsl       one subgroup per output, whole quant blocks per lane
           wgsl/linear_blk.wgsl        integer dot products on int8 input rows (linear_blk.py);
                                       GemvVariant.cols > 1: several token rows per workgroup
All of them include linear_common.wgsl (bias, fused RMSNorm, activation, epilogue), so every
variant computes the same maths. The options are typed: GemvVariant (which decode kernel) or
GemmVariant (which prefill GEMM and its tile; kernels/autotune.py measures both), PreNorm
(RMSNorm of x fused in) and Epilogue (what happens to each output: bias, gate/up activation,
soft-cap, residual; the blk GEMV's QuantOut, the QKV GEMV's RopeOut).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import GPULimitError, UnsupportedModelError
from ..gpu.base import Device
from ..tensor import TensorDesc
from . import linear_blk
from .base import Kernel, ceil_div, wgsl_float
from .bindings import Bindings
from .linear_gemm import GemmVariant, float_defines, int8_defines, mma_defines
from .lora import LoraOut, LoraPartials
from .norm import PreNorm
from .quantize import block_defines, declare_rows, row_words
from .rope import declare_rope_outputs
from .tree import declare_tree
from .weights import GPUWeight, wide_accessor_wgsl, wide_input_wgsl, wide_supported

MAX_COLS = 16   # token rows per workgroup of the decode GEMVs that take several (GemvVariant.cols)
COLS_VARIANTS = ("blk", "subgroup", "wide")
DECODE_TEMPLATES = {"split": "linear_split", "row": "linear_row", "subgroup": "linear_subgroup",
                    "wide": "linear_wide", "blk": "linear_blk"}


# GemvVariant.name's numeric parts: (prefix, field), longer prefixes first
_NAME_FIELDS = (("rps", "rps"), ("cols", "cols"), ("wg", "wg"), ("r", "rows"), ("u", "unroll"), ("m", "mrows"))


@dataclass(frozen=True)
class GemvVariant:
    """A decode GEMV variant (autotune's choice or the static rule; prefill ignores it)."""
    variant: str = "split"   # "split" | "row" | "subgroup" | "wide" | "blk"
    rows: int = 4            # outputs per workgroup (row: unused, WG outputs per workgroup)
    wg: int = 64             # invocations per workgroup
    unroll: int = 1          # subgroup / wide: 4 = four loads in flight per lane; wide split K
                             # (one column): 2-4 strides of the block loop at a time
    rps: int = 4             # blk with QuantOut: rows per subgroup at a time
    mrows: int = 1           # wide: consecutive rows per subgroup at a time (input loaded once for them)
    cols: int = 1            # blk / subgroup / wide: token rows per workgroup, each weight block
                             # read once for all (tree verification, the streams; autotune
                             # gemv_cols); 1: the one-row kernel
    qlast: bool = False      # blk with QuantOut, one column: ROWS (dividing 32) outputs per
                             # workgroup, and each 32-block's last workgroup to finish quantizes it
                             # (instead of 32 rows per workgroup)
    ksplit: bool = False     # wide: the whole workgroup strides the blocks of mrows rows at a time
                             # (split K, reduced across its subgroups; ROWS a multiple of mrows)

    @property
    def name(self) -> str:
        """Short readable form for reports, e.g. "wide r16 wg128 m4", "blk r32 wg256 rps4"
        (fields at their defaults left out; rps only where it is used, a QuantOut's rows)."""
        parts = [self.variant, f"r{self.rows}", f"wg{self.wg}"]
        parts += [f"u{self.unroll}"] * (self.unroll != 1) + [f"m{self.mrows}"] * (self.mrows != 1)
        parts += ["ksplit"] * self.ksplit + [f"cols{self.cols}"] * (self.cols != 1) + ["qlast"] * self.qlast
        parts += [f"rps{self.rps}"] * (self.variant == "blk" and self.rows == 32 and not self.qlast)
        return " ".join(parts)

    @classmethod
    def from_name(cls, name: str) -> GemvVariant:
        """The variant `name` names (its inverse; for scripts that force a variant); ValueError
        naming the part it cannot read."""
        head, *parts = name.split()
        if head not in ("split", "row", "subgroup", "wide", "blk"):
            raise ValueError(f"GEMV variant {name!r}: unknown kind {head!r}")
        kw: dict = {"variant": head}
        for part in parts:
            if part in ("ksplit", "qlast"):
                kw[part] = True
                continue
            # longer prefixes first ("rps2" is not rows)
            pre, field = next(((p, f) for p, f in _NAME_FIELDS if part.startswith(p) and part[len(p):].isdigit()),
                              (None, None))
            if field is None:
                raise ValueError(f"GEMV variant {name!r}: cannot read {part!r}")
            kw[field] = int(part[len(pre):])
        return cls(**kw)


def rope_variant(v: GemvVariant) -> GemvVariant:
    """The float decode GEMV v as it takes the RoPE epilogue: one column; an odd mrows computes
    one rotation pair per subgroup (twice the rows, or half its subgroups would idle), split K
    twice its rows at a time; an even mrows: its rows are whole pairs, v itself."""
    if v.mrows % 2 == 0:
        return replace(v, cols=1)
    if v.ksplit:
        return replace(v, cols=1, rows=2 * v.rows, mrows=2 * v.mrows)
    return replace(v, cols=1, rows=2 * v.rows, mrows=1)


@dataclass(frozen=True)
class QuantOut:
    """blk epilogue: also write the outputs as the next GEMV's int8 row (binding "qout"), times
    that GEMV's norm weight (binding "qnw") + norm_offset when norm_offset is not None; write_y
    False: the int8 row is the only output."""
    row: TensorDesc
    fmt: str
    norm_offset: float | None
    write_y: bool


@dataclass(frozen=True)
class RopeOut:
    """QKV epilogue: RoPE + Q relayout + KV append instead of writing y (bindings "q", "kc",
    "vc", "inv_freq"; see rope.py)."""
    q: TensorDesc
    n_heads: int
    n_kv: int
    head_dim: int
    cap: int
    rope_half: bool
    kv_f16: bool = False         # the caches hold f16 (rope.kv_type)
    tree: bool = False           # each row rotated by its tree record's position ("tree": tree.py)


@dataclass(frozen=True)
class Epilogue:
    """What happens to each output: + bias[o] ("bias"), act(gate) * up when there is a second
    weight ("silu" or "gelu_tanh"), softcap * tanh(y / softcap), + y (residual); and qout / rope."""
    bias: bool = False
    residual: bool = False
    act: str = "silu"
    softcap: float | None = None
    qout: QuantOut | None = None
    rope: RopeOut | None = None
    lora: LoraOut | None = None
    lpart: LoraPartials | None = None   # with qout: the next GEMV's LoRA shares per int8 block


def _weight_decl(n: str, binding: int, w: GPUWeight, variant: str, dev: Device) -> str:
    if variant == "wide":
        return wide_accessor_wgsl(n, binding, w.fmt, w.o, w.i)
    if variant in ("blk", "gemm_i8"):
        return linear_blk.weight_decl(n, binding, w.fmt, w.o, w.i)
    return w.wgsl(n, binding, native_f16=dev.has_f16)


def ks_red_floats(wg: int, slots: int) -> int:
    """Workgroup floats of the split-K wide GEMV's sums: each of `slots` sums per subgroup
    (subgroups are >= 4 invocations: at most WG / 4 of them) and their totals."""
    return slots * (wg // 4 + 1)


def qlast_bytes(outputs: int, rows: int) -> tuple[int, int]:
    """Bytes of the last-workgroup quantizing GEMV's scratch for `outputs` outputs of `rows`
    token rows: qy (the outputs' f32 bits) and qcnt (a u32 counter per 32-block)."""
    return 4 * outputs * rows, max(4, 4 * (outputs * rows // 32))


def _red_floats(v: str, rows: int, wg: int, dev: Device, ks_slots: int = 0) -> int:
    """Floats of the float GEMVs' workgroup reduction array: the split variant reduces every row
    (and a pair's second) and its fused norm's sums through it, the split-K wide one its ks_slots
    sums at a time (ks_red_floats); the others do not use it (one float: WGSL has no empty array).
    A size over the adapter's workgroup storage is a GPULimitError (the tuner skips such candidates;
    a driver handed one can lose the device)."""
    red = max(2 * rows * wg, wg) if v == "split" else max(1, ks_red_floats(wg, ks_slots))
    limit = int(dev.info.limits.get("max-compute-workgroup-storage-size", 16384))
    if 4 * red > limit:
        raise GPULimitError(f"the {v} GEMV with {rows} rows x {wg} invocations needs {4 * red} bytes of workgroup "
                            f"storage; the adapter allows {limit}")
    return red


def _mrows_code(m: int, pair: bool, cols: int, nt: str, rope: bool = False, ksplit: bool = False,
                kunroll: int = 1, norm: bool = False) -> dict:
    """linear_wide.wgsl's MROWS statements, unrolled over the m rows (o + j; rows past the
    weight's last read its last row, and are not written) and the NCOL columns (c: token row
    t{c}, input block xb{c}; each column the one-column statements); nt: the token count.
    rope (one column, m even): the m rows are output indices o + j, weight rows rperm(o + j)
    (rope_epilogue.wgsl), and each two adjacent ones, rotation partners, go to rope_out.
    ksplit (KSPLIT, also for m = 1): the sums' slots, each subgroup's partials put into red
    (KS_PUT) and the totals taken back (KS_GET) for the epilogue; kunroll > 1 (with ksplit): the
    block loop takes kunroll strides at a time (blocks b + u bstep), each stride's sums in
    accumulators of their own (MR_ACC_U) added to the first's after the loop (MR_MERGE_U), so
    kunroll x m weight blocks are in flight per invocation. norm (PRE_NORM): each column's squares
    of x (ss_{c}, added by x_blk) meet like the sums, and 1 / rms scales the column's sums before
    the epilogue."""
    if m <= 1 and not ksplit:
        return {"MROWS": False, "KSPLIT": False}
    js, cs = range(m), range(cols)
    row = [f"min(o + {j}u, w_O - 1u)" for j in js]
    row = [f"rperm({r})" for r in row] if rope else row
    decl = [f"    var m{j}_{c} = 0.0;" + (f" var n{j}_{c} = 0.0;" if pair else "") for c in cs for j in js]
    decl += [f"    var ss_{c} = 0.0;" for c in cs]
    acc = []
    for c in cs:   # column c: its input block, then its rows' sums (only where it has a token row)
        acc += [f"      if (nc > {c}u) {{"] if cols > 1 else []
        acc.append(f"      let xb{c} = x_blk(x_row(t{c}), b, &ss_{c});")
        acc += [f"      m{j}_{c} += w_dot({row[j]}, b, xb{c});" + (f" n{j}_{c} += w2_dot({row[j]}, b, xb{c});" if pair else "")
                for j in js]
        acc += ["      }"] if cols > 1 else []
    red = [f"    m{j}_{c} = subgroupAdd(m{j}_{c});" + (f" n{j}_{c} = subgroupAdd(n{j}_{c});" if pair else "")
           for c in cs for j in js]
    red += [f"    ss_{c} = subgroupAdd(ss_{c});" for c in cs] if norm else []
    if not rope:
        epi = [f"      if (o + {j}u < w_O && tbase + {c}u < {nt}) {{ epilogue(t{c}, o + {j}u, m{j}_{c}, "
               f"{f'n{j}_{c}' if pair else f'm{j}_{c}'}); }}" for c in cs for j in js]
    else:   # the pairs (o + j, o + j + 1): whole pairs, as w_O and o are even
        epi = [f"      if (o + {j}u < w_O) {{\n"
               f"        let va{j} = epilogue_value(t0, {row[j]}, m{j}_0, 0.0);\n"
               f"        let vb{j} = epilogue_value(t0, {row[j + 1]}, m{j + 1}_0, 0.0);\n"
               f"        rope_out(t0, o + {j}u, va{j}, vb{j});\n        rope_out(t0, o + {j + 1}u, vb{j}, va{j});\n      }}"
               for j in js[::2]]
    sums = [v for c in cs for j in js for v in ([f"m{j}_{c}"] + ([f"n{j}_{c}"] if pair else []))]
    if norm:   # 1 / rms of each column scales its sums (in the epilogue's invocation, after they met)
        epi = [f"      let inv{c} = rms_inv(ss_{c});" + "".join(
            f" m{j}_{c} *= inv{c};" + (f" n{j}_{c} *= inv{c};" if pair else "") for j in js) for c in cs] + epi
    d = {"MROWS": m, "MR_DECL": "\n".join(decl), "MR_ACC": "\n".join(acc), "MR_RED": "\n".join(red),
         "MR_EPI": "\n".join(epi), "KSPLIT": ksplit, "KUNROLL": ksplit and kunroll > 1}
    if ksplit and kunroll > 1:   # (one column: LinearKernel checks)
        us = range(1, kunroll)

        def s(v: str, u: int) -> str:   # stride u's accumulator of sum v (stride 0: v itself)
            return f"{v}_{u}" if u else v
        acc_u = [f"      let xb0_{u} = x_blk(x_row(t0), b + {u}u * bstep, &ss_0);" for u in range(kunroll)]
        acc_u += [f"      {s(f'm{j}_0', u)} += w_dot({row[j]}, b + {u}u * bstep, xb0_{u});"
                  + (f" {s(f'n{j}_0', u)} += w2_dot({row[j]}, b + {u}u * bstep, xb0_{u});" if pair else "")
                  for u in range(kunroll) for j in js]
        d.update(KU=kunroll, MR_ACC_U="\n".join(acc_u),
                 MR_DECL_U="\n".join(f"    var {v}_{u} = 0.0;" for u in us for v in sums),
                 MR_MERGE_U="\n".join(f"    {v} += " + " + ".join(f"{v}_{u}" for u in us) + ";" for v in sums))
    else:
        d.update(KU=1, MR_DECL_U="", MR_ACC_U="", MR_MERGE_U="")
    if ksplit:
        slots = sums + ([f"ss_{c}" for c in cs] if norm else [])
        d.update(KS_SLOTS=len(slots), KS_PUT="\n".join(f"      red[{k}u * KSN + sgi] = {v};" for k, v in enumerate(slots)),
                 KS_GET="\n".join(f"      {v} = red[KST + {k}u];" for k, v in enumerate(slots)))
    return d


class LinearKernel(Kernel):
    """y = x W^T (+ the epilogue), stage "decode" (a GemvVariant) or "prefill" (a GemmVariant;
    a GemvVariant there means the default float GEMM).
    Bindings, in this order (those of absent options are not declared):
      step      the Step uniform
      x         (T_cap, I) activation; blk and the int8 GEMM: (T_cap, row_words(I)) u32 int8 rows
                from QuantizeKernel
      y         (T_cap, O) activation (x_last_row: row 0 only); bound even where never written
                (rope, QuantOut(write_y=False))
      w         the (O, I) weight (w.buffers); w2: the second weight (gate/up: the up projection)
      bias      (O) f32, with epilogue.bias
      nw        (I) f32 norm weight, with pre_norm on float GEMVs
      q, kc, vc, inv_freq   with epilogue.rope (RopeOut)
      qout      (T_cap, row_words(O)) u32 int8 rows, with epilogue.qout; qnw: (O) f32 the next
                GEMV's norm weight, with qout.norm_offset
      lu, lb    the LoRA shrink's rows and the B pool, with epilogue.lora (kernels/lora.py); fused:
                the input blocks' shares, lctl the adapter table, then lb
      lpa, lpc, lpw   with epilogue.lpart: the next GEMV's A pool, the adapter table, its shares
    Dispatch: workgroups(t)."""

    def __init__(self, dev: Device, stage: str, x: TensorDesc, y: TensorDesc, w: GPUWeight,
                 w2: GPUWeight | None = None, *, variant: GemvVariant | GemmVariant = GemvVariant(),
                 pre_norm: PreNorm | None = None, epilogue: Epilogue = Epilogue(), x_last_row: bool = False):
        """x_last_row (decode): read x's row step.last_row, write y's row 0 (the LM head)."""
        if stage not in ("decode", "prefill"):
            raise ValueError(f"a linear layer's stage is 'decode' or 'prefill', not {stage!r}")
        ep, qout, rope = epilogue, epilogue.qout, epilogue.rope
        gemm = None
        if stage == "prefill":
            gemm = variant if isinstance(variant, GemmVariant) else GemmVariant()
            gemm.check()
            for u in (w, w2):
                if u is not None:
                    gemm.check_weight(u.fmt)
            v = "gemm_i8" if gemm.int8 else "gemm_mma" if gemm.mma else "gemm"
            if qout is not None:
                raise ValueError("the prefill GEMM has no quantizing epilogue")
            if pre_norm is not None and not gemm.int8:
                raise ValueError("the float prefill GEMMs read a normed input (a Norm pass before them); pre_norm "
                                 "is the int8 GEMM's 1/rms")
            if gemm.mma and not dev.has_mma_f16:
                raise UnsupportedModelError("the matrix-unit GEMM needs chromium-experimental-subgroup-matrix with f16 "
                                            "16 x 16 x 16 (f32 results), shader-f16 and subgroups of 32")
            if not gemm.takes_weights(w, w2):
                raise UnsupportedModelError(f"direct weight loads read row-major f16 weights with rows a multiple of "
                                            f"{4 * gemm.kstep} inputs; {w.name} is {w.fmt} ({w.o} x {w.i})")
            if not gemm.fits(dev, w2 is not None, pre_norm is not None):
                raise UnsupportedModelError(f"GEMM tile {gemm} needs more invocations or workgroup memory "
                                            f"({gemm.workgroup_bytes(w2 is not None, pre_norm is not None)} bytes) "
                                            "than this adapter offers")
        elif isinstance(variant, GemvVariant):
            v = variant.variant
        else:
            raise ValueError("a decode GEMV takes a GemvVariant")
        if v not in DECODE_TEMPLATES and gemm is None:
            raise ValueError(f"unknown decode GEMV variant {v!r}; the variants are {sorted(DECODE_TEMPLATES)}")
        self.template = DECODE_TEMPLATES.get(v, f"linear_{v}")
        blk = v == "blk"
        i8 = blk or v == "gemm_i8"   # int8 input rows, integer dot products
        if i8:
            for u in (w, w2):
                if u is not None and not linear_blk.supported(u.fmt, u.i):
                    raise UnsupportedModelError(f"the integer-dot GEMV reads q8, q4 and their group / per-channel / "
                                                f"e0m4 forms (inputs a multiple of 32), q4k, q5k and q6k (of 256) "
                                                f"weights; {u.name} is {u.fmt} ({u.o} x {u.i})")
            if not dev.has_dp4a:
                raise UnsupportedModelError("the integer-dot GEMV needs WGSL's packed_4x8_integer_dot_product")
            if x.c != row_words(w.i) or (w2 is not None and w2.fmt != w.fmt):
                raise ValueError("the integer-dot GEMV reads rows made by QuantizeKernel")
            if qout is not None:
                if not variant.qlast:
                    variant = replace(variant, rows=32)
                elif 32 % variant.rows or variant.wg < 32 or variant.cols != 1 or rope is not None:
                    raise ValueError(f"the last-workgroup quantizing epilogue (qlast) takes one column, rows dividing "
                                     f"32 and workgroups of 32 or more; got {variant}")
                if not dev.has_subgroups or w.o % 32 or qout.row.c != row_words(w.o):
                    raise ValueError(f"a quantizing epilogue needs subgroups, outputs a multiple of 32 and a "
                                     f"{row_words(w.o)}-word row tensor; {w.name} has {w.o} outputs")
            elif gemm is None and variant.qlast:
                raise ValueError("qlast is a form of the quantizing epilogue (QuantOut)")
        if gemm is None and variant.cols != 1 and (v not in COLS_VARIANTS or x_last_row
                                                   or not 1 <= variant.cols <= MAX_COLS
                                                   or (qout is not None and variant.wg % 32)
                                                   or (v != "blk" and rope is not None)):
            raise ValueError(f"{variant.cols} token rows per workgroup: the integer-dot, subgroup and wide decode "
                             f"GEMVs take 1 to {MAX_COLS} (with a quantizing epilogue, a workgroup of whole 32s; "
                             f"the float ones without RoPE), not on the LM head's last row only; {w.name} is {v}")
        rows, wg = (variant.rows, variant.wg) if gemm is None else (0, gemm.wg)
        if rope is not None and (rows % 2 or qout is not None or w2 is not None or rope.head_dim % 2
                                 or v not in ("blk", "subgroup", "wide")
                                 or w.o != (rope.n_heads + 2 * rope.n_kv) * rope.head_dim):
            raise ValueError(f"RoPE in the GEMV epilogue needs the blk, subgroup or wide decode GEMV, an even row "
                             f"count and the QKV weight; {w.name} ({v}, {rows} rows)")
        if gemm is None and variant.ksplit and (v != "wide" or not dev.has_subgroups):
            raise ValueError(f"split K (ksplit) is a wide-GEMV option with subgroups; got {v}")
        if gemm is None and variant.ksplit and variant.unroll > 1 and (variant.cols != 1 or variant.unroll > 4):
            raise ValueError(f"split K takes 2 to 4 strides at a time (unroll) with one token row; got unroll "
                             f"{variant.unroll} with {variant.cols} columns")
        if gemm is None and (variant.mrows > 1 or variant.ksplit) and (v != "wide" or rows % variant.mrows
                                                                       or (rope is not None and variant.mrows % 2)):
            raise ValueError(f"several rows per subgroup (mrows {variant.mrows}) are a wide-GEMV option, for a row "
                             f"count that is a multiple of it (with RoPE an even count: whole rotation pairs); got "
                             f"{v} with {rows} rows")
        if v == "wide" and not all(wide_supported(u.fmt, u.i, u.layout) for u in (w, w2) if u is not None):
            raise UnsupportedModelError(f"the wide GEMV reads q4, q8 and row-major f16 with inputs a multiple "
                                        f"of 8; {w.name} is {w.fmt} ({w.o} x {w.i})")
        if x_last_row and stage != "decode":
            raise ValueError("x_last_row is a decode-kernel option")
        self.stage, self.w, self.variant, self.gemm = stage, w, variant, gemm
        b = Bindings()   # declared in binding order
        nw_vec4 = x.c % 4 == 0   # the norm weight read a slice at a time (norm_w4's NW_ALIGNED)

        def weight(name: str, u: GPUWeight) -> str:
            return b.weight(name, u, lambda n, k: _weight_decl(n, k, u, v, dev))
        d = {"STEP_DECL": b.step(),
             "X_DECL": (b.array("x", "array<vec4<u32>>", f"({x.w}, {x.c // 4}) int8 rows, four words per vec4",
                                writable=True, var="xq") if i8 else b.tensor("x", x, vec4_reads=True)),
             "Y_DECL": b.tensor("y", y),
             "W_DECL": weight("w", w),
             "W2_DECL": weight("w2", w2) if w2 is not None else "",
             "BIAS_DECL": b.array("bias", "array<f32>", f"({w.o})") if ep.bias else "",
             "NW_DECL": (b.array("nw", f"array<{'vec4<f32>' if nw_vec4 else 'f32'}>", f"({w.i}) norm weight")
                         if pre_norm and not i8 else ""),
             "XB_DECL": wide_input_wgsl(w.fmt) if v == "wide" else ""}
        if rope is not None:   # rope_epilogue.wgsl
            d.update(declare_rope_outputs(b, dev, rope.q, rope.n_kv, rope.head_dim, rope.cap, rope.kv_f16),
                     RH=rope.n_heads, RKVH=rope.n_kv, RDH=rope.head_dim, RGROUP=rope.n_heads // rope.n_kv,
                     RCAP=rope.cap, ROPE_HALF=rope.rope_half, ROPE_TREE=rope.tree,
                     TREE_DECL=declare_tree(b, rope.q.w // (rope.n_heads // rope.n_kv)) if rope.tree else "")
        fused = ep.lora is not None and ep.lora.fused
        if fused and (not blk or variant.cols != 1):
            raise ValueError(f"the fused LoRA shrink is read by the integer-dot GEMV of one token row; {w.name} is "
                             f"{v} with {variant.cols} columns")
        if ep.lpart is not None and (qout is None or variant.cols != 1):
            raise ValueError("the LoRA shares come with a quantizing epilogue of one token row")
        d.update(ep.lora.declare(b, w.o, w.i, wg) if ep.lora is not None else {"LU_DECL": "", "LB_DECL": "", "LORA": False})
        qlast = qout is not None and variant.qlast   # (qout: a decode GEMV)
        if qout is not None:
            d.update(QOUT_DECL=declare_rows(b, "qout", qout.row),
                     QNW_DECL=(b.array("qnw", "array<f32>", f"({w.o}) the next GEMV's norm weight")
                               if qout.norm_offset is not None else ""),
                     QLAST_DECL=(b.array("qy", "array<atomic<u32>>", f"({y.w}, {w.o}) f32 bits: the outputs, for "
                                         "each 32-block's last workgroup", writable=True)
                                 + b.array("qcnt", "array<atomic<u32>>", f"({y.w}, {w.o // 32}) workgroups done per "
                                           "32-block (zero between dispatches: the last resets it)", writable=True)
                                 if qlast else ""))
            if ep.lpart is not None:
                d.update(ep.lpart.declare(b))
        nt = "1u" if x_last_row else "step.n_tokens"
        ncol = variant.cols if gemm is None else 1
        mr = _mrows_code(variant.mrows if gemm is None else 1, w2 is not None, ncol, nt, rope is not None,
                         gemm is None and variant.ksplit, variant.unroll if gemm is None else 1,
                         norm=pre_norm is not None and not i8)
        d.update(mr)
        d.update(DUAL=w2 is not None, PAIR=w2 is not None or rope is not None, ROPE=rope is not None,
                 UNROLL4=gemm is None and variant.unroll == 4, BIAS=ep.bias, RESIDUAL=ep.residual, GELU=ep.act == "gelu_tanh",
                 SOFTCAP=ep.softcap is not None, CAP=wgsl_float(ep.softcap or 1.0),
                 ROWS=rows, WG=wg, RED=_red_floats(v, rows, wg, dev, mr.get("KS_SLOTS", 0)),
                 NCOL=ncol, COLS=ncol > 1, NT=nt, XROW="step.last_row" if x_last_row else "t",
                 PRE_NORM=pre_norm is not None and not i8)
        if pre_norm is not None and not i8:
            d.update(EPS=wgsl_float(pre_norm.eps), W_OFFSET=wgsl_float(pre_norm.w_offset), NW_ALIGNED=nw_vec4)
        if blk:   # pre_norm: QuantizeKernel applied the norm weight; 1/rms is applied here
            d.update(linear_blk.defines(w.fmt, w.i, rows, wg, w2 is not None, dev.has_subgroups,
                                        x_partials=pre_norm.x_partials if pre_norm else None,
                                        qout=qout is not None and not qlast, rps=variant.rps, rope=rope is not None,
                                        cols=variant.cols, qlast=qlast, lora=fused, unroll=variant.unroll),
                     XNORM=pre_norm is not None, XC=w.i, XEPS=wgsl_float(pre_norm.eps) if pre_norm else "0.0",
                     QOUT=qout is not None and not qlast, QLAST=qlast, QWRITE=qout is not None)
            if qout is not None:
                d.update(block_defines(qout.fmt, w.o, wg), QNORM=qout.norm_offset is not None,
                         QW_OFFSET=wgsl_float(qout.norm_offset or 0.0), QSKIP_Y=not qout.write_y)
        if gemm is not None and gemm.int8:   # as blk: the quantizer applied the norm weight, 1/rms here
            row = linear_blk.defines(w.fmt, w.i, 1, 64, False, False,
                                     x_partials=pre_norm.x_partials if pre_norm else None)
            d.update({k: row[k] for k in ("NB", "STRIDE4", "D4", "S4", "P0", "NP")})   # the int8 row's layout
            d.update(int8_defines(gemm, w.fmt, w2 is not None, pre_norm is not None), XNORM=pre_norm is not None, XC=w.i, XEPS=wgsl_float(pre_norm.eps) if pre_norm else "0.0")
        elif gemm is not None and gemm.mma:
            direct_y = (w2 is None and not ep.bias and ep.softcap is None and ep.lora is None and y.layout == "linear"
                        and not y.c_total and y.h == 1 and y.b == 1)
            d.update(mma_defines(gemm, w2 is not None, direct_y, ep.residual), DIRECT_Y=direct_y,
                     K_TAIL=-(-w.i // 4) % gemm.kstep != 0,
                     WH_DECL=b.array("wh", "array<f16>", f"({w.o}, {w.i}) f16: w's buffer") if gemm.direct else "",
                     WH2_DECL=(b.array("wh2", "array<f16>", f"({w.o}, {w.i}) f16: w2's buffer")
                               if gemm.direct and w2 is not None else ""))
        elif gemm is not None:
            d.update(float_defines(gemm, w2 is not None))
        super().__init__(dev, d, b, f"{self.template}_{w.fmt}{'_dual' if w2 else ''}"
                                    f"{f'_x{variant.cols}' if gemm is None and variant.cols > 1 else ''}")

    def bind(self, dev: Device, buffers: dict):
        """As Kernel.bind; the matrix-unit GEMM's direct loads also bind w's (w2's) buffer as wh (wh2)."""
        if self.gemm is not None and self.gemm.direct:
            def first(b):
                return b[0] if isinstance(b, list) else b
            buffers = {**buffers, "wh": first(buffers["w"])} | ({"wh2": first(buffers["w2"])} if "w2" in buffers else {})
        return super().bind(dev, buffers)

    @property
    def rows(self) -> int:
        return self.variant.rows

    def workgroups(self, t: int):
        if self.stage == "decode":
            per_wg = self.variant.wg if self.variant.variant == "row" else self.variant.rows
            return (ceil_div(self.w.o, per_wg), ceil_div(t, self.variant.cols), 1)
        return (ceil_div(self.w.o, self.gemm.bn), ceil_div(t, self.gemm.bm), 1)
