"""`webdrift profile`: one generation timed at both levels, a summary table and a Chrome trace.

Three runs of the same prompt after a warm-up: profiler off (the speed reference), host phases
only (its overhead is what leaving the profiler on costs), and host phases + GPU kernel
timestamps (the kernel timeline; per-kernel passes slow it down, see profiler.py). The summary's
host part comes from the phases-only run, its GPU part and the trace from the kernel-timed run.
A desktop tool beside bench.py, whose model helpers it uses (the engine through the core's
assembly path, token-id prompts); the profiler, timeline and trace it drives are the core's
webdrift/profile/ (pure Python, in the browser too).
Must not: import wgpu or js; be imported by the core.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..hub import DEFAULT_MODEL
from ..profile.profiler import DISABLED, Profiler
from ..profile.timeline import Timeline, format_summary, phase_table, summarize
from ..profile.trace import write_chrome_trace
from .outputs import check_writable


def profile_generation(eng, ids: list[int], new_tokens: int, prof: Profiler):
    """Generate new_tokens greedily from ids with prof attached; returns (GenerationStats, prof)."""
    from .bench import generate_ids
    eng.profiler = prof
    try:
        out = generate_ids(eng, ids, new_tokens)
    finally:
        eng.profiler = DISABLED
    if prof.kernels:
        prof.collect(eng.dev)
    return out.stats, prof


def run_profile(eng, prompt_tokens: int, new_tokens: int, kernels: bool = True) -> dict:
    """The three runs; returns {"runs": {...}, "summary": {...}, "profiler": Profiler, "timeline": Timeline}."""
    from .bench import generate_ids, prompt_ids
    ids = prompt_ids(eng.config.vocab_size, prompt_tokens)
    generate_ids(eng, ids[:min(prompt_tokens, eng.prefill_chunk + 1)], 4)      # compile + warm up
    runs = {}
    st, _ = profile_generation(eng, ids, new_tokens, DISABLED)
    runs["off"] = st.as_dict()
    st, host = profile_generation(eng, ids, new_tokens, Profiler(enabled=True, kernels=False))
    runs["phases"] = st.as_dict()
    timed = Profiler.for_device(eng.dev, kernels=kernels)
    if timed.kernels:
        st, _ = profile_generation(eng, ids, new_tokens, timed)
        runs["phases+kernels"] = st.as_dict()
    stepped = None
    if timed.kernels and eng.dev.can_time_sync:   # GPU busy / idle per whole step
        stepped = Profiler.for_device(eng.dev, kernels=True, steps=True)
        st, _ = profile_generation(eng, ids, new_tokens, stepped)
        runs["phases+steps"] = st.as_dict()
    off, on = runs["off"]["decode_tokens_per_s"], runs["phases"]["decode_tokens_per_s"]
    overhead = {"decode_pct": round(100.0 * (off - on) / off, 2) if off and on else None}
    p_off, p_on = runs["off"]["prefill_s"], runs["phases"]["prefill_s"]
    overhead["prefill_pct"] = round(100.0 * (p_on - p_off) / p_off, 2) if p_off else None
    tl = Timeline(timed) if timed.kernels else None
    summary = summarize(timed, tl) if timed.kernels else {"gpu": {}}
    summary["host"] = summarize(host, Timeline(host))["host"]
    summary["phases"] = phase_table(summary)
    if stepped is not None:
        dec = summarize(stepped, Timeline(stepped))["gpu"].get("decode", {})
        summary["gpu_steps"] = {k: dec.get(k) for k in ("submits", "span_ms", "busy_pct", "idle_pct", "step_gap_us")}
    summary["runs"] = runs
    summary["phase_profiling_overhead"] = overhead
    if not timed.kernels:
        summary["gpu_note"] = "the adapter has no timestamp-query: kernel timing skipped"
    return {"runs": runs, "summary": summary, "profiler": timed if timed.kernels else host, "timeline": tl}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help=f"a real model (known name, .gguf path or HF folder; default {DEFAULT_MODEL} if it is "
                        "in the cache, else --synthetic of its shape)")
    p.add_argument("--synthetic", default=None, help="a random-weight model shape (see `webdrift bench --help`)")
    p.add_argument("--quant", default="q4", help="storage format of --synthetic: f16, q8 (Q8_0), q4 (Q4_1), q4_0 (Q4_0) (default q4)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens (default %(default)s)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens to generate (default %(default)s)")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="engine prefill chunk (default: the engine's choice, 1024 on GPUs where it fits)")
    p.add_argument("--int8-activations", choices=("auto", "off", "on"), default="auto",
                   help="decode q4/q8 layers from int8 activations (default auto)")
    p.add_argument("--no-kernels", action="store_true", help="host phases only (no GPU timestamps)")
    p.add_argument("--trace", default=None, metavar="PATH", help="write a Chrome trace (Perfetto) JSON")
    p.add_argument("--json", default=None, metavar="PATH", help="write the summary as JSON")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args) -> int:
    from ..errors import InvalidArgumentError, WebdriftError
    from ..gpu.native import get_device
    from ..weights.synthetic import synthetic_source
    from .bench import INT8_CHOICES, build_engine, open_real_source
    if args.model and args.synthetic:
        raise InvalidArgumentError("give --model or --synthetic, not both")
    if args.prompt_tokens < 1 or args.new_tokens < 2:
        raise InvalidArgumentError("--prompt-tokens must be >= 1 and --new-tokens >= 2")
    check_writable(args.trace, "--trace")
    check_writable(args.json, "--json")
    if args.synthetic:
        src = synthetic_source(args.synthetic, args.quant)
    else:
        try:
            src = open_real_source(args.model or DEFAULT_MODEL, auto_pull=bool(args.model))
        except WebdriftError as e:
            if args.model:
                raise
            sys.stderr.write(f"the default model is not available ({e}); profiling --synthetic {DEFAULT_MODEL}\n")
            src = synthetic_source(DEFAULT_MODEL, args.quant)
    dev = get_device()
    eng = build_engine(dev, src, args.prompt_tokens + args.new_tokens + 1, args.prefill_chunk,
                       INT8_CHOICES[args.int8_activations])
    res = run_profile(eng, args.prompt_tokens, args.new_tokens, kernels=not args.no_kernels)
    s = res["summary"]
    print(f"{src.path} on {dev.info.adapter}: prompt {args.prompt_tokens}, new {args.new_tokens}, load "
          f"{eng.load_s:.2f} s")
    for name, r in res["runs"].items():
        print(f"  run {name:<15} prefill {r['prefill_tokens_per_s']:>9.1f} tok/s   decode "
              f"{r['decode_tokens_per_s']:>9.1f} tok/s")
    ov = s["phase_profiling_overhead"]
    print(f"  phase profiling overhead: decode {ov['decode_pct']}%, prefill {ov['prefill_pct']}% "
          "(run to run noise included)")
    print(format_summary(s))
    if s.get("gpu_note"):
        print(s["gpu_note"])
    meta = {"model": str(src.path), "adapter": dev.info.adapter, "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens}
    if args.trace:
        write_chrome_trace(args.trace, res["profiler"], res["timeline"], meta)
        print(f"trace written to {args.trace} (open in https://ui.perfetto.dev)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(s, **meta), f, indent=1)
    return 0
