"""What a dependent dispatch costs on this adapter beyond its bytes: N streaming reads of S bytes
each (profile/roofline.py's kernel, each over its own buffer), back to back in one pass timed as a
whole (the best of 5 after at least 0.4 s of the same pass, until the clocks stop rising:
autotune._busy); per kernel = total / N.
"barrier": every read writes one shared sink, so wgpu puts a barrier between each two, as between
a decode step's dependent kernels; "free": a sink each (no hazard, so kernels may overlap). Then
a least-squares fit per grid of the barrier column, t = fixed + S / bandwidth:
    PYTHONPATH=. python scripts/dispatch_chain.py [N [MB,MB,.. [GRID,GRID,..]]]
(defaults: 32 reads; 2, 8, 16, 33.5, 50, 117, 235 MB, the 8B's matrix sizes among them; grids of
8192 and 1056 workgroups of 256, clamped to the buffer). Results: docs/BENCHMARKS.md, session 34."""
import sys

from webdrift.gpu.base import Dispatch
from webdrift.gpu.native import get_device
from webdrift.kernels import autotune as A
from webdrift.kernels.bindings import Bindings
from webdrift.profile.roofline import FILL_WGSL, STREAM_READ_WGSL, WG

dev = get_device()
N = int(sys.argv[1]) if len(sys.argv) > 1 else 32
MB = [float(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "2,8,16,33.5,50,117,235").split(",")]
GRIDS = [int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "8192,1056").split(",")]


def per_kernel_us(ds: list) -> float:
    """The pass of ds timed whole, the best of 5, per dispatch (us), after the tuner's warm-up."""
    return A.best_pass_ns(dev, ds, 0.4) / len(ds) / 1e3


fits = {g: [] for g in GRIDS}   # grid: [(bytes, barrier us)]
for mb in MB:
    cap = int(mb * 1e6) // 16 * 16
    n4 = cap // 16
    srcs = [dev.create_buffer(cap, label=f"src{i}") for i in range(N)]
    sinks = [dev.create_buffer(16, label=f"sink{i}") for i in range(N)]
    fb, rb = Bindings(), Bindings()
    fill = dev.create_pipeline(FILL_WGSL.replace("{DST_DECL}", fb.array("dst", "array<vec4<u32>>", f"({n4})", writable=True))
                               .replace("{N4}", str(n4)).replace("{WG}", str(WG)), fb.kinds, label="fill")
    read = dev.create_pipeline(STREAM_READ_WGSL.replace("{SRC_DECL}", rb.array("src", "array<vec4<u32>>", f"({n4})"))
                               .replace("{SINK_DECL}", rb.array("sink", "array<u32>", "(4)", writable=True))
                               .replace("{N4}", str(n4)).replace("{WG}", str(WG)), rb.kinds, label="read")
    dev.submit([Dispatch(fill, dev.create_bind_group(fill, fb.buffers({"dst": s})), (4096, 1, 1), "fill") for s in srcs])
    line = []
    for grid in GRIDS:
        g = max(1, min(grid, (n4 + WG - 1) // WG))
        for shared in (True, False):
            ds = [Dispatch(read, dev.create_bind_group(read, rb.buffers({"src": s, "sink": sinks[0] if shared else sinks[i]})),
                           (g, 1, 1), "read") for i, s in enumerate(srcs)]
            us = per_kernel_us(ds)
            line.append(f"grid {g} {'barrier' if shared else 'free'} {us:.2f} us")
            if shared:
                fits[grid].append((cap, us))
    print(f"{mb} MB: " + ", ".join(line), flush=True)
    for b in srcs + sinks:
        dev.release_buffer(b)
for grid, pts in fits.items():
    if len(pts) > 1:
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        print(f"grid {grid} (barriers): fixed {my - slope * mx:.2f} us a kernel, {1e-3 / slope:.0f} GB/s marginal")
