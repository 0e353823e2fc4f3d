"""Weight conversion at load, on the GPU (the same path on desktop and in the browser, where
there is no numpy): raw file bytes -> a runtime GPUWeight in the layout its consumer wants.

Every stored type the core reads converts to every runtime format (f32, f16 in any WeightLayout;
q8, q8pc, q8g16; q4, q4g128, q4pc; e0m4) but q4k / q5k / q6k, which hold one GGUF type each: Q5_K
super-blocks as stored (copied, no kernel), Q4_K's and Q6_K's bits repacked for the integer-dot
kernels (kernels/weights.py). Q6_K -> q8g16 keeps Q6_K's integers and d x sub-block scale exactly. Into q8 / q4 the integers and scales are kept as they are where the format holds them
(Q8_0, Q5_0 -> q8 and q8_0; Q4_0 -> q4_0; Q4_0, Q4_1, Q4_K -> q4, Q4_K's sub-block scale and min multiplied
out into f16); anything else is decoded and re-quantized per group on the GPU (ggml's Q8_0 / Q4_1
/ Q4_0 rounding for q8 / q4 / q4_0; e0m4: kernels/weights.py), so `weight_format="q4"` on an f16 model, or Gemma's Q6_K tensors, need no host work.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..gpu.base import Device
from ..tensor.weight_layout import WeightLayout
from .base import Kernel, ceil_div, grid_1d
from .bindings import Bindings
from .weights import (
    AS_STORED,
    FORMAT_KIND,
    HALF_SCALES,
    NATIVE_SOURCE,
    GPUWeight,
    buffer_sizes,
    group_size,
    weight_accessor_wgsl,
)

FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = ("Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q4_K", "Q2_K", "Q3_K")
SOURCE_TYPES = FLOAT_TYPES + QUANT_TYPES     # stored types the GPU converter reads
# conversions that keep the stored integers (no re-quantization; Q4_K: f16 rounding of d * scale)
DIRECT = {("Q8_0", "q8"), ("Q5_0", "q8"), ("Q4_0", "q4"), ("Q4_1", "q4"), ("Q4_K", "q4"), ("Q6_K", "q8g16"),
          ("Q6_K", "q6k"), ("Q4_K", "q4k"), ("Q4_0", "q4_0"), ("Q8_0", "q8_0"), ("Q5_0", "q8_0")}
BLOCK_256 = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


class ConvertKernel(Kernel):
    """Raw stored rows -> rows row0 .. row0 + rows of a runtime weight (wgsl/convert.wgsl).
    Bindings:
      raw  the rows' stored bytes as u32 words
      dst  the GPUWeight written (dst.buffers), through its generated accessor
    Dispatch: self.grid."""
    template = "convert"

    def __init__(self, dev: Device, src_type: str, dst: GPUWeight, rows: int, row0: int):
        if src_type not in SOURCE_TYPES:
            raise UnsupportedModelError(f"tensor type {src_type} cannot be converted on the GPU "
                                        f"(supported: {', '.join(SOURCE_TYPES)})")
        if src_type in BLOCK_256 and dst.i % 256:
            raise UnsupportedModelError(f"{src_type} rows hold whole 256-element blocks; {dst.name} has {dst.i} columns")
        kind = FORMAT_KIND.get(dst.fmt, dst.fmt)
        group = group_size(dst.fmt, dst.i) if kind in ("q8", "q4") else 32 if kind in ("q4k", "q6k") else 4
        units = ceil_div(dst.i, 4 if kind in ("f32", "f16") else group)
        self.grid = grid_1d(ceil_div(rows * units, 64), dev.max_workgroups)
        b = Bindings()
        defines = {
            "SRC": src_type, f"SRC_{src_type}": True,
            "RAW_DECL": b.array("raw", "array<u32>", f"({rows} rows of {dst.i} {src_type} elements) stored bytes"),
            "DST_DECL": b.weight("dst", dst, lambda n, k: weight_accessor_wgsl(n, k, dst.fmt, dst.o, dst.i, dst.layout,
                                                                               writable=True), writable=True),
            "DST_FLOAT": dst.fmt in ("f32", "f16"), "DST_F16": dst.fmt == "f16",
            "DST_Q8": kind == "q8", "DST_Q4": kind == "q4", "DST_E0M4": dst.fmt == "e0m4", "DST_HALF": dst.fmt in HALF_SCALES, "DST_Q6K": kind == "q6k", "DST_Q4K": kind == "q4k",
            "Q8_DIRECT": (src_type, dst.fmt) in DIRECT, "Q4_DIRECT": (src_type, dst.fmt) in DIRECT,
            "ROWS": rows, "COLS": dst.i, "ROW0": row0, "UNITS": units, "GROUP": group, "NX": self.grid[0],
        }
        super().__init__(dev, defines, b, f"convert_{src_type}_{dst.fmt}")


def allocate_weight(dev: Device, name: str, fmt: str, o: int, i: int, layout: str = "OI") -> GPUWeight:
    lay = WeightLayout.named(layout, o, i) if fmt in ("f32", "f16") else None
    w = GPUWeight(name, fmt, o, i, layout=lay)
    w.buffers = [dev.create_buffer(n, label=f"{name}.{k}") for k, n in enumerate(buffer_sizes(fmt, o, i, lay))]
    return w


def upload_rows(dev: Device, dst: GPUWeight, src_type: str, raw, rows: int, row0: int = 0,
                max_chunk: int | None = None) -> None:
    """Convert `rows` rows of raw bytes (type src_type, dst.i columns) into dst rows row0..

    Tensors larger than the staging chunk (a quarter of the adapter's binding limit, at most
    64 MiB) go up in whole-row chunks, so a stored tensor never needs a binding of its own size.
    """
    n = len(raw)
    if rows <= 0 or n % rows:
        raise UnsupportedModelError(f"{dst.name}: {n} bytes do not split into {rows} rows")
    if dst.parts is not None:   # a row-split weight: the rows go into the part holding them
        for p in dst.parts:
            if p.row0 <= row0 and row0 + rows <= p.row0 + p.o:
                return upload_rows(dev, p, src_type, raw, rows, row0 - p.row0, max_chunk)
        raise UnsupportedModelError(f"{dst.name}: rows {row0}..{row0 + rows - 1} are not within one of its row "
                                    f"ranges ({dst.fmt})")
    row_bytes = n // rows
    if dst.fmt in NATIVE_SOURCE:
        want, block_bytes = NATIVE_SOURCE[dst.fmt]
        if src_type != want:
            raise UnsupportedModelError(f"{dst.name}: {dst.fmt} holds {want} super-blocks; this tensor is {src_type} "
                                        "(use q4 / q8 or a float format to convert it)")
        if row_bytes != dst.i // 256 * block_bytes or row0 + rows > dst.o:
            raise UnsupportedModelError(f"{dst.name}: {rows} rows of {row_bytes} bytes do not fit {dst.fmt} rows "
                                        f"{row0}.. of {dst.i} inputs")
    if dst.fmt in HALF_SCALES:   # scales OR-ed into words that start zeroed: each row converted once
        if any(r0 < row0 + rows and row0 < r0 + n for r0, n in dst.converted):
            raise ValueError(f"{dst.name}: rows {row0}..{row0 + rows - 1} were converted into this {dst.fmt} "
                             "weight already (its f16 scales are OR-ed into zeroed words: allocate a new one)")
        dst.converted.append((row0, rows))
    if dst.fmt in AS_STORED:   # the super-blocks as stored, rows row0.. of the one buffer
        dev.write_buffer(dst.buffers[0], raw, row0 * row_bytes)
        return
    limit = max_chunk or min(64 << 20, dev.max_binding_size // 4)
    per = max(1, limit // row_bytes)
    mv = memoryview(raw).cast("B")
    tmp = dev.create_buffer(min(n, per * row_bytes), label=f"raw:{dst.name}")
    for r in range(0, rows, per):
        cnt = min(per, rows - r)
        dev.write_buffer(tmp, mv[r * row_bytes:(r + cnt) * row_bytes])
        k = ConvertKernel(dev, src_type, dst, cnt, row0 + r)
        dev.submit([k.dispatch({"raw": (tmp, 0, (cnt * row_bytes + 3) // 4 * 4), "dst": dst.buffers}, k.grid)])
    dev.release_buffer(tmp)
