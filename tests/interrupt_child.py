"""The process tests/test_interrupt.py interrupts (python -m tests.interrupt_child MODE N): a tiny
engine generating while this process is sent SIGINT (Python's default handler: KeyboardInterrupt).

MODE "sweep": a timer thread sends SIGINT at N delays spread over one generation's duration.
MODE "map": a thread sends SIGINT the moment the host enters the token read-back (map_read), after
a random 0-300 us, N times: the interrupt lands in the map wait, its poll, the map callback or
just after. On lavapipe a submit executes the work, so a sweep rarely lands in the read-back.

After each interrupted generation the next one must give the reference tokens, with the engine
idle and the device's live bytes unchanged. Where each KeyboardInterrupt surfaced (the innermost
webdrift function of its traceback) is counted. Prints one JSON line; a hang or an abort is the
parent's to see.
"""

from __future__ import annotations

import json
import os
import random
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
    t = time.perf_counter()
    assert gen() == ref
    span = time.perf_counter() - t
    bytes0 = dev.bytes_allocated
    where: dict[str, int] = {}
    wrong = completed = 0
    entered = threading.Event()
    armed = threading.Event()
    real_map_read = dev.map_read

    async def watched_map_read(*a, **k):
        if armed.is_set():
            armed.clear()
            entered.set()
        return await real_map_read(*a, **k)
    dev.map_read = watched_map_read
    rng = random.Random(0)

    def shooter():
        while True:
            entered.wait()
            entered.clear()
            time.sleep(rng.uniform(0, 300e-6))
            os.kill(os.getpid(), signal.SIGINT)

    if mode == "map":
        threading.Thread(target=shooter, daemon=True).start()
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
            frames = [f for f in traceback.extract_tb(e.__traceback__) if "webdrift" in f.filename]
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
