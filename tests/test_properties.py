"""Property-based tests (hypothesis) of what a hostile input can reach (issue 15, "How it is
checked"):

- the GGUF reader on damaged real files (a small model written with gguf-py, SmolLM2's header
  region): every outcome is a WebdriftError with a message under 1 KB, or a load that agrees with
  gguf-py's own reader of the same bytes (tensor table and metadata);
- the safetensors reader on damaged files written by the `safetensors` package, byte-level and in
  the JSON header's fields, and HF config.json values: a short WebdriftError, or the tensors
  `safetensors` itself reads from the same bytes;
- the tokenizer: any str round-trips through encode/decode (and the streaming decoder), or is
  refused with an InvalidTextError (a TokenizerError) naming its first lone surrogate;
- every public generate and load argument, any value: a correct result (checked against
  teacher-forced logits for greedy runs) or an InvalidArgumentError.

Each property is bounded (max_examples, deadline) and derandomized, so a run is the same run
every time; the whole file takes well under 2 minutes on lavapipe.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webdrift
from tests.tiny_model import write_tiny_gguf
from webdrift.errors import (
    ContextLengthError,
    InvalidArgumentError,
    InvalidTextError,
    ModelFileError,
    ModelNotFoundError,
    WebdriftError,
)
from webdrift.runtime.loading import EngineOptions, make_tokenizer
from webdrift.weights.source import open_model_source

SETTINGS = {"derandomize": True, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
            "deadline": 10_000, "database": None}
MESSAGE_LIMIT = 1024
# (property, outcome) -> examples: the last test checks every property that ran met both of its
# outcomes (a property whose examples all fail early would test nothing)
OUTCOMES: collections.Counter = collections.Counter()


def short_error(e: BaseException, prop: str = "") -> None:
    assert isinstance(e, WebdriftError), f"{type(e).__name__}: {e}"
    assert len(str(e)) < MESSAGE_LIMIT, f"{len(str(e))}-character message: {str(e)[:200]}"
    if prop:
        OUTCOMES[prop, "error"] += 1


def accepted(prop: str) -> None:
    OUTCOMES[prop, "ok"] += 1


# -- damage ----------------------------------------------------------------------------------------

INTERESTING = [0, 1, 7, 255, 256, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62,
               2**63 - 1, 2**63, 2**64 - 1]


def damage(size: int, hot: int):
    """Edits of a file of `size` bytes, mostly in its first `hot` bytes (the header): byte runs
    overwritten, u32 / u64 fields set to boundary values, or the file cut short."""
    pos = st.one_of(st.integers(0, max(hot - 1, 0)), st.integers(0, size - 1))
    edit = st.one_of(
        st.tuples(st.just("bytes"), pos, st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("u32"), pos, st.sampled_from([v for v in INTERESTING if v < 2**32])),
        st.tuples(st.just("u64"), pos, st.sampled_from(INTERESTING)),
        st.tuples(st.just("cut"), pos, st.just(b"")),
    )
    return st.lists(edit, min_size=1, max_size=4)


def apply_edits(buf: bytearray, edits) -> list:
    """Apply edits in place; returns the undo list (for a large shared buffer) and the new size."""
    undo = []
    for kind, p, v in edits:
        if kind == "cut":
            continue
        raw = v if kind == "bytes" else struct.pack("<I" if kind == "u32" else "<Q", v)
        raw = raw[: len(buf) - p]
        undo.append((p, bytes(buf[p:p + len(raw)])))
        buf[p:p + len(raw)] = raw
    return undo


def cut_at(edits, size: int) -> int:
    return min([size] + [p for kind, p, _ in edits if kind == "cut"])


# -- GGUF ------------------------------------------------------------------------------------------

@functools.cache
def tiny_gguf() -> tuple[bytes, int, str]:
    import tempfile
    d = tempfile.mkdtemp(prefix="webdrift-prop-")
    path = write_tiny_gguf(os.path.join(d, "tiny.gguf"))
    with open(path, "rb") as f:
        data = f.read()
    from webdrift.weights.gguf import GGUFFile
    return data, GGUFFile(data).data_offset, d


def _gguf_py_view(path: str) -> dict:
    """The tensor table and scalar metadata as gguf-py (the reference implementation) reads them."""
    from gguf import GGUFReader, GGUFValueType
    r = GGUFReader(path)
    tensors = {t.name: (tuple(int(x) for x in t.shape), int(t.tensor_type), int(t.data_offset), int(t.n_bytes))
               for t in r.tensors}
    meta = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or not f.types:
            continue
        if f.types[0] == GGUFValueType.STRING:
            meta[name] = bytes(f.parts[f.data[0]]).decode("utf-8", "surrogateescape")
        elif f.types[0] != GGUFValueType.ARRAY:
            meta[name] = f.parts[f.data[0]].tolist()[0]
    return {"tensors": tensors, "meta": meta}


@settings(max_examples=120, **SETTINGS)
@given(st.data())
def test_gguf_reader_on_a_damaged_small_model(data):
    base, header_end, tmp = tiny_gguf()
    edits = data.draw(damage(len(base), header_end))
    buf = bytearray(base)
    apply_edits(buf, edits)
    blob = bytes(buf[: cut_at(edits, len(buf))])
    try:
        src = open_model_source(blob, name="damaged.gguf")
        tok = make_tokenizer(src)
    except Exception as e:    # noqa: BLE001 - the property: only short WebdriftErrors
        short_error(e, "gguf-small")
        return
    accepted("gguf-small")
    # a load: it must be what gguf-py reads from the same bytes
    path = os.path.join(tmp, "damaged.gguf")
    with open(path, "wb") as f:
        f.write(blob)
    try:
        ref = _gguf_py_view(path)
    except Exception as e:    # noqa: BLE001
        pytest.fail(f"webdrift loaded a file gguf-py rejects ({type(e).__name__}: {e}); edits {edits}")
    from webdrift.weights.gguf import GGUFFile
    gf = GGUFFile(blob)
    ours = {n: (tuple(ti.ne), ti.ggml_type, ti.offset, ti.nbytes) for n, ti in gf.tensors.items()}
    assert ours == ref["tensors"]
    for k, v in ref["meta"].items():
        got = gf.metadata[k]
        assert got == v or (isinstance(v, float) and np.float32(got) == np.float32(v)), k
    for name, t in src.tensors.items():
        assert len(t.raw()) == gf.tensors[name].nbytes
    assert tok.decode(tok.encode("the cat in the hat")) == "the cat in the hat"


@functools.cache
def smollm2_buffer(path: str) -> tuple[bytearray, int]:
    from webdrift.weights.gguf import GGUFFile
    with open(path, "rb") as f:
        buf = bytearray(f.read())
    return buf, GGUFFile(path).data_offset


@pytest.fixture(scope="module")
def smollm2_path(smollm2_gguf_path):
    return str(smollm2_gguf_path)


def test_gguf_reader_on_smollm2_header_damage(smollm2_path):
    buf, header_end = smollm2_buffer(smollm2_path)
    reference = open_model_source(smollm2_path)

    @settings(max_examples=30, **SETTINGS)
    @given(damage(header_end, header_end))
    def check(edits):
        edits = [e for e in edits if e[0] != "cut"]          # the file stays whole (98 MB is not copied)
        undo = apply_edits(buf, edits)
        try:
            src = open_model_source(memoryview(buf), name="smollm2-damaged.gguf")
            tok = make_tokenizer(src)
        except Exception as e:    # noqa: BLE001
            short_error(e, "gguf-smollm2")
            return
        finally:
            for p, old in reversed(undo):
                buf[p:p + len(old)] = old
        accepted("gguf-smollm2")
        # a load: the tensors it names are where the intact file has them (the data region is
        # untouched), and the tokenizer still works
        for name, t in src.tensors.items():
            ref = reference.tensors.get(name)
            if ref is not None and ref.type_name == t.type_name and ref.shape == t.shape:
                assert t.raw()[:64] == ref.raw()[:64]
        assert tok.decode(tok.encode("Hello world")) == "Hello world"
    check()


# -- safetensors and HF configs -----------------------------------------------------------------------

@functools.cache
def safetensors_file() -> bytes:
    import torch
    from safetensors.torch import save
    g = torch.Generator().manual_seed(0)
    tensors = {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=g).half(),
        "model.layers.0.mlp.up_proj.weight": torch.randn(12, 8, generator=g).bfloat16(),
        "model.norm.weight": torch.ones(8),
        "position_ids": torch.arange(6, dtype=torch.int64),
    }
    return save(tensors, metadata={"format": "pt"})


def _reference_safetensors(blob: bytes) -> dict | None:
    import torch
    from safetensors.torch import load
    try:
        loaded = load(blob)
    except Exception:     # noqa: BLE001 - the reference's own refusal
        return None
    return {k: (str(v.dtype), tuple(v.shape), v.contiguous().view(torch.uint8).numpy().tobytes())
            for k, v in loaded.items()}


_DTYPES = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16", "torch.int64": "I64"}


def _check_safetensors(blob: bytes, prop: str) -> None:
    from webdrift.weights.safetensors import SUPPORTED_DTYPES, SafetensorsFile
    try:
        sf = SafetensorsFile(blob, name="damaged.safetensors")
    except Exception as e:    # noqa: BLE001
        short_error(e, prop)
        return
    accepted(prop)
    ref = _reference_safetensors(blob)
    if ref is None:
        # the safetensors library is stricter (it also refuses data not covered by tensors):
        # what webdrift accepted must still be self-consistent
        for name, t in sf.tensors.items():
            if t.dtype in SUPPORTED_DTYPES:
                assert len(sf.raw(name)) == t.nbytes
        return
    assert set(ref) == set(sf.tensors)
    for name, (dtype, shape, raw) in ref.items():
        t = sf.tensors[name]
        assert (_DTYPES[dtype], shape) == (t.dtype, t.shape)
        if t.dtype in SUPPORTED_DTYPES:
            assert sf.raw(name) == raw


@settings(max_examples=150, **SETTINGS)
@given(st.data())
def test_safetensors_reader_on_damaged_bytes(data):
    base = safetensors_file()
    (n,) = struct.unpack_from("<Q", base)
    edits = data.draw(damage(len(base), 8 + n))
    buf = bytearray(base)
    apply_edits(buf, edits)
    _check_safetensors(bytes(buf[: cut_at(edits, len(buf))]), "safetensors-bytes")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)


@settings(max_examples=150, **SETTINGS)
@given(st.data())
def test_safetensors_header_fields(data):
    """The JSON header with fields replaced by any JSON value (what byte damage rarely reaches)."""
    base = safetensors_file()
    (n,) = struct.unpack_from("<Q", base)
    header = json.loads(base[8:8 + n])
    names = sorted(k for k in header if k != "__metadata__")
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(names + ["__metadata__"]))
        if name == "__metadata__" or data.draw(st.booleans()):
            header[name] = data.draw(json_values)
        else:
            field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
            entry = header.get(name) if isinstance(header.get(name), dict) else {}
            header[name] = dict(entry, **{field: data.draw(json_values)})
    h = json.dumps(header).encode()
    _check_safetensors(struct.pack("<Q", len(h)) + h + base[8 + n:], "safetensors-fields")


HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 300,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512, "hidden_act": "silu",
             "tie_word_embeddings": True}


@settings(max_examples=200, **SETTINGS)
@given(st.dictionaries(st.sampled_from(sorted(HF_CONFIG) + ["head_dim", "rope_scaling", "rope_parameters",
                                                             "model_type", "layer_types", "quantization_config",
                                                             "partial_rotary_factor", "eos_token_id"]),
                       json_values, min_size=1, max_size=4))
def test_hf_config_values(changes):
    from webdrift.weights.hf import hf_config_to_model_config
    cfg = dict(HF_CONFIG, **changes)
    try:
        c = hf_config_to_model_config(cfg, "config.json")
    except Exception as e:    # noqa: BLE001
        short_error(e, "hf-config")
        return
    accepted("hf-config")
    assert c.dim > 0 and c.n_heads % c.n_kv_heads == 0 and c.head_dim % 2 == 0 and c.vocab_size > 0


# -- the tokenizer ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_gguf_path):
    from webdrift.tokenizer import Tokenizer
    from webdrift.weights.gguf import GGUFFile
    return Tokenizer.from_gguf_metadata(GGUFFile(str(smollm2_gguf_path)).metadata)


@pytest.fixture(scope="module")
def gemma3_tokenizer(gemma3_gguf_path):
    from webdrift.tokenizer import Tokenizer
    from webdrift.weights.gguf import GGUFFile
    return Tokenizer.from_gguf_metadata(GGUFFile(str(gemma3_gguf_path)).metadata)


valid_text = st.lists(st.one_of(st.characters(codec=None),          # every code point but surrogates
                                st.sampled_from([" ", "  ", "\n", "\t", "<|im_end|>", "<|im_start|>", "\u00e9",
                                                 "0123", "\U0001f600", "\u2581", " the", "'s"])),
                      max_size=30).map("".join)
with_surrogate = st.tuples(valid_text, st.characters(categories=["Cs"]), valid_text).map("".join)
any_text = st.one_of(valid_text, valid_text, valid_text, with_surrogate)


def _first_surrogate(s: str) -> int | None:
    return next((i for i, c in enumerate(s) if 0xD800 <= ord(c) <= 0xDFFF), None)


def _round_trip(tok, s: str, expected: str, prop: str) -> None:
    bad = _first_surrogate(s)
    if bad is not None:
        with pytest.raises(InvalidTextError, match=f"character {bad} is U\\+{ord(s[bad]):04X}"):
            tok.encode(s)
        OUTCOMES[prop, "error"] += 1
        return
    accepted(prop)
    ids = tok.encode(s, add_special_tokens=False)
    assert tok.decode(ids) == expected
    dec = tok.stream_decoder()
    assert "".join(dec.push(i) for i in ids) + dec.flush() == expected


def test_tokenizer_round_trip_smollm2(smollm2_tokenizer, smollm2_gguf_path):
    """Byte-level BPE: decode(encode(s)) == s for every valid str whose UTF-8 bytes the vocabulary
    has. SmolLM2's lacks 21 of the 256 (0x04, 0xf1, ...: bytes its training text never held); a
    byte it lacks is dropped, as HF tokenizers drop it (no unk token), so the expectation is the
    UTF-8 of s without those bytes, decoded with errors="replace" (the vocabulary is read here from
    the GGUF metadata, not from the tokenizer)."""
    from webdrift.tokenizer.pretokenize import BYTE_TO_CHAR
    from webdrift.weights.gguf import GGUFFile
    vocab = set(GGUFFile(str(smollm2_gguf_path)).metadata["tokenizer.ggml.tokens"])
    has = bytes(b for b in range(256) if BYTE_TO_CHAR[b] in vocab)
    assert len(has) == 235

    @settings(max_examples=300, **SETTINGS)
    @given(any_text)
    def check(s):
        spelled = None if _first_surrogate(s) is not None else bytes(b for b in s.encode() if b in has)
        _round_trip(smollm2_tokenizer, s, spelled.decode("utf-8", "replace") if spelled is not None else s,
                    "tokenizer-smollm2")
    check()


def test_tokenizer_round_trip_gemma3(gemma3_tokenizer):
    """SentencePiece with byte fallback: every valid str comes back, except that U+2581 (its
    space marker) comes back as a space, as in HF tokenizers."""
    @settings(max_examples=150, **SETTINGS)
    @given(any_text)
    def check(s):
        _round_trip(gemma3_tokenizer, s, s.replace("\u2581", " "), "tokenizer-gemma3")
    check()


# -- every public generate / load argument ---------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_engine():
    _, _, d = tiny_gguf()
    return webdrift.load(os.path.join(d, "tiny.gguf"), max_context=64)


anything = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
                     st.text(max_size=6), st.lists(st.integers(-5, 300), max_size=3), st.just(object()),
                     st.just(np.int64(3)), st.just(np.float32(0.5)), st.complex_numbers(max_magnitude=2))
prompts = st.one_of(st.text(max_size=12), st.text(max_size=12), st.text(st.characters(categories=["Cs", "L"]), max_size=4),
                    st.lists(st.integers(0, 265), max_size=20), st.lists(st.integers(-3, 300), max_size=80), anything)
SAMPLING = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop_at_eos")
valid = {"max_new_tokens": st.integers(0, 8), "temperature": st.sampled_from([0.0, 0.0, 0.7, 1e-30, 3e38]),
         "top_k": st.one_of(st.none(), st.integers(0, 2**32 - 1)), "top_p": st.one_of(st.none(), st.floats(1e-37, 1.0)),
         "seed": st.one_of(st.none(), st.integers(-(2**70), 2**70)), "stop_at_eos": st.booleans()}


@given(st.data())
@settings(max_examples=80, **SETTINGS)
def test_generate_arguments(tiny_engine, data):
    """Any value for any argument: a correct result or an InvalidArgumentError naming it (a
    prompt longer than the context: ContextLengthError)."""
    eng = tiny_engine
    prompt = data.draw(prompts, label="prompt")
    kw = {k: data.draw(valid[k] if data.draw(st.sampled_from([True, True, True, False])) else anything, label=k)
          for k in SAMPLING if data.draw(st.booleans())}
    try:
        out = eng.generate(prompt, **kw)
    except ContextLengthError as e:
        short_error(e, "generate")
        assert len(eng.encode_prompt(prompt)) >= eng.max_context
        return
    except InvalidArgumentError as e:
        short_error(e, "generate")
        return
    except Exception as e:    # noqa: BLE001
        pytest.fail(f"{type(e).__name__}: {e} for prompt={prompt!r}, {kw}")
    accepted("generate")
    assert not eng.busy
    ids = eng.encode_prompt(prompt)
    budget = min(kw.get("max_new_tokens", 64), eng.max_context - len(ids))
    assert len(out.token_ids) <= budget and all(0 <= t < eng.config.vocab_size for t in out.token_ids)
    assert out.text == eng.tokenizer.decode(out.token_ids)
    assert out.stats.finish_reason in ("eos", "length", "context")
    if not kw.get("temperature") and out.token_ids:
        # greedy: each token is the argmax of the teacher-forced logits before it
        logits = eng.logits(ids + out.token_ids[:-1])
        assert list(np.argmax(logits[len(ids) - 1:], axis=1)) == out.token_ids


option_values = {"max_context": st.integers(-2, 600), "weight_format": st.sampled_from([None, "f32", "q5", 4]),
                 "prefill_chunk": st.integers(-1, 300), "layout": st.sampled_from(["linear", "tiled", None]),
                 "fuse": st.booleans(), "autotune": st.booleans(), "prefill_kernels": st.sampled_from(["auto", "x"]),
                 "int8_activations": st.sampled_from([None, False, "on", {"head": 1}, {"qkv": False}]),
                 "max_binding_bytes": st.one_of(st.none(), st.integers(0, 2**40)), "enable_lora": st.booleans(),
                 "max_lora_rank": st.integers(-1, 2000), "lora_pool_rank": st.one_of(st.none(), st.integers(-1, 70000)),
                 "lora_fused_shrink": st.booleans(), "steps_per_submit": st.one_of(st.none(), st.integers(-1, 40)),
                 "kv_cache": st.sampled_from([None, "f16", "f32", "bf16", 16])}


@given(st.data())
@settings(max_examples=300, **SETTINGS)
def test_engine_options_any_value(data):
    kw = {k: data.draw(anything if data.draw(st.booleans()) else option_values[k], label=k)
          for k in EngineOptions.names() if data.draw(st.booleans())}
    try:
        o = EngineOptions(**kw)
    except InvalidArgumentError as e:
        short_error(e, "options")
        assert str(e).split("=")[0] in kw
        return
    accepted("options")
    for k, v in kw.items():
        assert getattr(o, k) == v


@given(st.data())
@settings(max_examples=40, **SETTINGS)
def test_load_arguments(tiny_engine, data):
    """webdrift.load's arguments beyond the options: model, device, progress, auto_pull. A bad one
    fails before anything is loaded (model: ModelNotFoundError / ModelFileError name it)."""
    _, _, d = tiny_gguf()
    path = os.path.join(d, "tiny.gguf")
    ok = st.sampled_from([True, True, True, False])
    model = data.draw(st.just(path) if data.draw(ok) else st.one_of(     # (None: the default model, not drawn)
        anything.filter(lambda v: v is not None), st.text(max_size=8).map(lambda t: "no-such-model-" + t), st.just(d)), label="model")
    kw = {"device": data.draw(st.just(tiny_engine.dev) if data.draw(ok) else anything, label="device"),
          "progress": data.draw(st.one_of(st.none(), st.just(lambda *a: None)) if data.draw(ok) else anything,
                                label="progress"),
          "auto_pull": data.draw(st.booleans() if data.draw(ok) else anything, label="auto_pull")}
    try:
        eng = webdrift.load(model, max_context=64, **kw)
    except (InvalidArgumentError, ModelNotFoundError, ModelFileError) as e:
        short_error(e, "load")
        return
    except Exception as e:    # noqa: BLE001
        pytest.fail(f"{type(e).__name__}: {e} for model={model!r}, {kw}")
    accepted("load")
    assert eng.generate("the cat", max_new_tokens=3).token_ids == tiny_engine.generate(
        "the cat", max_new_tokens=3).token_ids


def test_every_property_met_both_outcomes():
    """Runs last: each property that ran here saw inputs it accepted and inputs it refused."""
    ran = {p for p, _ in OUTCOMES}
    print({p: (OUTCOMES[p, "ok"], OUTCOMES[p, "error"]) for p in sorted(ran)})
    thin = {p: (OUTCOMES[p, "ok"], OUTCOMES[p, "error"]) for p in ran
            if not (OUTCOMES[p, "ok"] and OUTCOMES[p, "error"])}
    assert not thin, f"(accepted, refused) per property: {thin}"
