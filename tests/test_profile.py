"""Profiler: the timeline maths (clock alignment, busy union, gaps) against hand-computed
numbers; a disabled profiler costs next to nothing. A real profiled generation (trace, summary,
the command): tests/tools/test_profile_command.py.
"""

from __future__ import annotations

import time

import pytest

from webdrift.gpu.base import TimestampRecorder
from webdrift.profile import DISABLED, Profiler, Timeline, kernel_family, summarize
from webdrift.profile.profiler import GPUBatch, Span


def _fake_profiler():
    """Two submits by hand: host submits at 1000 and 50000 ns; GPU clock starts near 10^9."""
    p = Profiler(kernels=True)
    g0 = 10**9
    b0 = GPUBatch("decode", 1000, TimestampRecorder(3), {"step": 1})
    b0.kernels = [("L0.qkv", g0 + 0, g0 + 100), ("L0.attention", g0 + 90, g0 + 300),     # overlap 10
                  ("L1.qkv", g0 + 350, g0 + 400)]                                       # gap 50
    b1 = GPUBatch("decode", 50000, TimestampRecorder(1), {"step": 2})
    b1.kernels = [("sample", g0 + 40000, g0 + 40100)]
    p.batches = [b0, b1]
    p.spans = [Span("tokenize", 0, 10), Span("readback", 100, 900, {"token": 0}),
               Span("decode.submit", 950, 1050), Span("readback", 1100, 60000, {"token": 1})]
    return p


def test_timeline_against_hand_computed_numbers():
    tl = Timeline(_fake_profiler())
    # offset: max(1000 - g0, 50000 - (g0 + 40000)) = 10000 - g0
    assert tl.offset_ns == 10000 - 10**9
    assert [k.start_ns for k in tl.kernels] == [10000, 10090, 10350, 50000]
    assert [(g.start_ns, g.end_ns, g.kind) for g in tl.gaps] == [(10300, 10350, "kernel"), (10400, 50000, "step")]
    assert Timeline.busy_ns(tl.kernels) == 300 + 50 + 100
    assert kernel_family("L12.gate_up+act") == "gate_up+act" and kernel_family("lm_head") == "lm_head"
    s = summarize(_fake_profiler())["gpu"]["decode"]
    assert s["span_ms"] == pytest.approx(40100e-6) and s["busy_ms"] == pytest.approx(450e-6)
    assert s["families"]["qkv"]["count"] == 2
    assert s["families"]["qkv"]["share_pct"] == pytest.approx(100 * 150 / 460, abs=1e-3)
    h = summarize(_fake_profiler())["host"]
    assert h["decode_step_ms"]["mean"] == pytest.approx((60000 - 900) / 1e6)
    assert h["host_overhead_us_per_step"]["mean"] == pytest.approx((60000 - 900 - 58900) / 1e3)


def test_disabled_profiler_costs_nothing_measurable():
    assert not DISABLED and DISABLED.gpu_timer("decode", 10) is None
    n = 20000
    t0 = time.perf_counter_ns()
    for i in range(n):
        with DISABLED.phase("decode.submit", step=i):
            pass
        DISABLED.gpu_timer("decode", 10, step=i)
        with DISABLED.phase("readback", token=i):
            pass
    per_step_us = (time.perf_counter_ns() - t0) / n / 1e3
    assert per_step_us < 25.0         # ~1.5 us on a desktop, ~6 us on a 2-core CI VM: far below a decode step
    assert DISABLED.spans == [] and DISABLED.batches == []
