"""Kernel classes for the transformer's operators; each specialises its template in wgsl/.

  EmbeddingKernel    wgsl/embedding.wgsl         gather rows of a (vocab, dim) weight (or of one row shard)
  RMSNormKernel      wgsl/rms_norm.wgsl          RMSNorm (+ fused residual add / accumulate)
  LinearKernel       wgsl/matvec.wgsl (decode) or wgsl/matmul.wgsl (prefill): stage-aware
  RopeQKVKernel      wgsl/rope_qkv.wgsl          RoPE + Q relayout + in-place KV append
  AttentionKernel    wgsl/attention.wgsl + attention_combine.wgsl (split over the cache)
  SampleKernel       wgsl/sample.wgsl            greedy / temperature / top-k / top-p
Binding 0 of every kernel is the Step uniform (kernels/step.py). Activation tensors are bound
read_write (they share one arena buffer, and WebGPU forbids read-only and writable views of one
buffer in the same dispatch).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..gpu.base import READ, RW, UNI, Device
from ..tensor import TensorDesc, accessor_wgsl
from . import gemv_blk
from .base import Kernel, ceil_div
from .step import STEP_DECL
from .weights import GPUWeight, wide_accessor_wgsl, wide_supported


def _f(x: float) -> str:
    r = repr(float(x))
    return r if ("e" in r or "." in r) else r + ".0"


class EmbeddingKernel(Kernel):
    template = "embedding"

    def __init__(self, dev: Device, w: GPUWeight, out: TensorDesc, scale: float = 1.0, nt: str = "step.n_tokens",
                 shard: bool = False):
        """shard: w is a row shard of the table (rows w.row0 .. w.row0 + w.o): write only the
        tokens whose ids fall in it (one dispatch per shard covers the whole table)."""
        self.out = out
        d = {"STEP_DECL": STEP_DECL, "W_DECL": w.wgsl("w", 2, native_f16=dev.has_f16),
             "OUT_DECL": accessor_wgsl(out, 2 + w.n_bindings, "out"), "SCALE": _f(scale), "NT": nt,
             "SHARD": shard, "ROW0": w.row0, "NROWS": w.o}
        super().__init__(dev, d, (UNI, RW) + (READ,) * w.n_bindings + (RW,), "embedding")

    def workgroups(self, t: int):
        return (ceil_div(self.out.s, 64), t, 1)


class RMSNormKernel(Kernel):
    template = "rms_norm"

    def __init__(self, dev: Device, x: TensorDesc, out: TensorDesc, eps: float, w_offset: float = 0.0,
                 add_input: TensorDesc | None = None, accumulate: bool = False, last_row: bool = False):
        d = {"STEP_DECL": STEP_DECL, "X_DECL": accessor_wgsl(x, 1, "x"),
             "OUT_DECL": accessor_wgsl(out, 2, "out"),
             "W_BINDING": 3, "EPS": _f(eps), "W_OFFSET": _f(w_offset), "ADD_INPUT": add_input is not None,
             "ACCUMULATE": accumulate, "LAST_ROW": last_row, "NT": "1u" if last_row else "step.n_tokens"}
        binds = (UNI, RW, RW, READ)
        if add_input is not None:
            r = add_input
            d["R_DECL"] = accessor_wgsl(r, 4, "r")
            binds += (RW,)
        super().__init__(dev, d, binds, "rms_norm")

    def workgroups(self, t: int):
        return (t, 1, 1)


def _weight_decl(n: str, binding: int, w: GPUWeight, variant: str, dev: Device) -> str:
    if variant == "wide":
        return wide_accessor_wgsl(n, binding, w.fmt, w.o, w.i)
    if variant == "blk":
        return gemv_blk.weight_decl(n, binding, w.fmt, w.o, w.i)
    return w.wgsl(n, binding, native_f16=dev.has_f16)


class LinearKernel(Kernel):
    """y = x W^T, stage-aware: `stage="decode"` -> matvec.wgsl, `"prefill"` -> matmul.wgsl."""

    def __init__(self, dev: Device, stage: str, x: TensorDesc, y: TensorDesc, w: GPUWeight,
                 w2: GPUWeight | None = None, bias: bool = False, residual: bool = False,
                 act: str = "silu", softcap: float | None = None, x_last_row: bool = False,
                 rows: int = 4, wg: int = 64, variant: str = "split", pre_norm: tuple | None = None,
                 unroll: int = 1, x_partials: int | None = None, qout: tuple | None = None, rps: int = 4,
                 rope: dict | None = None):
        """pre_norm=(eps, w_offset): RMSNorm of x fused in; its weight is the last binding (blk:
        x came from QuantizeKernel with the norm weight applied; 1/rms is applied here from the
        x_partials partial sums of x^2 in the row).
        qout=(xq desc, consumer fmt, norm w_offset or None, write_y) (blk, subgroups): also write
        the outputs as the next GEMV's int8 input row; bindings after the others: the xq buffer,
        then that GEMV's norm weight. Forces rows = 32.
        rope=dict(q=q_rel desc, n_heads, n_kv, head_dim, cap, rope_half) (blk, the QKV projection):
        RoPE + Q relayout + KV append in the epilogue instead of writing y; bindings after the
        others: q_rel, K cache, V cache, inv_freq."""
        self.template = "matvec" if stage == "decode" else "matmul"
        blk = stage == "decode" and variant == "blk"
        if blk:
            self.template = "matvec_blk"
            for v in (w, w2):
                if v is not None and not gemv_blk.supported(v.fmt, v.i):
                    raise UnsupportedModelError(f"the integer-dot GEMV reads q8 and q4 weights; {v.name} is {v.fmt}")
            if not dev.has_dp4a:
                raise UnsupportedModelError("the integer-dot GEMV needs WGSL's packed_4x8_integer_dot_product")
            if x.c != gemv_blk.row_words(w.i) or (w2 is not None and w2.fmt != w.fmt):
                raise ValueError("the integer-dot GEMV reads rows made by QuantizeKernel")
            if qout is not None:
                rows = 32
                if not dev.has_subgroups or w.o % 32 or qout[0].c != gemv_blk.row_words(w.o):
                    raise ValueError(f"a quantizing epilogue needs subgroups, outputs a multiple of 32 and a "
                                     f"{gemv_blk.row_words(w.o)}-word row tensor; {w.name} has {w.o} outputs")
        if rope is not None and (rows % 2 or qout is not None or w2 is not None or rope["head_dim"] % 2
                                 or stage != "decode" or variant not in ("blk", "subgroup", "wide")
                                 or w.o != (rope["n_heads"] + 2 * rope["n_kv"]) * rope["head_dim"]):
            raise ValueError(f"RoPE in the GEMV epilogue needs the blk, subgroup or wide decode GEMV, an even row "
                             f"count and the QKV weight; {w.name} ({variant}, {rows} rows)")
        if variant == "wide" and not all(wide_supported(v.fmt, v.i, v.layout) for v in (w, w2) if v is not None):
            raise UnsupportedModelError(f"the wide GEMV reads q4, q8 and row-major f16 with inputs a multiple "
                                        f"of 8; {w.name} is {w.fmt} ({w.o} x {w.i})")
        self.stage, self.w, self.rows, self.variant, self.wg = stage, w, rows, variant, wg
        b = 3
        d = {"STEP_DECL": STEP_DECL,
             "X_DECL": accessor_wgsl(x, 1, "x"),
             "Y_DECL": accessor_wgsl(y, 2, "y"),
             "W_DECL": _weight_decl("w", b, w, variant, dev),
             "DUAL": w2 is not None, "PAIR": w2 is not None or rope is not None, "ROPE": rope is not None,
             "WIDE": variant == "wide", "UNROLL4": unroll == 4,
             "SG_VARIANT": variant in ("subgroup", "wide"),
             "SUBGROUP_ENABLE": dev.wgsl_subgroup_enable and variant in ("subgroup", "wide"),
             "BIAS": bias, "RESIDUAL": residual,
             "GELU": act == "gelu_tanh", "SOFTCAP": softcap is not None, "CAP": _f(softcap or 1.0),
             "ROWS": rows, "WG": wg, "RED": max(2 * rows * wg, wg), "ROW_PER_THREAD": variant == "row", "SUBGROUP": variant == "subgroup",
             "NT": "1u" if x_last_row else "step.n_tokens", "XROW": "step.last_row" if x_last_row else "t"}
        binds = (UNI, RW, RW) + (READ,) * w.n_bindings
        b += w.n_bindings
        if w2 is not None:
            d["W2_DECL"] = _weight_decl("w2", b, w2, variant, dev)
            binds += (READ,) * w2.n_bindings
            b += w2.n_bindings
        if bias:
            d["BIAS_BINDING"] = b
            binds += (READ,)
            b += 1
        d["PRE_NORM"] = pre_norm is not None and not blk
        if pre_norm is not None and not blk:
            d.update(NW_BINDING=b, EPS=_f(pre_norm[0]), W_OFFSET=_f(pre_norm[1]))
            binds += (READ,)
        if blk:   # pre_norm: QuantizeKernel applied the norm weight; 1/rms is applied here
            d.update(gemv_blk.defines(w.fmt, w.i, rows, wg, w2 is not None, dev.has_subgroups, dev.wgsl_subgroup_enable,
                                      x_partials=x_partials, qout=qout is not None, rps=rps, rope=rope is not None),
                     XNORM=pre_norm is not None, XC=w.i, XEPS=_f(pre_norm[0]) if pre_norm else "0.0", PRE_NORM=False,
                     QOUT=qout is not None)
        if rope is not None:   # rope_epilogue.wgsl's bindings follow the others
            d.update(Q_DECL=accessor_wgsl(rope["q"], len(binds), "q"), ROPE_BINDING=len(binds) + 1,
                     ROPE_BINDING1=len(binds) + 2, ROPE_BINDING2=len(binds) + 3,
                     RH=rope["n_heads"], RKVH=rope["n_kv"], RDH=rope["head_dim"],
                     RGROUP=rope["n_heads"] // rope["n_kv"], RCAP=rope["cap"], ROPE_HALF=rope["rope_half"])
            binds += (RW, RW, RW, READ)
        if blk and qout is not None:
            _, qfmt, qnorm, write_y = qout
            d.update(gemv_blk.qout_defines(qfmt, w.o, wg), QOUT_BINDING=len(binds), QNORM=qnorm is not None,
                     QW_OFFSET=_f(qnorm or 0.0), QSKIP_Y=not write_y)
            binds += (RW,)
            if qnorm is not None:
                d["QNW_BINDING"] = len(binds)
                binds += (READ,)
        if x_last_row and stage != "decode":
            raise ValueError("x_last_row is a decode-kernel option")
        super().__init__(dev, d, binds, f"{self.template}_{w.fmt}{'_dual' if w2 else ''}")

    def workgroups(self, t: int):
        if self.stage == "decode":
            per_wg = self.wg if self.variant == "row" else self.rows
            return (ceil_div(self.w.o, per_wg), t, 1)
        return (ceil_div(self.w.o, 64), ceil_div(t, 64), 1)


class QuantizeKernel(Kernel):
    """Activation rows (optionally RMS-normalised) -> int8 blocks for the integer-dot GEMV
    (wgsl/quantize.wgsl); `fmt` is the consuming weight's format (it fixes the int8 order)."""
    template = "quantize"

    def __init__(self, dev: Device, x: TensorDesc, xq: TensorDesc, fmt: str, pre_norm: tuple | None = None,
                 last_row: bool = False):
        if x.c % 32 or xq.c != gemv_blk.row_words(x.c) or fmt not in gemv_blk.FORMATS:
            raise ValueError(f"cannot quantize {x.name} ({x.c} channels) into {xq.name} ({xq.c} words) for {fmt}")
        d = {"STEP_DECL": STEP_DECL, "X_DECL": accessor_wgsl(x, 1, "x"), "PRE_NORM": pre_norm is not None,
             "LAST_ROW": last_row, "NT": "1u" if last_row else "step.n_tokens", **gemv_blk.qout_defines(fmt, x.c, gemv_blk.QWG)}
        binds = (UNI, RW, RW)
        self.n_groups = gemv_blk.n_partials(x.c)
        if pre_norm is not None:   # (eps, w_offset): the norm weight here, 1/rms in the GEMV
            d.update(W_OFFSET=_f(pre_norm[1]))
            binds += (READ,)
        super().__init__(dev, d, binds, f"quantize_{fmt}")

    def workgroups(self, t: int):
        return (self.n_groups, t, 1)


class RopeQKVKernel(Kernel):
    template = "rope_qkv"

    def __init__(self, dev: Device, qkv: TensorDesc, q_rel: TensorDesc, n_heads: int, n_kv: int, head_dim: int,
                 cap: int, rope_half: bool, qk_norm: bool = False, eps: float = 1e-6, w_offset: float = 0.0):
        self.n_slots = n_heads + 2 * n_kv
        d = {"STEP_DECL": STEP_DECL,
             "QKV_DECL": accessor_wgsl(qkv, 1, "qkv"),
             "Q_DECL": accessor_wgsl(q_rel, 2, "q"),
             "H": n_heads, "KVH": n_kv, "DH": head_dim, "HALF": head_dim // 2, "GROUP": n_heads // n_kv,
             "CAP": cap, "ROPE_HALF": rope_half, "QK_NORM": qk_norm, "EPS": _f(eps), "W_OFFSET": _f(w_offset)}
        binds = (UNI, RW, RW, RW, RW, READ) + ((READ, READ) if qk_norm else ())
        super().__init__(dev, d, binds, "rope_qkv")

    def workgroups(self, t: int):
        return (self.n_slots, t, 1)


class AttentionKernel(Kernel):
    template = "attention"
    MAX_CHUNK = 256

    @classmethod
    def chunk_for(cls, head_dim: int) -> int:
        """Keys per workgroup: the power of two >= head_dim, at least 64. Short chunks give decode
        many workgroups (the cache is split over them like flash-decoding; 256-key chunks left
        1B's decode attention at 34 us on an H100 with 64 workgroups)."""
        return min(cls.MAX_CHUNK, max(64, 1 << (head_dim - 1).bit_length()))

    MAX_GQA = 8   # query heads per KV head the grouped variant unrolls

    def __init__(self, dev: Device, q_rel: TensorDesc, n_heads: int, n_kv: int, head_dim: int, cap: int,
                 rows_cap: int, scale: float, window: int = 0, softcap: float | None = None,
                 grouped: bool = False):
        """grouped (attention_gqa.wgsl): one workgroup per (chunk, token, KV head) serves all the
        query heads of that KV head (K and V read once for them); else one per query head."""
        if head_dim % 4 or head_dim > self.MAX_CHUNK:
            raise UnsupportedModelError(f"attention needs head_dim to be a multiple of 4 and <= {self.MAX_CHUNK}, "
                                        f"got {head_dim}")
        self.CHUNK = self.chunk_for(head_dim)
        self.nsplit = ceil_div(cap, self.CHUNK)
        self.group, self.n_kv = n_heads // n_kv, n_kv
        nj = self.CHUNK // head_dim
        if cap % 4 or ceil_div(self.CHUNK, nj) % 4:
            raise ValueError(f"attention reads V four keys at a time: cache rows {cap} must be a multiple of 4")
        d = {"STEP_DECL": STEP_DECL, "CHUNK4": self.CHUNK // 4,
             "Q_DECL": accessor_wgsl(q_rel, 1, "q"),
             "DH": head_dim, "DH4": head_dim // 4, "NJ": nj, "JL": ceil_div(self.CHUNK, nj),
             "GROUP": self.group, "CAP": cap, "CHUNK": self.CHUNK, "NSPLIT": self.nsplit,
             "ROWS_CAP": rows_cap, "SCALE": _f(scale), "WINDOW": window or 0,
             "SOFTCAP": softcap is not None, "CAP_ATTN": _f(softcap or 1.0)}
        self.grouped = grouped
        if grouped:
            if self.group > self.MAX_GQA:
                raise UnsupportedModelError(f"grouped attention unrolls at most {self.MAX_GQA} query heads per KV "
                                            f"head, got {self.group}")
            self.template = "attention_gqa"
            d.update(self._gqa_code(self.group, head_dim))
        super().__init__(dev, d, (UNI, RW, RW, RW, RW), "attention_gqa" if grouped else "attention")

    def _gqa_code(self, group: int, head_dim: int) -> dict:
        """attention_gqa.wgsl's per-head statements, unrolled over the group's heads."""
        hs = range(group)
        j = "\n".join
        return {"QS": group * head_dim // 4, "SC": group * self.CHUNK // 4,
                "RED": group * self.CHUNK, "ML": 2 * group,
                "S_DECL": j(f"  var s{h} = -3.0e38;" for h in hs),
                "A_DECL": j(f"    var a{h} = 0.0;" for h in hs),
                "A_ACC": j(f"      a{h} += dot(qs[{h}u * DH4 + d], kv);" for h in hs),
                "S_SET": j(f"    s{h} = score(a{h});" for h in hs),
                "RED_S": j(f"  red[{h}u * CHUNK + lid] = s{h};" for h in hs),
                "E_SET": j(f"  let e{h} = select(0.0, exp(s{h} - ml[{h}u]), vis);\n"
                           f"  sc[({h}u * CHUNK + lid) / 4u][lid % 4u] = e{h};\n"
                           f"  red[{h}u * CHUNK + lid] = e{h};" for h in hs),
                "O_DECL": j(f"  var o{h} = 0.0;" for h in hs),
                "O_ACC": j(f"      o{h} += dot(sc[{h}u * CHUNK4 + j], v);" for h in hs),
                "RED_O": "  workgroupBarrier();\n" + j(f"  red[{h}u * CHUNK + lid] = o{h};" for h in hs)}

    def workgroups(self, t: int):
        if self.grouped:
            return (self.nsplit, t, self.n_kv)
        return (self.nsplit, t * self.group, self.n_kv)


class AttentionCombineKernel(Kernel):
    template = "attention_combine"

    def __init__(self, dev: Device, out: TensorDesc, n_heads: int, n_kv: int, head_dim: int, nsplit: int,
                 rows_cap: int, quant: str | None = None):
        """quant ("q8" / "q4"): out is a QuantizeKernel row tensor for n_heads * head_dim channels
        and the heads are written as int8 blocks for that weight format."""
        self.group, self.n_kv = n_heads // n_kv, n_kv
        d = {"STEP_DECL": STEP_DECL, "DH": head_dim, "GROUP": self.group, "NSPLIT": nsplit, "ROWS_CAP": rows_cap,
             "WG": min(256, max(32, head_dim)), "QUANT": quant is not None}
        if quant is None:
            d["OUT_DECL"] = accessor_wgsl(out, 2, "out")
        else:
            if not self.quant_supported(head_dim) or out.c != gemv_blk.row_words(n_heads * head_dim):
                raise ValueError(f"the combine writes int8 blocks for head_dim a multiple of 32 up to 256 into "
                                 f"QuantizeKernel rows; got head_dim {head_dim}, {out.name} of {out.c} words")
            d.update(gemv_blk.qout_defines(quant, n_heads * head_dim, min(256, max(32, head_dim))))
        super().__init__(dev, d, (UNI, RW, RW), "attention_combine")

    @staticmethod
    def quant_supported(head_dim: int) -> bool:
        return head_dim % 32 == 0 and head_dim <= 256

    def workgroups(self, t: int):
        return (t * self.group, self.n_kv, 1)


class SampleKernel(Kernel):
    template = "sample"

    def __init__(self, dev: Device, logits: TensorDesc, vocab: int, row: str = "step.last_row", partials: int = 0):
        """partials: the number of ArgmaxKernel spans greedy sampling reduces (binding 4); 0: scan."""
        d = {"STEP_DECL": STEP_DECL,
             "L_DECL": accessor_wgsl(logits, 1, "l"),
             "V": vocab, "CH": ceil_div(vocab, 256), "LROW": row, "NPART": partials}
        super().__init__(dev, d, (UNI, RW, RW, RW) + ((RW,) if partials else ()), "sample")

    def workgroups(self, t: int = 1):
        return (1, 1, 1)


class ArgmaxKernel(Kernel):
    """Greedy sampling's first phase (wgsl/argmax.wgsl): the maximum of each SPAN of logits."""
    template = "argmax"

    def __init__(self, dev: Device, logits: TensorDesc, vocab: int, row: str = "step.last_row", span: int = 4096):
        self.n_parts = ceil_div(vocab, span)
        d = {"STEP_DECL": STEP_DECL, "L_DECL": accessor_wgsl(logits, 1, "l"), "V": vocab, "SPAN": span, "LROW": row}
        super().__init__(dev, d, (UNI, RW, RW), "argmax")

    def workgroups(self, t: int = 1):
        return (self.n_parts, 1, 1)
