"""Profiling: host phases (perf_counter) and GPU kernels (timestamp queries), a kernel timeline with
its idle gaps, Chrome trace export and summary tables (lm-Meter's two levels, online).

    from webdrift.profile import Profiler, summarize, format_summary, write_chrome_trace
    eng.profiler = Profiler.for_device(eng.dev, kernels=True)
    eng.generate(ids, max_new_tokens=64)
    eng.profiler.collect(eng.dev)
    print(format_summary(summarize(eng.profiler)))
    write_chrome_trace("trace.json", eng.profiler)

Pure Python (runs in Pyodide too). The desktop `webdrift profile` command that drives it is a
tool: webdrift/tools/profile.py.
Must not: import numpy, wgpu or webdrift.tools.
"""

from .profiler import DISABLED, GPUBatch, Profiler, Span
from .timeline import Gap, KernelEvent, Timeline, format_summary, kernel_family, summarize
from .trace import chrome_trace, write_chrome_trace

__all__ = ["DISABLED", "GPUBatch", "Gap", "KernelEvent", "Profiler", "Span", "Timeline", "chrome_trace",
           "format_summary", "kernel_family", "summarize", "write_chrome_trace"]
