"""Chrome trace export (the JSON Perfetto and chrome://tracing open).

Tracks (pid/tid):
  1/1  host: phases        tokenize, prefill.submit, decode.submit, readback, detokenize
  1/2  host: decode steps  one event per generated token (previous token on host -> this one)
  2/1  GPU: kernels        every timed dispatch ("X" events, in start order; kernels that
                           overlap an earlier one go to lanes 2/3, 2/4, ... so events nest)
  2/100 GPU: idle          the gaps in which no kernel runs (args.kind: kernel | step)
Times are microseconds from the first event (`ts`, `dur`); `otherData` carries the summary.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import json
from itertools import pairwise

from .profiler import Profiler
from .timeline import Timeline, summarize

HOST_PID, GPU_PID = 1, 2
PHASES_TID, STEPS_TID, KERNELS_TID, IDLE_TID = 1, 2, 1, 100


def _meta(pid: int, tid: int | None, name: str) -> dict:
    if tid is None:
        return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def chrome_trace(prof: Profiler, timeline: Timeline | None = None, meta: dict | None = None) -> dict:
    """The profile as a Chrome trace dict ({"traceEvents": [...], ...})."""
    tl = timeline or Timeline(prof)
    starts = [s.t0 for s in prof.spans] + [k.start_ns for k in tl.kernels]
    origin = min(starts) if starts else prof.t_start

    def us(t: int) -> float:
        return round((t - origin) / 1e3, 3)

    def ev(name: str, cat: str, pid: int, tid: int, t0: int, t1: int, args: dict | None = None) -> dict:
        e = {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": us(t0),
             "dur": round(max(0, t1 - t0) / 1e3, 3)}
        if args:
            e["args"] = args
        return e

    events = [_meta(HOST_PID, None, "host (Python)"), _meta(HOST_PID, PHASES_TID, "phases"),
              _meta(HOST_PID, STEPS_TID, "decode steps"),
              _meta(GPU_PID, None, "GPU (timestamp queries)"), _meta(GPU_PID, KERNELS_TID, "kernels"),
              _meta(GPU_PID, IDLE_TID, "idle")]
    for s in sorted(prof.spans, key=lambda s: s.t0):
        events.append(ev(s.name, "host", HOST_PID, PHASES_TID, s.t0, s.t1, dict(s.args)))
    reads = sorted((s for s in prof.spans if s.name == "readback"), key=lambda s: s.t0)
    gens = [s.t0 for s in prof.spans if s.name == "tokenize"]
    for i, (a, b) in enumerate(pairwise(reads)):
        if b.t0 >= a.t1 and not any(a.t1 <= t < b.t1 for t in gens):
            events.append(ev("decode step", "host", HOST_PID, STEPS_TID, a.t1, b.t1,
                             {"token": b.args.get("token", i + 1), "wait_us": round(b.dur_ns / 1e3, 3)}))
    lanes: list[int] = []          # end time of the last kernel in each lane
    for k in tl.kernels:
        lane = next((j for j, end in enumerate(lanes) if end <= k.start_ns), None)
        if lane is None:
            lanes.append(k.end_ns)
            lane = len(lanes) - 1
            if lane:
                events.append(_meta(GPU_PID, KERNELS_TID + lane + 1, f"kernels (overlap {lane})"))
        else:
            lanes[lane] = k.end_ns
        tid = KERNELS_TID if lane == 0 else KERNELS_TID + lane + 1
        events.append(ev(k.label, k.family, GPU_PID, tid, k.start_ns, k.end_ns,
                         dict(k.args, stage=k.stage, submit=k.batch)))
    for g in tl.gaps:
        events.append(ev("idle", "gap", GPU_PID, IDLE_TID, g.start_ns, g.end_ns, {"kind": g.kind, "stage": g.stage}))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"summary": summarize(prof, tl), **(meta or {})}}


def write_chrome_trace(path: str, prof: Profiler, timeline: Timeline | None = None, meta: dict | None = None) -> dict:
    """Write the Chrome trace JSON to path; returns the dict written."""
    tr = chrome_trace(prof, timeline, meta)
    with open(path, "w") as f:
        json.dump(tr, f)
    return tr
