"""Runtime weight formats and their generated WGSL accessors.

A GPUWeight is a linear-layer weight W[o, i] (O rows = outputs, I columns = inputs) on the GPU
in one of these formats (fused dequantization happens in the accessor):
  f32: array<vec4<f32>>  element order from a WeightLayout (permutation of G,S_O,O4,HWD,S_I,I4)
  f16: array<vec2<u32>>  same order, four f16 packed in two words (works without shader-f16)
  q8 : data  array<u32>  (O, I/4)   four int8 per word, element i at byte i%4
       scale array<f32>  (O, I/32)  x = scale * q               (== GGUF Q8_0, lossless)
  q4 : data  array<u32>  (O, I/8)   eight uint4 per word, element i at nibble i%8
       sm    array<u32>  (O, I/32)  (scale, min) as packed f16x2; x = scale * q + min
                                    (== GGUF Q4_1 lossless; Q4_0 is min = -8 * scale)
  q8_0: as q8 with the scale in f16, two a word: block k = o * I/32 + b's in half k % 2 of
       word k / 2 of `scale` (ceil(O I/32 / 2) words; == GGUF Q8_0 and Q5_0 lossless: 8.5 bits a
       weight against q8's 9)
  q4_0: as q4 with the zero point 8 implied: one f16 scale d per 32, x = d (q - 8), in `sm` two
       a word as q8_0's (== GGUF Q4_0 lossless: 4.5 bits a weight against q4's 5)
  q8pc: as q8 with one scale per row (G = I: per-channel, symmetric)
  q4g128, q4pc: as q4 with one (scale, min) per 128 inputs / per row (G = I)
  e0m4: as q4 (nibbles, f16x2 per 32), the pair being (scale s, bias b) and the nibble q the 4
       fraction bits of an f32 with a zero exponent (E0M4, Transformer-Lite): x = s * 1.q + b,
       1.q = bitcast<f32>(0x3f800000 | q << 19) in [1, 2), so no int -> float conversion
  q8g16: as q8 with one scale per 16 inputs: Q6_K's integers (q - 32) with d x its int8 sub-block
       scale in f32, exactly (d * sc has at most 19 significant bits)
  q4k: GGUF Q4_K super-blocks, every bit kept (144 bytes per 256 inputs, one binding, 9 vec4),
       the 16-byte header (d, dmin, the 12 bytes of the 6-bit sub-block scales and mins) as stored
       and then each 32-block's nibbles in q4's order (repacked at load): x = d sc q - dmin m
  q5k: GGUF Q5_K super-blocks as stored (176 bytes per 256 inputs, one binding),
       read natively: x = d sc q - dmin m with the 6-bit sub-block (sc, m), bit for bit gguf-py's
  q6k: GGUF Q6_K's codes, scales and d, every bit kept (212 bytes per 256 inputs: 6.625 bits per
       weight against the stored 6.5625), repacked at load into word-aligned 32-blocks for the
       integer-dot kernels: x = (d sc) (q - 32), sc the int8 scale of its 16 inputs
       data array<u32> (O, I/32, 6): words 0..3 the codes' low 4 bits in q4's order (nibble n of
              word k: input 8k + n), words 4, 5 their high 2 bits: bits 2(s % 4), 2(s % 4) + 1 of
              byte j of word 4 + s / 4 hold input 8k + 2j + p for s = 2k + p (so a shift and a mask
              give word k's even (p = 0) or odd (p = 1) inputs' high bits in the byte lanes that
              `w >> 4p & 0x0F0F0F0F` gives their low bits)
       sc   array<u32> (O, I/256, 5): words 0..3 the 16 int8 scales, word 4 d (the f16 as f32)
Row-split weights ("q4k*5120|q6k*1024"): consecutive row ranges in formats of their own, each
       range a weight of that format with its own buffers (in the order of the ranges), so a
       fused Q|K|V whose stored types differ (a Q4_K_M file's Q4_K Q / K with a Q6_K V) keeps every
       stored bit; `{w}_read4` picks the range by the row (split_parts, split_format).
(G, the group: inputs sharing one scale, FORMAT_GROUP; 0 = the whole row. A row holds ceil(I / G)
groups, the last one holding the remainder where G does not divide I: SmolLM2's 576 inputs in
q4g128 are 4 groups of 128 and one of 64.)
Every format exposes `fn {w}_read4(o: u32, s: u32) -> vec4<f32>`: inputs 4s..4s+3 of row o.
A matrix whose buffers would exceed one storage binding (the token embedding / LM head of a large
vocabulary) is held as row shards: several GPUWeights of whole rows, shard k holding rows
row0_k .. row0_k + o_k (models/footprint.row_shards plans them).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UnsupportedModelError
from ..tensor import slices
from ..tensor.weight_layout import WeightLayout

FORMATS = ("f32", "f16", "q8", "q8_0", "q8pc", "q8g16", "q4", "q4_0", "q4g128", "q4pc", "e0m4", "q4k", "q5k", "q6k")
# quantized formats: the storage kind (q8: int8 + f32 scale; q4: uint4 + a (scale, min) pair per
# group, f16x2, or q4_0's one f16 scale) and the group G of inputs sharing a scale (0: per channel,
# the whole row)
FORMAT_KIND = {"q8": "q8", "q8_0": "q8", "q8pc": "q8", "q8g16": "q8", "q4": "q4", "q4_0": "q4", "q4g128": "q4", "q4pc": "q4",
               "e0m4": "q4"}
FORMAT_GROUP = {"q8": 32, "q8_0": 32, "q8pc": 0, "q8g16": 16, "q4": 32, "q4_0": 32, "q4g128": 128, "q4pc": 0, "e0m4": 32}
# formats whose scales are f16, two a word (GGUF Q8_0's and Q4_0's own; the others' are f32 or f16x2 pairs)
HALF_SCALES = ("q8_0", "q4_0")
# formats that hold one GGUF K-quant type's values natively and nothing else: the type each needs
# and its stored bytes per 256 inputs (a super-block)
NATIVE_SOURCE = {"q4k": ("Q4_K", 144), "q5k": ("Q5_K", 176), "q6k": ("Q6_K", 210)}
AS_STORED = ("q5k",)   # of them, those whose buffer is the stored super-blocks, copied (no kernel)


SPLIT_SEP, ROWS_SEP = "|", "*"   # a row-split format: "fmt*rows|fmt*rows..."


def split_format(parts: list[tuple[str, int]]) -> str:
    """The format of a weight whose consecutive row ranges are (format, rows) parts; one part (or
    parts of one format) is that plain format."""
    merged: list[list] = []
    for f, rows in parts:
        if merged and merged[-1][0] == f:
            merged[-1][1] += rows
        else:
            merged.append([f, rows])
    if len(merged) == 1:
        return merged[0][0]
    return SPLIT_SEP.join(f"{f}{ROWS_SEP}{rows}" for f, rows in merged)


def split_parts(fmt: str) -> list[tuple[str, int]] | None:
    """A row-split format's (format, rows) parts in row order; None for a plain format."""
    if SPLIT_SEP not in fmt:
        return None
    parts = []
    for p in fmt.split(SPLIT_SEP):
        f, _, rows = p.partition(ROWS_SEP)
        if f not in FORMATS or f in ("f32", "f16") or not rows.isdigit() or int(rows) <= 0:
            raise UnsupportedModelError(f"weight format {fmt!r}: each row range is a quantized format and a row "
                                        f"count ('q4k*5120|q6k*1024'), not {p!r}")
        parts.append((f, int(rows)))
    return parts


def split_ranges(parts: list[tuple[str, int]]) -> list[tuple[int, str, int, int]]:
    """A row-split weight's ranges as (k, format, first row, rows)."""
    out, row0 = [], 0
    for k, (f, rows) in enumerate(parts):
        out.append((k, f, row0, rows))
        row0 += rows
    return out


def wgsl_by_range(parts: list[tuple[str, int]], row: str, emit, indent: str = "  ") -> list[str]:
    """WGSL lines running emit(k, format, first row) -- range k's statements, reading the row at
    `row - first row` within it -- in the branch of the row range holding `row` (an if / else
    chain, the last range unconditioned)."""
    L = []
    for k, f, row0, rows in split_ranges(parts):
        head = f"if ({row} < {row0 + rows}u) {{" if k < len(parts) - 1 else "{"
        L.append(indent + ("} else " if k else "") + head)
        L += [indent + "  " + line for line in emit(k, f, row0)]
    return L + [indent + "}"]


def format_names(fmt: str) -> list[str]:
    """The plain formats a weight of format fmt holds (a row-split one: its parts')."""
    parts = split_parts(fmt)
    return [f for f, _ in parts] if parts else [fmt]


def group_size(fmt: str, i: int) -> int:
    """Inputs sharing one scale in a quantized weight of i inputs."""
    return FORMAT_GROUP[fmt] or i


def check_format(fmt: str, i: int) -> None:
    """A clear error where a weight of i inputs cannot be held in format fmt."""
    parts = split_parts(fmt)
    if parts:
        for f, _ in parts:
            check_format(f, i)
        return
    if fmt not in FORMATS:
        raise UnsupportedModelError(f"weight format {fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt in FORMAT_KIND and i % 32:
        raise UnsupportedModelError(f"{fmt} weights need the input size to be a multiple of 32, got {i}")
    if fmt in NATIVE_SOURCE and i % 256:
        raise UnsupportedModelError(f"{fmt} weights hold 256-input super-blocks; the input size {i} is not a multiple of 256")


def n_groups(fmt: str, i: int) -> int:
    """Scales per row of a quantized weight of i inputs (the last group may be shorter)."""
    return -(-i // group_size(fmt, i))


def _scale_index(n: str, fmt: str, i: int) -> str:
    """WGSL index of the scale of inputs 4s..4s+3 of row o."""
    ng = n_groups(fmt, i)
    return "o" if ng == 1 else f"o * {ng}u + s / {group_size(fmt, i) // 4}u"


@dataclass
class GPUWeight:
    name: str
    fmt: str
    o: int
    i: int
    buffers: list = field(default_factory=list)      # gpu Buffers, in binding order
    layout: WeightLayout | None = None               # f32 / f16 only
    row0: int = 0                                    # a row shard: rows row0 .. row0+o of the whole matrix
    converted: list = field(default_factory=list, repr=False)   # (row0, rows) ranges converted into it (HALF_SCALES)
    _parts: list = field(default_factory=list, repr=False)      # a row-split weight's parts (parts)

    @property
    def parts(self) -> list[GPUWeight] | None:
        """A row-split weight's row ranges as weights of their own (rows row0.. of this one, its
        buffers in order; the same objects every time, so the converter's bookkeeping holds);
        None for a plain format."""
        sp = split_parts(self.fmt)
        if sp is None:
            return None
        if not self._parts:
            b = 0
            for _, f, row0, rows in split_ranges(sp):
                n = len(buffer_sizes(f, rows, self.i))
                self._parts.append(GPUWeight(f"{self.name}[{row0}:{row0 + rows}]", f, rows, self.i,
                                             self.buffers[b:b + n], row0=row0))
                b += n
        return self._parts

    @property
    def n_bindings(self) -> int:
        return len(buffer_sizes(self.fmt, self.o, self.i, self.layout))

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def wgsl(self, name: str, binding: int, native_f16: bool = False) -> str:
        return weight_accessor_wgsl(name, binding, self.fmt, self.o, self.i, self.layout, native_f16=native_f16)


def buffer_sizes(fmt: str, o: int, i: int, layout: WeightLayout | None = None) -> list[int]:
    """Byte sizes of the buffers a weight of this format and shape needs (a row-split one: its
    parts' buffers in row order)."""
    parts = split_parts(fmt)
    if parts:
        if sum(rows for _, rows in parts) != o:
            raise UnsupportedModelError(f"weight format {fmt!r} splits {sum(r for _, r in parts)} rows; the weight has {o}")
        return [n for f, rows in parts for n in buffer_sizes(f, rows, i)]
    if fmt == "f32":
        return [layout.n_elements * 4]
    if fmt == "f16":
        return [layout.n_elements * 2]
    check_format(fmt, i)
    if fmt == "q6k":
        return [o * (i // 32) * 24, o * (i // 256) * 20]
    if fmt in NATIVE_SOURCE:   # q4k (reordered at load) and q5k: the stored bytes
        return [o * (i // 256) * NATIVE_SOURCE[fmt][1]]
    groups = o * n_groups(fmt, i)
    scales = (groups + 1) // 2 * 4 if fmt in HALF_SCALES else groups * 4
    return [o * i if FORMAT_KIND[fmt] == "q8" else o * i // 2, scales]


def _half_scale(n: str, arr: str, atomic: bool) -> str:
    """WGSL: the f16 scale g of HALF_SCALES' `{n}_{arr}` as f32 (atomic: the converter's view)."""
    word = f"atomicLoad(&{n}_{arr}[g / 2u])" if atomic else f"{n}_{arr}[g / 2u]"
    return f"unpack2x16float({word} >> (16u * (g % 2u))).x"


def _half_decl(n: str, arr: str, binding: int, mode: str, o: int, ng: int, what: str) -> str:
    """A HALF_SCALES scale buffer; written (read_write) by the converter as atomics, two groups
    sharing a word."""
    t = "atomic<u32>" if mode == "read_write" else "u32"
    return (f"@group(0) @binding({binding}) var<storage, {mode}> {n}_{arr}: array<{t}>;   "
            f"// ({o} * {ng} / 2) two f16 scales d a word; {what}\n")


def q8_scale_decl(n: str, binding: int, fmt: str, mode: str, o: int, ng: int) -> str:
    """The scale buffer of a q8-kind weight (o rows of ng groups) and `fn {n}_scl(g) -> f32`,
    group g's scale (g = o * ng + the group)."""
    if fmt in HALF_SCALES:
        return (_half_decl(n, "scale", binding, mode, o, ng, "x = d q")
                + f"fn {n}_scl(g: u32) -> f32 {{ return {_half_scale(n, 'scale', mode == 'read_write')}; }}\n")
    return (f"@group(0) @binding({binding}) var<storage, {mode}> {n}_scale: array<f32>;  // ({o}, {ng})\n"
            f"fn {n}_scl(g: u32) -> f32 {{ return {n}_scale[g]; }}\n")


def q4_sm_decl(n: str, binding: int, fmt: str, mode: str, o: int, ng: int) -> str:
    """The scale buffer of a q4-kind weight (o rows of ng groups) and `fn {n}_pair(g) ->
    vec2<f32>`, group g's (scale, min) (g = o * ng + the group): q4_0's d and -8 d, else the
    stored f16x2 pair."""
    if fmt in HALF_SCALES:
        return (_half_decl(n, "sm", binding, mode, o, ng, "x = d (q - 8)")
                + f"fn {n}_pair(g: u32) -> vec2<f32> {{\n"
                  f"  let d = {_half_scale(n, 'sm', mode == 'read_write')};\n"
                  f"  return vec2<f32>(d, -8.0 * d);\n}}\n")
    return (f"@group(0) @binding({binding}) var<storage, {mode}> {n}_sm: array<u32>;   // ({o}, {ng}) f16x2 "
            f"{'(scale, bias)' if fmt == 'e0m4' else '(scale, min)'}\n"
            f"fn {n}_pair(g: u32) -> vec2<f32> {{ return unpack2x16float({n}_sm[g]); }}\n")


def weight_accessor_wgsl(n: str, binding: int, fmt: str, o: int, i: int,
                         layout: WeightLayout | None, writable: bool = False, native_f16: bool = False) -> str:
    """native_f16 (device specialisation, adapters with shader-f16): f16 weights are read as
    array<vec4<f16>> instead of unpacking u32 pairs; the bytes are the same either way."""
    mode = "read_write" if writable else "read"
    parts = split_parts(fmt)
    if parts:
        return _split_accessor(n, binding, parts, o, i, writable)
    head = f"// {n}: weight ({o} outputs, {i} inputs), format {fmt}\nconst {n}_O: u32 = {o}u; const {n}_I: u32 = {i}u; const {n}_SI: u32 = {slices(i)}u;\n"
    if fmt == "f32":
        return head + layout.wgsl_index(n) + (
            f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<vec4<f32>>;\n"
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{ return {n}_data[{n}_index(o, 4u * s) / 4u]; }}\n")
    if fmt == "f16" and native_f16 and not writable:
        return head + layout.wgsl_index(n) + (
            f"@group(0) @binding({binding}) var<storage, read> {n}_data: array<vec4<f16>>;\n"
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{ return vec4<f32>({n}_data[{n}_index(o, 4u * s) / 4u]); }}\n")
    if fmt == "f16":
        return head + layout.wgsl_index(n) + (
            f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<vec2<u32>>;\n"
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n"
            f"  let p = {n}_data[{n}_index(o, 4u * s) / 4u];\n"
            f"  return vec4<f32>(unpack2x16float(p.x), unpack2x16float(p.y));\n}}\n")
    check_format(fmt, i)
    if fmt == "q5k":
        return head + _q5k_accessor(n, binding, mode, o, i)
    if fmt == "q6k":
        return head + _q6k_accessor(n, binding, mode, o, i)
    if fmt == "q4k":
        return head + _q4k_accessor(n, binding, mode, o, i)
    ng = n_groups(fmt, i)
    sc = _scale_index(n, fmt, i)
    if FORMAT_KIND[fmt] == "q8":
        return head + (
            f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<u32>;   // ({o}, {i // 4}) 4 x int8\n"
            + q8_scale_decl(n, binding + 1, fmt, mode, o, ng) +
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n"
            f"  let w = {n}_data[o * {i // 4}u + s];\n"
            f"  let q = vec4<i32>(i32(w << 24u), i32(w << 16u), i32(w << 8u), i32(w)) >> vec4<u32>(24u);\n"
            f"  return vec4<f32>(q) * {n}_scl({sc});\n}}\n")
    data = (f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<u32>;   // ({o}, {i // 8}) 8 x uint4\n"
            + q4_sm_decl(n, binding + 1, fmt, mode, o, ng) +
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n"
            f"  let w = {n}_data[o * {i // 8}u + s / 2u] >> ((s % 2u) * 16u);\n"
            f"  let sm = {n}_pair({sc});\n")
    if fmt == "e0m4":   # the nibbles as the top 4 fraction bits of 1.0f: 1 + q / 16, two bit operations
        return head + data + (
            "  let f = bitcast<vec4<f32>>((vec4<u32>(w << 19u, w << 15u, w << 11u, w << 7u) & vec4<u32>(0x780000u))\n"
            "                             | vec4<u32>(0x3f800000u));\n"
            "  return f * sm.x + sm.y;\n}\n")
    return head + data + (
        "  let q = vec4<f32>(vec4<u32>(w, w >> 4u, w >> 8u, w >> 12u) & vec4<u32>(15u));\n"
        "  return q * sm.x + sm.y;\n}\n")


def _split_accessor(n: str, binding: int, parts: list[tuple[str, int]], o: int, i: int, writable: bool) -> str:
    """A row-split weight: part k declared as weight `{n}_p{k}` (its bindings after the previous
    parts'), and `{n}_read4(o, s)` reading row o from the part holding it."""
    decls = []
    for k, f, _, rows in split_ranges(parts):
        decls.append(weight_accessor_wgsl(f"{n}_p{k}", binding, f, rows, i, None, writable))
        binding += len(buffer_sizes(f, rows, i))
    body = wgsl_by_range(parts, "o", lambda k, f, row0: [f"return {n}_p{k}_read4(o - {row0}u, s);"])
    return (f"// {n}: weight ({o} outputs, {i} inputs), rows split {'|'.join(f'{f}*{r}' for f, r in parts)}\n"
            f"const {n}_O: u32 = {o}u; const {n}_I: u32 = {i}u; const {n}_SI: u32 = {slices(i)}u;\n"
            + "".join(decls) + f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n" + "\n".join(body) + "\n}\n")


def _q5k_accessor(n: str, binding: int, mode: str, o: int, i: int) -> str:
    """Q5_K super-blocks read in place (ggml's block_q5_K): words 0: d, dmin
    (f16x2); 1..3: the 12 bytes of eight 6-bit (scale, min); 4..11: qh[32], bit b of byte l
    the fifth bit of element 32 b + l; then 128 nibble bytes, byte 32 (j / 64) + j % 32 holding
    element j in its low (j % 64 < 32) or high nibble. Four consecutive inputs share one word."""
    words = NATIVE_SOURCE["q5k"][1] // 4
    qs = 12   # Q5_K: the nibbles after d, dmin, scales and qh
    hi = (f"  let h = {n}_data[blk + 4u + (j % 32u) / 4u] >> (j / 32u);\n"
          f"  let q = vec4<f32>((vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(15u))\n"
          f"                  | ((vec4<u32>(h, h >> 8u, h >> 16u, h >> 24u) & vec4<u32>(1u)) << vec4<u32>(4u)));\n")
    return (
        f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<u32>;   // ({o}, {i // 256}) "
        f"Q5_K super-blocks of {words} words\n"
        f"fn {n}_byte(blk: u32, b: u32) -> u32 {{ return ({n}_data[blk + b / 4u] >> (8u * (b % 4u))) & 0xffu; }}\n"
        f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n"
        f"  let blk = (o * {i // 256}u + s / 64u) * {words}u;\n"
        f"  let j = (4u * s) % 256u;\n"
        f"  let sb = j / 32u;\n"
        f"  var sc = {n}_byte(blk, 4u + sb) & 63u;\n"
        f"  var mn = {n}_byte(blk, 8u + sb) & 63u;\n"
        f"  if (sb >= 4u) {{\n"
        f"    let md = {n}_byte(blk, 8u + sb);\n"
        f"    sc = (md & 15u) | (({n}_byte(blk, sb) >> 6u) << 4u);\n"
        f"    mn = (md >> 4u) | (({n}_byte(blk, 4u + sb) >> 6u) << 4u);\n"
        f"  }}\n"
        f"  let dm = unpack2x16float({n}_data[blk]);\n"
        f"  let w = {n}_data[blk + {qs}u + 8u * (j / 64u) + (j % 32u) / 4u] >> (4u * ((j / 32u) % 2u));\n"
        + hi +
        "  return q * (dm.x * f32(sc)) - dm.y * f32(mn);\n}\n")


def q6k_decl(n: str, binding: int, mode: str, o: int, i: int, word: str = "u32") -> str:
    """q6k's two buffers: data as `word` (u32, or vec2<u32>: a 32-block's 6 words as 3 loads)."""
    per = {"u32": 6, "vec2<u32>": 3}[word]
    return (f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<{word}>;   // ({o}, {i // 32}, {per}) "
            f"Q6_K codes, 32-blocks\n"
            f"@group(0) @binding({binding + 1}) var<storage, {mode}> {n}_sc: array<u32>;   // ({o}, {i // 256}, 5) "
            f"16 int8 scales, d\n")


def q6k_natural_wgsl(n: str) -> str:
    """`fn {n}_nlo(e, o)` / `fn {n}_nhi(e, o) -> u32`: from a q6k block's even / odd code words of
    inputs 8k..8k+7 (q4's order: e = inputs 8k, 8k+2, 8k+4, 8k+6 as bytes, o the odd ones), the
    words of inputs 8k..8k+3 and 8k+4..8k+7 in channel order: a q6k range of a row-split weight
    whose int8 rows are in channel order (with q5k / q8 / q8_0 ranges)."""
    return (f"fn {n}_nlo(e: u32, o: u32) -> u32 {{\n"
            f"  return (e & 0xFFu) | ((o & 0xFFu) << 8u) | ((e & 0xFF00u) << 8u) | ((o & 0xFF00u) << 16u);\n}}\n"
            f"fn {n}_nhi(e: u32, o: u32) -> u32 {{\n"
            f"  return ((e >> 16u) & 0xFFu) | ((o >> 8u) & 0xFF00u) | ((e >> 8u) & 0xFF0000u) | (o & 0xFF000000u);\n}}\n")


def q6k_block_wgsl(n: str) -> str:
    """For the integer-dot kernels: `fn {n}_q6(w, ws, h, hs) -> u32`, four codes as int8 bytes
    (q - 32) from the low nibbles (w >> ws) & 0x0F0F0F0F and the high bit pairs (h >> hs) &
    0x03030303 (v ^ 0x20 is q - 32 as 6-bit two's complement, and its bit 5 times 6 = 0xC0
    sign-extends each byte, no carries); `fn {n}_q6s(blk) -> vec2<f32>`, d x the scales of the
    two 16-input halves of 32-block blk (o * NB + b)."""
    return (f"fn {n}_q6(w: u32, ws: u32, h: u32, hs: u32) -> u32 {{\n"
            f"  let u = (((w >> ws) & 0x0F0F0F0Fu) | (((h >> hs) & 0x03030303u) << 4u)) ^ 0x20202020u;\n"
            f"  return u | ((u & 0x20202020u) * 6u);\n}}\n"
            f"fn {n}_q6s(blk: u32) -> vec2<f32> {{\n"
            f"  let c = {n}_sc[blk / 8u * 5u + (blk % 8u) / 2u] << (16u - 16u * (blk % 2u));\n"
            f"  return bitcast<f32>({n}_sc[blk / 8u * 5u + 4u]) * vec2<f32>(f32(i32(c << 8u) >> 24u), f32(i32(c) >> 24u));\n}}\n")


def q4k_block_wgsl(n: str, vec4s: int = 9) -> str:
    """For the integer-dot kernels (`{n}_data: array<vec4<u32>>`, `vec4s` per super-block, the
    first the header d, dmin, scales[12]: Q4_K's 9, Q5_K's 11): `fn {n}_k4sm(blk) -> vec2<f32>`,
    the (scale, min) pair of 32-block blk (o * NB + b) as q4 has them: (d sc, -dmin m), the 6-bit
    sub-block sc, m unpacked as ggml's get_scale_min_k4 (exact in f32)."""
    return (f"fn {n}_k4sm(blk: u32) -> vec2<f32> {{\n"
            f"  let h = {n}_data[blk / 8u * {vec4s}u];\n"
            f"  let j = blk % 8u;\n"
            f"  let k = 8u * (j % 4u);\n"
            f"  let md = (h.w >> k) & 0xffu;   // j >= 4: byte j + 4\n"
            f"  let sc = select(((h.y >> k) & 63u), (md & 15u) | (((h.y >> (k + 6u)) & 3u) << 4u), j >= 4u);\n"
            f"  let mn = select(((h.z >> k) & 63u), (md >> 4u) | (((h.z >> (k + 6u)) & 3u) << 4u), j >= 4u);\n"
            f"  let dm = unpack2x16float(h.x);\n"
            f"  return vec2<f32>(dm.x * f32(sc), -(dm.y * f32(mn)));\n}}\n")


def q5k_block_wgsl(n: str) -> str:
    """For the integer-dot kernels over Q5_K super-blocks as stored (11 vec4: the header, qh[32]
    in vec4 1-2, qs[128] in 3-10): `fn {n}_q5(w, h, s) -> u32`, the 5-bit codes of four
    consecutive inputs of sub-block s as bytes (natural order), from the qs word w holding their
    nibbles (low half for even s) and the qh word h holding their fifth bits (bit s of each
    byte); and the (d sc, -dmin m) pairs ({n}_k4sm), as Q4_K's."""
    return (f"fn {n}_q5(w: u32, h: u32, s: u32) -> u32 {{\n"
            f"  return ((w >> (4u * (s % 2u))) & 0x0F0F0F0Fu) | (((h >> s) & 0x01010101u) << 4u);\n}}\n"
            + q4k_block_wgsl(n, 11))


def _q4k_accessor(n: str, binding: int, mode: str, o: int, i: int) -> str:
    """read4: inputs 4s..4s+3 of row o from q4k's super-blocks (nibbles in q4's order)."""
    return (f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<vec4<u32>>;   // ({o}, {i // 256}, 9) "
            f"Q4_K super-blocks, each 32-block's nibbles in q4's order\n" + q4k_block_wgsl(n) +
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n"
            f"  let blk = o * {i // 32}u + s / 8u;\n"
            f"  let e = (4u * s) % 32u;\n"
            f"  let w = {n}_data[blk / 8u * 9u + 1u + blk % 8u][e / 8u] >> (4u * (e % 8u));\n"
            f"  let sm = {n}_k4sm(blk);\n"
            f"  return vec4<f32>(vec4<u32>(w, w >> 4u, w >> 8u, w >> 12u) & vec4<u32>(15u)) * sm.x + sm.y;\n}}\n")


def _q6k_accessor(n: str, binding: int, mode: str, o: int, i: int) -> str:
    """read4: inputs 4s..4s+3 (natural order) of row o from q6k's repacked blocks."""
    return q6k_decl(n, binding, mode, o, i) + q6k_block_wgsl(n) + (
        f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n"
        f"  let blk = o * {i // 32}u + s / 8u;   // the 32-block, and inputs e .. e + 3 of it\n"
        f"  let e = (4u * s) % 32u;\n"
        f"  let k = e / 8u;\n"
        f"  let lo = {n}_data[6u * blk + k] >> (4u * (e % 8u));\n"
        f"  let h0 = {n}_data[6u * blk + 4u + k / 2u] >> (2u * ((2u * k) % 4u));       // even inputs e, e + 2\n"
        f"  let h1 = {n}_data[6u * blk + 4u + k / 2u] >> (2u * ((2u * k + 1u) % 4u));  // odd inputs e + 1, e + 3\n"
        f"  let j = (e % 8u) / 2u;   // byte lane of input e\n"
        f"  let q = vec4<u32>(lo, lo >> 4u, lo >> 8u, lo >> 12u) & vec4<u32>(15u);\n"
        f"  let h = vec4<u32>(h0 >> (8u * j), h1 >> (8u * j), h0 >> (8u * j + 8u), h1 >> (8u * j + 8u)) & vec4<u32>(3u);\n"
        f"  return (vec4<f32>(q | (h << vec4<u32>(4u))) - 32.0) * {n}_q6s(blk)[e / 16u];   // d x its half's scale\n}}\n")


# --- block accessors for the wide GEMV (linear_wide.wgsl): one 32/8-element block per call ---

def wide_supported(fmt: str, i: int, layout: WeightLayout | None) -> bool:
    """Whether the block-wise GEMV can read this weight (rows contiguous, whole blocks)."""
    if fmt in ("q4", "q4_0", "q8", "q8_0"):
        return True
    if fmt == "f16":
        return i % 8 == 0 and layout is not None and layout.order[-3:] == ("HWD", "S_I", "I4") and layout.order[1:3] == ("S_O", "O4")
    return False


def wide_slices(fmt: str) -> int:
    """4-channel input slices per block of the wide GEMV: 8 (a 32-value q4 / q8 block) or 2 (8 f16)."""
    return 2 if fmt == "f16" else 8


def wide_input_wgsl(fmt: str) -> str:
    """`struct XB` (the input slices of one block) and `fn x_blk(t, b, ss) -> XB`, read through the
    kernel's `load_xs(t, s, ss)` (with a fused norm: x's squares added to *ss): loaded once per
    block and shared by both weights of a pair
    (gate/up, or RoPE's rotation partners). Fields, not an array (arrays indexed in loops can end
    up in local memory)."""
    k = wide_slices(fmt)
    fields = ", ".join(f"x{j}: vec4<f32>" for j in range(k))
    loads = ", ".join(f"load_xs(t, {k}u * b + {j}u, ss)" for j in range(k))
    return (f"struct XB {{ {fields} }}\n"
            f"fn x_blk(t: u32, b: u32, ss: ptr<function, f32>) -> XB {{ return XB({loads}); }}\n")


def wide_accessor_wgsl(n: str, binding: int, fmt: str, o: int, i: int) -> str:
    """`const {n}_NB` (blocks per row) and `fn {n}_dot(o, b, x: XB) -> f32`: the dot product of
    block b of row o with the block's input slices (wide_input_wgsl's XB). Generated fully
    unrolled, with no arrays: arrays indexed in loops end up in local memory on some drivers
    (measured 20x slower on an H200 through Vulkan)."""
    head = f"// {n}: weight ({o}, {i}) format {fmt}, read a whole block per call\nconst {n}_O: u32 = {o}u;\n"
    sig = f"fn {n}_dot(o: u32, b: u32, x: XB) -> f32 {{\n"
    if fmt in ("q4", "q4_0"):   # 16 bytes of nibbles + (scale, min): sum((d q + m) x) = d sum(q x) + m sum(x)
        body = [f"  let q = {n}_data[o * {n}_NB + b];", f"  let sm = {n}_pair(o * {n}_NB + b);"]
        body += [f"  let x{k} = x.x{k};" for k in range(8)]
        terms = []
        for k, c in enumerate("xyzw"):
            body.append(f"  let w{k} = q.{c};")
            terms.append(f"dot(vec4<f32>(vec4<u32>(w{k}, w{k} >> 4u, w{k} >> 8u, w{k} >> 12u) & vec4<u32>(15u)), x{2 * k})")
            terms.append(f"dot(vec4<f32>(vec4<u32>(w{k} >> 16u, w{k} >> 20u, w{k} >> 24u, w{k} >> 28u) & vec4<u32>(15u)), x{2 * k + 1})")
        body.append("  let acc = " + "\n      + ".join(terms) + ";")
        body.append("  let xs = " + " + ".join(f"x{k}" for k in range(8)) + ";")
        body.append("  return sm.x * acc + sm.y * (xs.x + xs.y + xs.z + xs.w);")
        return head + (f"const {n}_NB: u32 = {i // 32}u;\n"
                       f"@group(0) @binding({binding}) var<storage, read> {n}_data: array<vec4<u32>>;  // ({o}, {i // 32}) blocks\n"
                       + q4_sm_decl(n, binding + 1, fmt, "read", o, i // 32) + sig + "\n".join(body) + "\n}\n")
    if fmt in ("q8", "q8_0"):   # 32 int8 in two vec4<u32>
        body = [f"  let qa = {n}_data[(o * {n}_NB + b) * 2u];", f"  let qb = {n}_data[(o * {n}_NB + b) * 2u + 1u];"]
        terms = []
        for k in range(8):
            w = f"q{'ab'[k // 4]}.{'xyzw'[k % 4]}"
            body.append(f"  let w{k} = {w};")
            terms.append(f"dot(vec4<f32>(vec4<i32>(i32(w{k} << 24u), i32(w{k} << 16u), i32(w{k} << 8u), i32(w{k})) "
                         f">> vec4<u32>(24u)), x.x{k})")
        body.append("  return (" + "\n      + ".join(terms) + f") * {n}_scl(o * {n}_NB + b);")
        return head + (f"const {n}_NB: u32 = {i // 32}u;\n"
                       f"@group(0) @binding({binding}) var<storage, read> {n}_data: array<vec4<u32>>;  // ({o}, {i // 32}, 2)\n"
                       + q8_scale_decl(n, binding + 1, fmt, "read", o, i // 32) + sig + "\n".join(body) + "\n}\n")
    if fmt == "f16":   # row-major (OI layout, I % 8 == 0): 8 halves per block
        return head + (
            f"const {n}_NB: u32 = {i // 8}u;\n"
            f"@group(0) @binding({binding}) var<storage, read> {n}_data: array<vec4<u32>>;  // ({o}, {i // 8}) f16 x8\n"
            + sig +
            f"  let q = {n}_data[o * {n}_NB + b];\n"
            f"  return dot(vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y)), x.x0)\n"
            f"       + dot(vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w)), x.x1);\n}}\n")
    raise UnsupportedModelError(f"the wide GEMV does not read {fmt} weights")
