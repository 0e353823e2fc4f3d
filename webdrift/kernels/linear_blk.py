"""Code generation for the integer-dot-product decode GEMV (wgsl/linear_blk.wgsl, LinearKernel's
variant "blk"; its input rows come from quantize.py).

The templates hold the structure (quantize.wgsl: RMSNorm + int8 quantization of activation rows;
linear_blk.wgsl: block loop and reduction); this module writes the unrolled parts: per-row bodies
with named accumulators (arrays indexed in loops can end up in local memory) and the input
quantization whose int8 packing matches each weight format's byte order for dot4I8Packed:
  q8: word k of a block holds weights 4k..4k+3 as int8 -> x packed in natural order.
  q4: word k holds weights 8k..8k+7 as nibbles; `w & 0x0F0F0F0F` gives the even ones (8k, 8k+2,
      8k+4, 8k+6) as bytes and `(w >> 4) & 0x0F0F0F0F` the odd ones -> x packed even / odd.
  q8_0: as q8, its scale an f16 (two a word). q4_0: as q4, its pair (d, -8 d) from the f16 scale it stores.
  q4k: Q4_K super-blocks with each 32-block's nibbles in q4's order (kernels/weights.py) -> as q4,
      its (scale, min) pair (d sc, -dmin m) from the super-block's header.
  q5k: Q5_K super-blocks as stored: a 32-block's nibbles (8 consecutive qs words) with each
      input's fifth bit from qh OR-ed in as bit 4 -> codes 0..31 as bytes in natural order, x
      packed naturally as for q8; its (scale, min) pair (d sc, -dmin m) from the header, as q4k.
  q6k: q4's nibble words plus the high bit pairs laid out so that one shift and mask give the same
      even / odd byte lanes (kernels/weights.py), made int8 (q - 32) -> x packed even / odd; the
      two 16-input halves of a block (x's lo and hi words) have their own scales.
A row-split weight reads its ranges in one order (quantize.order_format): q4's where all its
ranges take it, else channel order, where its q6k ranges' even / odd words are shuffled into
channel order as they load (`{n}_nlo` / `{n}_nhi`; the code below calls such a range Q6K_NAT):
a Q5_K_M file's Q5_K Q / K with a Q6_K V. q4 / q4_0 / q4k take only q4's order.
Several columns (cols > 1: NCOL token rows per workgroup): each weight block is loaded once and
dotted with every column's x block, accumulators a{r}_{c}; a column's sum is the same expression,
in the same order, as the one-row kernel's (cols == 1 writes exactly the one-row text).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import re

from ..errors import UnsupportedModelError
from .quantize import FORMATS, NATURAL_ORDER, ceil4, n_partials, order_format, row_words
from .weights import (
    FORMAT_GROUP,
    buffer_sizes,
    format_names,
    n_groups,
    q4_sm_decl,
    q4k_block_wgsl,
    q5k_block_wgsl,
    q6k_block_wgsl,
    q6k_decl,
    q6k_natural_wgsl,
    q8_scale_decl,
    split_parts,
    split_ranges,
    wgsl_by_range,
)

Q8_FORMATS = ("q8", "q8_0", "q8pc")   # int8 weights, read in x's natural order
Q4_FORMATS = ("q4", "q4_0", "q4g128", "q4pc", "e0m4")   # q4's nibbles and a (scale, min) pair per group
MIN_TERM_FORMATS = (*Q4_FORMATS, "q4k", "q5k")   # formats whose block product has a min term (m_w s_x)
Q6K_NAT = "q6k_nat"   # code generation's name for a q6k range read in channel order


def code_parts(fmt: str) -> list[tuple[str, int]] | None:
    """A row-split weight's (format, rows) ranges as the generated code reads them: q6k ranges
    Q6K_NAT where the weight's int8 rows are in channel order; None for a plain format."""
    parts = split_parts(fmt)
    if parts is None or order_format(fmt) not in NATURAL_ORDER:
        return parts
    return [(Q6K_NAT if f == "q6k" else f, rows) for f, rows in parts]


def supported(fmt: str, i: int) -> bool:
    """Whether the integer-dot GEMV reads weights of this format and input size; a row-split
    weight where every range's format is read in the weight's one int8 row order (q4k with q6k:
    q4's order; q5k, q8 or q8_0 with q6k: channel order, q6k shuffled; q5k with q4k: no)."""
    parts = split_parts(fmt)
    if parts:
        natural = order_format(fmt) in NATURAL_ORDER
        return all(supported(f, i) and ((f in NATURAL_ORDER or f == "q6k") if natural else f not in NATURAL_ORDER)
                   for f, _ in parts)
    return fmt in FORMATS and i % (256 if fmt in ("q4k", "q5k", "q6k") else 32) == 0


def weight_decl(n: str, binding: int, fmt: str, o: int, i: int) -> str:
    """The weight's buffers (bindings binding, binding + 1) read one whole 32-block per load; a
    row-split weight: each range as weight {n}_p{k}, its bindings after the previous range's."""
    parts = split_parts(fmt)
    if parts:
        decls = [f"const {n}_O: u32 = {o}u;   // rows split {fmt}\n"]
        for (k, f, _, rows), (read_as, _) in zip(split_ranges(parts), code_parts(fmt)):
            decls.append(weight_decl(f"{n}_p{k}", binding, f, rows, i)
                         + (q6k_natural_wgsl(f"{n}_p{k}") if read_as == Q6K_NAT else ""))
            binding += len(buffer_sizes(f, rows, i))
        return "".join(decls)
    nb = i // 32
    head = f"// {n}: weight ({o} outputs, {i} inputs), format {fmt}, read one 32-block at a time\nconst {n}_O: u32 = {o}u;\n"
    if fmt in Q8_FORMATS:
        return head + (f"@group(0) @binding({binding}) var<storage, read> {n}_data: array<vec4<u32>>;  // ({o}, {nb}, 2) int8 x 16\n"
                       + q8_scale_decl(n, binding + 1, fmt, "read", o, n_groups(fmt, i)))
    if fmt in Q4_FORMATS:
        decl = (f"@group(0) @binding({binding}) var<storage, read> {n}_data: array<vec4<u32>>;  // ({o}, {nb}) uint4 x 32\n"
                + q4_sm_decl(n, binding + 1, fmt, "read", o, n_groups(fmt, i)))
        if fmt == "e0m4":   # x = s (1 + q / 16) + b = (s / 16) q + (s + b): q4's (scale, min) pair
            decl += (f"fn {n}_qpair(g: u32) -> vec2<f32> {{\n  let p = {n}_pair(g);\n"
                     "  return vec2<f32>(p.x * 0.0625, p.x + p.y);\n}\n")
        return head + decl
    if fmt == "q4k":
        return head + (f"@group(0) @binding({binding}) var<storage, read> {n}_data: array<vec4<u32>>;  "
                       f"// ({o}, {i // 256}, 9) Q4_K super-blocks, nibbles in q4's order\n") + q4k_block_wgsl(n)
    if fmt == "q6k":
        return head + q6k_decl(n, binding, "read", o, i, word="vec2<u32>") + q6k_block_wgsl(n)
    if fmt == "q5k":
        return head + (f"@group(0) @binding({binding}) var<storage, read> {n}_data: array<vec4<u32>>;  "
                       f"// ({o}, {i // 256}, 11) Q5_K super-blocks as stored\n") + q5k_block_wgsl(n)
    raise UnsupportedModelError(f"the integer-dot GEMV reads {FORMATS}, not {fmt}")


def _q6k_load(n: str, r: int, o: str, natural: bool = False) -> list[str]:
    """Block b of row o (rw{r}) of a q6k weight: its 8 int8 words (k, p) in x's even / odd order as
    {n}v{r}_{2k+p}, and its two half scales d sc as {n}s{r} (vec2); natural (Q6K_NAT): the words
    shuffled into channel order, {n}v{r}_t inputs 4t..4t+3 (the halves stay words 0-3 and 4-7)."""
    L = [f"    let {n}i{r} = 3u * ({o} * NB + b);",
         f"    let {n}A{r} = {n}_data[{n}i{r}];", f"    let {n}B{r} = {n}_data[{n}i{r} + 1u];",
         f"    let {n}H{r} = {n}_data[{n}i{r} + 2u];",
         f"    let {n}s{r} = {n}_q6s({o} * NB + b);"]
    words = (f"{n}A{r}.x", f"{n}A{r}.y", f"{n}B{r}.x", f"{n}B{r}.y")
    for k in range(4):
        for p in range(2):
            s = 2 * k + p
            L.append(f"    let {n}{'t' if natural else 'v'}{r}_{s} = {n}_q6({words[k]}, {4 * p}u, {n}H{r}.{'xy'[s // 4]}, {2 * (s % 4)}u);")
    if natural:
        for k in range(4):
            e, od = f"{n}t{r}_{2 * k}", f"{n}t{r}_{2 * k + 1}"
            L += [f"    let {n}v{r}_{2 * k} = {n}_nlo({e}, {od});", f"    let {n}v{r}_{2 * k + 1} = {n}_nhi({e}, {od});"]
    return L


def _q5k_load(n: str, r: int, o: str) -> list[str]:
    """Block b of row o (rw{r}) of a q5k weight: its 8 words of 5-bit codes (natural order) as
    {n}v{r}_0..7 and its pair as {n}m{r}."""
    L = [f"    let {n}k{r} = {o} * NB + b;", f"    let {n}i{r} = {n}k{r} / 8u * 11u;", f"    let {n}j{r} = {n}k{r} % 8u;",
         f"    let {n}A{r} = {n}_data[{n}i{r} + 3u + 2u * ({n}j{r} / 2u)];",
         f"    let {n}B{r} = {n}_data[{n}i{r} + 4u + 2u * ({n}j{r} / 2u)];",
         f"    let {n}H{r} = {n}_data[{n}i{r} + 1u];", f"    let {n}G{r} = {n}_data[{n}i{r} + 2u];",
         f"    let {n}m{r} = {n}_k4sm({n}k{r});"]
    for t, c in enumerate("xyzw"):
        L.append(f"    let {n}v{r}_{t} = {n}_q5({n}A{r}.{c}, {n}H{r}.{c}, {n}j{r});")
        L.append(f"    let {n}v{r}_{t + 4} = {n}_q5({n}B{r}.{c}, {n}G{r}.{c}, {n}j{r});")
    return L


def _q5k_acc(n: str, acc: str, r: int, xk: str) -> str:
    terms = [f"dot4I8Packed({n}v{r}_{t}, {xk}.lo.{c})" for t, c in enumerate("xyzw")]
    terms += [f"dot4I8Packed({n}v{r}_{t + 4}, {xk}.hi.{c})" for t, c in enumerate("xyzw")]
    return f"{acc} += {n}m{r}.x * {xk}.d * f32({' + '.join(terms)}) + {n}m{r}.y * {xk}.s;"


def _q6k_terms(n: str, r: int, xk: str, half: int) -> str:
    """Half `half` (x's lo / hi words: inputs 0..15 / 16..31) of a q6k block's integer dot."""
    src = f"{xk}.{'lo' if half == 0 else 'hi'}"
    return " + ".join(f"dot4I8Packed({n}v{r}_{4 * half + j}, {src}.{c})" for j, c in enumerate("xyzw"))


def _q6k_acc(n: str, acc: str, r: int, xk: str) -> str:
    return (f"{acc} += {xk}.d * ({n}s{r}.x * f32({_q6k_terms(n, r, xk, 0)})\n"
            f"        + {n}s{r}.y * f32({_q6k_terms(n, r, xk, 1)}));")


def _q4_block(n: str, o: str, fmt: str) -> str:
    """q4 / q4k: the vec4 of 32 nibbles of block b of row o (q4k: after its super-block's header)."""
    return f"{n}_data[({o} * NB + b) / 8u * 9u + 1u + b % 8u]" if fmt == "q4k" else f"{n}_data[{o} * NB + b]"


def scale_group(fmt: str, o: str) -> str:
    """WGSL: the index of the scale (pair) of 32-block b of row o, for a format of one scale per
    32 inputs (o * NB + b), per 128 (ceil(NB / 4) a row) or per row (FORMAT_GROUP)."""
    g = FORMAT_GROUP.get(fmt, 32)
    return {32: f"{o} * NB + b", 128: f"{o} * ((NB + 3u) / 4u) + b / 4u", 0: f"{o}"}[g]


def q4_pair(n: str, o: str, fmt: str) -> str:
    """q4-kind formats: the (scale, min) pair of block b of row o, x = scale q + min (q4k: from
    its super-block's header; e0m4: from its (scale, bias))."""
    if fmt == "q4k":
        return f"{n}_k4sm({o} * NB + b)"
    return f"{n}_{'qpair' if fmt == 'e0m4' else 'pair'}({scale_group(fmt, o)})"


def _row(n: str, acc: str, r: int, fmt: str, o: str) -> list[str]:
    """Row o (rw{r}, or its index within a row range) of weight n, block b, into {acc}{r}."""
    if fmt in ("q6k", Q6K_NAT):
        return _q6k_load(n, r, o, fmt == Q6K_NAT) + [f"    {_q6k_acc(n, f'{acc}{r}', r, 'xk')}"]
    if fmt == "q5k":
        return _q5k_load(n, r, o) + [f"    {_q5k_acc(n, f'{acc}{r}', r, 'xk')}"]
    if fmt in Q8_FORMATS:
        terms = [f"dot4I8Packed({n}a{r}.{c}, xk.lo.{c})" for c in "xyzw"] + [f"dot4I8Packed({n}b{r}.{c}, xk.hi.{c})" for c in "xyzw"]
        return [f"    let {n}a{r} = {n}_data[2u * ({o} * NB + b)];",
                f"    let {n}b{r} = {n}_data[2u * ({o} * NB + b) + 1u];",
                f"    {acc}{r} += f32({' + '.join(terms)}) * ({n}_scl({scale_group(fmt, o)}) * xk.d);"]
    terms = []
    for k, c in enumerate("xyzw"):
        src = "xk.lo" if k < 2 else "xk.hi"
        lo, hi = ("x", "y") if k % 2 == 0 else ("z", "w")
        terms.append(f"dot4I8Packed({n}q{r}.{c} & 0x0F0F0F0Fu, {src}.{lo})")
        terms.append(f"dot4I8Packed(({n}q{r}.{c} >> 4u) & 0x0F0F0F0Fu, {src}.{hi})")
    return [f"    let {n}q{r} = {_q4_block(n, o, fmt)};",
            f"    let {n}m{r} = {q4_pair(n, o, fmt)};",
            f"    {acc}{r} += {n}m{r}.x * xk.d * f32({' + '.join(terms)}) + {n}m{r}.y * xk.s;"]


def row_body(fmt: str, rows: int, dual: bool, base: str = "o0", rope: bool = False, cols: int = 1) -> str:
    """The block loop's body: the rows' weight blocks of block b and their products with the
    columns' x blocks. A row-split weight: where the workgroup's rows all lie in one row range
    (all but a boundary workgroup), that range's straight-line body, its loads issued together;
    at a boundary, each row in a branch on its range."""
    if rope:   # output index -> weight row (rotation partners adjacent)
        L = [f"    let rw{r} = rperm(min({base} + {r}u, w_O - 1u));" for r in range(rows)]
    else:
        L = [f"    let rw{r} = min({base} + {r}u, w_O - 1u);" for r in range(rows)]
    parts = code_parts(fmt)
    if parts is None:
        return "\n".join(L + _rows_body(fmt, rows, dual, cols, "", lambda r: f"rw{r}"))
    for k, f, row0, n in split_ranges(parts):
        inside = " && ".join(f"rw{r} >= {row0}u && rw{r} < {row0 + n}u" if row0 else f"rw{r} < {n}u" for r in range(rows))
        L.append(f"    {'} else ' if k else ''}if ({inside}) {{")
        L += _rows_body(f, rows, dual, cols, f"_p{k}", lambda r, row0=row0: f"(rw{r} - {row0}u)")
    L.append("    } else {   // a workgroup at a range boundary: each row in its range")
    if cols == 1:
        for r in range(rows):
            for n, acc in (("w", "a"), ("w2", "g")) if dual else (("w", "a"),):
                L += _by_range(parts, r, lambda wn, f, o, r=r, acc=acc: _row(wn, acc, r, f, o), n)
    else:
        for c0 in range(0, cols, XK_GROUP):
            group = range(c0, min(cols, c0 + XK_GROUP))
            L += [f"    let xk{c} = x_block(xr{c}, b);" for c in group]
            for r in range(rows):
                for n, acc in (("w", "a"), ("w2", "g")) if dual else (("w", "a"),):
                    L += _by_range(parts, r, lambda wn, f, o, r=r, acc=acc, group=group: _load(wn, r, f, o)
                                   + [_dot(wn, acc, r, c, f) for c in group], n)
    return "\n".join(L + ["    }"])


def _rows_body(fmt: str, rows: int, dual: bool, cols: int, part: str, row) -> list[str]:
    """The body for one plain format: weights w{part} (and w2{part}), row r at row(r)."""
    if cols > 1:
        return _cols_body(fmt, rows, dual, cols, part, row)
    L = []
    for r in range(rows):
        L += _row(f"w{part}", "a", r, fmt, row(r))
        if dual:
            L += _row(f"w2{part}", "g", r, fmt, row(r))
    return L


def _by_range(parts: list, r: int, emit, n: str) -> list[str]:
    """emit(weight, format, row) for row rw{r} of the row-split weight n, in a branch per row
    range, each reading its own weight {n}_p{k} at the row within it."""
    return wgsl_by_range(parts, f"rw{r}", lambda k, f, row0: emit(f"{n}_p{k}", f, f"(rw{r} - {row0}u)"), "    ")


def _load(n: str, r: int, fmt: str, o: str) -> list[str]:
    """Weight block b of row o (rw{r}), loaded once for every column (q4: its even / odd nibbles)."""
    if fmt in ("q6k", Q6K_NAT):
        return _q6k_load(n, r, o, fmt == Q6K_NAT)
    if fmt == "q5k":
        return _q5k_load(n, r, o)
    if fmt in Q8_FORMATS:
        return [f"    let {n}a{r} = {n}_data[2u * ({o} * NB + b)];",
                f"    let {n}b{r} = {n}_data[2u * ({o} * NB + b) + 1u];",
                f"    let {n}s{r} = {n}_scl({scale_group(fmt, o)});"]
    return [f"    let {n}q{r} = {_q4_block(n, o, fmt)};",
            f"    let {n}e{r} = {n}q{r} & vec4<u32>(0x0F0F0F0Fu);",
            f"    let {n}o{r} = ({n}q{r} >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);",
            f"    let {n}m{r} = {q4_pair(n, o, fmt)};"]


def _dot(n: str, acc: str, r: int, c: int, fmt: str) -> str:
    """acc{r}_{c} += column c's block product: _row's expression, term for term."""
    xk = f"xk{c}"
    if fmt in ("q6k", Q6K_NAT):
        return f"      {_q6k_acc(n, f'{acc}{r}_{c}', r, xk)}"
    if fmt == "q5k":
        return f"      {_q5k_acc(n, f'{acc}{r}_{c}', r, xk)}"
    if fmt in Q8_FORMATS:
        terms = ([f"dot4I8Packed({n}a{r}.{e}, {xk}.lo.{e})" for e in "xyzw"]
                 + [f"dot4I8Packed({n}b{r}.{e}, {xk}.hi.{e})" for e in "xyzw"])
        return f"      {acc}{r}_{c} += f32({' + '.join(terms)}) * ({n}s{r} * {xk}.d);"
    terms = []
    for k, e in enumerate("xyzw"):
        src = f"{xk}.lo" if k < 2 else f"{xk}.hi"
        lo, hi = ("x", "y") if k % 2 == 0 else ("z", "w")
        terms += [f"dot4I8Packed({n}e{r}.{e}, {src}.{lo})", f"dot4I8Packed({n}o{r}.{e}, {src}.{hi})"]
    return f"      {acc}{r}_{c} += {n}m{r}.x * {xk}.d * f32({' + '.join(terms)}) + {n}m{r}.y * {xk}.s;"


XK_GROUP = 4   # columns whose int8 x blocks are loaded together in the several-column GEMV


def _cols_body(fmt: str, rows: int, dual: bool, cols: int, part: str = "", row=lambda r: f"rw{r}") -> list[str]:
    """The weight loads, then for each group of XK_GROUP columns their x blocks and products:
    loads not separated by branches are issued together (H100, 2026-11-24, scripts/streams_gemv.py:
    the 1B gate/up at 4 and 8 rows 7% faster than with each column's loads and products behind
    `if (c < nc)`), but all 8 columns' x blocks at once (80 registers) ran the 1B QKV of 8 streams
    2-3x slower than two groups of 4 (H100, 2026-11-25, BENCHMARKS.md session 17). Weights
    w{part} / w2{part}, row r at row(r)."""
    w, w2 = f"w{part}", f"w2{part}"
    L = []
    for r in range(rows):
        L += _load(w, r, fmt, row(r)) + (_load(w2, r, fmt, row(r)) if dual else [])
    for c0 in range(0, cols, XK_GROUP):
        group = range(c0, min(cols, c0 + XK_GROUP))
        L += [f"    let xk{c} = x_block(xr{c}, b);" for c in group]
        for c in group:
            for r in range(rows):
                L.append(_dot(w, "a", r, c, fmt))
                if dual:
                    L.append(_dot(w2, "g", r, c, fmt))
    return L


def _names(rows: int, dual: bool, cols: int) -> list[str]:
    """Accumulator names; cols > 1: column-major, column c's a0.. then g0.. at c * RC (RC =
    rows, or 2 rows with dual)."""
    if cols == 1:
        return [f"a{r}" for r in range(rows)] + ([f"g{r}" for r in range(rows)] if dual else [])
    return [f"{v}{r}_{c}" for c in range(cols) for v in ("ag" if dual else "a") for r in range(rows)]


def acc_decl(rows: int, dual: bool, cols: int = 1) -> str:
    names = _names(rows, dual, cols)
    return "\n".join(f"  var {v} = 0.0;" for v in names)


def _tree_sum(n: int) -> list[str]:
    """WGSL lines: the workgroup-memory tree sum of n values per invocation (red[r * WG + lid]),
    for adapters without subgroups."""
    return ["  workgroupBarrier();",
            "  for (var k = WG / 2u; k > 0u; k >>= 1u) {",
            f"    if (lid < k) {{ for (var r = 0u; r < {n}u; r++) {{ red[r * WG + lid] += red[r * WG + lid + k]; }} }}",
            "    workgroupBarrier();",
            "  }"]


def reduce(rows: int, dual: bool, subgroups: bool, rope: bool = False, cols: int = 1, qlast: bool = False,
           lora: bool = False) -> str:
    """Sum the accumulators over the workgroup; invocation r < ROWS runs the epilogue of row r
    (rope: RoPE / relayout / KV append, with its partner's sum from invocation r ^ 1; qlast: the
    value also goes to qy, for its 32-block's last workgroup to quantize; lora: each sum plus its
    LoRA term, lora_add of linear_blk.wgsl's LFUSE, before 1/rms)."""
    if cols > 1:
        if lora:
            raise ValueError("the fused LoRA shrink (LFUSE) takes one token row")
        return _reduce_cols(rows, dual, subgroups, rope, cols)

    def acc(e: str, o: str, part: int = 0) -> str:
        return f"inv * ({e} + lora_add(t, {o}).{'xy'[part]})" if lora else f"inv * {e}"
    names = _names(rows, dual, 1)
    if subgroups:
        L = [f"  let {v}s = subgroupAdd({v});" for v in names]
        L.append("  if (lane == 0u) {")
        L += [f"    red[{k}u * WG + lid / sg] = {v}s;" for k, v in enumerate(names)]
        L.append("  }")
        L.append("  workgroupBarrier();")
        L.append(f"  if (lid < {len(names)}u) {{")
        L.append("    var tot = 0.0;")
        L.append("    for (var k = 0u; k < WG / sg; k++) { tot += red[lid * WG + k]; }")
        L.append("    red[lid * WG] = tot;")
        L.append("  }")
    else:
        L = [f"  red[{k}u * WG + lid] = {v};" for k, v in enumerate(names)] + _tree_sum(len(names))
    L.append("  workgroupBarrier();")
    L.append("  if (lid < ROWS && o0 + lid < w_O) {")
    acc2 = acc("red[(ROWS + lid) * WG]", "o0 + lid", 1) if dual else "0.0"
    if rope:
        L.append("    let ix = o0 + lid;")
        L.append(f"    rope_out(t, ix, epilogue_value(t, rperm(ix), {acc('red[lid * WG]', 'rperm(ix)')}, 0.0),")
        L.append(f"             epilogue_value(t, rperm(ix ^ 1u), {acc('red[(lid ^ 1u) * WG]', 'rperm(ix ^ 1u)')}, 0.0));")
    elif qlast:
        L.append(f"    let v = epilogue_value(t, o0 + lid, {acc('red[lid * WG]', 'o0 + lid')}, {acc2});")
        L.append("    if (QWRITE_Y) { y_write1(0u, t, 0u, o0 + lid, v); }")
        L.append("    atomicStore(&qy[t * w_O + o0 + lid], bitcast<u32>(v));")
    else:
        L.append(f"    epilogue(t, o0 + lid, {acc('red[lid * WG]', 'o0 + lid')}, {acc2});")
    L.append("  }")
    return "\n".join(L)


def sg_store(rps: int, dual: bool, cols: int = 1) -> str:
    """QOUT: the subgroup's RPS row sums into `res` (lane 0; column c's at c * 2 ROWS)."""
    if cols > 1:
        names = _names(rps, dual, cols)
        L = [f"    let {v}s = subgroupAdd({v});" for v in names]
        L.append("    if (lane == 0u) {")
        for c in range(cols):
            L += [f"      res[{2 * c}u * ROWS + r0 + {r}u] = a{r}_{c}s;" for r in range(rps)]
            if dual:
                L += [f"      res[{2 * c + 1}u * ROWS + r0 + {r}u] = g{r}_{c}s;" for r in range(rps)]
        L.append("    }")
        return "\n".join(L)
    names = _names(rps, dual, 1)
    L = [f"    let {v}s = subgroupAdd({v});" for v in names]
    L.append("    if (lane == 0u) {")
    L += [f"      res[r0 + {r}u] = a{r}s;" for r in range(rps)]
    if dual:
        L += [f"      res[ROWS + r0 + {r}u] = g{r}s;" for r in range(rps)]
    L.append("    }")
    return "\n".join(L)


def _reduce_cols(rows: int, dual: bool, subgroups: bool, rope: bool, cols: int) -> str:
    """reduce() for NCOL columns: every accumulator summed as the one-row kernel sums it
    (subgroupAdd, then the subgroups' partials in order; or the same tree), packed at stride S
    in `red` (S = WG / sg, or WG); then invocation j handles row j % ROWS of column j / ROWS."""
    names = _names(rows, dual, cols)
    rc = rows * (2 if dual else 1)
    if subgroups:
        L = [f"  let {v}s = subgroupAdd({v});" for v in names]
        L.append("  let S = WG / sg;")
        L.append("  if (lane == 0u) {")
        L += [f"    red[{k}u * S + lid / sg] = {v}s;" for k, v in enumerate(names)]
        L.append("  }")
        L.append("  workgroupBarrier();")
        L.append(f"  for (var j = lid; j < {len(names)}u; j += WG) {{")
        L.append("    var tot = 0.0;")
        L.append("    for (var k = 0u; k < S; k++) { tot += red[j * S + k]; }")
        L.append("    red[j * S] = tot;")
        L.append("  }")
    else:
        L = ["  let S = WG;"] + [f"  red[{k}u * WG + lid] = {v};" for k, v in enumerate(names)] + _tree_sum(len(names))
    L.append("  workgroupBarrier();")
    L.append("  for (var j = lid; j < ROWS * nc; j += WG) {")
    L.append("    let r = j % ROWS;")
    L.append("    let c = j / ROWS;")
    L.append(f"    let k = c * {rc}u;")
    L.append("    if (o0 + r < w_O) {")
    if rope:
        L.append("      let ix = o0 + r;")
        L.append("      rope_out(t0 + c, ix, epilogue_value(t0 + c, rperm(ix), col_inv(c) * red[(k + r) * S], 0.0),")
        L.append("               epilogue_value(t0 + c, rperm(ix ^ 1u), col_inv(c) * red[(k + (r ^ 1u)) * S], 0.0));")
    else:
        acc2 = "col_inv(c) * red[(k + ROWS + r) * S]" if dual else "0.0"
        L.append(f"      epilogue(t0 + c, o0 + r, col_inv(c) * red[(k + r) * S], {acc2});")
    L.append("    }")
    L.append("  }")
    return "\n".join(L)


def red_floats(rows: int, dual: bool, wg: int, subgroups: bool, cols: int, qout: bool = False) -> int:
    """Workgroup floats `red` needs (XNORM takes wg; the sums of cols > 1 take their count times
    S = wg / subgroup size, at most wg / 4 -- WGSL's smallest subgroup --, or wg)."""
    if qout:
        return wg
    n = rows * (2 if dual else 1)
    if cols == 1:
        return max(wg, n * wg)
    return max(wg, n * cols * (wg // 4 if subgroups else wg))


def xnorm_cols(cols: int, xp: int, xcg: int, subgroups: bool = False) -> str:
    """linear_blk_xnorm.wgsl for several columns: each column's partial sums (ssq{c}, lane k's
    share) summed by the one-row kernel's tree over XP lanes, xcg columns' trees side by side
    sharing their barriers; lane 0 writes column c's 1/rms to xinv[c]. Named values, no loop
    over columns: an array indexed in a loop can live in local memory. subgroups: each column's
    subgroupAdd, then its subgroups' sums in order (the one-row kernel's), all columns at once."""
    if subgroups:
        return "\n".join(["  let xs = WG / sg;",
                          *(f"  let sss{c} = subgroupAdd(ssq{c});" for c in range(cols)),
                          "  if (lane == 0u) {", *(f"    red[{c}u * xs + lid / sg] = sss{c};" for c in range(cols)), "  }",
                          "  workgroupBarrier();",
                          f"  if (lid < {cols}u) {{",
                          "    var ss = 0.0;",
                          "    for (var k = 0u; k < xs; k++) { ss += red[lid * xs + k]; }",
                          "    xinv[lid] = rms_inv(ss);",
                          "  }",
                          "  workgroupBarrier();"])
    L = []
    for c0 in range(0, cols, xcg):
        js = range(c0, min(cols, c0 + xcg))
        L += ["  if (lid < XP) {", *(f"    red[{j - c0}u * XP + lid] = ssq{j};" for j in js), "  }",
              "  workgroupBarrier();",
              "  for (var k = XP / 2u; k > 0u; k >>= 1u) {",
              "    if (lid < k) {", *(f"      red[{j - c0}u * XP + lid] += red[{j - c0}u * XP + lid + k];" for j in js), "    }",
              "    workgroupBarrier();",
              "  }",
              "  if (lid == 0u) {", *(f"    xinv[{j}u] = rms_inv(red[{j - c0}u * XP]);" for j in js), "  }",
              "  workgroupBarrier();"]
    return "\n".join(L)


XNORM_TREE_FLOATS = 1024   # workgroup floats for the side-by-side trees of several columns' 1/rms


def unrolled_body(body: str, unroll: int, stride: str, cols: int) -> str:
    """The block loop's body over `unroll` blocks b0, b0 + stride, ... (stride: WG, or the
    subgroup size with the quantizing epilogue), each in a scope of its own with its b and x
    block(s), in the loop's order, so every sum is formed exactly as with one block an
    iteration: only the loads of later blocks can be issued before the products of earlier ones
    (more weight bytes in flight per invocation). A block past the row's end (NB not a multiple
    of the stride times unroll) loads block NB - 1 and its x block with scale and sum zero
    (x_block_m): its terms add +-0."""
    first = ["    let b = b0;"] + ([] if cols > 1 else ["    let xk = x_block(xr, b);"])
    if unroll == 1:
        return "\n".join([*first, body])
    out = ["    {", *first, body, "    }"]
    for u in range(1, unroll):
        head = [f"    let ok = b0 + {u}u * {stride} < NB;", f"    let b = min(b0 + {u}u * {stride}, NB - 1u);"]
        head += [] if cols > 1 else ["    let xk = x_block_m(xr, b, ok);"]
        out += ["    {", *head, re.sub(r"x_block\((xr\d*), b\)", r"x_block_m(\1, b, ok)", body), "    }"]
    return "\n".join(out)


def defines(fmt: str, i: int, rows: int, wg: int, dual: bool, subgroups: bool,
            x_partials: int | None = None, qout: bool = False, rps: int = 4, rope: bool = False, cols: int = 1,
            qlast: bool = False, lora: bool = False, unroll: int = 1) -> dict:
    """x_partials: how many partial sums of x^2 the input rows carry (XNORM): QuantizeKernel's
    n_partials(i) by default, i / 32 from a quantizing GEMV epilogue. qout: the quantizing
    epilogue (rows == 32; each subgroup accumulates RPS rows at a time); qlast: the quantizing
    epilogue in each 32-block's last workgroup (the one-row kernel otherwise). cols: token rows
    per workgroup (NCOL). lora: the fused LoRA shrink's terms in the epilogue (LFUSE). unroll:
    blocks per invocation an iteration (BU, unrolled_body)."""
    nb = i // 32
    acc_rows = rps if qout else rows
    np_ = x_partials or n_partials(i)
    xp = min(wg, 1 << (np_ - 1).bit_length())          # the partial sums' tree (linear_blk_xnorm.wgsl)
    xcg = max(1, min(cols, XNORM_TREE_FLOATS // xp))   # columns whose trees share barriers
    return {"XP": xp, "XCG": xcg, "NB": nb, "STRIDE4": row_words(i) // 4, "D4": 2 * nb, "S4": 2 * nb + ceil4(nb) // 4,
            "P0": 8 * nb + 2 * ceil4(nb), "NP": np_, "Q4": any(f in MIN_TERM_FORMATS for f in format_names(fmt)),
            "RED": max(red_floats(rows, dual, wg, subgroups, cols, qout), xcg * xp, cols * (wg // 4)), "RPS": rps,
            "NCOL": cols, "COLS": cols > 1, "RES": 2 * rows * cols,
            # columns past the workgroup's last token row read (and compute) its last row again:
            # no branch between the loads, and only columns < nc are written
            "XR_DECL": "\n".join(f"  let xr{c} = (t0 + min({c}u, nc - 1u)) * STRIDE4;" for c in range(cols)),
            "SSQ_DECL": "\n".join(f"  let ssq{c} = x_partials(xr{c}, lid);" for c in range(cols)),
            "XNORM_COLS": xnorm_cols(cols, xp, xcg, subgroups),
            "SG_STORE": sg_store(rps, dual, cols) if qout else "",
            "ACC_DECL": acc_decl(acc_rows, dual, cols),
            "ROW_BODY": unrolled_body(row_body(fmt, acc_rows, dual, "o0 + r0" if qout else "o0", rope=rope, cols=cols),
                                      unroll, "sg" if qout else "WG", cols), "BU": unroll,
            "REDUCE": "" if qout else reduce(rows, dual, subgroups, rope=rope, cols=cols, qlast=qlast, lora=lora),
            "SG_ARGS": (", @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg: u32" if subgroups else "")}
