"""Tensor virtualization (ML Drift): logical tensors vs their physical GPU realizations.

A *logical* tensor has BHWC sizes (an LLM activation: B = 1, H = 1, W = tokens, C = channels);
a *physical* storage says how its elements sit in a GPU buffer. Kernels never hand-write index
math: this module emits WGSL accessor functions (`src_read(b, x, y, s) -> vec4<f32>`,
`src_write(...)`) for the storage chosen, and kernel templates call those. Channels are read in
4-channel slices (S = ceil(C/4)); padding channels read as zero and are never written.

Storages for activations (f32):
  linear  - dense BHWC, channel fastest: index = ((b*H + y)*W + x)*C + c   (array<f32>)
  sliced  - ML Drift's HSWBC4: index = ((y*S + s)*W + x)*B + b, one vec4 per slice (array<vec4<f32>>)

Weights of a linear layer (O outputs, I inputs) are laid out as a permutation of ML Drift's
(G, S_O, O4, HWD, S_I, I4) axes (G = HWD = 1 for linear layers); see weight_layout.py.
Must not: import numpy or wgpu (this runs in Pyodide).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError

LAYOUTS = ("linear", "sliced")


def slices(c: int) -> int:
    """S = ceil(C / 4): the number of 4-channel slices."""
    return (c + 3) // 4


@dataclass(frozen=True)
class TensorDesc:
    """A logical activation tensor: BHWC sizes + physical layout.

    For LLM activations: B = 1, H = 1, W = tokens (capacity), C = channels.
    """
    name: str
    c: int
    w: int = 1
    h: int = 1
    b: int = 1
    layout: str = "linear"
    c0: int = 0           # a column view: channels c0 .. c0+c of a tensor with c_total channels
    c_total: int = 0      # (0: not a view, c_total = c)

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise InvalidArgumentError(f"tensor {self.name!r}: layout {self.layout!r} is not one of {LAYOUTS}")
        if self.c_total and (self.c0 + self.c > self.c_total or (self.layout == "sliced" and self.c0 % 4)):
            raise InvalidArgumentError(f"tensor {self.name!r}: columns {self.c0}..{self.c0 + self.c} do not fit "
                                       f"{self.c_total} channels (sliced views start at a multiple of 4)")

    def columns(self, c0: int, c: int) -> TensorDesc:
        """The view of channels c0 .. c0+c of every row (same buffer binding, same rows): e.g. the
        logits a row shard of the LM head writes. Accessors index it with the full row stride."""
        base = self.c_total or self.c
        return TensorDesc(self.name, c=c, w=self.w, h=self.h, b=self.b, layout=self.layout,
                          c0=self.c0 + c0, c_total=base)

    @property
    def s(self) -> int:
        return slices(self.c)

    @property
    def nbytes(self) -> int:
        """Bytes of the physical storage (sliced storage pads C up to 4*S; a view: the whole tensor's)."""
        full = self.c_total or self.c
        c = full if self.layout == "linear" else 4 * slices(full)
        return self.b * self.h * self.w * c * 4


def linear_vec4(t: TensorDesc) -> bool:
    """Whether linear tensor t's rows are whole vec4s (channels, the view's start and its whole row
    multiples of 4), so a read-only view can load 16 bytes at a time (accessor_wgsl's vec4_reads)."""
    return t.c % 4 == 0 and t.c0 % 4 == 0 and (t.c_total or t.c) % 4 == 0


def accessor_wgsl(t: TensorDesc, binding: int, name: str | None = None, writable: bool = True,
                  vec4_reads: bool = False) -> str:
    """WGSL declaration + accessors for tensor t bound at @binding(binding) (kernels declare it
    through kernels/bindings.Bindings.tensor, which numbers it).

    Emits: const {n}_B/_H/_W/_C/_S; fn {n}_read(b, x, y, s) -> vec4<f32>;
    fn {n}_read1(b, x, y, c) -> f32; and, when writable, {n}_write / {n}_write1. The buffer is
    declared as f32 words, so each store is one word: a store to one component of a vec4 in memory
    may write the whole vec4 (WGSL, "Component Reference from Vector Memory View"), a race between
    invocations writing neighbouring channels. vec4_reads (a kernel that only reads t): where its
    slices are whole vec4s in memory (sliced storage; linear where linear_vec4(t)) the buffer is
    declared as vec4s, one 16-byte load a slice, and there are no write accessors (still bound
    `mode`: activations share the arena buffer).
    """
    n = name or t.name
    mode = "read_write" if writable else "read"
    out = [f"// {n}: logical BHWC ({t.b}, {t.h}, {t.w}, {t.c}), S = {t.s}, physical '{t.layout}'",
           f"const {n}_B: u32 = {t.b}u; const {n}_H: u32 = {t.h}u; const {n}_W: u32 = {t.w}u;",
           f"const {n}_C: u32 = {t.c}u; const {n}_S: u32 = {t.s}u;"]
    if t.c_total:   # a column view: rows keep the whole tensor's stride, channels start at c0
        out.append(f"const {n}_C0: u32 = {t.c0}u; const {n}_CT: u32 = {t.c_total}u; const {n}_ST: u32 = "
                   f"{slices(t.c_total)}u;")
    if t.layout == "linear":   # {n}_idx: the f32 word of channel c
        idx = (f"((b * {n}_H + y) * {n}_W + x) * {n}_CT + {n}_C0 + c" if t.c_total
               else f"((b * {n}_H + y) * {n}_W + x) * {n}_C + c")
    else:                      # sliced HSWBC4, {n}_idx: the vec4 of slice s
        idx = (f"((y * {n}_ST + {n}_C0 / 4u + s) * {n}_W + x) * {n}_B + b" if t.c_total
               else f"((y * {n}_S + s) * {n}_W + x) * {n}_B + b")
    if t.layout == "linear" and vec4_reads and linear_vec4(t):
        # a read-only view of rows of whole vec4s: a slice is one 16-byte load, not four scalar
        # loads (no write accessors: a store to one component of a vec4 may write the whole
        # vec4, a race with the invocations writing its other components)
        out += [
            f"@group(0) @binding({binding}) var<storage, {mode}> {n}_buf: array<vec4<f32>>;",
            f"fn {n}_idx(b: u32, x: u32, y: u32, c: u32) -> u32 {{ return {idx}; }}",
            (f"fn {n}_read1(b: u32, x: u32, y: u32, c: u32) -> f32 {{ let i = {n}_idx(b, x, y, c); "
             f"return {n}_buf[i >> 2u][i & 3u]; }}"),
            f"fn {n}_read(b: u32, x: u32, y: u32, s: u32) -> vec4<f32> {{ return {n}_buf[{n}_idx(b, x, y, 4u * s) >> 2u]; }}",
        ]
    elif t.layout == "linear":
        out += [
            f"@group(0) @binding({binding}) var<storage, {mode}> {n}_buf: array<f32>;",
            f"fn {n}_idx(b: u32, x: u32, y: u32, c: u32) -> u32 {{ return {idx}; }}",
            f"fn {n}_read1(b: u32, x: u32, y: u32, c: u32) -> f32 {{ return {n}_buf[{n}_idx(b, x, y, c)]; }}",
            f"fn {n}_read(b: u32, x: u32, y: u32, s: u32) -> vec4<f32> {{",
            f"  let i = {n}_idx(b, x, y, 4u * s);",
        ]
        if t.c % 4 == 0:
            out.append(f"  return vec4<f32>({n}_buf[i], {n}_buf[i + 1u], {n}_buf[i + 2u], {n}_buf[i + 3u]);")
        else:  # the last slice is partial: padding channels read as zero
            out += ["  var v = vec4<f32>(0.0);",
                    f"  for (var k = 0u; k < 4u; k++) {{ if (4u * s + k < {n}_C) {{ v[k] = {n}_buf[i + k]; }} }}",
                    "  return v;"]
        out.append("}")
        if writable:
            out += [
                f"fn {n}_write1(b: u32, x: u32, y: u32, c: u32, v: f32) {{ {n}_buf[{n}_idx(b, x, y, c)] = v; }}",
                f"fn {n}_write(b: u32, x: u32, y: u32, s: u32, v: vec4<f32>) {{",
                f"  let i = {n}_idx(b, x, y, 4u * s);",
                f"  for (var k = 0u; k < 4u; k++) {{ if (4u * s + k < {n}_C) {{ {n}_buf[i + k] = v[k]; }} }}",
                "}",
            ]
    else:  # sliced HSWBC4
        out.append(f"fn {n}_idx(b: u32, x: u32, y: u32, s: u32) -> u32 {{ return {idx}; }}")
        if vec4_reads:   # read-only: one 16-byte load a slice (as linear's vec4 view)
            out += [
                f"@group(0) @binding({binding}) var<storage, {mode}> {n}_buf: array<vec4<f32>>;",
                f"fn {n}_read(b: u32, x: u32, y: u32, s: u32) -> vec4<f32> {{ return {n}_buf[{n}_idx(b, x, y, s)]; }}",
                (f"fn {n}_read1(b: u32, x: u32, y: u32, c: u32) -> f32 {{ return {n}_buf[{n}_idx(b, x, y, c / 4u)]"
                 f"[c % 4u]; }}"),
            ]
        else:   # f32 words (a store to one component of a vec4 may write the whole vec4)
            out += [
                f"@group(0) @binding({binding}) var<storage, {mode}> {n}_buf: array<f32>;",
                f"fn {n}_read(b: u32, x: u32, y: u32, s: u32) -> vec4<f32> {{",
                f"  let i = 4u * {n}_idx(b, x, y, s);",
                f"  return vec4<f32>({n}_buf[i], {n}_buf[i + 1u], {n}_buf[i + 2u], {n}_buf[i + 3u]);",
                "}",
                (f"fn {n}_read1(b: u32, x: u32, y: u32, c: u32) -> f32 {{ return {n}_buf[4u * {n}_idx(b, x, y, c / 4u)"
                 f" + c % 4u]; }}"),
            ]
            if writable:
                out += [
                    f"fn {n}_write(b: u32, x: u32, y: u32, s: u32, v: vec4<f32>) {{",
                    f"  let i = 4u * {n}_idx(b, x, y, s);",   # padding channels written as zero
                    *(f"  {n}_buf[i + {k}u] = select(0.0, v.{'xyzw'[k]}, 4u * s + {k}u < {n}_C);" for k in range(4)),
                    "}",
                    (f"fn {n}_write1(b: u32, x: u32, y: u32, c: u32, v: f32) {{ {n}_buf[4u * {n}_idx(b, x, y, c / 4u)"
                     f" + c % 4u] = v; }}"),
                ]
    return "\n".join(out) + "\n"


# --- host-side packing (used by tests and uploads; pure Python over flat lists/bytes) --------

def host_index(t: TensorDesc, b: int, x: int, y: int, c: int) -> int:
    """Element index (in f32 units) of logical element (b, x, y, c) in t's physical storage."""
    full, c = t.c_total or t.c, c + t.c0
    if t.layout == "linear":
        return ((b * t.h + y) * t.w + x) * full + c
    return (((y * slices(full) + c // 4) * t.w + x) * t.b + b) * 4 + c % 4
