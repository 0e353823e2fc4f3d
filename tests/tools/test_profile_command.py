"""`webdrift profile` (webdrift/tools/profile.py): a real profiled generation gives a valid,
self-consistent Chrome trace and summary, the command writes them, and whole decode steps can be
timed as one pass each.
"""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from webdrift.gpu.native import NativeDevice
from webdrift.profile import Profiler, chrome_trace
from webdrift.tools.cli import main

PROMPT, NEW = 32, 15          # max_context 48 = bench --quick's: the tiny q4 kernels are reused


@pytest.fixture(scope="module")
def profiled():
    from webdrift.gpu.native import get_device
    from webdrift.tools.bench import build_engine
    from webdrift.tools.profile import run_profile
    from webdrift.weights.synthetic import synthetic_source
    dev = get_device()
    if not dev.has_timestamps:
        pytest.fail("the test adapter (lavapipe in CI) must offer timestamp-query")
    eng = build_engine(dev, synthetic_source("tiny", "q4"), PROMPT + NEW + 1)
    res = run_profile(eng, PROMPT, NEW, kernels=True)
    return eng, res


def _x_events(trace, pid, tid=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and (tid is None or e["tid"] == tid)]


def test_trace_is_valid_and_consistent(profiled):
    eng, res = profiled
    prof = res["profiler"]
    tr = json.loads(json.dumps(chrome_trace(prof, res["timeline"])))       # JSON round trip
    for e in tr["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0 and e["name"]
    names = {m["args"]["name"] for m in tr["traceEvents"] if m["ph"] == "M"}
    assert {"host (Python)", "GPU (timestamp queries)", "phases", "kernels", "idle"} <= names
    host = {e["name"] for e in _x_events(tr, 1, 1)}
    assert {"tokenize", "prefill.submit", "decode.submit", "readback", "detokenize"} <= host
    assert len(_x_events(tr, 1, 2)) == NEW - 1                              # one per decode step
    kern = _x_events(tr, 2, 1)
    n_decode = len(eng.decode.dispatches(1))
    n_all = len([e for e in _x_events(tr, 2) if e["tid"] != 100])         # every lane of kernels
    assert n_all == len(eng.prefill.dispatches(PROMPT)) + (NEW - 1) * n_decode
    starts = [e["ts"] for e in kern]
    assert starts == sorted(starts)
    for a, b in pairwise(kern):                                               # one lane: no overlap
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
    for g in _x_events(tr, 2, 100):
        assert g["dur"] > 0 and g["args"]["kind"] in ("kernel", "step")
    # every GPU submit starts after the host submitted it
    for b in prof.batches:
        first = min(k[1] for k in b.kernels) + res["timeline"].offset_ns
        assert first >= b.host_submit_ns


def test_summary_adds_up(profiled):
    _, res = profiled
    s = res["summary"]
    for stage in ("prefill", "decode"):
        g = s["gpu"][stage]
        assert sum(f["share_pct"] for f in g["families"].values()) == pytest.approx(100.0, abs=0.05)
        assert g["busy_pct"] + g["idle_pct"] == pytest.approx(100.0, abs=0.05)
        assert 0 < g["busy_ms"] <= g["span_ms"] + 1e-6
        assert g["kernel_gap_us"]["min"] >= 0 and g["step_gap_us"]["min"] >= 0
        assert sum(f["count"] for f in g["families"].values()) == g["kernels"]
    assert s["gpu"]["decode"]["submits"] == NEW - 1
    fams = s["gpu"]["decode"]["families"]
    for op in ("qkv", "attention", "gate_up", "down", "lm_head", "sample"):   # fusions may prefix names
        assert any(op in f for f in fams), (op, list(fams))
    h = s["host"]
    assert h["decode_step_ms"]["n"] == NEW - 1 and h["decode_step_ms"]["min"] > 0
    assert h["host_overhead_us_per_step"]["n"] == NEW - 1 and h["time_to_first_token_ms"] > 0
    assert set(s["runs"]) == {"off", "phases", "phases+kernels", "phases+steps"}
    for r in s["runs"].values():
        assert r["new_tokens"] == NEW and r["decode_tokens_per_s"] > 0


def test_profile_cli_writes_trace(tmp_path, capsys):
    tr, js = tmp_path / "t.json", tmp_path / "s.json"
    assert main(["profile", "--synthetic", "tiny", "--quant", "q4", "--prompt-tokens", str(PROMPT),
                 "--new-tokens", str(NEW), "--trace", str(tr), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "host phases" in out and "kernel family" in out
    trace = json.loads(tr.read_text())
    assert _x_events(trace, 2) and trace["otherData"]["summary"]["gpu"]["decode"]["kernels"] > 0
    # one read for the prompt's token, then one per submit of 1, 2, 4, ... decode steps
    assert json.loads(js.read_text())["host"]["phases"]["readback"]["count"] == _reads(NEW, NativeDevice.decode_steps_per_submit)


def _reads(new: int, most: int) -> int:
    n = done = 1
    while done < new:
        done += min(most, new - done, done)
        n += 1
    return n


def test_whole_step_timing(profiled):
    """run_profile's fourth run times each decode submit as one pass: one (start, end) per step,
    in order and not overlapping, and busy + idle = span."""
    eng, res = profiled
    gs = res["summary"]["gpu_steps"]
    assert gs["submits"] == NEW - 1                     # the first token comes from prefill
    assert abs(gs["busy_pct"] + gs["idle_pct"] - 100.0) < 0.05
    assert gs["span_ms"] > 0 and gs["busy_pct"] > 0
    prof = Profiler.for_device(eng.dev, kernels=True, steps=True)
    from webdrift.tools.profile import profile_generation
    profile_generation(eng, [1, 2, 3], 4, prof)
    dec = [b for b in prof.batches if b.stage == "decode"]
    assert dec and all(len(b.kernels) == 1 and b.kernels[0][1] < b.kernels[0][2] for b in dec)
    assert all(a.kernels[0][2] <= b.kernels[0][1] for a, b in pairwise(dec))   # steps do not overlap
