"""webdrift.weights.quant against the independent `gguf` package (gguf.quants), bit for bit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from webdrift.errors import InvalidArgumentError, UnsupportedModelError
from webdrift.weights.gguf import GGUFFile, ggml_type
from webdrift.weights.quant import (
    DEQUANTIZABLE_TYPES,
    dequantize,
    quantize_q4_0,
    quantize_q4_1,
    quantize_q8_0,
)

# byte offsets of the f16 scale fields inside one block, per type (from ggml's block structs)
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}  # fmt: skip
BLOCK_TYPES = list(F16_FIELDS)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _reference(raw: bytes, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    t = ggml_type(type_name)
    arr = np.frombuffer(raw, dtype=np.uint8)
    if type_name == "F32":
        arr = arr.view(np.float32)
    elif type_name == "F16":
        arr = arr.view(np.float16)
    else:
        arr = arr.reshape(-1, shape[-1] // t.block_size * t.type_size)
    return np.asarray(gguf.quants.dequantize(arr, Q[type_name])).reshape(shape)


def _random_blocks(type_name: str, n_blocks: int, rng) -> bytes:
    """Random bytes with finite, realistic f16 scales (random bytes elsewhere cover every code)."""
    t = ggml_type(type_name)
    b = rng.integers(0, 256, size=(n_blocks, t.type_size), dtype=np.uint8)
    for off in F16_FIELDS[type_name]:
        scales = (rng.standard_normal(n_blocks) * 0.05).astype("<f2")
        b[:, off : off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return b.tobytes()


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_dequantize_random_blocks_bit_exact(type_name):
    rng = np.random.default_rng(hash(type_name) % 2**32)
    t = ggml_type(type_name)
    n_blocks = 3000  # several work chunks' worth of rows for the 32-element types
    shape = (6, n_blocks * t.block_size // 6)
    raw = _random_blocks(type_name, n_blocks, rng)
    ours = dequantize(raw, type_name, shape)
    assert ours.dtype == np.float32 and ours.shape == shape
    assert _bits_equal(ours, _reference(raw, type_name, shape))


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_dequantize_arbitrary_bytes(type_name):
    """Whatever the bytes (NaN/inf scales included) the result matches the reference."""
    rng = np.random.default_rng(7)
    t = ggml_type(type_name)
    raw = rng.integers(0, 256, size=64 * t.type_size, dtype=np.uint8).tobytes()
    shape = (64 * t.block_size,)
    with np.errstate(all="ignore"):
        ours = dequantize(raw, type_name, shape)
        ref = _reference(raw, type_name, shape)
    np.testing.assert_array_equal(ours, ref)  # NaN == NaN here


def test_dequantize_float_types():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 48)).astype(np.float32)
    assert _bits_equal(dequantize(x.tobytes(), "F32", x.shape), x)
    h = x.astype(np.float16)
    assert _bits_equal(dequantize(h.tobytes(), "F16", x.shape), h.astype(np.float32))
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated bf16
    ref_bf = np.asarray(gguf.quants.dequantize(bf.view(np.uint8), Q.BF16)).reshape(x.shape)
    assert _bits_equal(dequantize(bf.tobytes(), "BF16", x.shape), ref_bf)
    assert _bits_equal(dequantize(bf.tobytes(), 30, x.shape), ref_bf)  # by ggml type id
    # numpy arrays and memoryviews are accepted as raw too
    assert _bits_equal(dequantize(memoryview(x.tobytes()), "F32", x.shape), x)
    assert _bits_equal(dequantize(np.frombuffer(x.tobytes(), np.uint8), "F32", x.shape), x)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_dequantize_blocks_from_gguf_quantizer(type_name):
    """Realistic blocks (gguf's own quantizer on gaussian data) decode identically."""
    x = np.random.default_rng(11).standard_normal((16, 256)).astype(np.float32)
    raw = np.asarray(gguf.quants.quantize(x, Q[type_name])).tobytes()
    ours = dequantize(raw, type_name, x.shape)
    assert _bits_equal(ours, _reference(raw, type_name, x.shape))
    assert np.abs(ours - x).max() < 0.5  # and they are an approximation of x


def _one_tensor_per_type(path, skip=("token_embd.weight",)):
    g = GGUFFile(path)
    seen = {}
    for name, ti in g.tensors.items():
        if ti.type_name not in seen and name not in skip:
            seen[ti.type_name] = ti
    return g, seen


def test_real_smollm2_tensors(smollm2_gguf_path):
    g, per_type = _one_tensor_per_type(smollm2_gguf_path, skip=())
    assert set(per_type) == {"F32", "Q4_1", "Q8_0"}
    for ti in per_type.values():
        raw = g.raw(ti.name)
        assert _bits_equal(dequantize(raw, ti.type_name, ti.shape), _reference(raw, ti.type_name, ti.shape))


def test_real_gemma3_tensors(gemma3_gguf_path):
    g, per_type = _one_tensor_per_type(gemma3_gguf_path)
    assert {"F32", "Q5_0", "Q4_K", "Q6_K", "Q8_0"} <= set(per_type)
    for ti in per_type.values():
        raw = g.raw(ti.name)
        assert _bits_equal(
            dequantize(raw, ti.type_name, ti.shape), _reference(raw, ti.type_name, ti.shape)
        ), ti


def test_every_declared_type_is_tested():
    assert set(DEQUANTIZABLE_TYPES) == set(BLOCK_TYPES) | {"F32", "F16", "BF16"}


def test_dequantize_errors():
    with pytest.raises(InvalidArgumentError, match="needs 34 bytes, got 33"):
        dequantize(b"\0" * 33, "Q8_0", (32,))
    with pytest.raises(InvalidArgumentError, match="not a multiple of the Q4_K block size 256"):
        dequantize(b"\0" * 144, "Q4_K", (2, 128))
    with pytest.raises(InvalidArgumentError, match="unknown ggml type 'Q9_9'"):
        dequantize(b"", "Q9_9", (1,))
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS"):
        dequantize(b"\0" * 66, "IQ2_XXS", (256,))


# ---------------------------------------------------------------- quantizers


def _quant_inputs():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((12, 128)).astype(np.float32)
    x[0, :32] = 0.0  # all-zero block
    x[1, :32] = 3.25  # constant block
    x[2, :32] = np.linspace(-1, 1, 32)  # exact ties for the rounding
    x[3, :32] = rng.standard_normal(32) * 1e4  # large values
    x[4, :32] = np.repeat([-2.0, 2.0], 16)  # max-magnitude tie: the first one wins
    x[5] *= 1e-6  # tiny values
    return x


@pytest.mark.parametrize(
    ("fn", "type_name"), [(quantize_q8_0, "Q8_0"), (quantize_q4_0, "Q4_0"), (quantize_q4_1, "Q4_1")]
)
def test_quantizers_match_gguf_and_roundtrip(fn, type_name):
    x = _quant_inputs()
    ours = fn(x)
    t = ggml_type(type_name)
    assert ours.dtype == np.uint8 and ours.shape == (12, 128 // 32 * t.type_size)
    np.testing.assert_array_equal(ours, gguf.quants.quantize(x, Q[type_name]))
    # round trip within the format's error bound; storing a scale as f16 adds a relative error h
    # and, for tiny scales (f16 subnormals), an absolute error up to sub
    back = dequantize(ours.tobytes(), type_name, x.shape).reshape(-1, 32)
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(1, keepdims=True)
    lo, hi = blocks.min(1, keepdims=True), blocks.max(1, keepdims=True)
    h, sub = 2.0**-11, 2.0**-25
    if type_name == "Q8_0":  # d = amax/127, |q| <= 127
        bound = amax / 127 * (0.5 + 127 * h) + 127 * sub
    elif type_name == "Q4_0":  # d = -max/8; the opposite extreme clamps from 16 to 15: error up to d
        bound = amax / 8 * (1 + 8 * h) + 8 * sub
    else:  # Q4_1: d = (max - min)/15, m = min
        bound = (hi - lo) / 15 * (0.5 + 15 * h) + np.abs(lo) * h + 16 * sub
    assert np.all(np.abs(back - blocks) <= bound * 1.0001 + 1e-30)


def test_quantizers_keep_leading_shape_and_reject_bad_rows():
    x = np.ones((2, 3, 64), dtype=np.float32)
    assert quantize_q8_0(x).shape == (2, 3, 68)
    assert quantize_q4_1(x[0]).shape == (3, 40)
    with pytest.raises(InvalidArgumentError, match="multiple of 32"):
        quantize_q4_0(np.ones((2, 33), dtype=np.float32))
