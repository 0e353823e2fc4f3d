"""The tuner's decision logic with asynchronous timestamps (the browser's way): a device that
has timestamp queries but reads them only by awaiting gets the static choice at first use and a
queued measurement; `await tune_pending` measures it (one timing per await), the fastest
candidate by the fake clock below wins, also when timestamps are quantized to 100 us (timed in
growing batches), a candidate whose compile error arrives late is skipped, and the result is
cached, exported and reused by a fresh process.

The fake device wraps the real (lavapipe) one for compiling kernels; its timed submits run
nothing and its `read_timestamps` (async) reports the cost the test assigns to each dispatch."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import numpy as np
import pytest

from webdrift.errors import GPUError
from webdrift.kernels import autotune
from webdrift.kernels.linear import GemvVariant, LinearKernel

FAST = GemvVariant("row", rows=1, wg=64)      # every adapter can run it
NEXT = GemvVariant("split", rows=4, wg=64)     # likewise
FAST_NS, NEXT_NS, SLOW_NS = 3_000, 5_000, 10_000
FLUSH_NS = 85_000      # the L2-evicting dispatch (256 MiB at ~3 TB/s)


def tag(v: GemvVariant) -> str:
    return f"gemv:{v.variant}:{v.rows}:{v.wg}:{v.unroll}:{v.rps}"


class TaggedLinear(LinearKernel):
    """LinearKernel whose dispatches are labelled with their variant (so the fake clock knows them)."""

    def __init__(self, *a, variant=None, **kw):
        super().__init__(*a, variant=variant, **kw)
        self._tag = tag(variant)

    def dispatch(self, buffers, workgroups, label=""):
        return super().dispatch(buffers, workgroups, self._tag)


class AsyncTimedDevice:
    """A GPU that reads timestamps only asynchronously; `quantum_ns` rounds each reading down."""

    has_timestamps = True
    can_time_sync = False
    has_sync_reads = False

    def __init__(self, real, quantum_ns: int = 1, is_cpu: bool = False, reject: str = "", fast_cold_ns: int = 0):
        self._real = real
        self.fast_cold_ns = fast_cold_ns   # FAST's cost right after the L2 flush (0: as warm)
        self.flushed = 0
        self.info = replace(real.info, is_cpu=is_cpu, adapter=f"fake-async-gpu-{quantum_ns}-{is_cpu}-{reject}")
        self.quantum = quantum_ns
        self.reads = 0
        self.reject = reject          # pipelines whose label starts with this "fail to compile" (reported late)
        self.failed: list[str] = []

    def create_pipeline(self, wgsl, bindings, entry="main", label=""):
        if self.reject and label.startswith(self.reject):
            self.failed.append(label)
        return self._real.create_pipeline(wgsl, bindings, entry, label)

    async def check_errors(self):
        if self.failed:
            label, self.failed = self.failed[0], []
            raise GPUError(f"kernel {label!r} failed to compile: workgroup storage over the limit")

    def __getattr__(self, name):
        return getattr(self._real, name)

    @property
    def has_subgroups(self):
        return self._real.has_subgroups

    @property
    def has_f16(self):
        return self._real.has_f16

    def submit(self, dispatches, copies=None, timestamps=None):
        if timestamps is None:
            return self._real.submit(dispatches, copies)
        timestamps.pending = list(dispatches)       # nothing runs: the clock is fake
        return 0

    def read_timestamps_sync(self, rec):
        raise AssertionError("the async tuner must not read timestamps synchronously")

    async def read_timestamps(self, rec):
        await asyncio.sleep(0)
        self.reads += 1
        cost, prev = [], None
        for d in rec.pending:
            flush = d.pipeline.label.startswith("l2_flush")
            self.flushed += flush
            cold = prev is not None and prev.pipeline.label.startswith("l2_flush")
            cost.append(FLUSH_NS if flush else (self.fast_cold_ns or FAST_NS) if d.label == tag(FAST) and cold
                        else FAST_NS if d.label == tag(FAST) else NEXT_NS if d.label == tag(NEXT) else SLOW_NS)
            prev = d
        assert not any(self.reject and d.pipeline.label.startswith(self.reject) for d in rec.pending), \
            "a candidate that failed to compile was timed"
        spans = [sum(cost)] if rec.whole else cost
        rec.ticks_ns.extend((1_000_000, 1_000_000 + s // self.quantum * self.quantum) for s in spans)
        rec.pending = None


@pytest.fixture
def tuner(monkeypatch, tmp_path):
    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    monkeypatch.setattr(autotune, "_pending", {})
    monkeypatch.setattr(autotune, "_new", {})
    monkeypatch.setattr(autotune, "_flushes", {})     # each fake GPU's L2-flush buffer goes with the test
    monkeypatch.setattr(autotune, "LinearKernel", TaggedLinear)
    from tests.gpu_util import device, make_weight
    w, _ = make_weight(np.zeros((64, 128), np.float32), "q4")
    return device(), w


@pytest.mark.parametrize("quantum_ns", [1, 100_000])
def test_async_tuning_queues_measures_caches_and_reuses(tuner, quantum_ns):
    real, w = tuner
    dev = AsyncTimedDevice(real, quantum_ns)
    static = autotune.static_choice(dev)
    assert static != FAST
    # first use: the static choice at once, the measurement queued (nothing timed yet)
    assert autotune.choose_gemv(dev, w) == static
    assert autotune.pending(dev) and dev.reads == 0
    steps = []
    got = asyncio.run(autotune.tune_pending(dev, progress=lambda d, t, k: steps.append((d, t))))
    assert steps[-1][0] == steps[-1][1] == len(got) and dev.reads > 0
    (key, choice), = got.items()
    assert GemvVariant(**choice) == FAST            # the cheapest by the fake clock, quantized or not
    assert autotune.pending(dev) == []
    reads = dev.reads
    assert autotune.choose_gemv(dev, w) == FAST and dev.reads == reads and not autotune.pending(dev)
    # a fresh process (the browser's next visit): choices imported from the store, nothing re-measured
    exported = autotune.export_choices(new_only=True)
    assert exported == {key: choice}
    autotune._memory.clear()
    assert autotune.import_choices(exported) == 1
    assert autotune.choose_gemv(dev, w) == FAST and not autotune.pending(dev) and dev.reads == reads


@pytest.mark.parametrize("quantum_ns", [1, 100_000])
def test_async_timing_reads_weights_from_memory(tuner, quantum_ns):
    """On a GPU every timed run follows the L2-evicting dispatch (its own time subtracted), as the
    synchronous tuner does: a candidate that is fastest only while its weights sit in L2 (timed
    back to back) loses to one that is faster from memory, as in a decode step."""
    real, w = tuner
    dev = AsyncTimedDevice(real, quantum_ns, fast_cold_ns=7_000)
    autotune.choose_gemv(dev, w)
    got = asyncio.run(autotune.tune_pending(dev))
    assert [GemvVariant(**v) for v in got.values()] == [NEXT] and dev.flushed > 0


def test_software_adapter_keeps_static_rule_unless_forced(tuner):
    real, w = tuner
    dev = AsyncTimedDevice(real, is_cpu=True)
    assert autotune.choose_gemv(dev, w) == autotune.static_choice(dev) and not autotune.pending(dev)
    assert autotune.choose_gemv(dev, w, enabled=False) == autotune.static_choice(dev) and not autotune.pending(dev)
    assert autotune.choose_gemv(dev, w, enabled="force") == autotune.static_choice(dev)
    assert len(autotune.pending(dev)) == 1
    got = asyncio.run(autotune.tune_pending(dev))
    assert [GemvVariant(**v) for v in got.values()] == [FAST]
    assert autotune.choose_gemv(dev, w, enabled="force") == FAST
    assert autotune.choose_gemv(dev, w) == autotune.static_choice(dev)     # not forced: the rule, cache or not


def test_pause_and_cancel(tuner):
    real, w = tuner
    dev = AsyncTimedDevice(real)
    autotune.choose_gemv(dev, w)
    autotune.choose_gemv(dev, w, int8=True)
    assert len(autotune.pending(dev)) == 2
    paused = []

    async def pause():
        paused.append(1)

    done = asyncio.run(autotune.tune_pending(dev, pause=pause, cancelled=lambda: len(paused) > 1))
    assert len(done) == 1 and len(autotune.pending(dev)) == 1     # stopped before the second: still queued
    assert len(paused) > dev.reads > 1          # paused before the first and after every timing
    autotune.forget(dev)
    assert autotune.pending(dev) == []


def test_candidate_failing_to_compile_late_is_skipped(tuner):
    """The browser reports a pipeline's compile error asynchronously (e.g. a variant over the
    adapter's workgroup-memory limit): the async tuner awaits the device's errors after compiling
    each candidate and never times or chooses one that failed."""
    real, w = tuner
    dev = AsyncTimedDevice(real, reject="linear_row")
    autotune.choose_gemv(dev, w)
    got = asyncio.run(autotune.tune_pending(dev))
    assert [GemvVariant(**v) for v in got.values()] == [NEXT]


def test_choices_of_other_kernels_are_measured_again(tuner, monkeypatch, tmp_path):
    """A cached choice is keyed by the kernels' hash (template.kernels_id: every wgsl template and
    kernels/*.py): after an upgrade or an edited template, the choices a cache holds for the old
    kernels are not applied to the new ones but measured again; the hash follows the files."""
    from webdrift.kernels import template
    dev, w = tuner
    fake = AsyncTimedDevice(dev)
    assert autotune.key_prefix(fake).startswith(f"{fake.info.adapter}|{fake.info.backend}|k{template.kernels_id()}|")
    autotune.choose_gemv(fake, w)
    asyncio.run(autotune.tune_pending(fake))
    assert not autotune.pending(fake) and autotune.choose_gemv(fake, w) == FAST
    assert len(autotune._load_file()) == 1            # written to the cache file under the current hash
    # the same file read by other kernels: one template edited
    src = tmp_path / "wgsl"
    src.mkdir()
    real = next(d for d in template._template_dirs() if d.is_dir())
    for p in real.iterdir():
        if p.name.endswith(".wgsl"):
            (src / p.name).write_text(p.read_text() + ("\n// edited\n" if p.name == "linear_row.wgsl" else ""))
    old = template.kernels_id()
    monkeypatch.setattr(template, "_template_dirs", lambda: [src])
    template.kernels_id.cache_clear()
    try:
        assert template.kernels_id() != old
        monkeypatch.setattr(autotune, "_memory", {})     # a fresh process with the edited template
        reads = fake.reads
        autotune.choose_gemv(fake, w)
        assert autotune.pending(fake), "a choice measured on other kernels was applied without measuring"
        asyncio.run(autotune.tune_pending(fake))
        assert fake.reads > reads and len(autotune._load_file()) == 2
    finally:
        template.kernels_id.cache_clear()


def test_bench_tunes_again_while_a_rebuild_queues_more(tuner):
    """The benchmark's load (profile/benchmark.build_tuned): a build on an asynchronously timed
    adapter queues measurements; they are measured and the engine built again, and again where
    that rebuild queues a choice that depends on a measured one (on an H200 through Dawn a fresh
    1B q4 load queued 25 choices, its rebuild 4 more), at most TUNE_ROUNDS times."""
    from webdrift.profile import benchmark
    real, w = tuner
    dev = AsyncTimedDevice(real)
    static = autotune.static_choice(dev)
    seen, log = [], []

    def build():                     # the int8 GEMV is asked for only once the float one is FAST
        v = autotune.choose_gemv(dev, w)
        if v == FAST:
            autotune.choose_gemv(dev, w, int8=True)
        seen.append(v)
        return len(seen)

    eng, _ = asyncio.run(benchmark.build_tuned(dev, build, 0, log.append, lambda d, t: None))
    assert eng == 3 and seen == [static, FAST, FAST] and not autotune.pending(dev)
    assert log == ["  tuning 1 kernel choices ..."] * 2
    assert len(autotune.export_choices(new_only=True)) == 2

    # a build that always asks for something new stops after TUNE_ROUNDS rounds (the last left queued)
    def measure():
        return {"measured": True}
        yield

    builds = []

    def endless():
        builds.append(autotune._decide(dev, f"endless|{len(builds)}", True, measure, {"measured": False}))
        return len(builds)

    eng, _ = asyncio.run(benchmark.build_tuned(dev, endless, 0, lambda s: None, lambda d, t: None))
    assert eng == benchmark.TUNE_ROUNDS + 1 == len(builds)
    assert autotune.pending(dev) == [f"endless|{benchmark.TUNE_ROUNDS}"]


class RampingClock:
    """A device whose batches take `spans` ns in turn (the last repeated): a GPU's clocks rising
    from idle. submit() and the synchronous timestamp read are all _busy uses."""

    def __init__(self, spans, read_s: float = 0.0):
        self.spans, self.read, self.read_s = list(spans), 0, read_s

    def submit(self, dispatches, timestamps=None):
        pass

    def read_timestamps_sync(self, rec):
        time.sleep(self.read_s)        # (a batch's round trip)
        rec.ticks_ns = [(0, self.spans[min(self.read, len(self.spans) - 1)])]
        self.read += 1


def test_busy_waits_for_the_clocks_to_settle(monkeypatch):
    """_busy keeps the GPU busy past its minimum while its batches still speed up (clocks rising),
    stops at the first batch no more than 3% faster than the fastest before it, and gives up
    BUSY_SETTLE_S later on a GPU that keeps speeding up."""
    ramp = RampingClock([400, 300, 200, 150, 120, 118, 100])
    autotune._drive_sync(ramp, autotune._busy(ramp, None, 0.0))
    assert ramp.read == 7         # 400 .. 120 each > 3% faster than the best before; 118 is not (+ the batch queued)
    flat = RampingClock([100])
    autotune._drive_sync(flat, autotune._busy(flat, None, 0.0))
    assert flat.read == 3
    monkeypatch.setattr(autotune, "BUSY_SETTLE_S", 0.05)
    faster = RampingClock([int(1e12 * 0.9 ** i) for i in range(200)], read_s=0.001)   # 10% faster each batch
    t0 = time.perf_counter()
    autotune._drive_sync(faster, autotune._busy(faster, None, 0.0))
    assert 0.05 <= time.perf_counter() - t0 < 1.0 and faster.read > 3
