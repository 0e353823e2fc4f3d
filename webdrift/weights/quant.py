"""GGML block formats in numpy: dequantization to float32, and a few quantizers for test files.

Desktop only (conversion, reference checks, tests): it needs numpy, which the browser runtime
does not have, so nothing on the run-time path may import this module; GPU kernels dequantize
on the device from the raw bytes instead. Results are bit-exact with ggml's reference C code
(checked against the independent `gguf` package in tests/test_quant.py).

Block layouts (one block = `block_size` consecutive elements of a row; little-endian):
    Q4_0  (32 el, 18 B):  f16 d | u8 qs[16]                 x = d * (q - 8)
    Q4_1  (32 el, 20 B):  f16 d | f16 m | u8 qs[16]         x = d * q + m
    Q5_0  (32 el, 22 B):  f16 d | u32 qh | u8 qs[16]        x = d * ((q | h << 4) - 16)
    Q5_1  (32 el, 24 B):  f16 d | f16 m | u32 qh | u8 qs[16] x = d * (q | h << 4) + m
    Q8_0  (32 el, 34 B):  f16 d | i8 qs[32]                 x = d * q
      4-bit q: element j < 16 is qs[j] & 0xF, element j + 16 is qs[j] >> 4; h = bit j of qh.
    Q2_K  (256 el, 84 B):  u8 scales[16] | u8 qs[64] | f16 d | f16 dmin
    Q3_K  (256 el, 110 B): u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d
    Q4_K  (256 el, 144 B): f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
    Q5_K  (256 el, 176 B): f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
    Q6_K  (256 el, 210 B): u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from webdrift.errors import InvalidArgumentError, UnsupportedModelError
from webdrift.weights.gguf import ggml_type

__all__ = [
    "DEQUANTIZABLE_TYPES",
    "dequantize",
    "quantize_q4_0",
    "quantize_q4_1",
    "quantize_q8_0",
]

_QK_K = 256
# blocks per numpy work chunk: keeps temporaries (several x the float32 output) cache-friendly
_CHUNK_BLOCKS = 1 << 14


def _f16(b: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 -> (n, 1) float32 (little-endian f16)."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., k) uint8 -> (..., 2, k): [..., 0, :] low nibbles, [..., 1, :] high nibbles."""
    return np.stack([qs & 0x0F, qs >> 4], axis=-2)


# ---------------------------------------------------------------- 32-element block formats


def _deq_q4_0(b: np.ndarray, out: np.ndarray) -> None:  # (n, 18) -> out (n, 32)
    d = _f16(b[:, 0:2])
    out[...] = _nibbles(b[:, 2:18]).reshape(-1, 32).astype(np.int8) - np.int8(8)
    out *= d


def _deq_q4_1(b: np.ndarray, out: np.ndarray) -> None:  # (n, 20) -> out (n, 32)
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    out[...] = _nibbles(b[:, 4:20]).reshape(-1, 32)
    out *= d
    out += m


def _q5_high_bits(qh: np.ndarray) -> np.ndarray:  # (n, 4) uint8 -> (n, 32) uint8 of 0/16
    return np.unpackbits(qh, axis=1, bitorder="little") << np.uint8(4)


def _deq_q5_0(b: np.ndarray, out: np.ndarray) -> None:  # (n, 22) -> out (n, 32)
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 6:22]).reshape(-1, 32) | _q5_high_bits(b[:, 2:6])
    out[...] = q.astype(np.int8) - np.int8(16)
    out *= d


def _deq_q5_1(b: np.ndarray, out: np.ndarray) -> None:  # (n, 24) -> out (n, 32)
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    out[...] = _nibbles(b[:, 8:24]).reshape(-1, 32) | _q5_high_bits(b[:, 4:8])
    out *= d
    out += m


def _deq_q8_0(b: np.ndarray, out: np.ndarray) -> None:  # (n, 34) -> out (n, 32)
    d = _f16(b[:, 0:2])
    out[...] = b[:, 2:34].view(np.int8)
    out *= d


# ---------------------------------------------------------------- K-quants (256-element blocks)


def _k4_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K packed 6-bit scales: (n, 12) uint8 -> scales (n, 8), mins (n, 8) as float32.

    bytes 0-3: scale j (low 6 bits), bytes 4-7: min j (low 6 bits), for j < 4; for j >= 4 the
    low 4 bits come from byte j + 4 (scale: low nibble, min: high nibble) and the high 2 bits
    from the top bits of bytes j - 4 (scale) and j (min).
    """
    a, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([a & 0x3F, (md & 0x0F) | ((a >> 6) << 4)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _deq_q4_k(b: np.ndarray, out: np.ndarray) -> None:  # (n, 144) -> out (n, 256)
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k4_scales_mins(b[:, 4:16])
    dl = (d * sc).reshape(n, 8, 1)  # per 32-element sub-block
    ml = (dmin * mn).reshape(n, 8, 1)
    # qs[32*j + l]: low nibble -> sub-block 2j, element l; high nibble -> sub-block 2j+1
    o = out.reshape(n, 8, 32)
    o[...] = _nibbles(b[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32)
    o *= dl
    o -= ml


def _deq_q5_k(b: np.ndarray, out: np.ndarray) -> None:  # (n, 176) -> out (n, 256)
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k4_scales_mins(b[:, 4:16])
    dl = (d * sc).reshape(n, 8, 1)
    ml = (dmin * mn).reshape(n, 8, 1)
    ql = _nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
    # bit s of qh[l] is the 5th bit of element l of sub-block s
    qh = np.unpackbits(b[:, 16:48].reshape(n, 32, 1), axis=2, bitorder="little")  # (n, 32, 8)
    o = out.reshape(n, 8, 32)
    o[...] = ql | (qh.transpose(0, 2, 1) << np.uint8(4))
    o *= dl
    o -= ml


def _deq_q6_k(b: np.ndarray, out: np.ndarray) -> None:  # (n, 210) -> out (n, 256)
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 2, 32)  # [half, which 32-byte run, l]
    qh = b[:, 128:192].reshape(n, 2, 1, 32)  # [half, -, l]
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)  # (n, 16)
    d = _f16(b[:, 208:210])
    # within a half, element 32*k + l (k = 0..3): low nibble of ql[l], of ql[l+32], high nibble
    # of ql[l], of ql[l+32]; its top 2 bits are (qh[l] >> 2k) & 3; scale index 8*half + 2k + l//16
    lo = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # (n, 2, 4, 32)
    hi = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = (lo | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)
    o = out.reshape(n, 16, 16)
    o[...] = q.reshape(n, 16, 16)
    o *= (d * sc).reshape(n, 16, 1)


def _deq_q2_k(b: np.ndarray, out: np.ndarray) -> None:  # (n, 84) -> out (n, 256)
    n = b.shape[0]
    scales = b[:, 0:16]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0x0F).astype(np.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).astype(np.float32)).reshape(n, 16, 1)
    # qs[32*h + l] holds 4 crumbs: bits 2k..2k+1 -> element 128*h + 32*k + l
    qs = b[:, 16:80].reshape(n, 2, 1, 32)
    q = (qs >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    o = out.reshape(n, 16, 16)
    o[...] = q.reshape(n, 16, 16)
    o *= dl
    o -= ml


def _deq_q3_k(b: np.ndarray, out: np.ndarray) -> None:  # (n, 110) -> out (n, 256)
    n = b.shape[0]
    hmask = b[:, 0:32]
    qs = b[:, 32:96]
    s = b[:, 96:108]
    d = _f16(b[:, 108:110])
    # 16 6-bit scales: low 4 bits from bytes 0..7 (low nibbles first, then high nibbles),
    # high 2 bits from bytes 8..11 (crumb k of byte 8 + i for scale 4k + i), biased by 32
    lo = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)
    hi = (s[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)) & 0x03
    sc = (lo | (hi.reshape(n, 16) << np.uint8(4))).astype(np.int8) - np.int8(32)
    dl = (d * sc.astype(np.float32)).reshape(n, 16, 1)
    # element 128*h + 32*k + l: 2 low bits from qs[32*h + l] >> 2k, high bit from bit (4h + k)
    # of hmask[l]; a *clear* mask bit subtracts 4
    ql = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    hb = np.unpackbits(hmask.reshape(n, 32, 1), axis=2, bitorder="little")  # (n, 32, 8)
    hb = hb.transpose(0, 2, 1).reshape(n, 2, 4, 32)
    q = ql.astype(np.int8) - ((hb ^ 1) << np.uint8(2)).astype(np.int8)
    o = out.reshape(n, 16, 16)
    o[...] = q.reshape(n, 16, 16)
    o *= dl


# name -> fn(blocks (n, type_size) uint8, out (n, block_size) float32 C-contiguous)
_BLOCK_DEQUANT: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {
    "Q4_0": _deq_q4_0,
    "Q4_1": _deq_q4_1,
    "Q5_0": _deq_q5_0,
    "Q5_1": _deq_q5_1,
    "Q8_0": _deq_q8_0,
    "Q2_K": _deq_q2_k,
    "Q3_K": _deq_q3_k,
    "Q4_K": _deq_q4_k,
    "Q5_K": _deq_q5_k,
    "Q6_K": _deq_q6_k,
}
DEQUANTIZABLE_TYPES: tuple[str, ...] = ("F32", "F16", "BF16", *_BLOCK_DEQUANT)


def dequantize(
    raw: bytes | bytearray | memoryview | np.ndarray, type_name_or_id: str | int, shape: Sequence[int]
) -> np.ndarray:
    """Decode a tensor's stored bytes to a float32 array of `shape` (numpy order; blocks run
    along the last axis). `raw` must be exactly the tensor's bytes."""
    t = ggml_type(type_name_or_id)
    shape = tuple(int(s) for s in shape)
    if any(s <= 0 for s in shape):
        raise InvalidArgumentError(f"dequantize: shape {shape} has a non-positive dimension")
    n_el = 1
    for s in shape:
        n_el *= s
    if (shape[-1] if shape else 1) % t.block_size:
        raise InvalidArgumentError(
            f"dequantize: last dimension {shape[-1]} of shape {shape} is not a multiple of the "
            f"{t.name} block size {t.block_size}"
        )
    nbytes = n_el // t.block_size * t.type_size
    buf = (
        np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw.view(np.uint8).ravel()
    )
    if buf.size != nbytes:
        raise InvalidArgumentError(
            f"dequantize: {t.name} tensor of shape {shape} needs {nbytes} bytes, got {buf.size}"
        )

    if t.name == "F32":
        return buf.view("<f4").astype(np.float32).reshape(shape)
    if t.name == "F16":
        return buf.view("<f2").astype(np.float32).reshape(shape)
    if t.name == "BF16":
        return (buf.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    fn = _BLOCK_DEQUANT.get(t.name)
    if fn is None:
        raise UnsupportedModelError(
            f"dequantization of ggml type {t.name} is not supported; supported: "
            + ", ".join(DEQUANTIZABLE_TYPES)
        )
    blocks = buf.reshape(-1, t.type_size)  # (n_blocks, type_size)
    out = np.empty((blocks.shape[0], t.block_size), dtype=np.float32)  # (n_blocks, block_size)
    for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        fn(blocks[i : i + _CHUNK_BLOCKS], out[i : i + _CHUNK_BLOCKS])
    return out.reshape(shape)


# ---------------------------------------------------------------- quantizers (ggml *_ref)


def _as_blocks(x: np.ndarray, block: int, fn: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % block:
        raise InvalidArgumentError(f"{fn}: last dimension of shape {x.shape} must be a multiple of {block}")
    return x.reshape(-1, block)


def _out_shape(x: np.ndarray, block: int, type_size: int) -> tuple[int, ...]:
    return (*np.shape(x)[:-1], np.shape(x)[-1] // block * type_size)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:  # (n, 32) uint8 (0..15) -> (n, 16)
    return q[:, :16] | (q[:, 16:] << np.uint8(4))


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float -> Q8_0 bytes as uint8 of shape (*x.shape[:-1], x.shape[-1] // 32 * 34): ggml's
    quantize_row_q8_0_ref bit for bit (d = amax/127, q = roundf(x/d), half away from zero)."""
    b = _as_blocks(x, 32, "quantize_q8_0")
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    v = b * inv
    # C roundf (half away from zero) without the float32 rounding of |v| + 0.5
    a = np.abs(v)
    fl = np.floor(a)
    q = (np.sign(v) * (fl + np.floor(2 * (a - fl)))).astype(np.int8)
    out = np.concatenate([d.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(_out_shape(x, 32, 34))


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """float -> Q4_0 bytes, uint8 of shape (..., cols // 32 * 18); ggml's quantize_row_q4_0_ref:
    d = (value with the largest magnitude) / -8, q = min(15, trunc(x/d + 8.5))."""
    b = _as_blocks(x, 32, "quantize_q4_0")
    imax = np.abs(b).argmax(axis=1)[:, None]
    d = np.take_along_axis(b, imax, axis=1) / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.minimum(np.trunc(b * inv + np.float32(8.5)), 15).astype(np.uint8)
    out = np.concatenate([d.astype("<f2").view(np.uint8), _pack_nibbles(q)], axis=1)
    return out.reshape(_out_shape(x, 32, 18))


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    """float -> Q4_1 bytes, uint8 of shape (..., cols // 32 * 20); ggml's quantize_row_q4_1_ref:
    d = (max - min) / 15, m = min, q = min(15, trunc((x - min)/d + 0.5))."""
    b = _as_blocks(x, 32, "quantize_q4_1")
    lo = b.min(axis=1, keepdims=True)
    hi = b.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.minimum(np.trunc((b - lo) * inv + np.float32(0.5)), 15).astype(np.uint8)
    out = np.concatenate(
        [d.astype("<f2").view(np.uint8), lo.astype("<f2").view(np.uint8), _pack_nibbles(q)], axis=1
    )
    return out.reshape(_out_shape(x, 32, 20))
