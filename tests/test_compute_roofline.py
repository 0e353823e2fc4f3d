"""The compute roofline probes (profile/compute.py, issue 11): each probe's per-thread result
equals its recurrence computed independently (numpy), so the timed kernels really do the
multiply-adds they are credited with; the bench report carries the peaks and each row's share
of the f32 peak; the FLOPs per token count the weight matrices."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.gpu_util import device
from webdrift.profile import compute


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def sums(r) -> np.ndarray:
    return np.frombuffer(r["sums"], np.float32)


@pytest.mark.parametrize("kind", ["f32", "f16"])
def test_float_probe_sums_its_chains(kind):
    """a <- a * 0.5 + 0.25 from a0 = x + j: every lane reaches 0.5 (x = (g mod 64) / 128), so a
    thread's sum of CHAINS chains x 4 lanes is 2 CHAINS exactly; with 3 steps it is the closed form."""
    dev = device()
    if kind == "f16" and not dev.has_f16:
        pytest.fail("this adapter has no shader-f16: run on one that has it (lavapipe does)")
    r = run(compute.ameasure_compute(dev, kind, reps=1, workgroups=2, iters=64))
    assert r["tflops"] > 0 and r["threads"] == 512
    np.testing.assert_array_equal(sums(r), np.full(512, 2.0 * compute.CHAINS, np.float32))
    r3 = run(compute.ameasure_compute(dev, kind, reps=1, workgroups=1, iters=3))
    x = (np.arange(256) % 64) / 128.0
    want = sum(4 * ((x + j) * 0.125 + 0.25 * (1 + 0.5 + 0.25)) for j in range(compute.CHAINS))
    np.testing.assert_allclose(sums(r3), want, rtol=2e-3 if kind == "f16" else 1e-6)


def test_int8_probe_sums_its_chains():
    """a <- dot4I8Packed(a, 0x01010101) + a: a's four signed bytes summed and added (wrapping)."""
    r = run(compute.ameasure_compute(device(), "int8", reps=1, workgroups=1, iters=40))
    a = np.array([[(g % 7) + j for j in range(compute.CHAINS)] for g in range(256)], np.int64)
    for _ in range(40):
        b = (a & 0xFFFFFFFF).astype(np.uint32).view(np.uint8).reshape(256, compute.CHAINS, 4).view(np.int8)
        a = a + b.astype(np.int64).sum(axis=-1)
        a = ((a + 2**31) % 2**32) - 2**31              # i32 wraps
    np.testing.assert_array_equal(sums(r), a.sum(axis=1).astype(np.float32))


def test_prefill_flops_count_the_weight_matrices():
    from webdrift.weights.synthetic import synthetic_source
    src = synthetic_source("smollm2-135m", "q4")
    cfg = src.config
    per_layer = cfg.dim * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * cfg.dim + 3 * cfg.dim * cfg.ffn_dim
    assert compute.prefill_flops_per_token(src) == 2 * (cfg.n_layers * per_layer + cfg.vocab_size * cfg.dim)


def test_bench_reports_compute_peaks(tmp_path):
    import json

    from webdrift.tools.cli import main
    js = tmp_path / "r.json"
    assert main(["bench", "--quick", "--quant", "q4", "--no-peers", "--json", str(js)]) == 0
    rep = json.loads(js.read_text())
    peaks = rep["roofline"]["compute"]
    assert set(peaks) >= {"f32", "int8"} and all(v["tflops"] > 0 for v in peaks.values())
    from webdrift.weights.synthetic import synthetic_source
    flops = compute.prefill_flops_per_token(synthetic_source("tiny", "q4"))   # what --quick runs
    for r in rep["results"]:
        want = 100 * r["prefill_tps"] * flops / (peaks["f32"]["tflops"] * 1e12)
        assert r["prefill_pct_compute"] == pytest.approx(want, rel=0.01, abs=0.01)


def test_bench_json_keeps_the_models_done_when_cut_short(tmp_path, monkeypatch):
    """`webdrift bench --json` rewrites its file after each model, so a run cut short (a device
    call's time limit; here the second model's run interrupted) leaves a complete report of the
    models done, marked incomplete; a finished run's file has every model and no mark."""
    import json

    from webdrift.profile.benchmark import missing_fields
    from webdrift.tools import bench
    from webdrift.tools.cli import main
    real, calls = bench.bench_model, []

    def cut_at_second(*a, **kw):
        calls.append(a[1])
        if len(calls) == 2:
            raise KeyboardInterrupt      # what a time limit's signal does to the process
        return real(*a, **kw)

    monkeypatch.setattr(bench, "bench_model", cut_at_second)
    js = tmp_path / "r.json"
    argv = ["bench", "--quick", "--quant", "q4,q8", "--protocol", "16/4", "--no-peers", "--json", str(js)]
    assert main(argv) == 130            # "webdrift: interrupted"
    rep = json.loads(js.read_text())
    assert rep["incomplete"] == "1 of 2 models done" and missing_fields(rep) == []
    assert [(r["quant"], r["prompt_tokens"], r["new_tokens"]) for r in rep["results"]] == [("q4", 16, 4)]
    assert rep["results"][0]["decode_tps"] > 0 and not (tmp_path / "r.json.tmp").exists()
    monkeypatch.setattr(bench, "bench_model", real)
    assert main(argv) == 0
    rep = json.loads(js.read_text())
    assert "incomplete" not in rep and [r["quant"] for r in rep["results"]] == ["q4", "q8"]


def test_matrix_unit_probe_only_where_offered():
    """The matrix units' probe (Dawn's subgroup matrices) is offered where the adapter has them, and
    is credited with MMA_CHAINS x ITERS 16 x 16 x 16 multiply-accumulates per subgroup of 32 (its
    result, ITERS / 256 in every element, and its speed were checked on an H200 through Dawn:
    docs/BENCHMARKS.md, session 31; no adapter here has matrix units)."""
    from tests.test_kernels_gemm_mma import SourceDevice
    assert compute.kinds(SourceDevice())[-1] == "mma_f16"
    assert "mma_f16" not in compute.kinds(device())
    src, _ = compute.probe_source("mma_f16", 512, iters=8)
    assert src.count("subgroupMatrixMultiplyAccumulate(a, b, c") == compute.MMA_CHAINS
    assert src.count("subgroupMatrixStore<row_major>(&out, base + ") == compute.MMA_CHAINS
    assert "for (var i = 0u; i < 8u; i++)" in src and "base = (gid.x / 32u) * 8u * 256u" in src
    assert compute.out_floats("mma_f16", 512) == 16 * compute.MMA_CHAINS * 256
    assert compute.multiply_adds(512, 8, "mma_f16") == 16 * compute.MMA_CHAINS * 8 * 4096
    assert compute.multiply_adds(512, 8) == 512 * compute.CHAINS * 8 * 4


def test_a_peak_not_measured_says_why():
    """The bench's log and report summary name a probe the adapter refused (e.g. the matrix units'
    on a Dawn build without them) with its error, not as "None TFLOP/s"."""
    from webdrift.tools.bench import compute_line, peak_text
    peaks = {"f32": {"tflops": 60.6, "method": "gpu-timestamps"},
             "mma_f16": {"tflops": None, "error": "GPUError: kernel 'compute_mma_f16' failed to compile " + "x" * 500}}
    line = compute_line({"compute": peaks})
    assert line.startswith("compute peaks (multiply-adds x 2, best): f32 60.6 TFLOP/s (gpu-timestamps), "
                           "mma_f16 not measured (GPUError: kernel 'compute_mma_f16' failed to compile x")
    assert "None" not in line and len(line) < 250
    assert peak_text("f32", peaks["f32"], method=False) == "f32 60.6 TFLOP/s"
