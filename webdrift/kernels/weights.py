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
Every format exposes `fn {w}_read4(o: u32, s: u32) -> vec4<f32>`: inputs 4s..4s+3 of row o.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UnsupportedModelError
from ..tensor import slices
from ..tensor.weight_layout import WeightLayout

FORMATS = ("f32", "f16", "q8", "q4")


@dataclass
class GPUWeight:
    name: str
    fmt: str
    o: int
    i: int
    buffers: list = field(default_factory=list)      # gpu Buffers, in binding order
    layout: WeightLayout | None = None               # f32 / f16 only

    @property
    def n_bindings(self) -> int:
        return 1 if self.fmt in ("f32", "f16") else 2

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def wgsl(self, name: str, binding: int) -> str:
        return weight_accessor_wgsl(name, binding, self.fmt, self.o, self.i, self.layout)


def buffer_sizes(fmt: str, o: int, i: int, layout: WeightLayout | None = None) -> list[int]:
    """Byte sizes of the buffers a weight of this format and shape needs."""
    if fmt == "f32":
        return [layout.n_elements * 4]
    if fmt == "f16":
        return [layout.n_elements * 2]
    if i % 32:
        raise UnsupportedModelError(f"{fmt} weights need the input size to be a multiple of 32, got {i}")
    if fmt == "q8":
        return [o * i, o * (i // 32) * 4]
    if fmt == "q4":
        return [o * i // 2, o * (i // 32) * 4]
    raise UnsupportedModelError(f"weight format {fmt!r} is not one of {FORMATS}")


def weight_accessor_wgsl(n: str, binding: int, fmt: str, o: int, i: int,
                         layout: WeightLayout | None, writable: bool = False) -> str:
    mode = "read_write" if writable else "read"
    head = f"// {n}: weight ({o} outputs, {i} inputs), format {fmt}\nconst {n}_O: u32 = {o}u; const {n}_I: u32 = {i}u; const {n}_SI: u32 = {slices(i)}u;\n"
    if fmt == "f32":
        return head + layout.wgsl_index(n) + (
            f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<vec4<f32>>;\n"
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{ return {n}_data[{n}_index(o, 4u * s) / 4u]; }}\n")
    if fmt == "f16":
        return head + layout.wgsl_index(n) + (
            f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<vec2<u32>>;\n"
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n"
            f"  let p = {n}_data[{n}_index(o, 4u * s) / 4u];\n"
            f"  return vec4<f32>(unpack2x16float(p.x), unpack2x16float(p.y));\n}}\n")
    if fmt == "q8":
        return head + (
            f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<u32>;   // ({o}, {i // 4}) 4 x int8\n"
            f"@group(0) @binding({binding + 1}) var<storage, {mode}> {n}_scale: array<f32>;  // ({o}, {i // 32})\n"
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n"
            f"  let w = {n}_data[o * {i // 4}u + s];\n"
            f"  let q = vec4<i32>(i32(w << 24u), i32(w << 16u), i32(w << 8u), i32(w)) >> vec4<u32>(24u);\n"
            f"  return vec4<f32>(q) * {n}_scale[o * {i // 32}u + s / 8u];\n}}\n")
    if fmt == "q4":
        return head + (
            f"@group(0) @binding({binding}) var<storage, {mode}> {n}_data: array<u32>;   // ({o}, {i // 8}) 8 x uint4\n"
            f"@group(0) @binding({binding + 1}) var<storage, {mode}> {n}_sm: array<u32>;   // ({o}, {i // 32}) f16x2 (scale, min)\n"
            f"fn {n}_read4(o: u32, s: u32) -> vec4<f32> {{\n"
            f"  let w = {n}_data[o * {i // 8}u + s / 2u] >> ((s % 2u) * 16u);\n"
            f"  let q = vec4<f32>(vec4<u32>(w, w >> 4u, w >> 8u, w >> 12u) & vec4<u32>(15u));\n"
            f"  let sm = unpack2x16float({n}_sm[o * {i // 32}u + s / 8u]);\n"
            f"  return q * sm.x + sm.y;\n}}\n")
    raise UnsupportedModelError(f"weight format {fmt!r} is not one of {FORMATS}")
