"""Online, low-overhead profiling at lm-Meter's two levels: host phases and GPU kernels.

A `Profiler` rides along with an Engine (`engine.profiler = Profiler(...)`). The engine's host loop
wraps its phases in `with prof.phase(name, **args)` and passes `timestamps=prof.gpu_timer(stage,
n, **args)` to each submit. Everything stays in memory until `collect(dev)` reads the GPU
timestamps back after the generation, so nothing is added to the critical path but a clock read
and a list append per phase; a disabled profiler (`DISABLED`, the engine's default) returns a
shared no-op context and None, which costs well under a microsecond per decode step.

Host phases use `time.perf_counter_ns` (monotonic). GPU kernels are timed with timestamp queries:
the native backend puts each dispatch of a timed submit in its own compute pass with
`timestamp_writes` (wgpu-py 0.32 does not expose timestamps inside passes), which adds a pass
boundary per kernel: kernel-timed runs are slower than untimed ones, so report speed from an
untimed run and shares/gaps from a timed one. Ticks are taken as nanoseconds (Vulkan's
timestampPeriod is 1 on NVIDIA and lavapipe; wgpu-py does not expose it).

Must not: import numpy or wgpu (runs in Pyodide too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..gpu.base import TimestampRecorder

_now = time.perf_counter_ns


@dataclass
class Span:
    """One host phase: [t0, t1) in perf_counter_ns."""
    name: str
    t0: int
    t1: int
    args: dict = field(default_factory=dict)

    @property
    def dur_ns(self) -> int:
        return self.t1 - self.t0


@dataclass
class GPUBatch:
    """The kernels of one timed submit: stage ("prefill" / "decode"), the host time of the submit
    and, after collect(), per-kernel (label, start_ns, end_ns) in GPU clock ticks."""
    stage: str
    host_submit_ns: int
    recorder: TimestampRecorder
    args: dict = field(default_factory=dict)
    kernels: list = field(default_factory=list)


class _Phase:
    __slots__ = ("args", "name", "prof", "t0")

    def __init__(self, prof: Profiler, name: str, args: dict):
        self.prof, self.name, self.args = prof, name, args

    def __enter__(self):
        self.t0 = _now()
        return self

    def __exit__(self, *exc):
        self.prof.spans.append(Span(self.name, self.t0, _now(), self.args))
        return False


class _NullPhase:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL_PHASE = _NullPhase()


class Profiler:
    """Collects host phase spans and GPU kernel timestamps of one or more generations.

    enabled: record host phases. kernels: also time every dispatch with GPU timestamps (needs
    the adapter's timestamp-query feature; see `for_device`). steps: time each submit as a
    whole instead (one pass with a timestamp at each end; native backend): the GPU's busy and
    idle time between decode steps without the per-kernel passes' overhead.
    """

    def __init__(self, enabled: bool = True, kernels: bool = False, steps: bool = False):
        self.enabled = bool(enabled)
        self.kernels = bool(enabled and kernels)
        self.steps = bool(self.kernels and steps)
        self.spans: list[Span] = []
        self.batches: list[GPUBatch] = []
        self.t_start = _now()

    @classmethod
    def for_device(cls, dev, kernels: bool = True, steps: bool = False) -> Profiler:
        """A profiler that times kernels (or whole steps) only where the device can (timestamp-query)."""
        return cls(True, kernels and dev.has_timestamps, steps=steps)

    def __bool__(self) -> bool:
        return self.enabled

    # -- hooks the engine calls ---------------------------------------------------------------
    def phase(self, name: str, **args):
        """Context manager timing one host phase (a no-op when disabled)."""
        if not self.enabled:
            return _NULL_PHASE
        return _Phase(self, name, args)

    def gpu_timer(self, stage: str, n_dispatches: int, **args) -> TimestampRecorder | None:
        """A TimestampRecorder for the next submit (pass it as `timestamps=`), or None."""
        if not self.kernels:
            return None
        rec = TimestampRecorder(n_dispatches, whole=self.steps)
        self.batches.append(GPUBatch(stage, _now(), rec, args))
        return rec

    # -- after a generation -----------------------------------------------------------------
    def collect(self, dev) -> None:
        """Read back the timestamps of every timed submit not read yet, synchronously (devices
        with has_sync_reads: the native backend)."""
        for b in self._unread():
            dev.read_timestamps_sync(b.recorder)
            self._take(b)

    async def acollect(self, dev) -> None:
        """collect() on any backend (the browser's reads are awaited)."""
        for b in self._unread():
            await dev.read_timestamps(b.recorder)
            self._take(b)

    def _unread(self) -> list[GPUBatch]:
        return [b for b in self.batches if not b.kernels and b.recorder.pending is not None]

    @staticmethod
    def _take(b: GPUBatch) -> None:
        rec = b.recorder
        b.kernels = [(lab, int(s), int(e)) for lab, (s, e) in zip(rec.labels, rec.ticks_ns)]
        rec.pending = None

    def reset(self) -> None:
        self.spans.clear()
        self.batches.clear()
        self.t_start = _now()


DISABLED = Profiler(enabled=False)
