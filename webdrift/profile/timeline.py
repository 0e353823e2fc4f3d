"""From a Profiler's raw records to a kernel timeline and a summary (lm-Meter's analysis step).

Timeline: every timed kernel with its start and end on the host clock, in start order, and the
idle gaps of the GPU between them. GPU timestamps have their own time base; they are moved onto
the host's perf_counter clock by the smallest offset that puts every timed submit's first kernel
after the host time of that submit (a GPU cannot start work before it is submitted), so the
alignment is exact up to the submit latency of the best-aligned submit.

Gaps: idle = time in which no kernel runs. Kernels are walked in start order against the latest
end seen so far, so overlapping kernels (possible between passes on a real GPU) never produce a
negative gap; a gap is "kernel" inside one submit (pass boundaries, barriers, launch latency) or
"step" between submits (the host loop, the read-back round trip).

Summary (plain dict, JSON-ready): per stage GPU span / busy / idle, time share per kernel family
(shares of one stage sum to 100%), host phases, time to first token and per-step host overhead
(a decode step's wall time minus the time the host waited for its token).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise

from .profiler import Profiler

_LAYER = re.compile(r"^L(\d+)\.")


def kernel_family(label: str) -> str:
    """'L12.gate_up+act' -> 'gate_up+act' (one family per operator, whatever the layer)."""
    return _LAYER.sub("", label)


@dataclass
class KernelEvent:
    stage: str          # "prefill" | "decode"
    batch: int          # index of the timed submit
    label: str          # dispatch label, e.g. "L3.qkv"
    family: str
    start_ns: int       # on the host perf_counter_ns clock
    end_ns: int
    args: dict

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Gap:
    start_ns: int
    end_ns: int
    kind: str           # "kernel" (inside a submit) | "step" (between submits)
    stage: str          # stage of the kernel after the gap

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


class Timeline:
    """Kernels and GPU idle gaps of a profiled run, on the host clock."""

    def __init__(self, prof: Profiler):
        self.prof = prof
        batches = [b for b in prof.batches if b.kernels]
        # GPU ticks -> host ns: the smallest offset with every submit starting after its host submit
        self.offset_ns = max((b.host_submit_ns - min(k[1] for k in b.kernels) for b in batches), default=0)
        ev: list[KernelEvent] = []
        for i, b in enumerate(batches):
            for label, s, e in b.kernels:
                e = max(e, s)   # a clock glitch must not give a negative duration
                ev.append(KernelEvent(b.stage, i, label, kernel_family(label), s + self.offset_ns,
                                      e + self.offset_ns, b.args))
        ev.sort(key=lambda k: (k.start_ns, k.end_ns))
        self.kernels = ev
        self.gaps: list[Gap] = []
        frontier, prev_batch = None, None
        for k in ev:
            if frontier is not None and k.start_ns > frontier:
                self.gaps.append(Gap(frontier, k.start_ns, "step" if k.batch != prev_batch else "kernel", k.stage))
            frontier = k.end_ns if frontier is None else max(frontier, k.end_ns)
            prev_batch = k.batch

    @staticmethod
    def busy_ns(kernels: list[KernelEvent]) -> int:
        """Length of the union of the kernels' intervals (kernels sorted by start)."""
        total, cur_s, cur_e = 0, None, None
        for k in kernels:
            if cur_e is None or k.start_ns > cur_e:
                if cur_e is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = k.start_ns, k.end_ns
            else:
                cur_e = max(cur_e, k.end_ns)
        if cur_e is not None:
            total += cur_e - cur_s
        return total


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "mean": 0.0, "median": 0.0, "min": 0.0, "max": 0.0}
    v = sorted(values)
    n = len(v)
    med = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
    return {"n": n, "mean": sum(v) / n, "median": med, "min": v[0], "max": v[-1]}


def _r(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


def _rstats(values: list[float], nd: int) -> dict:
    return {k: (v if k == "n" else _r(v, nd)) for k, v in _stats(values).items()}


def summarize(prof: Profiler, timeline: Timeline | None = None) -> dict:
    """The profile summary as a JSON-ready dict (times in ms / us, shares in %)."""
    tl = timeline or Timeline(prof)
    out: dict = {"host": _host_summary(prof), "gpu": {}}
    for stage in ("prefill", "decode"):
        ks = [k for k in tl.kernels if k.stage == stage]
        if not ks:
            continue
        span = max(k.end_ns for k in ks) - ks[0].start_ns
        busy = Timeline.busy_ns(ks)
        ktime = sum(k.dur_ns for k in ks) or 1
        fam: dict[str, dict] = {}
        for k in ks:
            f = fam.setdefault(k.family, {"count": 0, "total_ns": 0})
            f["count"] += 1
            f["total_ns"] += k.dur_ns
        families = {name: {"count": f["count"], "total_ms": _r(f["total_ns"] / 1e6, 6),
                           "mean_us": _r(f["total_ns"] / f["count"] / 1e3, 2),
                           "share_pct": _r(100.0 * f["total_ns"] / ktime, 3)}
                    for name, f in sorted(fam.items(), key=lambda kv: -kv[1]["total_ns"])}
        gaps = [g for g in tl.gaps if g.stage == stage]
        kgap = [g.dur_ns / 1e3 for g in gaps if g.kind == "kernel"]
        sgap = [g.dur_ns / 1e3 for g in gaps if g.kind == "step"]
        n_batches = len({k.batch for k in ks})
        out["gpu"][stage] = {
            "submits": n_batches, "kernels": len(ks),
            "kernels_per_submit": _r(len(ks) / n_batches, 1),
            "span_ms": _r(span / 1e6, 6), "busy_ms": _r(busy / 1e6, 6), "idle_ms": _r((span - busy) / 1e6, 6),
            "busy_pct": _r(100.0 * busy / span if span else 100.0, 2),
            "idle_pct": _r(100.0 * (span - busy) / span if span else 0.0, 2),
            "gpu_ms_per_submit": _r(ktime / n_batches / 1e6, 6),
            "kernel_gap_us": _rstats(kgap, 2),
            "step_gap_us": _rstats(sgap, 2),
            "families": families,
        }
    out["phases"] = phase_table(out)
    return out


def phase_table(summary: dict) -> dict:
    """lm-Meter's phases from a summary, in ms: where each is measured is in its name (host clock
    or GPU kernel time). Sampling and the embedding run on the GPU in webdrift (no host work)."""
    h, g = summary.get("host", {}), summary.get("gpu", {})
    ph = h.get("phases", {})

    def fam(name: str) -> float:
        return sum(st.get("families", {}).get(name, {}).get("total_ms", 0.0) for st in g.values())

    out = {"tokenize_host_ms": ph.get("tokenize", {}).get("total_ms", 0.0),
           "prefill_to_first_token_host_ms": h.get("time_to_first_token_ms", 0.0),
           "decode_step_host_ms_mean": h.get("decode_step_ms", {}).get("mean", 0.0),
           "readback_wait_host_ms": ph.get("readback", {}).get("total_ms", 0.0),
           "detokenize_host_ms": ph.get("detokenize", {}).get("total_ms", 0.0)}
    if g:
        out.update({"embedding_gpu_ms": _r(fam("embedding"), 6),
                    "prefill_gpu_busy_ms": g.get("prefill", {}).get("busy_ms", 0.0),
                    "decode_gpu_ms_per_step": g.get("decode", {}).get("gpu_ms_per_submit", 0.0),
                    "sampling_gpu_ms": _r(fam("sample"), 6)})
    return out


def _host_summary(prof: Profiler) -> dict:
    phases: dict[str, list[int]] = {}
    for s in prof.spans:
        phases.setdefault(s.name, []).append(s.dur_ns)
    table = {name: {"count": len(d), "total_ms": _r(sum(d) / 1e6, 6), "mean_us": _r(sum(d) / len(d) / 1e3, 2)}
             for name, d in phases.items()}
    out: dict = {"phases": table}
    reads = [s for s in prof.spans if s.name == "readback"]
    pre = [s for s in prof.spans if s.name == "prefill.submit"]
    if pre and reads:
        first = next((r for r in reads if r.t1 >= pre[0].t0), None)
        if first is not None:
            out["time_to_first_token_ms"] = _r((first.t1 - pre[0].t0) / 1e6, 6)
    # decode steps: from one token on the host to the next; overhead = step - wait for the token
    starts = [s.t0 for s in prof.spans if s.name == "tokenize"]   # one per generation
    steps, overhead = [], []
    for a, b in pairwise(reads):
        if b.t0 < a.t1 or any(a.t1 <= t < b.t1 for t in starts):
            continue
        n = b.args.get("tokens", 1)      # a read brings the tokens of every step of its submit:
        step = (b.t1 - a.t1) / n         # each of its steps counts once, at the submit's mean
        steps += [step / 1e6] * n
        overhead += [(step - b.dur_ns / n) / 1e3] * n
    out["decode_step_ms"] = _rstats(steps, 6)
    out["host_overhead_us_per_step"] = _rstats(overhead, 3)
    if steps:
        out["host_overhead_pct_of_step"] = _r(100.0 * sum(overhead) / 1e3 / sum(steps), 3)
    return out


def format_summary(summary: dict) -> str:
    """The summary as text tables (what `webdrift profile` prints)."""
    lines: list[str] = []
    if summary.get("phases"):
        lines.append("phases (lm-Meter; ms): " + ", ".join(f"{k} {v:.3f}" for k, v in summary["phases"].items()))
    h = summary.get("host", {})
    lines.append("host phases (perf_counter):")
    lines.append(f"  {'phase':<20} {'count':>6} {'total ms':>11} {'mean us':>10}")
    for name, p in h.get("phases", {}).items():
        lines.append(f"  {name:<20} {p['count']:>6} {p['total_ms']:>11.3f} {p['mean_us']:>10.1f}")
    if "time_to_first_token_ms" in h:
        lines.append(f"  time to first token: {h['time_to_first_token_ms']:.3f} ms")
    st, ov = h.get("decode_step_ms", {}), h.get("host_overhead_us_per_step", {})
    if st.get("n"):
        lines.append(f"  decode step: mean {st['mean']:.3f} ms, median {st['median']:.3f} ms over {st['n']} steps; "
                     f"host overhead per step: mean {ov['mean']:.1f} us, median {ov['median']:.1f} us "
                     f"({h.get('host_overhead_pct_of_step', 0.0):.2f}% of the step)")
    for stage, g in summary.get("gpu", {}).items():
        lines.append(f"GPU {stage} (timestamps): {g['submits']} submits, {g['kernels']} kernels, "
                     f"span {g['span_ms']:.3f} ms, busy {g['busy_pct']:.1f}% / idle {g['idle_pct']:.1f}%, "
                     f"{g['gpu_ms_per_submit']:.3f} ms of kernels per submit")
        kg, sg = g["kernel_gap_us"], g["step_gap_us"]
        lines.append(f"  gaps between kernels: mean {kg['mean']:.1f} us (n={kg['n']}); "
                     f"between submits: mean {sg['mean']:.1f} us (n={sg['n']})")
        lines.append(f"  {'kernel family':<22} {'count':>6} {'total ms':>11} {'mean us':>10} {'share':>8}")
        for name, f in g["families"].items():
            lines.append(f"  {name:<22} {f['count']:>6} {f['total_ms']:>11.3f} {f['mean_us']:>10.1f} "
                         f"{f['share_pct']:>7.2f}%")
    gs = summary.get("gpu_steps")
    if gs and gs.get("submits"):
        lines.append(f"GPU decode, whole steps timed (one pass each, no per-kernel passes): {gs['submits']} steps, "
                     f"span {gs['span_ms']:.3f} ms, busy {gs['busy_pct']:.1f}% / idle {gs['idle_pct']:.1f}%, "
                     f"gap between steps mean {gs['step_gap_us']['mean']:.1f} us")
    return "\n".join(lines)
