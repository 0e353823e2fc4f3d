"""`webdrift bench`: the quick report is complete, bad choices fail clearly, synthetic weights are
sane GGUF blocks (checked with the gguf package's own dequantizer), oversize models fail before
allocating, and the native device's byte counter follows create/release.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from webdrift import GPULimitError, InvalidArgumentError
from webdrift.gpu.native import get_device
from webdrift.models.footprint import check_limits, decode_read_bytes, plan_weights
from webdrift.tools.bench import PEER_NAMES, missing_fields
from webdrift.tools.cli import main
from webdrift.weights.synthetic import PRESETS, QUANTS, synthetic_source


def test_bench_quick_report_is_complete(tmp_path, capsys):
    js, md = tmp_path / "bench.json", tmp_path / "docs" / "BENCH.md"
    rc = main(["bench", "--quick", "--json", str(js), "--markdown", str(md), "--plot", str(tmp_path / "d.png")])
    out = capsys.readouterr().out
    assert rc == 0, out
    rep = json.loads(js.read_text())
    assert missing_fields(rep) == []
    assert "report complete" in out
    rows = rep["results"]
    assert {(r["quant"], r["prompt_tokens"], r["new_tokens"]) for r in rows} == {
        (q, p, m) for q in ("f16", "q8", "q4") for p, m in ((32, 16), (16, 8))}
    for r in rows:
        assert r["error"] is None
        assert r["prefill_tps"] > 0 and r["decode_tps"] > 0 and r["load_s"] > 0
        assert r["peak_gpu_bytes"] >= r["weight_bytes"] > 0
        assert r["roofline_decode_tps"] > 0
        assert r["pct_roofline"] == pytest.approx(100 * r["decode_tps"] / r["roofline_decode_tps"], rel=0.02)
        assert set(PEER_NAMES) <= set(r["peers"])
        # the software adapter's rule (grouped where a KV head serves several query heads), with its chunk
        assert len(r["attention"]) == 1 and r["attention"][0] in ("grouped64", "head64")
        # ... and its static decode GEMV, named by op family (every layer GEMV and the LM head)
        assert r["decode_gemv"] and all(v == ["row r1 wg64"] for v in r["decode_gemv"].values()), r["decode_gemv"]
        assert {"o_proj+residual", "down+residual"} <= set(r["decode_gemv"]) and any("lm_head" in k for k in r["decode_gemv"])
    assert rep["roofline"]["best_GBps"] > 0 and rep["roofline"]["bytes"] > 0
    assert rep["machine"]["adapter"]
    text = md.read_text()
    assert text.startswith("# Benchmarks") and "| tiny | q4 | 32/16 |" in text and "Command: `" in text
    # smaller quantized weights are fewer bytes to read per token
    wb = {r["quant"]: r["read_bytes_per_token"] for r in rows if r["prompt_tokens"] == 32}
    assert wb["q4"] < wb["q8"] < wb["f16"]


def test_gemv_variant_names():
    """How a report names a decode GEMV variant: the fields that differ from their defaults; the
    name reads back into the variant."""
    from webdrift.kernels.linear import GemvVariant
    assert GemvVariant("wide", rows=16, wg=128, mrows=4).name == "wide r16 wg128 m4"
    assert GemvVariant("wide", rows=2, wg=256, unroll=4, mrows=2, ksplit=True).name == "wide r2 wg256 u4 m2 ksplit"
    assert GemvVariant("blk", rows=32, wg=512, rps=2).name == "blk r32 wg512 rps2"
    assert GemvVariant("blk", rows=4, wg=64, qlast=True).name == "blk r4 wg64 qlast"
    assert GemvVariant("blk", rows=2, wg=64, cols=4).name == "blk r2 wg64 cols4"
    # ... and read back (scripts/gemv_ab.py forces variants by these names)
    for v in (GemvVariant("wide", rows=2, wg=256, unroll=4, mrows=2, ksplit=True), GemvVariant("blk", rows=32, wg=512, rps=2),
              GemvVariant("blk", rows=4, wg=64, qlast=True), GemvVariant("row", rows=1, wg=64), GemvVariant("subgroup", cols=8)):
        assert GemvVariant.from_name(v.name) == v
    for bad, words in (("fast r1", "unknown kind 'fast'"), ("wide r16 x3", "cannot read 'x3'"), ("wide rfoo", "'rfoo'")):
        with pytest.raises(ValueError, match=words):
            GemvVariant.from_name(bad)


def test_missing_fields_names_what_is_absent():
    assert "results[]" in missing_fields({"results": []})
    rep = {"results": [{"model": "x", "error": None, "decode_tps": None}]}
    miss = missing_fields(rep)
    assert "results[0].decode_tps" in miss and "results[0].peers.hf_eager" in miss and "machine.adapter" in miss


@pytest.mark.parametrize("argv, words", [
    (["bench", "--quick", "--synthetic", "llama-9b"], list(PRESETS)),
    (["bench", "--quick", "--quant", "q3"], list(QUANTS)),
    (["profile", "--synthetic", "nope"], list(PRESETS)),
])
def test_bad_choices_list_the_choices(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("webdrift: error:")
    for w in words:
        assert w in err


def test_bad_choices_raise_invalid_argument():
    with pytest.raises(InvalidArgumentError, match="llama-3.1-8b"):
        synthetic_source("llama-9b", "q4")
    with pytest.raises(InvalidArgumentError, match="f16, q8, q4"):
        synthetic_source("tiny", "int3")


@pytest.mark.parametrize("quant", ["f16", "q8", "q4"])
def test_synthetic_bytes_are_finite_small_gguf_blocks(quant):
    src = synthetic_source("tiny", quant)
    t = src.tensors["blk.0.ffn_down.weight"]
    assert t.shape == (128, 256) and t.type_name == QUANTS[quant]
    raw = np.frombuffer(t.raw(), np.uint8)
    vals = quants.dequantize(raw, getattr(GGMLQuantizationType, t.type_name)).reshape(t.shape)
    assert np.isfinite(vals).all() and 0 < np.abs(vals).max() < 0.2 and vals.std() > 1e-4
    big = src.tensors["token_embd.weight"]            # tiled past the pool, still whole blocks
    assert len(big.raw()) == big.nbytes
    norm = np.frombuffer(src.tensors["output_norm.weight"].raw(), np.float32)
    assert norm.shape == (128,) and (norm == 1).all()


def test_synthetic_shapes_match_the_real_models():
    c = synthetic_source("llama-3.1-8b", "q4")
    assert not c.config.tied_embeddings and c.tensors["output.weight"].shape == (128256, 4096)
    assert c.n_params == pytest.approx(8.03e9, rel=0.01)
    assert synthetic_source("llama-3.2-1b", "f16").n_params == pytest.approx(1.236e9, rel=0.01)
    assert synthetic_source("smollm2-135m", "f16").n_params == pytest.approx(134.5e6, rel=0.01)


class _SmallDevice:
    """Limits of a small adapter, no GPU needed (check_limits reads only these)."""
    max_binding_size = 32 << 20
    max_buffer_size = 64 << 20

    class info:
        adapter = "small-test-adapter"


def test_oversize_embedding_is_sharded_oversize_layer_weight_refused():
    """A token embedding larger than one binding is planned as row shards (whole rows, each
    shard's buffers within the limit); a layer weight that does not fit still raises
    GPULimitError naming the tensor, its size, the limit and a fix."""
    src = synthetic_source("smollm2-135m", "f16")          # 49152 x 576 f16 embedding: 54 MiB
    plans = {p.label: p for p in check_limits(_SmallDevice(), src, None, 64)}
    e = plans["token_embd"]
    limit = 32 << 20
    assert len(e.shards) == 2 and e.shards[0] == (0, 29120)       # 29120 = 64 * (32 MiB // (576 * 2) // 64)
    assert [r0 for r0, _ in e.shards] == [0, 29120] and sum(n for _, n in e.shards) == 49152
    assert max(e.buffers) <= limit and e.nbytes == 49152 * 576 * 2
    assert all(not p.shards for lbl, p in plans.items() if lbl != "token_embd")
    # a lower cap (webdrift.load(max_binding_bytes=...)) shards further: 4 MiB -> 3640 rows -> 3584 per shard
    e4 = {p.label: p for p in check_limits(_SmallDevice(), src, None, 64, max_binding=4 << 20)}["token_embd"]
    assert len(e4.shards) == 14 and e4.shards[-1] == (13 * 3584, 49152 - 13 * 3584)
    # an 8B model in q8: the 501 MiB embedding and LM head shard, the 56 MiB FFN gate cannot
    with pytest.raises(GPULimitError) as exc:
        check_limits(_SmallDevice(), synthetic_source("llama-3.1-8b", "q8"), None, 64)
    msg = str(exc.value)
    assert "'blk.0.w_gate'" in msg and "14336 x 4096" in msg and "56 MiB" in msg, msg
    assert "32 MiB per storage binding" in msg and "q4" in msg, msg
    check_limits(_SmallDevice(), synthetic_source("tiny", "q4"), None, 64)     # fits: no error


def test_engine_raises_limit_error_before_allocating():
    from webdrift.runtime.engine import Engine
    from webdrift.runtime.loading import EngineOptions
    from webdrift.weights.synthetic import NullTokenizer
    dev = get_device()
    src = synthetic_source("smollm2-135m", "f16")   # wqkv: 960 x 576 f16 = 1.05 MiB
    n = dev.allocations
    with pytest.raises(GPULimitError, match=r"'blk\.0\.wqkv' \(960 x 576\) needs 1\.1 MiB.* 1 MiB per storage"):
        Engine(dev, src, NullTokenizer(), EngineOptions(max_context=64, max_binding_bytes=1 << 20))
    assert dev.allocations == n


def test_decode_read_bytes_counts_weights_and_kv():
    src = synthetic_source("tiny", "f16")
    plans = plan_weights(src)
    cfg = src.config
    at0, at100 = decode_read_bytes(cfg, plans, 0), decode_read_bytes(cfg, plans, 100)
    assert at100 - at0 == 2 * cfg.n_layers * cfg.kv_dim * 100 * 4
    # tied: the embedding is read in full by the LM head; f16 matrices = 2 bytes per weight, f32 norms
    n_matrix = sum(np.prod(t.shape) for t in src.tensors.values() if len(t.shape) == 2)
    n_norm = sum(np.prod(t.shape) for t in src.tensors.values() if len(t.shape) == 1)
    assert at0 == 2 * n_matrix + 4 * n_norm
    untied = synthetic_source("llama-3.1-8b", "q8")
    p8 = plan_weights(untied)
    emb = next(p for p in p8 if p.label == "token_embd")
    assert not emb.per_token and decode_read_bytes(untied.config, p8, 0) == pytest.approx(
        sum(p.nbytes for p in p8) - emb.nbytes, rel=1e-3)


def test_device_counts_live_bytes():
    dev = get_device()
    before = dev.bytes_allocated
    b = dev.create_buffer(1 << 20, label="count-me")
    assert dev.bytes_allocated == before + (1 << 20) and dev.peak_bytes >= before + (1 << 20)
    dev.release_buffer(b)
    assert dev.bytes_allocated == before
    c = dev.create_buffer(4096, label="collected")
    del c
    import gc
    gc.collect()
    assert dev.bytes_allocated == before


def test_bench_streams_rows(tmp_path):
    """--streams 2: each row reports the aggregate decode tok/s of 2 streams and its ratio to the
    row's single-stream decode tok/s (numbers, consistent with each other); bad counts refused."""
    js = tmp_path / "s.json"
    assert main(["bench", "--quick", "--quant", "q4", "--no-peers", "--streams", "2", "--json", str(js)]) == 0
    rows = json.loads(js.read_text())["results"]
    assert rows and all(r["error"] is None for r in rows)
    for r in rows:
        s = r["streams"]["2"]
        assert s["decode_tps_total"] > 0
        assert s["vs_single"] == pytest.approx(s["decode_tps_total"] / r["decode_tps"], rel=0.01, abs=0.002)
    with pytest.raises(InvalidArgumentError, match="--streams"):
        from webdrift.tools.bench import parse_streams
        parse_streams("1,x")

def test_compare_puts_reports_side_by_side(tmp_path, capsys):
    """`webdrift bench --compare A B`: rows of saved reports (e.g. desktop and browser on one GPU)
    side by side with ratios to the first; an incomplete file fails clearly."""
    from webdrift.profile.benchmark import MACHINE_FIELDS, ROW_FIELDS, make_report

    def report(route, decode, prefill):
        row = {f: 1 for f in ROW_FIELDS} | {"model": "m", "quant": "q4", "prompt_tokens": 8, "new_tokens": 4,
                                           "decode_tps": decode, "prefill_tps": prefill, "error": None,
                                           "peers": {p: {"skipped": "x"} for p in PEER_NAMES}}
        machine = {f: "" for f in MACHINE_FIELDS} | {"route": route, "adapter": "gpu"}
        return make_report(version="0", date="d", command="c", machine=machine, protocols=[(8, 4)], prefill_chunk=256,
                           repeats=1, roofline={"best_GBps": 1, "bytes": 16, "method": "m"}, peers_note="", results=[row])
    a, b, bad = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "bad.json"
    a.write_text(json.dumps(report("desktop (wgpu-native)", 200.0, 1000.0)))
    b.write_text(json.dumps(report("browser (Pyodide+WebGPU)", 170.0, 800.0)))
    bad.write_text(json.dumps({"results": []}))
    assert main(["bench", "--compare", str(a), str(b)]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| m |")]
    assert len(lines) == 2 and "desktop (wgpu-native)" in lines[0] and "browser (Pyodide+WebGPU)" in lines[1]
    assert lines[1].rstrip(" |").endswith("0.85 | 0.80")          # 170/200, 800/1000
    # the kernels that differ between the reports' rows are listed, those they share are not
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    ra["results"][0] |= {"attention": ["tiled64a32"], "decode_gemv": {"down+residual": ["wide r2 wg128 m2 ksplit"],
                                                                       "norm+gate_up+act": ["wide r16 wg128 m4"]}}
    rb["results"][0] |= {"attention": ["tiled64a32"], "decode_gemv": {"down+residual": ["wide r2 wg128 m2 ksplit"],
                                                                       "norm+gate_up+act": ["wide r2 wg256 u4 m2 ksplit"]}}
    a.write_text(json.dumps(ra))
    b.write_text(json.dumps(rb))
    assert main(["bench", "--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "Kernels that differ, m q4 8/4:" in out
    assert "| decode GEMV norm+gate_up+act | wide r16 wg128 m4 | wide r2 wg256 u4 m2 ksplit |" in out
    assert "down+residual" not in out and "| attention |" not in out
    assert main(["bench", "--compare", str(a), str(a)]) == 0 and "Kernels that differ" not in capsys.readouterr().out
    assert main(["bench", "--compare", str(a), str(bad)]) == 2
    assert "not a complete bench report" in capsys.readouterr().err

def test_bench_lora_rank_fields():
    """--lora-rank R: each row gets decode tok/s with a random rank-R adapter on all seven targets,
    with the LoRA slots but no adapter, the ratio to the plain engine and the switch host time;
    with --streams, K streams with one adapter each; lora_fused_shrink (--lora-fused-shrink) noted."""
    from webdrift.gpu.native import get_device
    from webdrift.tools.bench import bench_model
    from webdrift.weights.synthetic import synthetic_source
    rows = bench_model(get_device(), synthetic_source("tiny", "q4"), [(8, 4)], 100.0, lora_rank=4, streams=[3],
                       lora_fused_shrink=True)
    lo = rows[0]["lora"]
    assert "error" not in lo, lo
    assert lo["rank"] == 4 and lo["fused_shrink"] is True and lo["decode_tps"] > 0 and lo["slots_no_adapter_decode_tps"] > 0
    assert lo["decode_ratio"] == round(lo["decode_tps"] / rows[0]["decode_tps"], 3)
    assert 0 < lo["switch_ms"] < 1.0 and lo["pool_bytes"] > 0
    s3 = lo["streams"]["3"]    # three streams, one adapter each
    assert s3["decode_tps_total"] > 0 and s3["vs_single"] == round(s3["decode_tps_total"] / rows[0]["decode_tps"], 3)


def test_bench_kernel_profile(tmp_path, capsys):
    """--profile-tokens N: the last row's kernel_profile covers N-1 decode steps of exactly the
    engine's decode dispatches, its families add up to its total, the host phases are measured;
    --compare lists it by family; a negative count is refused."""
    from webdrift.profile.benchmark import build_engine
    js = tmp_path / "p.json"
    assert main(["bench", "--synthetic", "tiny", "--quant", "q4", "--no-peers", "--protocol", "16/4,24/4",
                 "--roofline-mib", "8", "--profile-tokens", "6", "--json", str(js)]) == 0
    rows = json.loads(js.read_text())["results"]
    assert "kernel_profile" not in rows[0]                  # the last row of the model only
    kp = rows[-1]["kernel_profile"]
    dev = get_device()
    if not dev.has_timestamps:
        assert kp is None
        return
    eng = build_engine(dev, synthetic_source("tiny", "q4"), 64)
    assert kp["decode_steps"] == 5 and kp["kernels_per_step"] == len(eng.decode.dispatches(1))
    assert kp["gpu_us_per_step"] == pytest.approx(sum(kp["families_us_per_step"].values()), rel=0.01)
    assert 0 < kp["whole_step_gpu_us"] and 0 < kp["whole_step_wall_us"]
    h = kp["host"]
    assert h["step_us"] > 0 and h["submit_us"] > 0 and h["readback_wait_us"] >= 0
    assert main(["bench", "--compare", str(js), str(js)]) == 0
    out = capsys.readouterr().out
    assert "Where a decode step goes (us), tiny q4 24/4" in out
    fam = next(iter(kp["families_us_per_step"]))
    assert any(line.startswith(f"| {fam} |") for line in out.splitlines())
    assert f"| encode + submit a step | {kp['host']['submit_us']:.1f} |" in out
    assert main(["bench", "--quick", "--profile-tokens", "-1"]) == 2
    assert "--profile-tokens -1" in capsys.readouterr().err


def test_bench_streams_kernel_profile(tmp_path):
    """--streams K with --profile-tokens N: each K's kernel_profile covers N-1 steps of the
    K-stream program's dispatches (one program per stream count rounded up to a power of two),
    the best of --repeats aggregate tok/s beside it."""
    from webdrift.profile.benchmark import agenerate_ids, build_engine
    from webdrift.runtime.engine import _run
    js = tmp_path / "s.json"
    assert main(["bench", "--synthetic", "tiny", "--quant", "q4", "--no-peers", "--protocol", "16/4",
                 "--roofline-mib", "8", "--streams", "3", "--repeats", "2", "--profile-tokens", "5",
                 "--json", str(js)]) == 0
    st = json.loads(js.read_text())["results"][0]["streams"]
    assert st["3"]["decode_tps_total"] > 0
    kp = st["3"]["kernel_profile"]
    dev = get_device()
    if not dev.has_timestamps:
        assert kp is None
        return
    eng = build_engine(dev, synthetic_source("tiny", "q4"), 256)
    _run(agenerate_ids(eng, [5, 6, 7], 2, n=3))
    assert set(eng._streams.programs) == {4}
    assert kp["decode_steps"] == 4 and kp["kernels_per_step"] == len(eng._streams.program(3).dispatches(3))
    assert kp["gpu_us_per_step"] == pytest.approx(sum(kp["families_us_per_step"].values()), rel=0.01)


def test_tuner_ab_tunes_each_engine_afresh_and_restores(monkeypatch, tmp_path, capsys):
    """profile.benchmark.tuner_ab (the A/B scripts' helper): each engine is built under its own
    setting of the tuner's attributes, with the in-memory choices cleared and a cache folder of
    its own; the attributes come back after; every engine's decode tok/s is reported."""
    from webdrift.kernels import autotune
    from webdrift.profile import benchmark
    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    seen, real = [], benchmark.build_engine

    def build(dev, src, cap, **kw):
        import os
        seen.append((autotune.CHAIN_LAYERS, autotune.CHAIN_TOP, len(autotune._memory), os.environ["WEBDRIFT_CACHE"]))
        return real(dev, src, cap, **kw)

    monkeypatch.setattr(benchmark, "build_engine", build)
    before = (autotune.CHAIN_LAYERS, autotune.CHAIN_TOP)
    autotune._memory["x"] = {}
    tps = benchmark.tuner_ab(get_device(), "tiny:q4", {"a": {"CHAIN_LAYERS": 1}, "b": {"CHAIN_LAYERS": 5, "CHAIN_TOP": 2}},
                             rounds=1)
    assert [s[:3] for s in seen] == [(1, before[1], 0), (5, 2, 0)]
    assert len({s[3] for s in seen} | {str(tmp_path)}) == 3
    assert (autotune.CHAIN_LAYERS, autotune.CHAIN_TOP) == before
    assert set(tps) == {"a", "b"} and all(len(v) == 1 and v[0] > 0 for v in tps.values())
    assert "tiny:q4 a: {" in capsys.readouterr().out
