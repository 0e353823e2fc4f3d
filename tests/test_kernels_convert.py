"""GPU weight conversion (kernels/convert.py, wgsl/convert.wgsl): raw GGUF / safetensors bytes of
every source type -> every runtime format and weight layout, decoded on the host from the
documented buffer formats and compared with gguf.quants.dequantize / numpy; re-quantization
into q8 / q4 compared with gguf-py's own Q8_0 / Q4_1 quantizers (ggml's reference rounding)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import device, source_bytes
from webdrift.errors import UnsupportedModelError
from webdrift.kernels.convert import SOURCE_TYPES, allocate_weight, upload_rows
from webdrift.models.manifest import runtime_format
from webdrift.tensor.weight_layout import WeightLayout

K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
assert set(SOURCE_TYPES) == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", *K_QUANTS}


def _flat_index(layout: str, o: np.ndarray, i: np.ndarray, n_i: int) -> np.ndarray:
    """Element index of W[o, i] per the documented orders (written here, not taken from webdrift)."""
    si = (n_i + 3) // 4
    if layout == "OI":        # (S_O, O4, S_I, I4): padded rows, row-major
        return o * (4 * si) + i
    assert layout == "OI4O4"  # (S_O, S_I, O4, I4): 4x4 blocks
    return (((o // 4) * si + i // 4) * 4 + o % 4) * 4 + i % 4


def read_dense(w) -> tuple[np.ndarray, np.ndarray | None]:
    """Host decode of a GPUWeight's buffers -> (O, I) float32, plus the padding of float formats."""
    dev = device()
    lay = None
    if w.fmt in ("f32", "f16"):
        lay = "OI" if w.layout.order == WeightLayout.named("OI", 1, 1).order else "OI4O4"
    return decode_buffers(w.fmt, w.o, w.i, [dev.read_buffer_sync(b) for b in w.buffers], lay)


def decode_buffers(fmt: str, O: int, I: int, raw: list[bytes], lay: str | None = "OI"):
    """(O, I) float32 values of runtime buffers `raw` in format fmt (layout lay for floats)."""
    if fmt in ("f32", "f16"):
        flat = np.frombuffer(raw[0], np.float32 if fmt == "f32" else np.float16).astype(np.float32)
        o, i = np.meshgrid(np.arange(O), np.arange(I), indexing="ij")
        dense = flat[_flat_index(lay, o, i, I)]
        # the padded input columns of real rows must hold zeros (kernels read whole slices)
        ip = np.arange(I, 4 * ((I + 3) // 4))
        pad = flat[_flat_index(lay, *np.meshgrid(np.arange(O), ip, indexing="ij"), I)] if ip.size else None
        return dense, pad
    if fmt == "q8":   # data (O, I/4) u32 = int8 bytes in element order; scale (O, I/32) f32
        q = np.frombuffer(raw[0], np.int8)[: O * I].reshape(O, I).astype(np.float32)
        s = np.frombuffer(raw[1], np.float32)[: O * I // 32].reshape(O, I // 32)
        return q * np.repeat(s, 32, axis=1), None
    assert fmt == "q4"  # data (O, I/8) u32, element 8k+n at nibble n of word k; sm (O, I/32) f16x2
    d = np.frombuffer(raw[0], np.uint32)[: O * I // 8].reshape(O, I // 8)
    q = np.stack([(d >> (4 * n)) & 15 for n in range(8)], axis=-1).reshape(O, I).astype(np.float32)
    sm = np.frombuffer(raw[1], np.float16)[: O * I // 16].reshape(O, I // 32, 2).astype(np.float32)
    return q * np.repeat(sm[..., 0], 32, axis=1) + np.repeat(sm[..., 1], 32, axis=1), None


def _convert(src: str, fmt: str, layout: str, O: int, I: int, seed: int = 0):
    x = np.random.default_rng(seed).standard_normal((O, I)).astype(np.float32)
    raw, ref = source_bytes(x, src)
    w = allocate_weight(device(), "w", fmt, O, I, layout)
    upload_rows(device(), w, src, raw, O)
    return w, ref


def _check_float(w, ref, fmt):
    got, pad = read_dense(w)
    if fmt == "f16":   # one f16 rounding of the decoded value (pack2x16float may round either way)
        np.testing.assert_allclose(got, ref, rtol=2.0**-10, atol=1e-7)
    else:
        np.testing.assert_array_equal(got, ref)
    if pad is not None:
        assert not pad.any(), "padding columns must be zero"


@pytest.mark.parametrize("layout", ["OI", "OI4O4"])
@pytest.mark.parametrize("fmt", ["f32", "f16"])
@pytest.mark.parametrize("src", SOURCE_TYPES)
def test_convert_to_float(src, fmt, layout):
    # O not a multiple of 4; I not a multiple of 4 where the source allows it (blocks need 32 / 256)
    O, I = 37, (67 if src in ("F32", "F16", "BF16") else 512 if src in K_QUANTS else 96)
    w, ref = _convert(src, fmt, layout, O, I)
    _check_float(w, ref, fmt)


@pytest.mark.parametrize("src,fmt", [("Q8_0", "q8"), ("Q4_0", "q4"), ("Q4_1", "q4"), ("Q5_0", "q8")])
@pytest.mark.parametrize("shape", [(37, 96), (5, 1536)])
def test_convert_lossless_quant(src, fmt, shape):
    w, ref = _convert(src, fmt, "OI", *shape)
    got, _ = read_dense(w)
    np.testing.assert_array_equal(got, ref)


def test_convert_q4_k_keeps_its_nibbles():
    """Q4_K -> q4: each 32-element sub-block's 6-bit (scale, min) times the super-block's f16
    (d, dmin) becomes the q4 block's f16 (scale, min) and the nibbles stay: the only error is that
    f16 rounding, |err| <= 2^-11 (15 scale + |min|) <= 2^-11 (range + max |x|) per block."""
    O, I = 13, 768
    w, ref = _convert("Q4_K", "q4", "OI", O, I)
    got, _ = read_dense(w)
    blk = ref.reshape(O, -1, 32)
    bound = 2.0**-11 * (np.ptp(blk, axis=2) + np.abs(blk).max(axis=2)) * 1.001 + 1e-9
    err = np.abs(got - ref).reshape(O, -1, 32).max(axis=2)
    assert (err <= bound).all(), float((err / bound).max())
    # the codes are the stored nibbles: element j of a super-block sits in byte 16 + 32 (j / 64)
    # + j % 32 (ggml's block_q4_K), low nibble for the first 32 of each 64
    x = np.random.default_rng(0).standard_normal((O, I)).astype(np.float32)
    raw = np.frombuffer(source_bytes(x, "Q4_K")[0], np.uint8).reshape(-1, 144)
    j = np.arange(256)
    want = (raw[:, 16 + 32 * (j // 64) + j % 32] >> (4 * ((j // 32) % 2))) & 15
    q, _, _ = _runtime_codes(w)
    np.testing.assert_array_equal(q.reshape(-1, 256), want)


def _gguf_codes(x: np.ndarray, kind: str):
    """gguf-py's quantizer (an independent port of ggml's reference): per-32-block codes and
    (scale, min) of x for Q8_0 (kind q8: min 0) or Q4_1 (q4)."""
    from gguf import GGMLQuantizationType, quants
    b = quants.quantize(x, getattr(GGMLQuantizationType, "Q8_0" if kind == "q8" else "Q4_1"))
    b = b.reshape(-1, 34 if kind == "q8" else 20)
    d = b[:, 0:2].copy().view("<f2").astype(np.float32)[:, 0]
    if kind == "q8":
        return b[:, 2:].view(np.int8).astype(np.int32), d, np.zeros_like(d)
    m = b[:, 2:4].copy().view("<f2").astype(np.float32)[:, 0]
    qs = b[:, 4:]
    return np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int32), d, m


def _runtime_codes(w):
    """The q8 / q4 weight's per-32-block codes and (scale, min), decoded from its documented buffers."""
    dev = device()
    raw = [dev.read_buffer_sync(b) for b in w.buffers]
    n = w.o * w.i // 32
    if w.fmt == "q8":
        q = np.frombuffer(raw[0], np.int8)[: w.o * w.i].reshape(n, 32).astype(np.int32)
        d = np.frombuffer(raw[1], np.float32)[:n]
        return q, d, np.zeros_like(d)
    words = np.frombuffer(raw[0], np.uint32)[: w.o * w.i // 8]
    q = np.stack([(words >> (4 * k)) & 15 for k in range(8)], axis=-1).reshape(n, 32).astype(np.int32)
    sm = np.frombuffer(raw[1], np.float16)[: 2 * n].reshape(n, 2).astype(np.float32)
    return q, sm[:, 0], sm[:, 1]


REQUANT = [(s, "q8") for s in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_1", *K_QUANTS)]
REQUANT += [(s, "q4") for s in ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "Q6_K")]


@pytest.mark.parametrize("src,fmt", REQUANT)
def test_convert_requantizes_like_ggml(src, fmt):
    """Every other (source, q8/q4) pair: decoded on the GPU and re-quantized per 32-block. Codes,
    scales and mins equal gguf-py's Q8_0 / Q4_1 quantization of the decoded source values (q8
    keeps the scale in f32 where Q8_0 rounds it to f16; a code may differ by one where the GPU's
    1/d rounds differently, in at most 0.2% of the elements), and every value is within half a
    step (q8: amax / 254, q4: (max - min) / 30) of the source value."""
    O, I = 11, 512
    w, x = _convert(src, fmt, "OI", O, I, seed=5)
    q, d, m = _runtime_codes(w)
    rq, rd, rm = _gguf_codes(x, fmt)
    if fmt == "q8":
        want_d = np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)
        np.testing.assert_allclose(d, want_d, rtol=2e-7)
        np.testing.assert_allclose(d, rd, rtol=2.0**-11)   # Q8_0's f16 of the same d
    else:
        np.testing.assert_array_equal(d, rd)
        np.testing.assert_array_equal(m, rm)
    diff = np.abs(q - rq)
    assert diff.max() <= 1 and np.count_nonzero(diff) <= 0.002 * q.size, (diff.max(), np.count_nonzero(diff))
    got, _ = read_dense(w)
    blk = x.reshape(O, -1, 32)
    half = (np.abs(blk).max(axis=2) / 254 if fmt == "q8" else np.ptp(blk, axis=2) / 30)
    # q4: + the f16 rounding of (d, min) the format stores
    slack = 1e-6 if fmt == "q8" else 2.0**-11 * (np.ptp(blk, axis=2) + np.abs(blk).min(axis=2) + np.abs(blk).max(axis=2))
    err = np.abs(got - x).reshape(O, -1, 32).max(axis=2)
    assert (err <= half * 1.0001 + slack).all()


def test_runtime_format_rule():
    assert runtime_format(["Q4_K"]) == "q4k" and runtime_format(["Q6_K"]) == "q6k"
    assert runtime_format(["Q5_0", "Q5_0", "Q8_0"]) == "q8_0"   # Gemma 3's Q|K|V: both held as stored
    assert runtime_format(["Q4_0"]) == "q4_0" and runtime_format(["Q8_0"]) == "q8_0"
    assert runtime_format(["Q4_K", "Q4_K", "Q6_K"]) == "q8"     # a Q4_K_M file's Q|K|V where V is Q6_K
    assert runtime_format(["Q4_K", "Q4_0"]) == "q4"
    assert runtime_format(["F16"]) == "f16" and runtime_format(["BF16"]) == "f32"
    assert runtime_format(["F16", "Q8_0"]) == "f32"
    assert runtime_format(["Q6_K", "F32"], "q4") == "q4"


@pytest.mark.parametrize("src,fmt", [("F32", "f16"), ("Q4_0", "q4"), ("Q8_0", "q8")])
def test_convert_row_offset_concatenates(src, fmt):
    """Two tensors uploaded at row0 = 0 and 11 land in one weight (e.g. a fused Q|K|V)."""
    I = 64
    a = np.random.default_rng(1).standard_normal((11, I)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((6, I)).astype(np.float32)
    w = allocate_weight(device(), "w", fmt, 17, I, "OI4O4")
    for x, row0 in ((a, 0), (b, 11)):
        raw, _ = source_bytes(x, src)
        upload_rows(device(), w, src, raw, x.shape[0], row0)
    ref = np.concatenate([source_bytes(a, src)[1], source_bytes(b, src)[1]])
    if fmt == "f16":
        _check_float(w, ref, fmt)
    else:
        np.testing.assert_array_equal(read_dense(w)[0], ref)


class _SmallGridDevice:
    """The real device with a tiny workgroup limit, to exercise the 2-D (x, y) dispatch grid."""
    max_workgroups = 3

    def __init__(self, dev):
        self._dev = dev

    def __getattr__(self, name):
        return getattr(self._dev, name)


@pytest.mark.parametrize("src,fmt", [("F32", "f32"), ("Q4_1", "q4")])
def test_convert_two_dimensional_grid(src, fmt):
    O, I = 29, 64      # f32: 29 * 16 units = 8 workgroups > 3 -> a (3, 3) grid with a ragged end
    x = np.random.default_rng(3).standard_normal((O, I)).astype(np.float32)
    raw, ref = source_bytes(x, src)
    dev = _SmallGridDevice(device())
    w = allocate_weight(dev, "w", fmt, O, I, "OI")
    upload_rows(dev, w, src, raw, O)
    np.testing.assert_array_equal(read_dense(w)[0], ref)


def test_convert_rejects_unsupported():
    w = allocate_weight(device(), "w", "q8", 4, 32, "OI")
    with pytest.raises(UnsupportedModelError, match="IQ2_XS cannot be converted"):
        upload_rows(device(), w, "IQ2_XS", b"\0" * 256, 4)
    with pytest.raises(UnsupportedModelError, match="Q6_K rows hold whole 256-element blocks; w has 32 columns"):
        upload_rows(device(), w, "Q6_K", b"\0" * 840, 4)


def test_quant_formats_need_blocks_of_32():
    with pytest.raises(UnsupportedModelError):
        allocate_weight(device(), "w", "q8", 4, 48)


def test_weight_layout_index_matches_documented_orders():
    for name in ("OI", "OI4O4"):
        lay = WeightLayout.named(name, 7, 13)
        o, i = np.meshgrid(np.arange(7), np.arange(13), indexing="ij")
        got = np.vectorize(lay.index)(o, i)
        np.testing.assert_array_equal(got, _flat_index(name, o, i, 13))
        assert lay.n_elements == 8 * 16


def test_upload_in_row_chunks_matches_whole():
    """A tensor converted in small row chunks (as large embeddings are) equals the one-shot result."""
    import numpy as np

    from tests.gpu_util import device, source_bytes
    from webdrift.kernels.convert import allocate_weight, upload_rows
    w = np.random.default_rng(3).standard_normal((37, 96)).astype(np.float32)
    for src, fmt in [("Q4_1", "q4"), ("Q8_0", "q8"), ("F16", "f16")]:
        raw, _ = source_bytes(w, src)
        whole = allocate_weight(device(), "whole", fmt, 37, 96)
        upload_rows(device(), whole, src, raw, 37)
        parts = allocate_weight(device(), "parts", fmt, 37, 96)
        upload_rows(device(), parts, src, raw, 37, max_chunk=5 * len(raw) // 37)   # 5 rows per chunk
        for a, b in zip(whole.buffers, parts.buffers):
            assert device().read_buffer_sync(a) == device().read_buffer_sync(b)
