"""Helpers for the GPU kernel tests: one device per process, numpy arrays in and out of a
TensorDesc's physical layout, the step uniform, weights from numpy, and running a kernel.

The layout maths here is written with numpy independently of webdrift (test_kernels_layout.py
checks it against `host_index` element by element), so a wrong accessor cannot hide behind a
wrong upload. Must not: compare kernels with their own earlier outputs.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, quants

from webdrift.gpu.base import UNIFORM
from webdrift.gpu.native import get_device
from webdrift.kernels.convert import allocate_weight, upload_rows
from webdrift.kernels.step import STEP_BYTES, pack_step
from webdrift.tensor import TensorDesc

_step_buffer = None


def device():
    """The process-wide native device (lavapipe on CI machines)."""
    return get_device()


def physical_index(desc: TensorDesc) -> np.ndarray:
    """(B, H, W, C) array: f32 element index of each logical element in desc's storage.

    linear: ((b*H + y)*W + x)*C + c          sliced (HSWBC4): (((y*S + c//4)*W + x)*B + b)*4 + c%4
    """
    b, y, x, c = np.meshgrid(np.arange(desc.b), np.arange(desc.h), np.arange(desc.w), np.arange(desc.c),
                             indexing="ij")
    if desc.layout == "linear":
        return ((b * desc.h + y) * desc.w + x) * desc.c + c
    return (((y * desc.s + c // 4) * desc.w + x) * desc.b + b) * 4 + c % 4


def _as_bwc(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr, np.float32)
    return arr[None] if arr.ndim == 2 else arr


def upload(desc: TensorDesc, arr: np.ndarray | None = None, fill: float = 0.0, buf=None):
    """A buffer holding desc with rows [0, len) of arr ((W', C), or (B, W', C)) and `fill` in
    every other logical element; padding channels of sliced storage stay zero."""
    dev = device()
    flat = np.zeros(desc.nbytes // 4, np.float32)
    idx = physical_index(desc)[:, 0]              # (B, W, C), H = 1 for activations
    flat[idx] = fill
    if arr is not None:
        a = _as_bwc(arr)
        flat[idx[: a.shape[0], : a.shape[1]]] = a
    if buf is None:
        buf = dev.create_buffer(desc.nbytes, label=desc.name)
    dev.write_buffer(buf, flat)
    return buf


def download(desc: TensorDesc, buf, rows: int | None = None, squeeze: bool = True) -> np.ndarray:
    """Rows [0, rows) of desc as (B, rows, C); (rows, C) when B = 1 and squeeze."""
    flat = np.frombuffer(device().read_buffer_sync(buf), np.float32)
    idx = physical_index(desc)[:, 0, : desc.w if rows is None else rows]
    out = flat[idx]
    return out[0] if desc.b == 1 and squeeze else out


def step_buffer():
    global _step_buffer
    if _step_buffer is None:
        _step_buffer = device().create_buffer(STEP_BYTES, UNIFORM, label="step")
    return _step_buffer


def write_step(n_tokens: int, pos0: int = 0, **kw) -> None:
    device().write_buffer(step_buffer(), pack_step(n_tokens, pos0, **kw))


def run(kernel, buffers: dict, t: int, **step) -> None:
    """Write the step uniform for t tokens (pos0, seed, ... in `step`) and dispatch kernel once
    with buffers {binding name: buffer} (the "step" binding added here)."""
    write_step(t, **step)
    device().submit([kernel.dispatch({"step": step_buffer(), **buffers}, kernel.workgroups(t))])


def run_steps(kernel, buffers: dict, steps: list[dict], t: int = 1) -> None:
    """Dispatch kernel once per step uniform in `steps` (pack_step keyword dicts), all in one
    submit: each dispatch binds its own 256-byte slot of one uniform buffer as "step"."""
    dev = device()
    slot = 256                                    # >= every adapter's uniform offset alignment
    blob = bytearray(slot * len(steps))
    for k, kw in enumerate(steps):
        blob[slot * k: slot * k + STEP_BYTES] = pack_step(**kw)
    ub = dev.create_buffer(len(blob), UNIFORM, label="steps")
    dev.write_buffer(ub, bytes(blob))
    dev.submit([kernel.dispatch({"step": (ub, slot * k, STEP_BYTES), **buffers}, kernel.workgroups(t))
                for k in range(len(steps))])
    dev.release_buffer(ub)


def f32_buffer(a: np.ndarray, label: str = ""):
    a = np.ascontiguousarray(a, np.float32)
    buf = device().create_buffer(a.nbytes, label=label)
    device().write_buffer(buf, a)
    return buf


def cache_buffer(a: np.ndarray, f16: bool = False, label: str = ""):
    """A KV cache buffer holding a's values as f32, or with f16 as f16 (kernels/rope.kv_type)."""
    a = np.ascontiguousarray(a, np.float16 if f16 else np.float32)
    buf = device().create_buffer(a.nbytes, label=label)
    device().write_buffer(buf, a)
    return buf


def read_cache(buf, n: int | None = None, f16: bool = False) -> np.ndarray:
    """A cache buffer's values (f16 ones widened) as float32."""
    out = np.frombuffer(device().read_buffer_sync(buf), np.float16 if f16 else np.float32).astype(np.float32)
    return out if n is None else out[:n]


def read_f32(buf, n: int | None = None) -> np.ndarray:
    out = np.frombuffer(device().read_buffer_sync(buf), np.float32)
    return out if n is None else out[:n]


def read_u32(buf, n: int | None = None) -> np.ndarray:
    out = np.frombuffer(device().read_buffer_sync(buf), np.uint32)
    return out if n is None else out[:n]


# -- weights --------------------------------------------------------------------------------

def source_bytes(w: np.ndarray, src_type: str) -> tuple[bytes, np.ndarray]:
    """Raw file bytes of w stored as src_type, and the values they decode to (numpy / gguf)."""
    w = np.ascontiguousarray(w, np.float32)
    if src_type == "F32":
        return w.tobytes(), w
    if src_type == "F16":
        h = w.astype(np.float16)
        return h.tobytes(), h.astype(np.float32)
    if src_type == "BF16":
        b = (w.view(np.uint32) >> 16).astype(np.uint16)     # truncation is a valid bf16 value
        return b.tobytes(), (b.astype(np.uint32) << 16).view(np.float32)
    qt = getattr(GGMLQuantizationType, src_type)
    if src_type in KQUANT_F16_FIELDS:   # gguf-py cannot quantize K-quants: random blocks instead
        q = random_kquant_blocks(src_type, w.shape[0], w.shape[1], seed=int(abs(w).sum() * 1000) % (1 << 31))
    else:
        q = quants.quantize(w, qt)
    return q.tobytes(), quants.dequantize(q, qt).astype(np.float32)


# K-quant block bytes and the offsets of their f16 fields (d, dmin)
KQUANT_F16_FIELDS = {"Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q4_K": (144, (0, 2)),
                     "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}


def random_kquant_blocks(src_type: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """(rows, cols / 256 * block bytes) uint8: every bit random (scales, mins, quants, high bits)
    except the f16 super-block scales, drawn from [0.002, 0.05] so the values stay finite."""
    size, fields = KQUANT_F16_FIELDS[src_type]
    if cols % 256:
        raise ValueError(f"{src_type} rows need a multiple of 256 columns, got {cols}")
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    for off in fields:
        d = rng.uniform(0.002, 0.05, size=b.shape[0]).astype("<f2")
        b[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, -1)


SOURCE_FOR = {"f32": "F32", "f16": "F16", "q8": "Q8_0", "q4": "Q4_1", "q6k": "Q6_K",   # q6k / q4k / q5k: random blocks
              "q4k": "Q4_K", "q5k": "Q5_K", "q4_0": "Q4_0", "q8_0": "Q8_0"}


def make_weight(w: np.ndarray, fmt: str, layout: str = "OI", src_type: str | None = None,
                name: str = "w"):
    """Upload numpy weight w (O, I) in runtime format fmt (through the GPU converter); returns
    (GPUWeight, the dense values the GPU weight holds per numpy/gguf). A row-split fmt: each row
    range from its format's source type."""
    from webdrift.kernels.weights import split_parts
    parts = split_parts(fmt)
    if parts:
        gw = allocate_weight(device(), name, fmt, w.shape[0], w.shape[1], layout)
        refs, row0 = [], 0
        for f, rows in parts:
            raw, ref = source_bytes(w[row0:row0 + rows], SOURCE_FOR[f])
            upload_rows(device(), gw, SOURCE_FOR[f], raw, rows, row0)
            refs.append(ref)
            row0 += rows
        return gw, np.concatenate(refs)
    src = src_type or SOURCE_FOR[fmt]
    raw, ref = source_bytes(w, src)
    if fmt == "f16" and src != "F16":
        ref = ref.astype(np.float16).astype(np.float32)
    gw = allocate_weight(device(), name, fmt, w.shape[0], w.shape[1], layout)
    upload_rows(device(), gw, src, raw, w.shape[0])
    return gw, ref
