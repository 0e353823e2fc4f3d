"""The process tests/test_interrupt.py interrupts (python -m tests.interrupt_child MODE N): a tiny
engine generating while this process is sent SIGINT (Python's default handler: KeyboardInterrupt).

MODE "sweep": a timer thread sends SIGINT at N delays spread over one generation's duration.
MODE "map": N times, the process sends itself SIGINT from inside the token read-back's wait (the
wait's look-up of its map's status, after a poll), so Python raises KeyboardInterrupt right there,
whatever the machine's speed (a timer aimed at the wait missed it on a loaded machine). On
lavapipe a submit executes the work, so a sweep rarely lands in the read-back.

After each interrupted generation the next one must give the reference tokens, with the engine
idle and the device's live bytes unchanged. Where each KeyboardInterrupt surfaced (the innermost
webdrift function of its traceback) is counted. Prints one JSON line; a hang or an abort is the
parent's to see.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback


def main(mode: str, n: int) -> None:
    from webdrift.gpu.native import get_device
    from webdrift.runtime.engine import Engine
    from webdrift.runtime.loading import EngineOptions
    from webdrift.weights.synthetic import NullTokenizer, synthetic_source

    dev = get_device()
    eng = Engine(dev, synthetic_source("tiny", "q4"), NullTokenizer(), EngineOptions(max_context=96))
    prompt = list(range(1, 40))

    def gen():
        return eng.generate(prompt, max_new_tokens=24, stop_at_eos=False).token_ids

    ref = gen()
    spans = []
    for _ in range(3):     # one generation's duration: the least of 3 (one timed during a load
        t = time.perf_counter()          # spike stretched the sweep past the generations: 13 of
        assert gen() == ref              # 30 signals fell after them on a loaded 2-core machine)
        spans.append(time.perf_counter() - t)
    span = min(spans)
    bytes0 = dev.bytes_allocated
    where: dict[str, int] = {}
    wrong = completed = 0
    armed = threading.Event()

    class ArmedLib:
        """wgpu-native's C API as webdrift.gpu.native calls it, except that an armed
        wgpuDevicePoll (NativeDevice._wait_map's, after the poll) sends SIGINT, which the
        interpreter raises at its next instruction, inside the wait."""
        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            return getattr(self._lib, name)

        def wgpuDevicePoll(self, *a):
            r = self._lib.wgpuDevicePoll(*a)
            if armed.is_set():
                armed.clear()
                os.kill(os.getpid(), signal.SIGINT)
            return r

    if mode == "map":
        dev._lib = ArmedLib(dev._lib)      # the device's C entry points (NativeDevice._lib)
    package = os.path.dirname(os.path.abspath(sys.modules["webdrift"].__file__))
    for k in range(n):
        timer = None
        if mode == "sweep":
            timer = threading.Timer(span * (k + 0.5) / n, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
        else:
            armed.set()
        try:
            gen()
        except KeyboardInterrupt as e:
            frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(package)]
            key = frames[-1].name if frames else "<outside webdrift>"
            where[key] = where.get(key, 0) + 1
        else:
            completed += 1
            try:
                time.sleep(0.05)          # a SIGINT arriving after the generation lands here
            except KeyboardInterrupt:
                pass
        finally:
            if timer is not None:
                timer.cancel()
        armed.clear()
        for _ in range(3):                # the next generation (a late SIGINT may hit the first try)
            try:
                out = gen()
                break
            except KeyboardInterrupt:
                continue
        wrong += out != ref
    print(json.dumps({"mode": mode, "where": where, "completed": completed, "wrong": wrong, "busy": eng.busy,
                      "span_s": round(span, 3), "bytes_before": bytes0, "bytes_after": dev.bytes_allocated}),
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sweep", int(sys.argv[2]) if len(sys.argv) > 2 else 20)
