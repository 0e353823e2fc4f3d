"""q4_0 and q8_0 (kernels/weights.py): GGUF Q4_0 / Q8_0 (and Q5_0) held as they are stored, one
f16 scale d per 32 weights, two scales a word: q4_0 with the zero point 8 implied (x = d (q - 8),
4.5 bits a weight; q4 holds the same values with a (scale, min) pair, 5 bits), q8_0 x = d q (8.5
bits; q8's f32 scale makes 9). Checked against gguf-py (q4_0 below; q8_0 the same checks after it): Q4_0 blocks converted on the GPU give
gguf-py's dequantized values bit for bit (read through the embedding kernel, which returns
w_read4 unchanged), float weights are quantized with ggml's Q4_0 rounding (gguf-py's quantize),
the float GEMV variants and the prefill GEMM against numpy on those values, the integer-dot
GEMV (one row, columns) and the int8 GEMM against the exact block sums, rows whose block count is
odd (two rows share a scale word), tensors uploaded in row chunks, and the format policy."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from tests.gpu_util import device, run, upload
from tests.test_kernels_gemm_i8 import decode_rows
from tests.test_kernels_kquant import assert_int8_kernels, assert_linear_matches, read_rows
from webdrift.kernels.convert import allocate_weight, upload_rows
from webdrift.kernels.linear import GemvVariant
from webdrift.kernels.quantize import QuantizeKernel, xq_desc
from webdrift.kernels.weights import buffer_sizes
from webdrift.models.manifest import runtime_format
from webdrift.tensor import TensorDesc

Q4_0 = GGMLQuantizationType.Q4_0


def q4_0_weight(O: int, I: int, seed: int, chunk_rows: int | None = None):
    """A q4_0 weight from random Q4_0 blocks (gguf-py's quantization of normal values); its
    values per gguf-py, and the blocks."""
    x = np.random.default_rng(seed).standard_normal((O, I)).astype(np.float32)
    blocks = quants.quantize(x, Q4_0)
    w = allocate_weight(device(), "w", "q4_0", O, I)
    upload_rows(device(), w, "Q4_0", blocks.tobytes(), O,
                max_chunk=None if chunk_rows is None else chunk_rows * blocks.shape[1])
    return w, quants.dequantize(blocks, Q4_0).astype(np.float32), blocks


@pytest.mark.parametrize("O,I", [(5, 96), (9, 1024), (3, 32)])
def test_q4_0_values_bit_exact_and_size(O, I):
    """Odd block counts (96: 3 a row) put two rows' scales in one word."""
    w, ref, blocks = q4_0_weight(O, I, seed=O)
    np.testing.assert_array_equal(read_rows(w, O, I).view(np.uint32), ref.view(np.uint32))
    stored = blocks.nbytes                                       # Q4_0: 18 bytes a 32-block
    assert sum(buffer_sizes("q4_0", O, I)) <= stored + 4 < sum(buffer_sizes("q4", O, I))
    assert w.nbytes >= sum(buffer_sizes("q4_0", O, I))


def test_q4_0_uploaded_in_row_chunks():
    O, I = 11, 224                                               # 7 blocks a row: odd
    w, ref, blocks = q4_0_weight(O, I, seed=4, chunk_rows=3)
    np.testing.assert_array_equal(read_rows(w, O, I).view(np.uint32), ref.view(np.uint32))
    # the scales are OR-ed into zeroed words: converting rows into the weight again is refused
    with pytest.raises(ValueError, match="rows 2..3 were converted into this q4_0 weight already"):
        upload_rows(device(), w, "Q4_0", blocks[2:4].tobytes(), 2, row0=2)


@pytest.mark.parametrize("src", ["F32", "F16"])
def test_floats_quantized_like_ggml(src):
    """weight_format="q4_0" on float weights: ggml's quantize_row_q4_0 (d = the value of largest
    magnitude / -8, q = trunc(x / d + 8.5) clamped to 15). The GPU's division may round the
    reciprocal a last bit off, so a code may differ where x / d + 8.5 is within 1e-5 of a whole
    number; every scale and nearly every code is gguf-py's."""
    O, I = 13, 320
    x = np.random.default_rng(2).standard_normal((O, I)).astype(np.float32)
    x[0, :32] = 0.0                                              # an all-zero block: d = 0
    raw = x if src == "F32" else x.astype(np.float16)
    want = quants.dequantize(quants.quantize(raw.astype(np.float32), Q4_0), Q4_0)
    w = allocate_weight(device(), "w", "q4_0", O, I)
    upload_rows(device(), w, src, raw.tobytes(), O)
    got = read_rows(w, O, I)
    xs = raw.astype(np.float32).reshape(O, -1, 32)
    d = np.take_along_axis(xs, np.abs(xs).argmax(-1)[..., None], -1) / -8.0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(d != 0, xs * (1.0 / d) + 8.5, 8.5).reshape(O, I)
    near = np.abs(t - np.round(t)) < 1e-5
    differ = got != want
    assert not (differ & ~near).any()
    assert differ.mean() < 0.01
    assert (got[0, :32] == 0).all()


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
@pytest.mark.parametrize("stage,T,variant", [
    ("decode", 1, GemvVariant("row", rows=1, wg=64)), ("decode", 2, GemvVariant("split", rows=4, wg=64)),
    ("decode", 1, GemvVariant("subgroup", rows=8, wg=256)), ("decode", 3, GemvVariant("wide", rows=4, wg=64)),
    ("decode", 1, GemvVariant("wide", rows=8, wg=128, mrows=2, ksplit=True)), ("prefill", 65, None)])
def test_float_kernels_read_q4_0_q8_0(fmt, stage, T, variant):
    if variant is not None and variant.variant in ("subgroup", "wide") and not device().has_subgroups:
        pytest.skip("no subgroups on this adapter")   # not counted: row / split cover the format
    w, wref, _ = (q4_0_weight if fmt == "q4_0" else q8_0_weight)(37, 480, seed=3)
    assert_linear_matches(w, wref, stage, T, variant)


@pytest.mark.parametrize("dual", [False, True])
def test_integer_dot_kernels_read_q4_0(dual):
    """QuantizeKernel's rows packed for q4_0, the integer-dot GEMV (one row and 4 columns) and the
    int8 prefill GEMM (two tiles) against the exact block sums in float64 (sum_b d_x d_w
    sum(q_x q_w) - 8 d_w s_x, s_x the block's float sum, as q4's min term), the columns bit for
    bit the one-row kernel's."""
    dev = device()
    T, O, I, CAP = 6, 37, 736, 8                                 # 23 blocks a row: odd
    x = np.random.default_rng(5).standard_normal((T, I)).astype(np.float32)
    xd, qd, yd = TensorDesc("x", I, CAP), xq_desc("xq", I, CAP), TensorDesc("y", O, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    run(QuantizeKernel(dev, xd, qd, "q4_0"), {"x": xb, "xq": qb}, T)
    vals, d, sx, _ = decode_rows(np.frombuffer(dev.read_buffer_sync(qb), np.uint32).reshape(CAP, -1)[:T], I, "q4_0")
    xdeq = vals * np.repeat(d.astype(np.float64), 32, axis=1)
    refs, ws = [], []
    for k in range(2 if dual else 1):
        w, wref, blocks = q4_0_weight(O, I, seed=7 + k)
        m = -8.0 * blocks.reshape(O, -1, 18)[..., :2].copy().view("<f2")[..., 0].astype(np.float64)   # (O, NB)
        refs.append(xdeq @ (wref - np.repeat(m, 32, axis=1)).T + sx.astype(np.float64) @ m.T)
        ws.append(w)
    want = refs[0] * 0.5 * (1 + np.tanh(refs[0] / 2)) * refs[1] if dual else refs[0]   # SiLU(gate) * up
    assert_int8_kernels(qb, qd, yd, T, ws[0], ws[1] if dual else None, want)


def test_format_policy():
    """Q4_0 tensors default to q4_0 (and "exact"); mixed with Q4_1 or Q4_K they share q4, with
    Q8_0 / Q6_K q8."""
    assert runtime_format(["Q4_0"]) == "q4_0" and runtime_format(["Q4_0"], "exact") == "q4_0"
    assert runtime_format(["Q4_0", "Q4_0", "Q4_0"]) == "q4_0"
    assert runtime_format(["Q4_0", "Q4_1"]) == "q4" and runtime_format(["Q4_0", "Q4_K"]) == "q4"
    assert runtime_format(["Q4_0", "Q6_K"]) == "q8" and runtime_format(["Q4_0", "Q8_0"]) == "q8"
    assert runtime_format(["Q4_0"], "q4") == "q4"


# --- q8_0: GGUF Q8_0 (and Q5_0) with its f16 scale, two a word --------------------------------

Q8_0 = GGMLQuantizationType.Q8_0


def q8_0_weight(O: int, I: int, seed: int, src: str = "Q8_0", chunk_rows: int | None = None):
    x = np.random.default_rng(seed).standard_normal((O, I)).astype(np.float32)
    t = getattr(GGMLQuantizationType, src)
    blocks = quants.quantize(x, t)
    w = allocate_weight(device(), "w", "q8_0", O, I)
    upload_rows(device(), w, src, blocks.tobytes(), O,
                max_chunk=None if chunk_rows is None else chunk_rows * blocks.shape[1])
    return w, quants.dequantize(blocks, t).astype(np.float32), blocks


@pytest.mark.parametrize("src", ["Q8_0", "Q5_0"])
@pytest.mark.parametrize("O,I,chunk", [(5, 96, None), (9, 1024, None), (11, 224, 3)])
def test_q8_0_values_bit_exact_and_size(src, O, I, chunk):
    w, ref, _ = q8_0_weight(O, I, seed=O, src=src, chunk_rows=chunk)
    np.testing.assert_array_equal(read_rows(w, O, I).view(np.uint32), ref.view(np.uint32))
    assert sum(buffer_sizes("q8_0", O, I)) <= O * I // 32 * 34 + 4 < sum(buffer_sizes("q8", O, I))


def test_floats_quantized_like_ggml_q8_0():
    """weight_format="q8_0" on float weights: ggml's quantize_row_q8_0 (d = max |x| / 127, q =
    round(x / d), d stored in f16); as for q4_0, a code may differ by one where x / d is within
    1e-5 of a half."""
    O, I = 13, 320
    x = np.random.default_rng(2).standard_normal((O, I)).astype(np.float32)
    x[0, :32] = 0.0
    want = quants.dequantize(quants.quantize(x, Q8_0), Q8_0)
    w = allocate_weight(device(), "w", "q8_0", O, I)
    upload_rows(device(), w, "F32", x.tobytes(), O)
    got = read_rows(w, O, I)
    xs = x.reshape(O, -1, 32)
    d = np.abs(xs).max(-1, keepdims=True) / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(d != 0, xs * (1.0 / d), 0.0).reshape(O, I)
    near = np.abs(np.abs(t - np.trunc(t)) - 0.5) < 1e-5
    differ = got != want
    assert not (differ & ~near).any()
    assert differ.mean() < 0.01 and (got[0, :32] == 0).all()


def test_integer_dot_kernels_read_q8_0():
    """The int8 rows in natural order, the integer-dot GEMV (one row, 4 columns) and the int8
    GEMM against sum_b d_x d_w sum(q_x q_w) in float64."""
    dev = device()
    T, O, I, CAP = 6, 37, 736, 8
    x = np.random.default_rng(5).standard_normal((T, I)).astype(np.float32)
    xd, qd, yd = TensorDesc("x", I, CAP), xq_desc("xq", I, CAP), TensorDesc("y", O, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    run(QuantizeKernel(dev, xd, qd, "q8_0"), {"x": xb, "xq": qb}, T)
    vals, d, _, _ = decode_rows(np.frombuffer(dev.read_buffer_sync(qb), np.uint32).reshape(CAP, -1)[:T], I, "q8_0")
    w, wref, _ = q8_0_weight(O, I, seed=7)
    want = (vals * np.repeat(d.astype(np.float64), 32, axis=1)) @ wref.astype(np.float64).T
    assert_int8_kernels(qb, qd, yd, T, w, None, want)


def test_q8_0_format_policy():
    """Q8_0 and Q5_0 default to q8_0 (and "exact"), also together (Gemma's Q5_0 Q/K with a Q8_0
    V); with other quantized types, q8; Q5_1 / Q5_K are re-quantized to q8."""
    assert runtime_format(["Q8_0"]) == "q8_0" and runtime_format(["Q5_0", "Q5_0", "Q8_0"]) == "q8_0"
    assert runtime_format(["Q8_0"], "exact") == "q8_0" and runtime_format(["Q5_0"], "exact") == "q8_0"
    assert runtime_format(["Q8_0", "Q6_K"]) == "q8" and runtime_format(["Q5_1"]) == "q8"
    assert runtime_format(["Q8_0"], "q8") == "q8"


def test_q4_0_q8_0_model_vs_transformers(tmp_path):
    """The tiny llama as a GGUF of Q4_0 layers with a Q8_0 O projection and embedding / LM head
    (llama.cpp's legacy types; transformers dequantizes them with gguf-py): the default formats
    are q4_0 / q8_0 and give transformers' fp32 logits within 1e-4 of the largest (float path,
    f32 KV cache)."""
    import torch
    from transformers import AutoModelForCausalLM

    import webdrift
    from tests.tiny_model import write_tiny_gguf
    types = {r: "Q4_0" for r in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up", "ffn_down")}
    path = write_tiny_gguf(tmp_path / "legacy.gguf", quant=types | {"attn_output": "Q8_0", "token_embd": "Q8_0"})
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="legacy.gguf", dtype=torch.float32).eval()
    ids = np.random.default_rng(1).integers(3, 260, 40).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    eng = webdrift.load(path, max_context=64, autotune=False, kv_cache="f32", int8_activations=False)
    lw = eng.model.layers[0]
    assert (lw.wqkv.fmt, lw.wo.fmt, lw.w_gate.fmt, lw.w_down.fmt, eng.model.output.fmt) == \
        ("q4_0", "q8_0", "q4_0", "q4_0", "q8_0")
    err = np.abs(eng.logits(ids) - want).max()
    assert err < 1e-4 * np.abs(want).max(), err


@pytest.mark.parametrize("gguf_type,new,old", [("Q4_0", "q4_0", "q4"), ("Q8_0", "q8_0", "q8")])
@pytest.mark.parametrize("int8", [False, True])
def test_same_logits_as_the_wider_formats(tmp_path, gguf_type, new, old, int8):
    """Every matrix of the tiny llama in one legacy type: the default format (q4_0 / q8_0) and the
    one that held it before (q4 with the pair (d, -8 d) / q8 with an f32 scale: the same values)
    give the same logits bit for bit, on the float path and with int8 activations."""
    import webdrift
    from tests.tiny_model import write_tiny_gguf
    roles = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "token_embd")
    path = write_tiny_gguf(tmp_path / "one.gguf", quant={r: gguf_type for r in roles})
    ids = np.random.default_rng(2).integers(3, 260, 24).tolist()
    logits = {}
    for fmt in (None, old):
        eng = webdrift.load(path, max_context=64, autotune=False, int8_activations=int8, weight_format=fmt)
        assert eng.model.layers[0].wqkv.fmt == (fmt or new)
        logits[fmt] = eng.logits(ids)
    np.testing.assert_array_equal(logits[None], logits[old])
