"""The prefill GEMMs (LinearKernel, stage "prefill"): their typed configuration (GemmVariant)
and the code generation of their templates' unrolled parts.

  float  wgsl/linear_gemm.wgsl      x (f32 activations) times any weight format, dequantized
                                    through w_read4 into workgroup memory (f32, or f16 tiles)
  int8   wgsl/linear_gemm_i8.wgsl   int8 activation rows (kernels/quantize.py) times q8 / q4 weight
                                    blocks with dot4I8Packed, the scales applied per 32-block

Both: a workgroup computes a BM-token x BN-output tile, invocation (ty, tx) a TM x TN register
block of tokens ty + i * NTY and outputs tx + j * NTX (NTY = BM / TM, NTX = BN / TN: strided, so
a subgroup's reads of workgroup memory are consecutive vec4s and its stores of y consecutive
outputs). K advances KSTEP units per step (float: 4-input slices; int8: 32-blocks); with
`double` the next step's tiles are fetched into registers before the current step's products and
stored into the other buffer after them (one barrier per step). This module writes the register
block (named accumulators: arrays indexed in loops can end up in local memory) and the
fetch / store slots; the templates hold the structure.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tensor.weight_layout import NAMED_ORDERS
from . import linear_blk
from .weights import format_names, split_parts, wgsl_by_range

WG_LIMIT_DEFAULT = 256          # WebGPU's guaranteed invocations per workgroup
WGMEM_LIMIT_DEFAULT = 16384     # and bytes of workgroup memory
MMA_SUBGROUP = 32               # the matrix-unit GEMM's subgroup size (Device.has_mma_f16 checks it)


@dataclass(frozen=True)
class GemmVariant:
    """A prefill GEMM configuration (kernels/autotune.py's choice or the static rule).
    int8: the integer-dot GEMM (int8 rows from QuantizeKernel x q8 / q4 weights)."""
    int8: bool = False
    bm: int = 64              # tokens per workgroup tile
    bn: int = 64              # outputs per workgroup tile
    tm: int = 4               # tokens per invocation
    tn: int = 4               # outputs per invocation
    kstep: int = 4            # per K step: float: 4-input slices; int8: 32-blocks
    double: bool = False      # double-buffered tiles, one barrier per K step
    f16_tiles: bool = False   # float: weight tiles as f16 in workgroup memory (needs shader-f16)
    mma: bool = False         # matrix units (linear_gemm_mma.wgsl): subgroups of tm x tn 16 x 16 results
    direct: bool = False      # mma: W's fragments loaded from its buffer (f16 row-major weights), no W tile
    sgm: int = 1              # mma: subgroups along the tile's tokens (bm = 16 tm sgm)
    sgn: int = 1              # and along its outputs (bn = 16 tn sgn)

    @property
    def wg(self) -> int:
        """Invocations per workgroup (mma: sgm x sgn subgroups)."""
        if self.mma:
            return MMA_SUBGROUP * self.sgm * self.sgn
        return (self.bm // self.tm) * (self.bn // self.tn)

    def check(self) -> None:
        if min(self.bm, self.bn, self.tm, self.tn, self.kstep) < 1 or self.bm % self.tm or self.bn % self.tn:
            raise ValueError(f"a GEMM tile of {self.bm} x {self.bn} needs register blocks that divide it, "
                             f"not {self.tm} x {self.tn}")
        if self.int8 and self.f16_tiles:
            raise ValueError("f16 tiles are a float-GEMM option")
        if self.direct and not self.mma:
            raise ValueError("direct weight loads are a matrix-unit GEMM option")
        if min(self.sgm, self.sgn) < 1 or (not self.mma and (self.sgm, self.sgn) != (1, 1)):
            raise ValueError(f"subgroups per tile (sgm x sgn) are a matrix-unit GEMM option, at least 1; not {self}")
        if self.mma and (self.int8 or self.f16_tiles or self.double or self.bm != 16 * self.tm * self.sgm
                         or self.bn != 16 * self.tn * self.sgn):
            raise ValueError(f"a matrix-unit GEMM tile is float, fetched ahead through registers (not double), "
                             f"sgm x sgn subgroups of tm x tn results of 16 x 16; not {self}")

    def check_weight(self, fmt: str) -> None:
        if self.f16_tiles and fmt != "f16":   # f16 tiles hold f16 weights exactly, nothing else
            raise ValueError(f"f16 GEMM tiles are for f16 weights, not {fmt}")

    def takes_weights(self, w, w2=None) -> bool:
        """Whether the tile reads weight w (and w2): with `direct`, only f16 row-major (OI) ones
        with rows a whole number of K steps."""
        return not self.direct or all(u.fmt == "f16" and (u.layout is None or u.layout.order == NAMED_ORDERS["OI"])
                                      and u.i % (4 * self.kstep) == 0 for u in (w, w2) if u is not None)

    def workgroup_bytes(self, dual: bool, pre_norm: bool = True) -> int:
        """Bytes of workgroup memory the kernel declares (pre_norm: with the int8 GEMM's 1/rms of
        its rows; the float GEMMs read a normed input)."""
        nbuf = 2 if self.double else 1
        nw = 2 if dual else 1
        if self.mma:   # f16 tiles of 4 kstep (+8 padding) inputs a row (W's unless direct), a subgroup's
            # f32 16 x 16 result (each of w, w2)
            per = 2 * (4 * self.kstep + 8) * (self.bm + (0 if self.direct else nw * self.bn))
            return per + 4 * nw * 256 * self.sgm * self.sgn
        if self.int8:   # per 32-block: 2 vec4<u32> + a vec2<f32> of scales, for x rows and weight rows
            per = self.bm * self.kstep * 40 + nw * self.bn * self.kstep * 40
            return nbuf * per + (4 * self.bm if pre_norm else 0)
        per = self.bm * self.kstep * 16 + nw * self.bn * self.kstep * (8 if self.f16_tiles else 16)
        return nbuf * per

    def fits(self, dev, dual: bool, pre_norm: bool = True) -> bool:
        """Whether the adapter runs this configuration (invocations, workgroup memory, f16); the
        choice counts the int8 GEMM's 1/rms scratch always, so it holds with or without a norm."""
        lim = dev.info.limits
        return (self.wg <= int(lim.get("max-compute-invocations-per-workgroup", WG_LIMIT_DEFAULT))
                and self.workgroup_bytes(dual, pre_norm) <= int(lim.get("max-compute-workgroup-storage-size",
                                                                        WGMEM_LIMIT_DEFAULT))
                and (not self.f16_tiles or dev.has_f16) and (not self.mma or dev.has_mma_f16))


def _slots(n_items: int, wg: int) -> int:
    return -(-n_items // wg)


def _bases(names: tuple, sizes: tuple) -> dict:
    """linear_gemm_loop.wgsl's tile offsets: `let NAME = cur * SIZE;` (double-buffered) or 0u."""
    return {"DB_BASES": "\n".join(f"    let {n} = cur * {z};" for n, z in zip(names, sizes)),
            "SB_BASES": "\n".join(f"    let {n} = 0u;" for n in names)}


def _store(tm: int, tn: int, dual: bool, inv: str) -> str:
    """The epilogue of the register block: every valid (token, output) through linear_common's
    epilogue(); inv(i): the row's 1/rms expression (or "")."""
    L = []
    for i in range(tm):
        L.append(f"  let tr{i} = t0 + ty + {i}u * NTY;")
        L.append(f"  if (tr{i} < T) {{")
        s = inv(i)
        for j in range(tn):
            g = f"{s}c{i}_{j}"
            u = f"{s}d{i}_{j}" if dual else g
            L.append(f"    if (o0 + tx + {j}u * NTX < w_O) {{ epilogue(tr{i}, o0 + tx + {j}u * NTX, {g}, {u}); }}")
        L.append("  }")
    return "\n".join(L)


def _acc_decl(tm: int, tn: int, dual: bool) -> str:
    names = [f"c{i}_{j}" for i in range(tm) for j in range(tn)]
    if dual:
        names += [f"d{i}_{j}" for i in range(tm) for j in range(tn)]
    return "\n".join(f"  var {n} = 0.0;" for n in names)


def _fetch_put(n_x: int, n_w: int, wg: int, k0: str, buf: str, tag: str) -> tuple[str, str]:
    """Fetch slots into registers (k0: the step's first K unit) and their stores into buffer buf."""
    f, p = [], []
    for k in range(_slots(n_x, wg)):
        f.append(f"    let {tag}x{k} = fetch_x(lid + {k * wg}u, t0, {k0}, T);")
        p.append(f"    put_x({buf}, lid + {k * wg}u, {tag}x{k});")
    for k in range(_slots(n_w, wg)):
        f.append(f"    let {tag}w{k} = fetch_w(lid + {k * wg}u, o0, {k0});")
        p.append(f"    put_w({buf}, lid + {k * wg}u, {tag}w{k});")
    return "\n".join(f), "\n".join(p)


def _common(v: GemmVariant, n_x: int, n_w: int) -> dict:
    fetch0, put0 = _fetch_put(n_x, n_w, v.wg, "0u", "0u", "p")
    fetch_next, put_next = _fetch_put(n_x, n_w, v.wg, "(k + 1u) * KS", "1u - cur", "n")
    fetch, put = _fetch_put(n_x, n_w, v.wg, "k * KS", "0u", "n")
    nbuf = 2 if v.double else 1
    return {"XS_N": nbuf * v.bm * v.kstep, "WS_N": nbuf * v.bn * v.kstep,
            "XSC_N": nbuf * v.bm * v.kstep, "WSC_N": nbuf * v.bn * v.kstep, "BM": v.bm, "BN": v.bn, "KS": v.kstep, "NTX": v.bn // v.tn, "NTY": v.bm // v.tm, "WG": v.wg,
            "NBUF": 2 if v.double else 1, "DB": v.double, "FETCH0": fetch0, "PUT0": put0,
            "FETCH_NEXT": fetch_next, "PUT_NEXT": put_next, "FETCH": fetch, "PUT": put}


def _madd4(acc: str, a: str, b: str) -> str:
    """acc += a . b for vec4<f32> a, b as a chain of four fused multiply-adds into acc: one
    instruction per multiply-add, where `acc += dot(a, b)` costs a multiply, three fused
    multiply-adds and an add for four (80% of the arithmetic peak at best)."""
    chain = acc
    for c in "xyzw":
        chain = f"fma({a}.{c}, {b}.{c}, {chain})"
    return f"      {acc} = {chain};"


def float_defines(v: GemmVariant, dual: bool) -> dict:
    """Defines of wgsl/linear_gemm.wgsl."""
    v.check()
    body = []
    for s in range(v.kstep):
        body.append("    {")
        body += [f"      let a{i} = xs[xb + {s}u * BM + ty + {i}u * NTY];" for i in range(v.tm)]
        for name, arr, acc in (("b", "ws", "c"), ("e", "ws2", "d")) if dual else (("b", "ws", "c"),):
            body += [f"      let {name}{j} = vec4<f32>({arr}[wb + {s}u * BN + tx + {j}u * NTX]);" for j in range(v.tn)]
            body += [_madd4(f"{acc}{i}_{j}", f"a{i}", f"{name}{j}") for i in range(v.tm) for j in range(v.tn)]
        body.append("    }")
    return {**_common(v, v.bm * v.kstep, v.bn * v.kstep), "ACC_DECL": _acc_decl(v.tm, v.tn, dual),
            "COMPUTE": "\n".join(body), "WT": "vec4<f16>" if v.f16_tiles else "vec4<f32>",
            **_bases(("xb", "wb"), ("KS * BM", "KS * BN")),
            "STORE": _store(v.tm, v.tn, dual, lambda i: "")}




def _i8_block_fn(n: str, fmt: str) -> str:
    """`fn {n}_block(o, b) -> Block`: 32-block b of row o of weight n (linear_gemm_i8.wgsl's Block:
    its 8 words in the quantizer's order for fmt, sc its pair): q4 / q4_0 / q4g128 / q4pc / e0m4
    the stored nibbles and their group's pair (linear_blk.q4_pair: (d, -8 d) for q4_0, (s / 16,
    s + b) for e0m4), q4k the nibbles after the super-block's header and (d sc,
    -dmin m) from it, q5k the 5-bit codes from Q5_K's qs and qh (helper's q5_block), q6k the codes
    q - 32 and d x the two halves' scales (q6_block), q8 / q8_0 / q8pc the int8 words and their
    group's scale."""
    head = f"fn {n}_block(o: u32, b: u32) -> Block {{\n  let k = o * NB + b;\n"
    if fmt == "q5k":   # the super-block's header at s; its qs vec4s holding block k's nibbles at q
        body = ("  let s = k / 8u * 11u;\n  let q = s + 3u + 2u * (k % 8u / 2u);\n"
                f"  return q5_block({n}_data[q], {n}_data[q + 1u], {n}_data[s + 1u], {n}_data[s + 2u], k % 8u, {n}_k4sm(k));\n")
    elif fmt == "q4k":
        body = f"  return q4_block({n}_data[k / 8u * 9u + 1u + k % 8u], {n}_k4sm(k));\n"
    elif fmt in linear_blk.Q4_FORMATS:
        body = f"  return q4_block({n}_data[k], {linear_blk.q4_pair(n, 'o', fmt)});\n"
    elif fmt == "q6k":
        body = f"  return q6_block({n}_data[3u * k], {n}_data[3u * k + 1u], {n}_data[3u * k + 2u], {n}_q6s(k));\n"
    elif fmt == linear_blk.Q6K_NAT:   # q6k in channel order (a row-split weight's: linear_blk.code_parts)
        h = [(f"p.h{j}.{a}", f"p.h{j}.{b}") for j in (0, 1) for a, b in ("xy", "zw")]
        words = [f"{n}_{fn}({e}, {o})" for e, o in h for fn in ("nlo", "nhi")]
        body = (f"  let p = q6_block({n}_data[3u * k], {n}_data[3u * k + 1u], {n}_data[3u * k + 2u], {n}_q6s(k));\n"
                f"  return Block(vec4<u32>({', '.join(words[:4])}),\n"
                f"               vec4<u32>({', '.join(words[4:])}), p.sc);\n")
    else:
        body = (f"  return Block({n}_data[2u * k], {n}_data[2u * k + 1u], "
                f"vec2<f32>({n}_scl({linear_blk.scale_group(fmt, 'o')}), 0.0));\n")
    return head + body + "}\n"


def _i8_helpers(fmts_names: list[tuple[str, str]]) -> str:
    """q5_block / q6_block, once per kernel, through the pure code-word function of the first
    weight of that format (`{n}_q5`, `{n}_q6`: the same text for every weight)."""
    out = []
    q5 = next((n for f, n in fmts_names if f == "q5k"), None)
    q6 = next((n for f, n in fmts_names if f in ("q6k", linear_blk.Q6K_NAT)), None)
    if q5:   # Q5_K as stored: a 32-block's 8 words of 5-bit codes (natural order) from qs vec4s A, B and qh H, G
        f = f"{q5}_q5"
        out.append("fn q5_block(A: vec4<u32>, B: vec4<u32>, H: vec4<u32>, G: vec4<u32>, j: u32, sc: vec2<f32>) -> Block {\n"
                   f"  return Block(vec4<u32>({f}(A.x, H.x, j), {f}(A.y, H.y, j), {f}(A.z, H.z, j), {f}(A.w, H.w, j)),\n"
                   f"               vec4<u32>({f}(B.x, G.x, j), {f}(B.y, G.y, j), {f}(B.z, G.z, j), {f}(B.w, G.w, j)), sc);\n}}\n")
    if q6:   # a q6k block's 6 words (low nibbles A, B; high bit pairs H) -> int8 q - 32 in the q4 order
        f = f"{q6}_q6"
        out.append("fn q6_block(A: vec2<u32>, B: vec2<u32>, H: vec2<u32>, sc: vec2<f32>) -> Block {\n"
                   f"  return Block(vec4<u32>({f}(A.x, 0u, H.x, 0u), {f}(A.x, 4u, H.x, 2u), {f}(A.y, 0u, H.x, 4u), {f}(A.y, 4u, H.x, 6u)),\n"
                   f"               vec4<u32>({f}(B.x, 0u, H.y, 0u), {f}(B.x, 4u, H.y, 2u), {f}(B.y, 0u, H.y, 4u), {f}(B.y, 4u, H.y, 6u)), sc);\n}}\n")
    return "".join(out)


def i8_block_wgsl(fmt: str, dual: bool) -> str:
    """linear_gemm_i8.wgsl's W_BLOCKS: `w_block(o, b)` (and `w2_block`) -> WBlock. One format:
    WBlock is Block. A row-split weight (kernels/weights.py): WBlock's sc is (scale of inputs
    0..15, of 16..31, min), each row range's Block mapped to it (q6k: its two half scales; the
    others: their scale twice, and their min or 0), so one product loop serves every range; a q6k
    range of a weight in channel order (linear_blk.code_parts) has its words shuffled into it."""
    names = ("w", "w2") if dual else ("w",)
    parts = linear_blk.code_parts(fmt)
    if parts is None:
        fns = [_i8_block_fn(n, fmt) for n in names]
        return "alias WBlock = Block;\n" + _i8_helpers([(fmt, "w")]) + "".join(fns)
    out = ["struct WBlock { h0: vec4<u32>, h1: vec4<u32>, sc: vec4<f32> }\n",
           _i8_helpers([(f, f"w_p{k}") for k, (f, _) in enumerate(parts)])]

    def to_wblock(n: str, k: int, f: str, row0: int) -> list[str]:   # range k's Block as a WBlock
        sc = "vec4<f32>(p.sc, 0.0, 0.0)" if f in ("q6k", linear_blk.Q6K_NAT) else "vec4<f32>(p.sc.x, p.sc.x, p.sc.y, 0.0)"
        return [f"let p = {n}_p{k}_block(o - {row0}u, b);", f"return WBlock(p.h0, p.h1, {sc});"]
    for n in names:
        out += [_i8_block_fn(f"{n}_p{k}", f) for k, (f, _) in enumerate(parts)]
        body = wgsl_by_range(parts, "o", lambda k, f, row0, n=n: to_wblock(n, k, f, row0))
        out.append(f"fn {n}_block(o: u32, b: u32) -> WBlock {{\n" + "\n".join(body) + "\n}\n")
    return "".join(out)


def int8_defines(v: GemmVariant, fmt: str, dual: bool, xnorm: bool) -> dict:
    """Defines of wgsl/linear_gemm_i8.wgsl (fmt: "q8", "q8_0", "q4", "q4_0", "q4k", "q5k", "q6k" or a
    row-split weight of them; the scale products per block: q8 / q8_0 d_w d_x isum, q4, q4_0, q4k
    and q5k d_w d_x isum + m_w s_x, q6k d_x (s0 isum_lo + s1 isum_hi), a row-split weight d_x (s0
    isum_lo + s1 isum_hi) + m_w s_x)."""
    v.check()
    body = []
    split = split_parts(fmt) is not None
    q4 = any(f in linear_blk.MIN_TERM_FORMATS for f in format_names(fmt))
    q6 = fmt == "q6k" or split   # a row-split weight: two half sums and three scales (i8_block_wgsl)
    sums = ("_0", "_1") if q6 else ("",)   # integer sums per block: q6k one per 16-input half
    parts = (("b", "ws", "n", "wsc", "wd", "c"), ("e", "ws2", "m", "wsc2", "we", "d")) if dual else \
        (("b", "ws", "n", "wsc", "wd", "c"),)
    for kb in range(v.kstep):
        body.append(f"    {{   // block {kb} of the step")
        body += [f"    var {isum}{i}_{j}{hs} = 0;" for _, _, isum, *_ in parts for i in range(v.tm) for j in range(v.tn)
                 for hs in sums]
        for h in range(2):
            body.append("    {")
            body += [f"      let a{i} = xs[xb + {2 * kb + h}u * BM + ty + {i}u * NTY];" for i in range(v.tm)]
            for name, arr, isum, *_ in parts:
                body += [f"      let {name}{j} = {arr}[wb + {2 * kb + h}u * BN + tx + {j}u * NTX];" for j in range(v.tn)]
                for i in range(v.tm):
                    for j in range(v.tn):
                        terms = " + ".join(f"dot4I8Packed(a{i}.{c}, {name}{j}.{c})" for c in "xyzw")
                        body.append(f"      {isum}{i}_{j}{sums[h % len(sums)]} += {terms};")
            body.append("    }")
        body.append("    {")
        body += [f"      let xd{i} = xsc[xb2 + {kb}u * BM + ty + {i}u * NTY];" for i in range(v.tm)]
        for _, _, isum, sarr, sn, acc in parts:
            body += [f"      let {sn}{j} = {sarr}[wb2 + {kb}u * BN + tx + {j}u * NTX];" for j in range(v.tn)]
            for i in range(v.tm):
                for j in range(v.tn):
                    if q6:
                        body.append(f"      {acc}{i}_{j} += xd{i}.x * ({sn}{j}.x * f32({isum}{i}_{j}_0) "
                                    f"+ {sn}{j}.y * f32({isum}{i}_{j}_1))" + (f" + {sn}{j}.z * xd{i}.y;" if split else ";"))
                        continue
                    line = f"      {acc}{i}_{j} += f32({isum}{i}_{j}) * (xd{i}.x * {sn}{j}.x)"
                    body.append(line + (f" + {sn}{j}.y * xd{i}.y;" if q4 else ";"))
        body.append("    }")
        body.append("    }")
    nbuf = 2 if v.double else 1
    return {**_common(v, v.bm * v.kstep, v.bn * v.kstep), "ACC_DECL": _acc_decl(v.tm, v.tn, dual),
            "XS_N": 2 * nbuf * v.bm * v.kstep, "WS_N": 2 * nbuf * v.bn * v.kstep, "COMPUTE": "\n".join(body), "Q4": q4,
            "W_BLOCKS": i8_block_wgsl(fmt, dual), "WSC_T": "vec4<f32>" if split else "vec2<f32>",
            **_bases(("xb", "wb", "xb2", "wb2"), ("2u * KS * BM", "2u * KS * BN", "KS * BM", "KS * BN")),
            "STORE": _store(v.tm, v.tn, dual, (lambda i: f"xinv[ty + {i}u * NTY] * ") if xnorm else (lambda i: ""))}


def mma_defines(v: GemmVariant, dual: bool, direct_y: bool = False, residual: bool = False) -> dict:
    """Defines of wgsl/linear_gemm_mma.wgsl: each of the workgroup's sgm x sgn subgroups computes
    v.tm x v.tn 16 x 16 results (accumulators acc{i}_{j}, and acd{i}_{j} for w2), each 16-input
    slice of the step a left load per row block, a right load per column block and a
    multiply-accumulate per pair; the next step's slices are fetched into registers fx{n} / fw{n} /
    fv{n} (invocation lid's n-th: slice lid + n WG) while this step's are multiplied.

    Written for WebGPU's bounds checks (Dawn's robustness transform), which otherwise halve the
    matrix units' throughput (H200, docs/BENCHMARKS.md session 32): the workgroup-memory matrix
    loads take literal offsets (a `switch` over the subgroups, the step's 16-input slices
    unrolled), which Dawn leaves unchecked, and the tile stores index from `lid` and constants by
    / and % only, which its integer range analysis proves in bounds.
    direct_y (not dual; the epilogue adds nothing, or the residual: y's own values): a tile inside
    T x O stores its results straight into y (y_buf, rows y_C apart), starting from y's values
    with `residual`; other tiles go through ys and epilogue()."""
    v.check()
    pairs = [(i, j) for i in range(v.tm) for j in range(v.tn)]
    decl = [f"  var acc{i}_{j} = Acc();" for i, j in pairs] + ([f"  var acd{i}_{j} = Acc();" for i, j in pairs]
                                                               if dual else [])
    if direct_y and dual:
        raise ValueError("results stored straight into y are for one weight (gate/up's product needs the epilogue)")

    def y_at(i, j):    # offset of result (i, j) of this subgroup in y
        return f"y_idx(0u, t0 + tm0 + {16 * i}u, 0u, o0 + om0 + {16 * j}u)"
    if direct_y:
        decl.append("  let full = t0 + BM <= T && o0 + BN <= w_O;   // the tile lies inside T x O (uniform)")
        if residual:
            decl += ["  if (full) {"] + [f"    acc{i}_{j} = subgroupMatrixLoad<Acc, row_major>(&y_buf, {y_at(i, j)}, y_C);"
                                         for i, j in pairs] + ["  }"]
    st, kt, nsg = 4 * v.kstep + 8, 4 * v.kstep, v.sgm * v.sgn
    cases = []
    for sg in range(nsg):       # subgroup sg's corner of the tile: tokens tm0 .., outputs om0 ..
        tm0, om0 = (sg // v.sgn) * 16 * v.tm, (sg % v.sgn) * 16 * v.tn
        body = []
        for kk in range(0, kt, 16):
            body += [f"        let a{i}k{kk} = subgroupMatrixLoad<Left, row_major>(&xs, {(tm0 + 16 * i) * st + kk}u, ST);"
                     for i in range(v.tm)]
            # the right matrices: W's (b, into acc) and W2's (e, into acd; tile 1 of ws, or wh2)
            for tile, name, acc in ((0, "b", "acc"), (1, "e", "acd")) if dual else ((0, "b", "acc"),):
                if v.direct:    # W's rows o0 + om0 + 16 j .. straight from its buffer (wh, wh2): W's row length apart
                    body += [f"        let {name}{j}k{kk} = subgroupMatrixLoad<Right, col_major>(&{('wh', 'wh2')[tile]}, "
                             f"(o0 + {om0 + 16 * j}u) * w_I + k * KT + {kk}u, w_I);" for j in range(v.tn)]
                else:
                    body += [f"        let {name}{j}k{kk} = subgroupMatrixLoad<Right, col_major>(&ws, "
                             f"{tile * st * v.bn + (om0 + 16 * j) * st + kk}u, ST);" for j in range(v.tn)]
                body += [f"        {acc}{i}_{j} = subgroupMatrixMultiplyAccumulate(a{i}k{kk}, {name}{j}k{kk}, {acc}{i}_{j});"
                         for i, j in pairs]
        cases.append(f"      case {sg}u: {{\n" + "\n".join(body) + "\n      }")
    compute = "    switch sg {\n" + "\n".join(cases) + "\n      default: {}\n    }"
    # the tiles' fetch slots: (register prefix, fetch fn, tile array, first element, slices per tile,
    # tile corner, extra fetch args)
    slots = [("fx", "fetch_x", "xs", 0, v.bm * v.kstep, "t0", ", T")]
    if not v.direct:
        slots += [("fw", "fetch_w", "ws", 0, v.bn * v.kstep, "o0", ", 0u")]
        slots += [("fv", "fetch_w", "ws", st * v.bn, v.bn * v.kstep, "o0", ", 1u")] if dual else []
    fetch0, put, fetch = [], [], []
    for reg, fn, arr, first, n, base, extra in slots:
        for s in range(_slots(n, v.wg)):
            # held as f16 (what the tile stores): half the registers of f32, which a 4 x 4 block of
            # results needs (128 a lane) to stay out of local memory
            fetch0.append(f"  var {reg}{s} = vec4<f16>({fn}(lid + {s * v.wg}u, {base}, 0u{extra}));")
            fetch.append(f"      {reg}{s} = vec4<f16>({fn}(lid + {s * v.wg}u, {base}, (k + 1u) * KS{extra}));")
            guard = "" if (s + 1) * v.wg <= n else f"if (idx < {n}u) "
            put.append(f"    {{ let idx = lid + {s * v.wg}u; {guard}{{ let i = {f'{first}u + ' if first else ''}"
                       f"(idx / KS) * ST + 4u * (idx % KS); "
                       f"let h = {reg}{s}; {arr}[i] = h.x; {arr}[i + 1u] = h.y; {arr}[i + 2u] = h.z; "
                       f"{arr}[i + 3u] = h.w; }} }}")
    ysg = 512 if dual else 256     # each subgroup's 16 x 16 result(s) in ys
    store = []
    if direct_y:
        store += ["  if (full) {"] + [f"    subgroupMatrixStore<row_major>(&y_buf, {y_at(i, j)}, acc{i}_{j}, y_C);"
                                      for i, j in pairs] + ["    return;", "  }"]
    up = f"ys[sg * {ysg}u + 256u + e]" if dual else f"ys[sg * {ysg}u + e]"    # epilogue's second value
    for i, j in pairs:    # one 16 x 16 result a subgroup at a time through ys (small: more workgroups fit an SM)
        cases = [f"    case {sg}u: {{ subgroupMatrixStore<row_major>(&ys, {sg * ysg}u, acc{i}_{j}, 16u);"
                 + (f" subgroupMatrixStore<row_major>(&ys, {sg * ysg + 256}u, acd{i}_{j}, 16u);" if dual else "") + " }"
                 for sg in range(nsg)]
        store += ["  switch sg {"] + cases + ["    default: {}", "  }",
                  "  workgroupBarrier();",
                  "  for (var q = 0u; q < 8u; q++) {   // e from lane and a constant-started loop: ys[] in range",
                  "    let e = lane + 32u * q;",
                  f"    let t = t0 + tm0 + {16 * i}u + e / 16u;",
                  f"    let o = o0 + om0 + {16 * j}u + e % 16u;",
                  f"    if (t < T && o < w_O) {{ epilogue(t, o, ys[sg * {ysg}u + e], {up}); }}",
                  "  }",
                  "  workgroupBarrier();"]
    return {"BM": v.bm, "BN": v.bn, "KS": v.kstep, "WG": v.wg, "SGN": v.sgn, "SUB_M": 16 * v.tm,
            "SUB_N": 16 * v.tn, "DIRECT_W": v.direct,
            "XS_N": st * v.bm, "WS_ALL": st * v.bn * (2 if dual else 1), "YS_N": ysg * v.sgm * v.sgn,
            "ACC_DECL": "\n".join(decl), "FETCH_DECL": "\n".join(fetch0), "PUT": "\n".join(put),
            "FETCH_NEXT": "\n".join(fetch), "COMPUTE": compute, "STORE": "\n".join(store)}
