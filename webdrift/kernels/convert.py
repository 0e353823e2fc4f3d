"""Weight conversion at load, on the GPU (the same path on desktop and in the browser, where
there is no numpy): raw file bytes -> a runtime GPUWeight in the layout its consumer wants.

Supported (source type -> runtime format): F32/F16/BF16/Q8_0/Q4_0/Q4_1 -> f32 or f16 (any
WeightLayout); Q8_0 -> q8 and Q4_0/Q4_1 -> q4 (lossless, bytes re-ordered for the kernels).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..gpu.base import READ, RW, Device
from ..tensor.weight_layout import WeightLayout
from .base import Kernel, ceil_div, grid_1d
from .weights import GPUWeight, buffer_sizes, weight_accessor_wgsl

SOURCE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
LOSSLESS = {"Q8_0": "q8", "Q4_0": "q4", "Q4_1": "q4"}


def default_format(src_type: str) -> str:
    """The runtime format a stored type maps to without loss (BF16 widens to f32)."""
    if src_type in LOSSLESS:
        return LOSSLESS[src_type]
    return {"F32": "f32", "F16": "f16", "BF16": "f32"}.get(src_type, "f32")


class ConvertKernel(Kernel):
    template = "convert"

    def __init__(self, dev: Device, src_type: str, dst: GPUWeight, rows: int, row0: int):
        if src_type not in SOURCE_TYPES:
            raise UnsupportedModelError(f"tensor type {src_type} cannot be converted on the GPU "
                                        f"(supported: {', '.join(SOURCE_TYPES)})")
        if dst.fmt in ("q8", "q4") and LOSSLESS.get(src_type) != dst.fmt:
            raise UnsupportedModelError(f"{src_type} -> {dst.fmt} conversion is not supported")
        units = ceil_div(dst.i, 4) if dst.fmt in ("f32", "f16") else dst.i // 32
        self.grid = grid_1d(ceil_div(rows * units, 64), dev.max_workgroups)
        defines = {
            "SRC": src_type, f"SRC_{src_type}": True,
            "DST_DECL": weight_accessor_wgsl("dst", 1, dst.fmt, dst.o, dst.i, dst.layout, writable=True),
            "DST_FLOAT": dst.fmt in ("f32", "f16"), "DST_F16": dst.fmt == "f16",
            "DST_Q8": dst.fmt == "q8", "DST_Q4": dst.fmt == "q4",
            "ROWS": rows, "COLS": dst.i, "ROW0": row0, "UNITS": units, "NX": self.grid[0],
        }
        super().__init__(dev, defines, (READ,) + (RW,) * dst.n_bindings, f"convert_{src_type}_{dst.fmt}")


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
    row_bytes = n // rows
    limit = max_chunk or min(64 << 20, dev.max_binding_size // 4)
    per = max(1, limit // row_bytes)
    mv = memoryview(raw).cast("B")
    tmp = dev.create_buffer(min(n, per * row_bytes), label=f"raw:{dst.name}")
    for r in range(0, rows, per):
        cnt = min(per, rows - r)
        dev.write_buffer(tmp, mv[r * row_bytes:(r + cnt) * row_bytes])
        k = ConvertKernel(dev, src_type, dst, cnt, row0 + r)
        dev.submit([k.dispatch([(tmp, 0, (cnt * row_bytes + 3) // 4 * 4)] + dst.buffers, k.grid)])
    dev.release_buffer(tmp)
