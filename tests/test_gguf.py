"""webdrift.weights.gguf and the GGUF side of webdrift.weights.source.

References: the `gguf` package (GGUFReader, GGUFWriter) for the format, transformers' own GGUF
loading code for what Gemma's stored norm weights mean, and (slow) transformers' logits for the
whole ModelConfig derived from each real file.
"""

from __future__ import annotations

import math
import os
import struct
import time
import tracemalloc

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from webdrift.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError, WebdriftError
from webdrift.weights.gguf import GGML_TYPES, GGUFFile, ggml_type, tensor_nbytes
from webdrift.weights.source import expected_tensor_shapes, open_model_source

# --------------------------------------------------------------------------------------------
# Real files
# --------------------------------------------------------------------------------------------


def test_smollm2_matches_gguf_reader(smollm2_gguf_path):
    ref = gguf.GGUFReader(smollm2_gguf_path)
    g = GGUFFile(smollm2_gguf_path)
    assert g.version == ref.fields["GGUF.version"].contents() == 3
    ref_keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(g.metadata) == ref_keys
    for k in ref_keys:
        f = ref.fields[k]
        assert g.metadata[k] == f.contents(), k
        assert g.metadata_types[k] == int(f.types[0]), k
    assert list(g.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        ti = g.tensors[t.name]
        assert ti.ne == tuple(int(d) for d in t.shape)
        assert ti.shape == tuple(reversed(ti.ne))
        assert ti.ggml_type == int(t.tensor_type)
        assert ti.type_name == t.tensor_type.name
        assert ti.offset == t.data_offset
        assert ti.nbytes == t.n_bytes
    for name in ("blk.0.attn_norm.weight", "blk.0.attn_q.weight", "token_embd.weight"):
        t = next(t for t in ref.tensors if t.name == name)
        assert g.raw(name) == t.data.tobytes()
    assert g.alignment == 32 and g.data_offset % 32 == 0


def test_smollm2_bytes_source_is_identical(smollm2_gguf_path):
    g = GGUFFile(smollm2_gguf_path)
    data = smollm2_gguf_path.read_bytes()
    m = GGUFFile(memoryview(data), name="smollm2.gguf")
    assert m.path_or_name == "smollm2.gguf"
    assert m.metadata == g.metadata and m.tensors == g.tensors
    assert m.raw("blk.3.ffn_up.weight") == g.raw("blk.3.ffn_up.weight")
    assert bytes(m.raw_view("blk.3.ffn_up.weight")) == g.raw("blk.3.ffn_up.weight")


def test_smollm2_tokenizer_metadata_present(smollm2_gguf_path):
    src = open_model_source(smollm2_gguf_path)
    md = src.tokenizer_info["metadata"]
    assert src.tokenizer_info["kind"] == "gguf"
    assert md["tokenizer.ggml.model"] == "gpt2"
    assert len(md["tokenizer.ggml.tokens"]) == 49152 and all(
        isinstance(t, str) for t in md["tokenizer.ggml.tokens"]
    )
    assert len(md["tokenizer.ggml.merges"]) > 40000 and " " in md["tokenizer.ggml.merges"][0]
    assert len(md["tokenizer.ggml.token_type"]) == 49152
    assert isinstance(src.chat_template, str) and "<|im_start|>" in src.chat_template


def test_smollm2_model_source(smollm2_gguf_path):
    t0 = time.perf_counter()
    src = open_model_source(str(smollm2_gguf_path))
    assert time.perf_counter() - t0 < 2.0  # header only, never the 98 MB of weights
    c = src.config
    assert src.format == "gguf" and src.path == str(smollm2_gguf_path)
    assert (c.arch, c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim) == (
        "llama", 49152, 576, 30, 9, 3, 64, 1536,
    )  # fmt: skip
    assert c.rope_style == "interleaved"  # llama.cpp permuted Q/K rows for its RoPE
    assert c.rope_theta == 100000.0 and c.max_position == 8192
    assert c.norm_eps == pytest.approx(1e-5)
    assert c.tied_embeddings and "output.weight" not in src.tensors
    assert not c.qkv_bias and not c.qk_norm and not c.post_norms
    assert c.bos_token_id == 1 and c.eos_token_ids[0] == 2 and c.add_bos_token is False
    types = {t.type_name for t in src.tensors.values()}
    assert types == {"F32", "Q4_1", "Q8_0"}
    assert src.tensors["token_embd.weight"].type_name == "Q8_0"
    assert src.tensors["blk.0.attn_q.weight"].shape == (576, 576)
    assert src.tensors["blk.0.attn_k.weight"].shape == (192, 576)
    for name, shape in expected_tensor_shapes(c).items():
        assert src.tensors[name].shape == shape


def test_gemma3_model_source(gemma3_gguf_path):
    t0 = time.perf_counter()
    src = open_model_source(gemma3_gguf_path)
    assert time.perf_counter() - t0 < 5.0  # 262k-token vocabulary in the header
    c = src.config
    assert (c.arch, c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim) == (
        "gemma3", 262144, 640, 18, 4, 1, 256, 2048,
    )  # fmt: skip
    assert c.rope_style == "half" and c.rope_theta == 1e6 and c.rope_local_theta == 10000.0
    assert c.act == "gelu_tanh" and c.qk_norm and c.post_norms
    assert c.embed_scale == pytest.approx(math.sqrt(640))
    assert c.attn_scale == pytest.approx(256**-0.5)
    assert c.norm_weight_offset == 0.0
    assert c.sliding_window == 512 and c.sliding_window_pattern == 6
    assert [i for i in range(18) if not c.layer_is_sliding(i)] == [5, 11, 17]
    assert c.final_logit_softcap is None and c.tied_embeddings
    assert c.bos_token_id == 2 and c.eos_token_ids == [1, 106] and c.add_bos_token is True
    assert {t.type_name for t in src.tensors.values()} == {"F32", "Q5_0", "Q4_K", "Q6_K", "Q8_0"}
    assert src.tensors["blk.0.attn_q_norm.weight"].shape == (256,)
    assert src.tokenizer_info["metadata"]["tokenizer.ggml.model"] == "llama"


def test_gemma3_norm_weights_already_include_one(gemma3_gguf_path):
    """transformers' own GGUF loader turns llama.cpp's stored Gemma norm weights into HF ones by
    subtracting 1, and HF's Gemma3RMSNorm multiplies by (1 + w): so the stored weight *is* the
    multiplier, and norm_weight_offset must be 0 for GGUF."""
    import torch
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    src = open_model_source(gemma3_gguf_path)
    proc = TENSOR_PROCESSORS["gemma3"]()
    rng = np.random.default_rng(0)
    for name in ("blk.0.attn_norm.weight", "blk.0.attn_q_norm.weight", "blk.3.post_ffw_norm.weight",
                 "output_norm.weight"):  # fmt: skip
        stored = src.tensors[name].to_numpy()
        hf_w = proc.process(stored.copy(), name).weights
        np.testing.assert_array_equal(hf_w, stored - 1)
        norm = Gemma3RMSNorm(stored.shape[0], eps=src.config.norm_eps)
        with torch.no_grad():
            norm.weight.copy_(torch.from_numpy(hf_w))
            x = rng.standard_normal((3, stored.shape[0])).astype(np.float32)
            y = norm(torch.from_numpy(x)).numpy()
        ours = (
            x
            / np.sqrt((x * x).mean(-1, keepdims=True) + src.config.norm_eps)
            * (stored + src.config.norm_weight_offset)
        )
        np.testing.assert_allclose(y, ours, rtol=2e-5, atol=2e-5 * np.abs(ours).max())


# --------------------------------------------------------------------------------------------
# Crafted files: valid ones through GGUFWriter, then corrupted
# --------------------------------------------------------------------------------------------

NESTED = [[1, 2], [3]]


def _write_gguf(path, alignment=None, extra=None) -> dict:
    w = GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -5)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 1e-300)
    w.add_array("t.arr_str", ["a", "", "ü", "x" * 300])
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.nested", NESTED)
    w.add_key_value("t.arr_f32", [1.0, 2.5], GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT32)
    for k, v in (extra or {}).items():
        w.add_string(k, v)
    rng = np.random.default_rng(1)
    tensors = {
        "a.weight": rng.standard_normal((2, 64)).astype(np.float32),
        "b.weight": rng.standard_normal((3, 32)).astype(np.float16),
    }
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    q = rng.standard_normal((4, 64)).astype(np.float32)
    qraw = gguf.quants.quantize(q, GGMLQuantizationType.Q8_0)
    w.add_tensor("c.weight", qraw, raw_dtype=GGMLQuantizationType.Q8_0)
    tensors["c.weight"] = qraw
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


@pytest.fixture
def small_gguf(tmp_path):
    path = tmp_path / "small.gguf"
    tensors = _write_gguf(path)
    return path, tensors


def test_crafted_file_roundtrip(small_gguf):
    path, tensors = small_gguf
    g = GGUFFile(path)
    md = g.metadata
    assert md["general.architecture"] == "llama"
    assert (md["t.u8"], md["t.i8"], md["t.u16"], md["t.i16"]) == (7, -7, 65535, -300)
    assert (md["t.u32"], md["t.i32"], md["t.f32"], md["t.bool"]) == (4000000000, -5, 1.5, True)
    assert (md["t.str"], md["t.u64"], md["t.i64"], md["t.f64"]) == ("héllo", 2**63 + 5, -(2**40), 1e-300)
    assert md["t.arr_str"] == ["a", "", "ü", "x" * 300]
    assert md["t.arr_i32"] == [1, -2, 3] and md["t.arr_f32"] == [1.0, 2.5]
    assert md["t.nested"] == NESTED
    assert g.tensors["a.weight"].shape == (2, 64) and g.tensors["a.weight"].ne == (64, 2)
    assert g.raw("a.weight") == tensors["a.weight"].tobytes()
    assert g.raw("b.weight") == tensors["b.weight"].tobytes()
    assert g.tensors["b.weight"].type_name == "F16"
    c = g.tensors["c.weight"]
    assert (c.type_name, c.shape, c.nbytes) == ("Q8_0", (4, 64), 4 * 2 * 34)
    assert g.raw("c.weight") == tensors["c.weight"].tobytes()
    with pytest.raises(InvalidArgumentError, match="no tensor 'nope'"):
        g.raw("nope")


def test_custom_alignment(tmp_path):
    path = tmp_path / "aligned.gguf"
    _write_gguf(path, alignment=256)
    g = GGUFFile(path)
    assert g.alignment == 256 and g.data_offset % 256 == 0
    assert all(t.offset % 256 == 0 for t in g.tensors.values())


def test_ggml_type_table_matches_gguf_package():
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        if qt.value in GGML_TYPES:
            t = GGML_TYPES[qt.value]
            assert (t.name, t.block_size, t.type_size) == (qt.name, block, size)
    for name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                 "Q5_K", "Q6_K", "Q8_K"):  # fmt: skip
        assert ggml_type(name).name == name
    assert tensor_nbytes("Q4_K", (10, 512)) == 10 * 2 * 144
    with pytest.raises(InvalidArgumentError, match="Q4_2"):
        ggml_type("Q4_2")


# ---- helpers to corrupt a file at a named place


def _find(data: bytes, needle: bytes) -> int:
    i = data.find(needle)
    assert i >= 0, needle
    return i


def _key_pos(data: bytes, key: str) -> int:
    """Offset of the u32 value type that follows metadata key `key`."""
    k = key.encode()
    return _find(data, struct.pack("<Q", len(k)) + k) + 8 + len(k)


def _tensor_pos(data: bytes, name: str) -> int:
    """Offset of the u32 n_dims that follows tensor name `name` in the tensor table."""
    k = name.encode()
    return _find(data, struct.pack("<Q", len(k)) + k) + 8 + len(k)


def _put(data: bytes, pos: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def _expect(path, data: bytes, exc=ModelFileError, match: str | None = None, max_seconds: float = 0.5):
    """Write `data`, parse it from the path and from memory: both must raise `exc` naming the
    source, fast and without allocating more than a few MB."""
    path.write_bytes(data)
    for source, label in ((path, str(path)), (memoryview(data), "crafted-in-memory.gguf")):
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            with pytest.raises(exc) as ei:
                GGUFFile(source, name=None if source is path else label)
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert time.perf_counter() - t0 < max_seconds
        assert peak < (4 << 20) + len(data), peak
        msg = str(ei.value)
        assert label in msg, msg
        if match:
            assert match in msg, msg
    return msg


def test_bad_magic(small_gguf, tmp_path):
    path, _ = small_gguf
    data = path.read_bytes()
    _expect(tmp_path / "bad.gguf", b"GGML" + data[4:], match="not a GGUF file")
    _expect(tmp_path / "bad.gguf", b"", match="not a GGUF file")
    _expect(tmp_path / "bad.gguf", b'{"json": true}', match="not a GGUF file")


def test_versions(small_gguf, tmp_path):
    data = small_gguf[0].read_bytes()
    _expect(tmp_path / "v.gguf", _put(data, 4, "<I", 99), match="version 99")
    _expect(tmp_path / "v.gguf", _put(data, 4, "<I", 1), exc=UnsupportedModelError, match="version 1")
    _expect(tmp_path / "v.gguf", _put(data, 4, ">I", 3), exc=UnsupportedModelError, match="big-endian")
    GGUFFile(memoryview(_put(data, 4, "<I", 2)))  # v2 has the same layout


def test_truncated_anywhere(small_gguf, tmp_path):
    path, _ = small_gguf
    data = path.read_bytes()
    g = GGUFFile(path)
    bad = tmp_path / "cut.gguf"
    end = max(t.offset + t.nbytes for t in g.tensors.values())  # the writer pads the file after it
    # every cut inside the header, then cuts inside the tensor data
    cuts = list(range(g.data_offset)) + [end - 1, end - 100, g.tensors["c.weight"].offset + 1]
    for cut in cuts:
        with pytest.raises(ModelFileError, match=f"cut-at-{cut}: "):
            GGUFFile(memoryview(data[:cut]), name=f"cut-at-{cut}")
    GGUFFile(memoryview(data[:end]))  # trailing padding is optional
    bad.write_bytes(data[: end - 1])
    with pytest.raises(ModelFileError, match="extends past the end") as ei:
        GGUFFile(bad)
    assert str(bad) in str(ei.value)
    bad.write_bytes(data[:100])
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(bad)


def test_absurd_counts_fail_before_allocating(small_gguf, tmp_path):
    data = small_gguf[0].read_bytes()
    bad = tmp_path / "absurd.gguf"
    # header counts (n_tensors at 8, n_kv at 16)
    _expect(bad, _put(data, 8, "<Q", 2**60), match="tensors")
    _expect(bad, _put(data, 16, "<Q", 2**60), match="metadata keys")
    # length of the first key's string
    _expect(bad, _put(data, 24, "<Q", 2**60), match="string length")
    # a string value's length
    _expect(bad, _put(data, _key_pos(data, "t.str") + 4, "<Q", 2**60), match="'t.str'")
    # array lengths: of strings, of ints, of nested arrays
    for key in ("t.arr_str", "t.arr_i32", "t.nested"):
        _expect(bad, _put(data, _key_pos(data, key) + 8, "<Q", 2**60), match=f"{key!r}")
    _expect(bad, _put(data, _key_pos(data, "t.arr_i32") + 8, "<Q", 2**62 + 1), match="array length")
    # one string inside a string array
    pos = _find(data, struct.pack("<Q", 300) + b"x" * 300)
    _expect(bad, _put(data, pos, "<Q", 2**60), match="t.arr_str")
    # a tensor's dimension: the claimed data no longer fits the file
    _expect(bad, _put(data, _tensor_pos(data, "a.weight") + 4, "<q", 2**40), match="extends past the end")


def test_bad_value_types(small_gguf, tmp_path):
    data = small_gguf[0].read_bytes()
    bad = tmp_path / "types.gguf"
    _expect(bad, _put(data, _key_pos(data, "t.u8"), "<I", 99), match="unknown value type 99")
    _expect(bad, _put(data, _key_pos(data, "t.arr_i32") + 4, "<I", 77), match="unknown value type 77")


def test_bad_tensor_infos(small_gguf, tmp_path):
    data = small_gguf[0].read_bytes()
    bad = tmp_path / "tensors.gguf"
    a = _tensor_pos(data, "a.weight")  # u32 n_dims=2 | i64 ne0=64 | i64 ne1=2 | u32 type | u64 offset
    _expect(bad, _put(data, a + 20, "<I", 4), match="unknown ggml type 4")  # Q4_2 was removed
    _expect(bad, _put(data, a + 20, "<I", 200), match="unknown ggml type 200")
    _expect(bad, _put(data, a, "<I", 5), match="5 dimensions")
    _expect(bad, _put(data, a, "<I", 0), match="0 dimensions")
    _expect(bad, _put(data, a + 4, "<q", 0), match="non-positive dimension")
    _expect(bad, _put(data, a + 12, "<q", -3), match="non-positive dimension")
    _expect(bad, _put(data, a + 24, "<Q", 8), match="not a multiple of the alignment")
    c = _tensor_pos(data, "c.weight")
    _expect(bad, _put(data, c + 4, "<q", 48), match="block size")  # Q8_0 rows are multiples of 32
    # b.weight (F16 3x32) claims a dimension that makes it run into c.weight
    b = _tensor_pos(data, "b.weight")
    _expect(bad, _put(data, b + 12, "<q", 5), match="overlaps")
    # duplicate tensor names: rename b.weight to a.weight
    _expect(bad, data.replace(b"b.weight", b"a.weight"), match="duplicate tensor name 'a.weight'")


def test_duplicate_keys_and_bad_alignment(tmp_path):
    path = tmp_path / "dup.gguf"
    _write_gguf(path, extra={"t.aaaa": "x", "t.bbbb": "y"})
    data = path.read_bytes()
    _expect(tmp_path / "d.gguf", data.replace(b"t.bbbb", b"t.aaaa"), match="duplicate metadata key 't.aaaa'")
    _write_gguf(path, alignment=64)
    data = path.read_bytes()
    pos = _key_pos(data, "general.alignment")
    _expect(tmp_path / "d.gguf", _put(data, pos + 4, "<I", 48), match="power of two")
    _expect(tmp_path / "d.gguf", _put(data, pos + 4, "<I", 0), match="power of two")


def test_missing_file_and_bad_source(tmp_path):
    with pytest.raises(ModelFileError, match="nope.gguf"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(InvalidArgumentError):
        GGUFFile(12345)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Model-level checks (open_model_source on crafted llama-like files)
# --------------------------------------------------------------------------------------------


def _write_model(
    path,
    arch="llama",
    dim=64,
    n_layers=2,
    heads=4,
    kv=2,
    ffn=96,
    vocab=50,
    skip=(),
    shapes=None,
    meta=None,
    drop_meta=(),
    tied=False,
):
    hd = dim // heads
    w = GGUFWriter(str(path), arch)
    kv_meta = {
        f"{arch}.embedding_length": dim,
        f"{arch}.block_count": n_layers,
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv,
        f"{arch}.feed_forward_length": ffn,
        f"{arch}.context_length": 256,
    }
    kv_meta.update(meta or {})
    for k, v in kv_meta.items():
        if k not in drop_meta:
            w.add_uint32(k, v)
    if f"{arch}.attention.layer_norm_rms_epsilon" not in drop_meta:
        w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(vocab)])
    want = {"token_embd.weight": (vocab, dim), "output_norm.weight": (dim,)}
    if not tied:
        want["output.weight"] = (vocab, dim)
    for i in range(n_layers):
        p = f"blk.{i}."
        want.update(
            {
                p + "attn_norm.weight": (dim,),
                p + "attn_q.weight": (heads * hd, dim),
                p + "attn_k.weight": (kv * hd, dim),
                p + "attn_v.weight": (kv * hd, dim),
                p + "attn_output.weight": (dim, heads * hd),
                p + "ffn_norm.weight": (dim,),
                p + "ffn_gate.weight": (ffn, dim),
                p + "ffn_up.weight": (ffn, dim),
                p + "ffn_down.weight": (dim, ffn),
            }
        )
    want.update(shapes or {})
    for name, shape in want.items():
        if name not in skip:
            w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_model_source_crafted_llama(tmp_path):
    p = tmp_path / "m.gguf"
    _write_model(p)
    src = open_model_source(p)
    c = src.config
    assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size) == (
        64,
        2,
        4,
        2,
        16,
        96,
        50,
    )
    assert not c.tied_embeddings and c.rope_style == "interleaved" and c.max_position == 256
    assert c.rope_theta == 10000.0  # default when rope.freq_base is absent
    assert src.tensors["blk.1.ffn_down.weight"].to_numpy().shape == (64, 96)
    src2 = open_model_source(p.read_bytes(), name="https://example/m.gguf")
    assert src2.path == "https://example/m.gguf" and src2.config == c
    _write_model(p, tied=True)
    assert open_model_source(p).config.tied_embeddings


def test_model_source_errors(tmp_path):
    p = tmp_path / "m.gguf"
    _write_model(p, skip=("blk.1.attn_k.weight",))
    with pytest.raises(
        ModelFileError, match=r"'blk.1.attn_k.weight' is missing \(expected shape \(32, 64\)\)"
    ) as ei:
        open_model_source(p)
    assert str(p) in str(ei.value)
    _write_model(p, shapes={"blk.0.ffn_up.weight": (95, 64)})
    with pytest.raises(
        ModelFileError, match=r"'blk.0.ffn_up.weight' has shape \(95, 64\), expected \(96, 64\)"
    ):
        open_model_source(p)
    _write_model(p, drop_meta=("llama.block_count",))
    with pytest.raises(ModelFileError, match="missing required metadata key 'llama.block_count'") as ei:
        open_model_source(p)
    assert str(p) in str(ei.value)
    _write_model(p, drop_meta=("llama.attention.layer_norm_rms_epsilon",))
    with pytest.raises(ModelFileError, match="layer_norm_rms_epsilon"):
        open_model_source(p)
    _write_model(p, arch="gpt2")
    with pytest.raises(UnsupportedModelError, match="'gpt2'.*llama, qwen2, gemma3") as ei:
        open_model_source(p)
    assert str(p) in str(ei.value)
    (tmp_path / "x.bin").write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match="x.bin"):
        open_model_source(tmp_path / "x.bin")
    with pytest.raises(WebdriftError, match="nothing-here"):
        open_model_source(tmp_path / "nothing-here")


# --------------------------------------------------------------------------------------------
# Slow: the whole ModelConfig vs transformers' logits (numpy reference forward)
# --------------------------------------------------------------------------------------------


def _rms(x, w, eps):
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps).astype(np.float32) * w


def _rope(x, theta, style):  # x: (T, heads, head_dim), positions 0..T-1
    t, _, d = x.shape
    ang = np.arange(t)[:, None] * (1.0 / theta ** (np.arange(0, d, 2) / d))[None, :]
    cos, sin = np.cos(ang)[:, None].astype(np.float32), np.sin(ang)[:, None].astype(np.float32)
    if style == "half":  # rotate pairs (i, i + d/2)
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    out = np.empty_like(x)  # "interleaved": rotate pairs (2i, 2i + 1)
    a, b = x[..., 0::2], x[..., 1::2]
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    return out


def _reference_logits(src, ids):
    """Every ModelConfig field that matters, applied literally (numpy, float32)."""
    c = src.config
    w = {n: t.to_numpy() for n, t in src.tensors.items()}
    off, t = c.norm_weight_offset, len(ids)
    x = w["token_embd.weight"][ids] * np.float32(c.embed_scale)
    pos = np.arange(t)
    for i in range(c.n_layers):
        p = f"blk.{i}."
        h = _rms(x, w[p + "attn_norm.weight"] + off, c.norm_eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(t, c.n_heads, c.head_dim)
        k = (h @ w[p + "attn_k.weight"].T).reshape(t, c.n_kv_heads, c.head_dim)
        v = (h @ w[p + "attn_v.weight"].T).reshape(t, c.n_kv_heads, c.head_dim)
        if c.qk_norm:
            q = _rms(q, w[p + "attn_q_norm.weight"] + off, c.norm_eps)
            k = _rms(k, w[p + "attn_k_norm.weight"] + off, c.norm_eps)
        sliding = c.layer_is_sliding(i)
        theta = c.rope_local_theta if sliding else c.rope_theta
        q, k = _rope(q, theta, c.rope_style), _rope(k, theta, c.rope_style)
        g = c.n_heads // c.n_kv_heads
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * np.float32(c.attn_scale or c.head_dim**-0.5)
        mask = pos[None, :] > pos[:, None]
        if sliding:
            mask |= pos[:, None] - pos[None, :] >= c.sliding_window
        s = np.where(mask[None], -np.inf, s)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(t, c.q_dim) @ w[p + "attn_output.weight"].T
        if c.post_norms:
            o = _rms(o, w[p + "post_attention_norm.weight"] + off, c.norm_eps)
        x = x + o
        h = _rms(x, w[p + "ffn_norm.weight"] + off, c.norm_eps)
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        if c.act == "silu":
            act = gate / (1 + np.exp(-gate))
        else:
            act = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
        f = (act * up) @ w[p + "ffn_down.weight"].T
        if c.post_norms:
            f = _rms(f, w[p + "post_ffw_norm.weight"] + off, c.norm_eps)
        x = x + f
    x = _rms(x, w["output_norm.weight"] + off, c.norm_eps)
    return x @ w["token_embd.weight" if c.tied_embeddings else "output.weight"].T


@pytest.mark.slow
@pytest.mark.parametrize(("model", "n_tokens"), [("smollm2", 24), ("gemma3", 600)])
def test_config_reproduces_transformers_logits(request, model, n_tokens):
    """transformers loads the same GGUF (un-permuting llama Q/K, subtracting 1 from Gemma norms);
    our ModelConfig read literally must give the same logits. 600 tokens cross Gemma's 512 window."""
    import torch

    path = request.getfixturevalue(f"{model}_gguf_path")
    ref_model = request.getfixturevalue(f"{model}_hf")        # tests/conftest.py: loaded once per session
    ref_model = ref_model[0] if model == "smollm2" else ref_model
    src = open_model_source(path)
    ids = [src.config.bos_token_id] + list(np.random.default_rng(0).integers(10, 5000, size=n_tokens))
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].numpy()
    ours = _reference_logits(src, np.array(ids))
    assert np.abs(ours - ref).max() < 2e-3 * np.abs(ref).max()
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() > 0.99


def test_open_fast_on_real_header(smollm2_gguf_path):
    t0 = time.perf_counter()
    for _ in range(3):
        GGUFFile(smollm2_gguf_path)
    assert (time.perf_counter() - t0) / 3 < 1.0
    assert os.path.getsize(smollm2_gguf_path) == 98362432


def test_runtime_path_needs_no_numpy(smollm2_gguf_path):
    """Pyodide has no numpy: opening a model and reading raw bytes must not import it."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "from webdrift.weights.source import open_model_source\n"
        f"src = open_model_source({str(smollm2_gguf_path)!r})\n"
        "assert len(src.tensors['blk.0.attn_q.weight'].raw()) == 576 * 576 // 32 * 20\n"
        "src = open_model_source(open(src.path, 'rb').read(), name='mem')\n"
        "assert src.config.dim == 576\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
