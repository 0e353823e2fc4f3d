"""K-quant layers kept exactly (issue 14): q4k / q5k hold GGUF Q4_K / Q5_K super-blocks as stored
and the kernels read them natively; q8g16 holds Q6_K's integers (q - 32) with d x the int8
sub-block scale in f32. Checked against gguf-py's dequantization of the same blocks (random bytes
in every field but the f16 super-block scales): every weight value bit for bit (read through the
embedding kernel, which returns w_read4 unchanged), the decode GEMV variants and the prefill GEMM
against numpy on those values, rows concatenated at an offset (Q|K|V), the "exact" format policy,
and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from tests.gpu_util import device, download, random_kquant_blocks, run, upload
from webdrift.errors import InvalidArgumentError, UnsupportedModelError
from webdrift.kernels.convert import allocate_weight, upload_rows
from webdrift.kernels.embedding import EmbeddingKernel
from webdrift.kernels.linear import GemvVariant, LinearKernel
from webdrift.models.manifest import runtime_format
from webdrift.runtime.options import EngineOptions
from webdrift.tensor import TensorDesc

EXACT = [("Q4_K", "q4k"), ("Q5_K", "q5k"), ("Q6_K", "q8g16"), ("Q6_K", "q6k")]


def kquant_weight(src: str, fmt: str, O: int, I: int, seed: int = 0, name: str = "w"):
    blocks = random_kquant_blocks(src, O, I, seed=seed)
    ref = quants.dequantize(blocks, getattr(GGMLQuantizationType, src)).astype(np.float32)
    w = allocate_weight(device(), name, fmt, O, I)
    upload_rows(device(), w, src, blocks.tobytes(), O)
    return w, ref


def read_rows(w, O: int, I: int) -> np.ndarray:
    """Every row of w as the kernels see it (EmbeddingKernel, scale 1: out = w_read4 of the row)."""
    cap = O
    od = TensorDesc("out", I, cap)
    ids = device().create_buffer(4 * cap, label="ids")
    device().write_buffer(ids, np.arange(cap, dtype=np.uint32))
    bufs = {"ids": ids, "w": w.buffers, "out": upload(od, None)}
    run(EmbeddingKernel(device(), w, od), bufs, O)
    return download(od, bufs["out"])[:O]


@pytest.mark.parametrize("src,fmt", EXACT)
@pytest.mark.parametrize("O,I", [(5, 256), (9, 1024)])
def test_values_bit_exact_with_gguf(src, fmt, O, I):
    w, ref = kquant_weight(src, fmt, O, I, seed=O)
    got = read_rows(w, O, I)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    per_row = {"q4k": I // 256 * 144, "q5k": I // 256 * 176, "q8g16": I + I // 16 * 4, "q6k": I // 256 * 212}[fmt]
    assert sum(b.size for b in w.buffers) >= O * per_row


@pytest.mark.parametrize("src,fmt", EXACT)
@pytest.mark.parametrize("stage,T,variant", [
    ("decode", 1, GemvVariant("row", rows=1, wg=64)), ("decode", 2, GemvVariant("split", rows=4, wg=64)),
    ("decode", 1, GemvVariant("subgroup", rows=8, wg=256)), ("prefill", 65, None)])
def test_linear_reads_kquants(src, fmt, stage, T, variant):
    if variant is not None and variant.variant == "subgroup" and not device().has_subgroups:
        pytest.skip("no subgroups on this adapter")   # not counted: row / split cover the format
    w, wref = kquant_weight(src, fmt, 37, 512, seed=3)
    assert_linear_matches(w, wref, stage, T, variant)


def assert_linear_matches(w, wref: np.ndarray, stage: str, T: int, variant) -> None:
    """LinearKernel (stage, variant; None: the prefill GEMM) over weight w on T random rows
    against numpy on w's values wref; the rows past T left as they were."""
    O, I = wref.shape
    x = np.random.default_rng(1).standard_normal((T, I)).astype(np.float32)
    xd, yd = TensorDesc("x", I, 72), TensorDesc("y", O, 72)
    bufs = {"x": upload(xd, x), "y": upload(yd, None, fill=1234.5), "w": w.buffers}
    run(LinearKernel(device(), stage, xd, yd, w, variant=variant or GemvVariant()), bufs, T)
    y = download(yd, bufs["y"])
    ref = x.astype(np.float64) @ wref.T.astype(np.float64)
    np.testing.assert_allclose(y[:T], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max() * 4)
    assert (y[T:] == 1234.5).all()


def kquant_mins(src: str, blocks: np.ndarray, I: int) -> np.ndarray:
    """(O, I / 32) the 32-blocks' additive terms: Q4_K's / Q5_K's -dmin m (the values of codes
    0: the blocks dequantized with every code byte after the 16-byte header zeroed), 0 for Q6_K
    (symmetric)."""
    if src == "Q6_K":
        return np.zeros((len(blocks), I // 32))
    z = blocks.reshape(-1, {"Q4_K": 144, "Q5_K": 176}[src]).copy()
    z[:, 16:] = 0
    t = getattr(GGMLQuantizationType, src)
    return quants.dequantize(z, t).reshape(len(blocks), I // 32, 32)[..., 0].astype(np.float64)


@pytest.mark.parametrize("src,fmt", [("Q4_K", "q4k"), ("Q5_K", "q5k"), ("Q6_K", "q6k")])
@pytest.mark.parametrize("dual", [False, True])
def test_integer_dot_kernels_read_kquants(src, fmt, dual):
    """The int8-activation paths on q4k / q5k / q6k: QuantizeKernel's rows (x packed for the
    format), the integer-dot GEMV (one row and 4 columns) and the int8 prefill GEMM (two tiles)
    against the exact block sums in float64 (sum_b d_x (d sc) sum(q_x q) + (-dmin m) s_x, the
    weights from gguf-py), and the columns bit for bit the one-row kernel's."""
    from tests.test_kernels_gemm_i8 import decode_rows
    from webdrift.kernels.quantize import QuantizeKernel, xq_desc
    dev = device()
    T, O, I, CAP = 6, 37, 768, 8
    x = np.random.default_rng(5).standard_normal((T, I)).astype(np.float32)
    xd, qd, yd = TensorDesc("x", I, CAP), xq_desc("xq", I, CAP), TensorDesc("y", O, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    run(QuantizeKernel(dev, xd, qd, fmt), {"x": xb, "xq": qb}, T)
    vals, d, s, _ = decode_rows(np.frombuffer(dev.read_buffer_sync(qb), np.uint32).reshape(CAP, -1)[:T], I, fmt)
    xdeq = vals * np.repeat(d.astype(np.float64), 32, axis=1)
    refs, ws = [], []
    for k in range(2 if dual else 1):
        blocks = random_kquant_blocks(src, O, I, seed=7 + k)
        w = allocate_weight(dev, f"w{k}", fmt, O, I)
        upload_rows(dev, w, src, blocks.tobytes(), O)
        wd = quants.dequantize(blocks, getattr(GGMLQuantizationType, src)).astype(np.float64)
        m = kquant_mins(src, blocks, I)
        refs.append(xdeq @ (wd - np.repeat(m, 32, axis=1)).T + s.astype(np.float64) @ m.T)
        ws.append(w)
    want = refs[0] * 0.5 * (1 + np.tanh(refs[0] / 2)) * refs[1] if dual else refs[0]   # SiLU(gate) * up
    assert_int8_kernels(qb, qd, yd, T, ws[0], ws[1] if dual else None, want)


def assert_int8_kernels(qb, qd, yd, T: int, w, w2, want: np.ndarray) -> None:
    """The integer-dot GEMV (one row, and 4 columns: bit for bit the one-row kernel's) and the
    int8 prefill GEMM (two tiles) over the int8 rows qb (qd) and weight w (with w2: SiLU(w x) *
    (w2 x)) against `want` (T, O); the rows past T left as they were."""
    from tests.gpu_util import step_buffer, write_step
    from webdrift.kernels.linear import Epilogue, GemmVariant
    dev = device()
    binds = {"step": step_buffer(), "x": qb, "w": w.buffers} | ({"w2": w2.buffers} if w2 is not None else {})
    write_step(T)
    outs = {}
    for name, stage, v in (("blk", "decode", GemvVariant("blk", rows=4, wg=64)),
                           ("cols", "decode", GemvVariant("blk", rows=4, wg=64, cols=4)),
                           ("gemm", "prefill", GemmVariant(int8=True, kstep=2)),
                           ("gemm_db", "prefill", GemmVariant(int8=True, bm=32, bn=32, tm=4, tn=2, kstep=1, double=True))):
        yb = upload(yd, None, fill=1234.5)
        k = LinearKernel(dev, stage, qd, yd, w, w2, variant=v, epilogue=Epilogue(act="silu"))
        dev.submit([k.dispatch(binds | {"y": yb}, k.workgroups(T))])
        outs[name] = download(yd, yb)
        assert (outs[name][T:] == 1234.5).all(), name
        np.testing.assert_allclose(outs[name][:T], want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=name)
    np.testing.assert_array_equal(outs["cols"], outs["blk"])


@pytest.mark.parametrize("src,fmt", [("Q4_K", "q4k"), ("Q6_K", "q6k")])
def test_repacked_in_row_chunks(src, fmt):
    """The formats repacked at load (q4k, q6k) from a tensor uploaded in chunks of 3 rows (as a
    tensor larger than the staging limit goes up): every value bit for bit."""
    O, I = 11, 512
    blocks = random_kquant_blocks(src, O, I, seed=4)
    w = allocate_weight(device(), "w", fmt, O, I)
    upload_rows(device(), w, src, blocks.tobytes(), O, max_chunk=3 * blocks.shape[1])
    ref = quants.dequantize(blocks, getattr(GGMLQuantizationType, src)).astype(np.float32)
    np.testing.assert_array_equal(read_rows(w, O, I).view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("src,fmt", EXACT)
def test_rows_at_an_offset(src, fmt):
    """Two tensors at rows 0 and 4 of one weight (a fused Q|K|V): each row bit for bit."""
    I = 256
    a, b = random_kquant_blocks(src, 4, I, seed=1), random_kquant_blocks(src, 3, I, seed=2)
    qt = getattr(GGMLQuantizationType, src)
    w = allocate_weight(device(), "w", fmt, 7, I)
    upload_rows(device(), w, src, a.tobytes(), 4, 0)
    upload_rows(device(), w, src, b.tobytes(), 3, 4)
    ref = np.concatenate([quants.dequantize(a, qt), quants.dequantize(b, qt)]).astype(np.float32)
    np.testing.assert_array_equal(read_rows(w, 7, I).view(np.uint32), ref.view(np.uint32))


def test_exact_policy():
    """weight_format="exact": each stored type in a format holding it bit for bit."""
    assert runtime_format(["Q4_K"], "exact") == "q4k" and runtime_format(["Q5_K"], "exact") == "q5k"
    assert runtime_format(["Q6_K"], "exact") == "q6k"
    assert runtime_format(["Q5_0", "Q5_0", "Q8_0"], "exact") == "q8_0"    # Gemma 3's Q|K|V
    assert runtime_format(["Q4_1"], "exact") == "q4" and runtime_format(["BF16"], "exact") == "f32"
    assert runtime_format(["Q3_K"], "exact") == "f32" and runtime_format(["Q4_K", "Q6_K"], "exact") == "f32"
    assert EngineOptions(weight_format="exact").weight_format == "exact"
    # a fused Q|K|V of several types with its rows known: each tensor's rows in its own format
    # (runs of one format merged); floats or types without an exact format among them: f32
    assert runtime_format(["Q4_K", "Q4_K", "Q6_K"], "exact", rows=[256, 128, 128]) == "q4k*384|q6k*128"
    assert runtime_format(["Q5_K", "Q5_K", "Q8_0"], "exact", rows=[64, 32, 32]) == "q5k*96|q8_0*32"
    assert runtime_format(["Q4_K", "Q6_K", "Q4_K"], "exact", rows=[8, 8, 8]) == "q4k*8|q6k*8|q4k*8"
    assert runtime_format(["Q4_K", "Q4_K", "Q4_K"], "exact", rows=[8, 8, 8]) == "q4k"
    assert runtime_format(["Q4_K", "F16", "Q6_K"], "exact", rows=[8, 8, 8]) == "f32"
    assert runtime_format(["Q4_K", "Q3_K", "Q6_K"], "exact", rows=[8, 8, 8]) == "f32"
    # the default: row-split where the integer-dot kernels read the mix (one int8 row order), else q8
    assert runtime_format(["Q4_K", "Q4_K", "Q6_K"], rows=[256, 128, 128]) == "q4k*384|q6k*128"
    assert runtime_format(["Q5_K", "Q5_K", "Q6_K"], rows=[256, 128, 128]) == "q5k*384|q6k*128"   # Q5_K_M
    assert runtime_format(["Q4_K", "Q4_K", "Q5_K"], rows=[256, 128, 128]) == "q8"   # two orders
    assert runtime_format(["Q4_K", "Q4_K", "Q6_K"]) == "q8"    # rows unknown


def row_split_weight(parts, I: int, seed: int = 0):
    """A row-split weight of (stored type, runtime format, rows) parts, from random blocks
    (K-quants: random_kquant_blocks; Q4_0 / Q8_0: gguf-py's quantization of normal values),
    each part's rows uploaded on their own; the whole matrix as gguf-py dequantizes it, and its
    32-blocks' additive terms (kquant_mins; Q4_0: -8 d; Q8_0: 0)."""
    from webdrift.kernels.weights import split_format
    rng = np.random.default_rng(seed)
    fmt = split_format([(f, rows) for _, f, rows in parts])
    w = allocate_weight(device(), "wsplit", fmt, sum(rows for *_, rows in parts), I)
    refs, mins, row0 = [], [], 0
    for k, (src, _, rows) in enumerate(parts):
        t = getattr(GGMLQuantizationType, src)
        if src in ("Q4_0", "Q8_0"):
            blocks = quants.quantize(rng.standard_normal((rows, I)).astype(np.float32), t)
            d = blocks.reshape(rows, I // 32, -1)[..., :2].copy().view("<f2")[..., 0].astype(np.float64)
            mins.append(-8.0 * d if src == "Q4_0" else 0.0 * d)
        else:
            blocks = random_kquant_blocks(src, rows, I, seed=seed + k)
            mins.append(kquant_mins(src, blocks, I))
        refs.append(quants.dequantize(blocks, t).astype(np.float32))
        upload_rows(device(), w, src, blocks.tobytes(), rows, row0)
        row0 += rows
    return w, np.concatenate(refs), np.concatenate(mins)


SPLITS = [[("Q4_K", "q4k", 24), ("Q6_K", "q6k", 13)],                       # a Q4_K_M Q|K|V with a Q6_K V
          [("Q6_K", "q6k", 8), ("Q4_K", "q4k", 16), ("Q5_K", "q5k", 9)],    # three ranges
          [("Q4_0", "q4_0", 11), ("Q8_0", "q8_0", 7)]]                       # f16 scales two a word in each


@pytest.mark.parametrize("parts", SPLITS, ids=["q4k|q6k", "q6k|q4k|q5k", "q4_0|q8_0"])
def test_row_split_weight(parts):
    """A row-split weight (a fused Q|K|V whose tensors differ in type): every value bit for bit
    gguf-py's, and the float GEMVs and the prefill GEMM on it against numpy."""
    w, ref, _ = row_split_weight(parts, 512, seed=len(parts))
    O = len(ref)
    np.testing.assert_array_equal(read_rows(w, O, 512).view(np.uint32), ref.view(np.uint32))
    assert [p.fmt for p in w.parts] == [f for _, f, _ in parts] and w.nbytes == sum(p.nbytes for p in w.parts)
    for stage, T, variant in [("decode", 1, GemvVariant("row", rows=1, wg=64)), ("decode", 2, GemvVariant("split", rows=4, wg=64)),
                              ("decode", 1, GemvVariant("subgroup", rows=8, wg=256)), ("prefill", 65, None)]:
        if variant is not None and variant.variant == "subgroup" and not device().has_subgroups:
            continue   # row / split cover the read on adapters without subgroups
        assert_linear_matches(w, ref, stage, T, variant)


@pytest.mark.parametrize("parts,dual", [
    ([("Q4_K", "q4k", 24), ("Q6_K", "q6k", 13)], False),                          # a Q4_K_M Q|K|V
    ([("Q6_K", "q6k", 9), ("Q4_K", "q4k", 16), ("Q4_0", "q4_0", 12)], True),       # three ranges, gate/up
    ([("Q8_0", "q8_0", 21), ("Q5_K", "q5k", 16)], False),
    ([("Q5_K", "q5k", 40), ("Q6_K", "q6k", 13)], False),                          # a Q5_K_M Q|K|V
    ([("Q6_K", "q6k", 9), ("Q8_0", "q8_0", 12), ("Q5_K", "q5k", 16)], True)],      # q6k first, channel order
    ids=["q4k|q6k", "q6k|q4k|q4_0-dual", "q8_0|q5k", "q5k|q6k", "q6k|q8_0|q5k-dual"])
def test_integer_dot_kernels_read_row_split(parts, dual):
    """The integer-dot GEMV (one row, 4 columns) and the int8 GEMM (two tiles) on row-split
    weights whose ranges read the input rows in one order (q4's, or channel order with the q6k
    ranges' words shuffled), against the exact block sums in float64 (as
    test_integer_dot_kernels_read_kquants); q4-order ranges with channel-order ones are refused."""
    from tests.test_kernels_gemm_i8 import decode_rows
    from webdrift.kernels import linear_blk
    from webdrift.kernels.quantize import QuantizeKernel, order_format, xq_desc
    dev = device()
    T, I, CAP = 6, 512, 8
    ws, refs = [], []
    for k in range(2 if dual else 1):
        w, wd, m = row_split_weight(parts, I, seed=11 + 5 * k)
        ws.append((w, wd.astype(np.float64), m))
    O = ws[0][0].o
    x = np.random.default_rng(5).standard_normal((T, I)).astype(np.float32)
    xd, qd, yd = TensorDesc("x", I, CAP), xq_desc("xq", I, CAP), TensorDesc("y", O, CAP)
    xb, qb = upload(xd, x), upload(qd, None)
    fmt = ws[0][0].fmt
    assert linear_blk.supported(fmt, I)
    run(QuantizeKernel(dev, xd, qd, fmt), {"x": xb, "xq": qb}, T)
    vals, d, s, _ = decode_rows(np.frombuffer(dev.read_buffer_sync(qb), np.uint32).reshape(CAP, -1)[:T], I, order_format(fmt))
    xdeq = vals * np.repeat(d.astype(np.float64), 32, axis=1)
    refs = [xdeq @ (wd - np.repeat(m, 32, axis=1)).T + s.astype(np.float64) @ m.T for _, wd, m in ws]
    want = refs[0] * 0.5 * (1 + np.tanh(refs[0] / 2)) * refs[1] if dual else refs[0]   # SiLU(gate) * up
    assert_int8_kernels(qb, qd, yd, T, ws[0][0], ws[1][0] if dual else None, want)
    assert linear_blk.supported("q5k*8|q6k*8", 512) and linear_blk.supported("q6k*8|q8_0*8", 512)
    assert not linear_blk.supported("q5k*8|q4k*8", 512)    # channel order against q4's
    assert not linear_blk.supported("q8_0*8|q6k*8|q4_0*8", 512)


def test_row_split_bad_input():
    from webdrift.kernels.weights import buffer_sizes, split_parts
    for bad in ("q4k*8|q9k*8", "q4k*8|f16*8", "q4k*8|q6k", "q4k*8|q6k*0", "q4k*x|q6k*8"):
        with pytest.raises(UnsupportedModelError, match="each row range is a quantized format and a row count"):
            split_parts(bad)
    with pytest.raises(UnsupportedModelError, match="splits 16 rows; the weight has 17"):
        buffer_sizes("q4k*8|q6k*8", 17, 256)
    w = allocate_weight(device(), "w", "q4k*2|q6k*2", 4, 256)
    with pytest.raises(UnsupportedModelError, match=r"rows 1..2 are not within one of its row ranges \(q4k\*2\|q6k\*2\)"):
        upload_rows(device(), w, "Q4_K", b"\0" * (2 * 144), 2, 1)
    with pytest.raises(UnsupportedModelError, match="q6k holds Q6_K super-blocks; this tensor is Q4_K"):
        upload_rows(device(), w, "Q4_K", b"\0" * (2 * 144), 2, 2)


def test_storage_buffers_over_the_adapter_limit(monkeypatch):
    """A kernel binding more storage buffers than the adapter allows per shader stage (a row-split
    weight adds its ranges' buffers; browsers' adapters may offer 8) is a GPULimitError naming
    the kernel and both counts, before any pipeline is made."""
    from webdrift.errors import GPULimitError
    from webdrift.kernels.linear import LinearKernel
    w = allocate_weight(device(), "w", "q4k*2|q6k*2", 4, 256)
    xd, yd = TensorDesc("x", 256, 2), TensorDesc("y", 4, 2)
    LinearKernel(device(), "decode", xd, yd, w, variant=GemvVariant("row", rows=1, wg=64))   # x, y, 3 weight buffers
    monkeypatch.setitem(device().info.limits, "max-storage-buffers-per-shader-stage", 4)
    with pytest.raises(GPULimitError, match=r"kernel 'linear_row_q4k\*2\|q6k\*2' binds 5 storage buffers; the adapter allows 4"):
        LinearKernel(device(), "decode", xd, yd, w, variant=GemvVariant("row", rows=1, wg=64))


def test_kquant_bad_input():
    with pytest.raises(UnsupportedModelError, match="q4k holds Q4_K super-blocks; this tensor is Q4_0"):
        w = allocate_weight(device(), "w", "q4k", 2, 256)
        upload_rows(device(), w, "Q4_0", b"\0" * (2 * 8 * 18), 2)
    with pytest.raises(UnsupportedModelError, match="q5k weights hold 256-input super-blocks; the input size 640"):
        allocate_weight(device(), "w", "q5k", 2, 640)
    with pytest.raises(UnsupportedModelError, match="do not fit q4k rows"):
        w = allocate_weight(device(), "w", "q4k", 2, 256)
        upload_rows(device(), w, "Q4_K", b"\0" * (3 * 144), 3)
    with pytest.raises(UnsupportedModelError, match="q6k holds Q6_K super-blocks; this tensor is Q8_0"):
        w = allocate_weight(device(), "w", "q6k", 2, 256)
        upload_rows(device(), w, "Q8_0", b"\0" * (2 * 8 * 34), 2)
    with pytest.raises(UnsupportedModelError, match="2 rows of 209 bytes do not fit q6k rows"):
        w = allocate_weight(device(), "w", "q6k", 2, 256)
        upload_rows(device(), w, "Q6_K", b"\0" * (2 * 209), 2)
    with pytest.raises(UnsupportedModelError, match="q6k weights hold 256-input super-blocks; the input size 576"):
        allocate_weight(device(), "w", "q6k", 2, 576)
    with pytest.raises(InvalidArgumentError, match="weight_format='q3k'"):
        EngineOptions(weight_format="q3k")


# -- a whole model of K-quant layers vs transformers (which dequantizes GGUF with gguf-py) ----------

def _kquant_gguf(path, v0: str = "Q4_K", qk0: str = "Q4_K") -> str:
    """A llama GGUF (dim 256, 2 layers, 4 / 2 heads, FFN 512, the tiny model's tokenizer) whose
    matrices are random K-quant blocks: Q|K|V and gate/up Q4_K, O Q5_K, down and the (tied)
    embedding Q6_K; super-block scales small enough for sensible activations. v0: layer 0's V
    type (a Q4_K_M file has Q6_K V on some layers), qk0 its Q and K type (a Q5_K_M file's: Q5_K)."""
    from gguf import GGUFWriter

    from tests.gpu_util import KQUANT_F16_FIELDS
    from tests.tiny_model import CHATML, MERGES, SPECIALS, tiny_tokens
    dim, ffn, heads, kv, layers = 256, 512, 4, 2, 2
    tokens = tiny_tokens()
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(0)

    def kq(name, typ, rows, cols):
        blocks = random_kquant_blocks(typ, rows, cols, seed=int(rng.integers(1 << 30)))
        size, fields = KQUANT_F16_FIELDS[typ]
        b = blocks.reshape(-1, size)
        for f in fields:
            b[:, f:f + 2] = rng.uniform(2e-4, 1.5e-3, len(b)).astype(np.float16).view(np.uint8).reshape(-1, 2)
        w.add_tensor(name, blocks, raw_dtype=getattr(GGMLQuantizationType, typ))

    kq("token_embd.weight", "Q6_K", len(tokens), dim)
    w.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    hd = dim // heads
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(dim, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(dim, np.float32))
        kq(p + "attn_q.weight", qk0 if i == 0 else "Q4_K", heads * hd, dim)
        kq(p + "attn_k.weight", qk0 if i == 0 else "Q4_K", kv * hd, dim)
        kq(p + "attn_v.weight", v0 if i == 0 else "Q4_K", kv * hd, dim)
        kq(p + "attn_output.weight", "Q5_K", dim, heads * hd)
        kq(p + "ffn_gate.weight", "Q4_K", ffn, dim)
        kq(p + "ffn_up.weight", "Q4_K", ffn, dim)
        kq(p + "ffn_down.weight", "Q6_K", dim, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_kquant_model_exact_vs_transformers(tmp_path):
    """weight_format="exact" (q4k, q5k, q6k) gives transformers' fp32 logits on the GGUF's own
    values within 1e-4 of the largest (with an f32 KV cache: the f16 one rounds K and V), every
    matrix re-quantized to q8 two orders of magnitude further off; the default formats are exact's,
    on the float path and with int8 activations."""
    import torch
    from transformers import AutoModelForCausalLM

    import webdrift
    path = _kquant_gguf(tmp_path / "kq.gguf")
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="kq.gguf", dtype=torch.float32).eval()
    ids = np.random.default_rng(1).integers(3, 260, 40).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    exact = webdrift.load(path, max_context=64, weight_format="exact", autotune=False, kv_cache="f32")
    lw = exact.model.layers[0]
    assert (lw.wqkv.fmt, lw.wo.fmt, lw.w_gate.fmt, lw.w_down.fmt, exact.model.output.fmt) == \
        ("q4k", "q5k", "q4k", "q6k", "q6k")
    err = np.abs(exact.logits(ids) - want).max()
    assert err < 1e-4 * np.abs(want).max(), err
    q8 = webdrift.load(path, max_context=64, autotune=False, kv_cache="f32", weight_format="q8")
    qerr = np.abs(q8.logits(ids) - want).max()
    assert qerr > 100 * err          # every matrix re-quantized to q8: on lavapipe 5e-5 vs 0.9 (largest logit 78)
    # the default keeps every K-quant (since session 23 also Q5_K: it was re-quantized to q8),
    # on the float path and with int8 activations (the integer-dot kernels read q4k, q5k, q6k)
    for int8 in (False, True):
        default = webdrift.load(path, max_context=64, autotune=False, kv_cache="f32", int8_activations=int8)
        dl = default.model.layers[0]
        assert (dl.wqkv.fmt, dl.wo.fmt, dl.w_down.fmt, default.model.output.fmt) == ("q4k", "q5k", "q6k", "q6k")
        got = default.logits(ids)
        if not int8:
            np.testing.assert_array_equal(got, exact.logits(ids))
            continue
        # activations rounded to int8 per 32-block: on lavapipe 1.18 of logits up to 78, top-1 40/40
        assert np.abs(got - want).max() < 0.03 * np.abs(want).max()
        assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.95


@pytest.mark.parametrize("fmt,needle", [("q4k", "token_embd: q4k holds Q4_K super-blocks; its tensors are F32"),
                                        ("q6k", "token_embd: q6k holds Q6_K super-blocks; its tensors are F32"),
                                        ("q4g128", None)])
def test_format_not_applicable_is_refused_at_plan(tmp_path, fmt, needle):
    """A format a model's tensors cannot take is refused before any allocation, naming the matrix
    (the tiny model: F32 tensors, 64 inputs)."""
    import webdrift
    from tests.tiny_model import write_tiny_gguf
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    if needle is None:    # q4g128 takes 64-input rows (one short group): it loads
        assert webdrift.load(path, max_context=32, weight_format=fmt, autotune=False).model.layers[0].wo.fmt == fmt
        return
    with pytest.raises(UnsupportedModelError, match=needle):
        webdrift.load(path, max_context=32, weight_format=fmt, autotune=False)
    with pytest.raises(UnsupportedModelError, match="token_embd: q5k holds Q5_K super-blocks"):
        webdrift.load(path, max_context=32, weight_format="q5k", autotune=False)


@pytest.mark.parametrize("qk0", ["Q4_K", "Q5_K"])
def test_kquant_model_row_split_qkv_vs_transformers(tmp_path, qk0):
    """A Q4_K_M-like layer whose V is Q6_K while Q / K are Q4_K (qk0 Q5_K: a Q5_K_M-like one, its
    int8 rows in channel order, the Q6_K range's words shuffled to it; before session 25 the
    default re-quantized it to q8): the default and weight_format=
    "exact" keep each tensor's rows in its own format (a row-split Q|K|V; before session 24 the
    default re-quantized it to q8 and exact widened it to f32) and give transformers' fp32 logits
    within 1e-4 of the largest (the same logits bit for bit); q8 (the old default) further off.
    With int8 activations the integer-dot GEMV (prefill through the GEMVs) and the int8 GEMM read
    the row-split weight and agree (this random model's Q6_K V, its int8 sub-block scales of
    mixed signs, amplifies any rounding of activations: against transformers both are ~20% off
    here, as q8 weights are; the kernels' sums are checked exactly in test_integer_dot_kernels_read_row_split)."""
    import torch
    from transformers import AutoModelForCausalLM

    import webdrift
    path = _kquant_gguf(tmp_path / "kq.gguf", v0="Q6_K", qk0=qk0)
    split = {"Q4_K": "q4k", "Q5_K": "q5k"}[qk0] + "*384|q6k*128"
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="kq.gguf", dtype=torch.float32).eval()
    ids = np.random.default_rng(2).integers(3, 260, 32).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    exact = webdrift.load(path, max_context=64, weight_format="exact", autotune=False, kv_cache="f32")
    assert [lw.wqkv.fmt for lw in exact.model.layers] == [split, "q4k"]
    got = exact.logits(ids)
    err = np.abs(got - want).max()
    assert err < 1e-4 * np.abs(want).max(), err
    default = webdrift.load(path, max_context=64, autotune=False, kv_cache="f32", int8_activations=False)
    assert [lw.wqkv.fmt for lw in default.model.layers] == [split, "q4k"]
    np.testing.assert_array_equal(default.logits(ids), got)
    q8 = webdrift.load(path, max_context=64, autotune=False, kv_cache="f32", weight_format="q8")
    assert q8.model.weight_bytes > default.model.weight_bytes
    assert np.abs(q8.logits(ids) - want).max() > 10 * err
    i8 = {pk: webdrift.load(path, max_context=64, autotune=False, kv_cache="f32", int8_activations=True,
                            prefill_kernels=pk) for pk in ("gemv", "gemm_int8")}
    assert all(e.model.int8_roles["qkv"] for e in i8.values())
    a, b = i8["gemv"].logits(ids), i8["gemm_int8"].logits(ids)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())
