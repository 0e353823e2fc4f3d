"""The memory roofline of the adapter, measured in the same run as the benchmark.

A WGSL streaming read (every thread XORs vec4<u32> loads over a grid-stride loop, four loads in
flight per iteration, and stores only if the result hits a magic value so nothing can be
optimised away) runs over one large buffer (1 GiB by default, capped by the adapter's binding
size) and is timed with GPU timestamps: bandwidth = bytes / kernel time (best of `reps`).
Decode is memory-bound, so a decode step cannot beat (bytes it must read) / bandwidth: that is
each model's decode ceiling (models/footprint.py computes the bytes).
The kernel source lives here rather than in wgsl/ because it is a measuring probe, not part of
the model; its bindings are declared through kernels/bindings.py like every kernel's.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import time

from ..gpu.base import Dispatch, TimestampRecorder
from ..kernels.bindings import Bindings

WG = 256

STREAM_READ_WGSL = """
// Streaming read: src (N4) vec4<u32>, read once, coalesced (thread g reads g, g+stride, ...).
{SRC_DECL}
{SINK_DECL}
const N4: u32 = {N4}u;

@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let stride = nwg.x * {WG}u;
  var a0 = vec4<u32>(0u); var a1 = vec4<u32>(0u); var a2 = vec4<u32>(0u); var a3 = vec4<u32>(0u);
  var i = gid.x;
  loop {
    if (i + 3u * stride >= N4) { break; }
    a0 = a0 ^ src[i]; a1 = a1 ^ src[i + stride]; a2 = a2 ^ src[i + 2u * stride]; a3 = a3 ^ src[i + 3u * stride];
    i = i + 4u * stride;
  }
  loop {
    if (i >= N4) { break; }
    a0 = a0 ^ src[i];
    i = i + stride;
  }
  let a = a0 ^ a1 ^ a2 ^ a3;
  let s = a.x ^ a.y ^ a.z ^ a.w;
  if (s == 0x9E3779B9u) { sink[gid.x & 3u] = s; }
}
"""

FILL_WGSL = """
// Fill dst (N4) vec4<u32> with a hash of the index, so the read is not of untouched zero pages.
{DST_DECL}
const N4: u32 = {N4}u;

@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let stride = nwg.x * {WG}u;
  for (var i = gid.x; i < N4; i = i + stride) {
    let h = i * 2654435761u;
    dst[i] = vec4<u32>(h, h ^ 0x55555555u, h + 1u, ~h);
  }
}
"""


def measure_bandwidth(dev, nbytes: int = 1 << 30, reps: int = 10, workgroups: int = 8192) -> dict:
    """Streaming-read bandwidth of dev in GB/s (1e9 bytes/s): best and median of reps (the
    desktop's synchronous call of ameasure_bandwidth)."""
    import asyncio
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(ameasure_bandwidth(dev, nbytes, reps, workgroups))
    finally:
        loop.close()


async def ameasure_bandwidth(dev, nbytes: int = 1 << 30, reps: int = 10, workgroups: int = 8192) -> dict:
    """Streaming-read bandwidth of dev in GB/s (1e9 bytes/s): best and median of reps.

    nbytes is capped by the adapter's max binding and buffer sizes (and rounded to 16 bytes).
    Uses GPU timestamps where the device has them, else host time around submit + read. Where
    timestamps can only be read asynchronously (the browser, which may round them to 100 us),
    each sample is one pass of `reps` reads timed as a whole (3 samples), so the rounding is
    spread over many reads.
    """
    cap = min(int(nbytes), dev.max_binding_size, dev.max_buffer_size)
    cap -= cap % 16
    n4 = cap // 16
    workgroups = max(1, min(workgroups, dev.max_workgroups, (n4 + WG - 1) // WG))
    src = dev.create_buffer(cap, label="roofline.src")
    sink = dev.create_buffer(16, label="roofline.sink")
    try:
        fb, rb = Bindings(), Bindings()
        fill_src = (FILL_WGSL.replace("{DST_DECL}", fb.array("dst", "array<vec4<u32>>", f"({n4})", writable=True))
                    .replace("{N4}", str(n4)).replace("{WG}", str(WG)))
        read_src = (STREAM_READ_WGSL.replace("{SRC_DECL}", rb.array("src", "array<vec4<u32>>", f"({n4})"))
                    .replace("{SINK_DECL}", rb.array("sink", "array<u32>", "(4) written only on a magic sum",
                                                     writable=True))
                    .replace("{N4}", str(n4)).replace("{WG}", str(WG)))
        fill = dev.create_pipeline(fill_src, fb.kinds, label="roofline_fill")
        read = dev.create_pipeline(read_src, rb.kinds, label="stream_read")
        fd = Dispatch(fill, dev.create_bind_group(fill, fb.buffers({"dst": src})), (workgroups, 1, 1), "roofline_fill")
        rd = Dispatch(read, dev.create_bind_group(read, rb.buffers({"src": src, "sink": sink})), (workgroups, 1, 1),
                      "stream_read")
        dev.submit([fd, rd])                       # fill, and warm the read up
        await dev.read_buffer(sink, 0, 4)
        await dev.check_errors()
        times_ns, timed = await atime_dispatch(dev, rd, reps, sink)
    finally:
        for b in (src, sink):
            dev.release_buffer(b)
    times_ns.sort()
    best, med = times_ns[0], times_ns[len(times_ns) // 2]
    return {"bytes": cap, "reps": len(times_ns), "method": "gpu-timestamps" if timed else "host-clock",
            "best_ms": round(best / 1e6, 4), "median_ms": round(med / 1e6, 4),
            "best_GBps": round(cap / best, 2), "median_GBps": round(cap / med, 2)}


async def atime_dispatch(dev, d: Dispatch, reps: int, probe) -> tuple[list[float], bool]:
    """Kernel times (ns) of dispatch d over `reps` runs, and whether GPU timestamps gave them:
    one timed submit where timestamps read synchronously; where they read only asynchronously
    (the browser, which may round them to 100 us), 3 samples of `reps` runs timed as a whole;
    without timestamps, host time of submit + a 4-byte read of `probe` per run."""
    times_ns: list[float] = []
    timed = dev.has_timestamps
    if timed and dev.can_time_sync:
        rec = TimestampRecorder(reps)
        dev.submit([d] * reps, timestamps=rec)
        dev.read_timestamps_sync(rec)
        times_ns = [float(e - s) for s, e in rec.ticks_ns if e > s]
    elif timed:
        for _ in range(3):
            rec = TimestampRecorder(1, whole=True)
            dev.submit([d] * reps, timestamps=rec)
            await dev.read_timestamps(rec)
            times_ns += [float(e - s) / reps for s, e in rec.ticks_ns if e > s]
    if not times_ns:
        timed = False
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            dev.submit([d])
            await dev.read_buffer(probe, 0, 4)
            times_ns.append(float(time.perf_counter_ns() - t0))
    return times_ns, timed


def decode_ceiling(bandwidth_GBps: float, bytes_per_token: float) -> float:
    """Tokens/s a decode step reading bytes_per_token cannot beat at this bandwidth."""
    return bandwidth_GBps * 1e9 / bytes_per_token if bytes_per_token > 0 else 0.0
