"""The benchmark protocol and its report schema, shared by `webdrift bench` (desktop) and the
browser's bench page (`bench()` of webdrift.js, `browser_api.api_bench`), so one script can put
their rows side by side.

Protocol (ML Drift): batch 1, greedy, a prompt of 1024 token ids then 256 generated tokens, and
128 / 128; token ids are fed directly (no tokenizer), EOS is ignored so every run generates all
its tokens. Per model and weight format a row reports prefill tokens/s (prompt / time to first
token on the host), decode tokens/s ((new - 1) / time after the first token), the decode ceiling
of the memory roofline measured in the same run (profile/roofline.py) and the % of it reached,
the peak of GPU memory webdrift allocated (the device's live-buffer high-water mark) and load
time. Where kernel choices are measured asynchronously (the browser), the engine is built once,
its queued measurements run (kernels/autotune.tune_pending), and it is built again with them
(again while a rebuild queues more: build_tuned).
Models: a real model's ModelSource, or a synthetic one (weights/synthetic.py: random weights in a
real model's shapes, made without numpy). The desktop tool adds its peers (PyTorch, llama.cpp),
tables and plots on top (webdrift/tools/bench.py).
Must not: import numpy, wgpu or js; import webdrift.tools.
"""

from __future__ import annotations

import gc
import random
from dataclasses import replace

from ..errors import InvalidArgumentError, WebdriftError

PROTOCOL = [(1024, 256), (128, 128)]
QUICK_PROTOCOL = [(32, 16), (16, 8)]
SAMPLING = "greedy (temperature 0), EOS ignored"
TUNE_ROUNDS = 3                         # build_tuned: tune, rebuild, and again while a rebuild queues more
DESKTOP_ROUTE = "desktop (wgpu-native)"
DAWN_ROUTE = "desktop (Dawn)"          # --gpu-api dawn (gpu/dawn.py)
BROWSER_ROUTE = "browser (Pyodide+WebGPU)"

# every result row of a complete report has these (values may be None only where `error` says why)
ROW_FIELDS = ("model", "quant", "source", "params", "weight_bytes", "prompt_tokens", "new_tokens",
              "prefill_tps", "decode_tps", "ttft_s", "read_bytes_per_token", "roofline_decode_tps",
              "pct_roofline", "peak_gpu_bytes", "load_s", "peers", "error")
REPORT_FIELDS = ("webdrift_version", "date", "command", "machine", "protocol", "sampling", "batch",
                 "roofline", "peers_note", "results")
MACHINE_FIELDS = ("adapter", "backend", "vendor", "driver", "adapter_type", "max_binding_bytes",
                  "max_buffer_bytes", "features", "host", "python", "wgpu", "route")
PEER_NAMES = ("hf_eager", "cuda_graph", "llama_cpp")


def parse_protocol(text: str) -> list[tuple[int, int]]:
    """'1024/256,128/128' -> [(1024, 256), (128, 128)]."""
    out = []
    for part in str(text).split(","):
        try:
            p, m = (int(x) for x in part.strip().split("/"))
        except ValueError:
            raise InvalidArgumentError(f"--protocol {text!r}: write PROMPT/NEW pairs, e.g. 1024/256,128/128") from None
        if p < 1 or m < 1:
            raise InvalidArgumentError(f"--protocol {text!r}: token counts must be >= 1")
        out.append((p, m))
    return out


def prompt_ids(vocab: int, n: int, seed: int = 1234) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def machine_info(dev, route: str, host: str, python: str) -> dict:
    """The machine part of a report, from the device object (and what the caller knows of the host)."""
    ai = dev.adapter_info
    return {"adapter": dev.info.adapter, "backend": dev.info.backend, "vendor": dev.info.vendor,
            "driver": ai.get("description", ""), "adapter_type": ai.get("adapter_type", ""),
            "max_binding_bytes": dev.max_binding_size, "max_buffer_bytes": dev.max_buffer_size,
            "features": sorted(dev.info.features), "host": host, "python": python,
            "wgpu": dev.wgpu_version, "route": route}


def model_label(src) -> tuple[str, str]:
    """(model, quant) labels of a source: synthetic name/quant, or file name/runtime formats."""
    if getattr(src, "format", "") == "synthetic":
        return src.name, src.quant
    from ..kernels.weights import format_names
    from ..models.footprint import plan_weights
    fmts = sorted({f for p in plan_weights(src) if p.o > 1 for f in format_names(p.fmt)})
    name = getattr(src, "bench_name", None) or str(src.path).replace("\\", "/").rsplit("/", 1)[-1]
    return name, "+".join(fmts)


def build_engine(dev, src, max_context: int, prefill_chunk: int | None = None, int8_activations: bool | None = None,
                 autotune=True, prefill_kernels: str = "auto", weight_format: str | None = None,
                 steps_per_submit: int | None = None, kv_cache: str | None = None):
    """An Engine for token ids only (no tokenizer: the protocol feeds ids), through the one
    assembly path (runtime/loading.py)."""
    from ..runtime.loading import EngineOptions, assemble
    from ..weights.synthetic import NullTokenizer
    options = EngineOptions(max_context=max_context, prefill_chunk=prefill_chunk, int8_activations=int8_activations,
                            autotune=autotune, prefill_kernels=prefill_kernels, weight_format=weight_format,
                            steps_per_submit=steps_per_submit, kv_cache=kv_cache)
    return assemble(src, options, dev, tokenizer=NullTokenizer())


async def agenerate_ids(eng, ids: list[int], new_tokens: int, n: int = 1, lora: str | tuple | None = None):
    from ..runtime.engine import SamplingParams
    sp = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, seed=0, stop_at_eos=False, n=n, lora=lora)
    return await eng.agenerate(ids, sp)


def interleaved_decode_tps(engs: dict, ids: list[int], new_tokens: int = 128, rounds: int = 3) -> dict:
    """Decode tok/s of each engine in `rounds` greedy generations of new_tokens after ids, the
    engines taking turns (clocks and host load drift alike for all): {name: [tok/s, ...]}.
    For A/B scripts on the desktop (it drives the event loop itself)."""
    from ..runtime.engine import _run
    tps = {n: [] for n in engs}
    for _ in range(rounds):
        for n, e in engs.items():
            tps[n].append(_run(agenerate_ids(e, ids, new_tokens)).stats.decode_tokens_per_s)
    return tps


def tuner_ab(dev, spec: str, settings: dict, rounds: int = 3) -> dict:
    """Decode tok/s of a synthetic model (spec "shape:quant") under settings of the tuner's module
    attributes ({engine name: {attribute of kernels/autotune.py: value}}), each engine tuned
    afresh (a cache folder of its own, the in-memory choices cleared) and its decode GEMVs
    printed, the engines interleaved (interleaved_decode_tps; depth 1024); the attributes are
    restored after. For the desktop A/B scripts (scripts/blk_unroll_ab.py, gemv_chain_ab.py)."""
    import os
    import tempfile

    from ..kernels import autotune
    from ..weights.synthetic import synthetic_source
    shape, quant = spec.split(":")
    src = synthetic_source(shape, quant)
    saved = {a: getattr(autotune, a) for kw in settings.values() for a in kw}
    engs = {}
    try:
        for name, kw in settings.items():
            for a, v in kw.items():
                setattr(autotune, a, v)
            autotune._memory.clear()
            os.environ["WEBDRIFT_CACHE"] = tempfile.mkdtemp()
            engs[name] = build_engine(dev, src, 1224)
            print(f"{spec} {name}: {decode_gemvs(engs[name])}", flush=True)
    finally:
        for a, v in saved.items():
            setattr(autotune, a, v)
    return interleaved_decode_tps(engs, prompt_ids(src.config.vocab_size, 1024), rounds=rounds)


async def astreams_tps(eng, ids: list[int], m: int, k: int, lora: tuple | None = None, repeats: int = 1) -> float:
    """Aggregate decode tokens/s of k streams of m tokens after `ids` (lora: one adapter per
    stream), the best of `repeats` generations, after an untimed warm-up generation (without it
    the first k measured held its programs' compile and tuning: 0.68x at k=4 vs 4.2x at k=8,
    H100 2026-11-23)."""
    await agenerate_ids(eng, ids, 2, n=k, lora=lora)   # builds (compiles, tunes) the k-row programs
    best = 0.0
    for _ in range(max(1, repeats)):
        rs = await agenerate_ids(eng, ids, m, n=k, lora=lora)
        dec = rs[0].stats.decode_s
        best = max(best, sum(r.stats.new_tokens - 1 for r in rs) / dec if dec > 0 else 0.0)
    return best


async def akernel_profile(eng, ids: list[int], new_tokens: int, n: int = 1, lora: str | None = None) -> dict | None:
    """Where a decode step's time goes, from three greedy generations of new_tokens after `ids`
    (n > 1: n streams decoded together, generate(n=n); a step then makes n tokens; lora: a
    resident adapter they apply),
    or None where the adapter has no timestamp-query. First every dispatch timed in its own pass
    (profile/profiler.py): GPU us per step by kernel family (the per-kernel passes add their own
    cost, so compare families, not the total with the step); then each step timed whole (one
    pass): the GPU's busy time per step; then host phases only (no GPU timing): the step's wall
    time and the host's share of it (host-bound when it is most of the step). Browsers quantize timestamps unless told not to (Dawn:
    disable-dawn-features=timestamp_quantization), which makes the per-kernel figures coarse."""
    from .profiler import DISABLED, Profiler
    from .timeline import summarize
    if not eng.dev.has_timestamps:
        return None

    async def timed(steps: bool, kernels: bool = True):
        prof = Profiler(True, kernels=kernels, steps=steps)
        eng.profiler = prof
        try:
            out = await agenerate_ids(eng, ids, new_tokens, n=n, lora=lora)
        finally:
            eng.profiler = DISABLED
        await prof.acollect(eng.dev)
        summary = summarize(prof)
        return (summary["gpu"].get("decode") if kernels else summary["host"]), (out[0] if n > 1 else out).stats

    g, _ = await timed(False)
    w, st = await timed(True)
    host, hst = await timed(False, kernels=False)
    if not g or not w:
        return None
    ph, steps = host["phases"], max(1, hst.new_tokens - 1)
    step_us = 1e3 * host["decode_step_ms"].get("median", 0.0)
    work_us = host["host_overhead_us_per_step"].get("median", 0.0)
    n, nw = g["submits"], w["submits"]
    return {"decode_steps": n, "kernels_per_step": round(g["kernels"] / n, 1),
            "gpu_us_per_step": round(1e3 * sum(f["total_ms"] for f in g["families"].values()) / n, 1),
            "families_us_per_step": {k: round(1e3 * f["total_ms"] / n, 2) for k, f in g["families"].items()},
            "whole_step_gpu_us": round(1e3 * sum(f["total_ms"] for f in w["families"].values()) / nw, 1),
            "whole_step_wall_us": round(1e6 * st.decode_s / max(1, st.new_tokens - 1), 1),
            # host phases only (no GPU timing): a step's wall time, the host's own work in it (the
            # step less the wait for its token), encoding + submitting a step, the wait for a token
            # (a submit may run several steps: submit_us is its time over its steps)
            "host": {"step_us": round(step_us, 1), "host_work_us": round(work_us, 1),
                     "submit_us": round(1e3 * ph["decode.submit"]["total_ms"] / steps, 1) if "decode.submit" in ph else None,
                     "readback_wait_us": round(step_us - work_us, 1), "steps_per_submit": eng.steps_per_submit}}


def log_kernel_profile(log, what: str, kp: dict | None) -> None:
    """One log line of a kernel_profile (akernel_profile): the step's GPU time timed whole, its
    wall time, the per-kernel sum and the eight costliest kernel families."""
    if kp:
        log(f"  {what}: {kp['whole_step_gpu_us']} us of GPU time (timed whole) in a "
            f"{kp['whole_step_wall_us']} us step; each kernel timed: {kp['gpu_us_per_step']} us in "
            f"{kp['kernels_per_step']} dispatches: " +
            ", ".join(f"{k} {v}" for k, v in list(kp["families_us_per_step"].items())[:8]))


async def ameasure_rooflines(dev, mib: int, quick: bool) -> dict:
    """The memory roofline (streaming read over `mib` MiB, profile/roofline.py) with the compute
    peaks under "compute" (profile/compute.py: f32, f16 where the adapter has it, int8 dot)."""
    from .compute import ameasure_peaks
    from .roofline import ameasure_bandwidth
    roof = await ameasure_bandwidth(dev, mib << 20, reps=3 if quick else 10)
    roof["compute"] = await ameasure_peaks(dev, reps=3 if quick else 5, workgroups=16 if quick else 2048,
                                           iters=64 if quick else 1024)
    return roof


def prefill_kernels_used(eng) -> tuple[str, str | None]:
    """What the engine's prefill runs: ("gemv" | "gemm_float" | "gemm_int8" | "gemm_int8:ROLE+ROLE"
    (int8 on those layer roles, float on the others), the first layer GEMM's tile as
    BMxBN/TMxTN/kK[/db][/f16][/mma: matrix units, TMxTN 16x16 results a subgroup], followed by
    " (>=R rows: TILE)" where buckets of R rows or more take another (Linear.large), or None for
    the GEMVs)."""
    from ..models.forward import Linear
    if eng.prefill.stage == "decode":
        return "gemv", None
    roles = eng.model.prefill_int8_roles
    kind = ("gemm_int8" if all(roles.values()) else "gemm_float" if not any(roles.values())
            else "gemm_int8:" + "+".join(r for r, v in roles.items() if v))
    op = next(op for op in eng.prefill.graph.ops if isinstance(op, Linear) and not op.head)

    def tile(v):
        return (f"{v.bm}x{v.bn}/{v.tm}x{v.tn}/k{v.kstep}" + ("/db" if v.double else "") + ("/f16" if v.f16_tiles else "")
                + ("/mma" if v.mma else ""))
    return kind, tile(op.variant) + (f" (>={op.large[0]} rows: {tile(op.large[1])})" if op.large else "")


def prefill_uses_matrix_units(eng) -> bool:
    """Whether any prefill GEMM runs on the matrix units (GemmVariant.mma: Dawn's subgroup
    matrices): such a prefill's share is of the matrix units' peak (compute.py's mma_f16 probe)."""
    from ..models.forward import Linear
    return eng.prefill.stage != "decode" and any(
        isinstance(op, Linear) and getattr(op.variant, "mma", False) for op in eng.prefill.graph.ops)


def prefill_pct_compute(prefill_tps: float, flops_per_token: float, peak_tflops: float | None) -> float | None:
    """A prefill's share (%) of a compute peak: tokens/s x FLOPs per token / peak."""
    if not peak_tflops or not prefill_tps:
        return None
    return round(100.0 * prefill_tps * flops_per_token / (peak_tflops * 1e12), 2)


def streams_needed_context(p: int, m: int, k: int) -> int:
    """A context that holds k streams of m tokens after a p-token prompt (runtime/streams.py: each
    stream's segment is whole attention chunks, at most 256 rows each)."""
    return p + k * (m + 256) + 256


async def abench_streams(eng, ids: list[int], m: int, single_tps: float, ks: list[int], log,
                         profile_tokens: int = 0, repeats: int = 1) -> dict:
    """Aggregate decode tokens/s of k streams decoded together (for each k of ks; the best of
    `repeats`, like the single stream's), and its ratio to the single stream's decode tokens/s
    (astreams_tps); with profile_tokens > 1, each k's kernel_profile (akernel_profile of k
    streams: where a step of k tokens goes). "gemv_cols": the token rows per workgroup of the
    streams' integer-dot GEMVs, over every stream count's program (GemvVariant.cols: 8 reads each
    weight block once for 8 streams; empty without int8 activations)."""
    out = {}
    for k in ks:
        total = await astreams_tps(eng, ids, m, k, repeats=repeats)
        out[str(k)] = {"decode_tps_total": round(total, 2),
                       "vs_single": round(total / single_tps, 3) if single_tps else None}
        log(f"    {k} streams: {total:.1f} tok/s together ({out[str(k)]['vs_single']}x one stream)")
        if profile_tokens > 1:
            out[str(k)]["kernel_profile"] = kp = await akernel_profile(eng, ids, profile_tokens, n=k)
            log_kernel_profile(log, f"a step of {k} streams", kp)
    # token rows per workgroup of the streams' integer-dot GEMVs (GemvVariant.cols; [] without int8)
    out["gemv_cols"] = sorted({op.variant.cols for p in (eng._streams.programs.values() if eng._streams else ())
                               for op in p.graph.ops if getattr(op, "int8_input", False)})
    return out


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def decode_attention(eng) -> list[str]:
    """The decode attention kernels the engine runs (AttnChoice names, one per sliding window:
    the load-time choice with its keys a chunk, kernels/autotune.choose_attention), e.g.
    ["split16"], ["split32a32"]."""
    from ..models.forward import Attention
    return sorted({op.kernel.name for op in eng.decode.graph.ops if isinstance(op, Attention)})


def decode_gemvs(eng) -> dict:
    """The decode GEMV variants the engine runs, by op family (the label without its layer), e.g.
    {"norm+gate_up+act": ["wide r16 wg128 m4"], ...}; several where layers differ (a Q4_K_M file's
    row-split layers). Load-time choices (kernels/autotune.choose_gemv): they differ between
    adapters and can between fresh tunings of one machine type (H200, 2026-11-29: an engine's 8B
    f16 gate/up pick ran 75.0 us a layer where another variant ran 61.4 on the same weights, and
    the same code decoded 175 and 196 tok/s in two leases; docs/BENCHMARKS.md session 34), so a
    report names them."""
    from ..kernels.linear import GemvVariant
    from ..models.forward import Linear
    out: dict = {}
    for op in eng.decode.graph.ops:
        if isinstance(op, Linear) and isinstance(op.variant, GemvVariant):
            out.setdefault(op.label.split(".", 1)[-1], set()).add(op.variant.name)
    return {k: sorted(v) for k, v in sorted(out.items())}


def empty_row(base: dict, p: int, m: int, **kw) -> dict:
    r = dict(base, prompt_tokens=p, new_tokens=m, prefill_tps=None, decode_tps=None, ttft_s=None,
             read_bytes_per_token=None, roofline_decode_tps=None, pct_roofline=None, peak_gpu_bytes=None,
             load_s=None, peers=None, error=None, prefill_pct_compute=None)
    r.update(kw)
    return r


async def build_tuned(dev, build, before: int, log, progress) -> tuple:
    """build() an engine; where that queued kernel measurements (asynchronous timing: the browser)
    measure them (kernels/autotune.tune_pending) and build it again with them, while a rebuild
    queues more (a choice that depends on a measured one: e.g. the 256-row tile of the GEMM kind
    the measured int8 decision picked), at most TUNE_ROUNDS times. Returns (engine, the device's
    bytes allocated before it, for its peak memory: the dropped builds' buffers not counted)."""
    from ..kernels import autotune as tuner
    eng = build()
    await dev.check_errors()
    for _ in range(TUNE_ROUNDS):
        queued = tuner.pending(dev)
        if not queued:
            break
        log(f"  tuning {len(queued)} kernel choices ...")
        await tuner.tune_pending(dev, progress=lambda d, t, k: progress(d, t))
        eng = None
        gc.collect()
        before = dev.peak_bytes = dev.bytes_allocated   # (the browser counts dropped buffers until released)
        eng = build()
        await dev.check_errors()
    return eng, before


async def abench_model(dev, src, protocols, bandwidth_GBps: float, repeats: int = 1, prefill_chunk: int | None = None,
                       log=None, int8_activations: bool | None = None, autotune=True, progress=None,
                       streams: list[int] | None = None, peak_tflops: float | None = None,
                       prefill_kernels: str = "auto", int8_peak_tflops: float | None = None,
                       weight_format: str | None = None, profile_tokens: int = 0,
                       steps_per_submit: int | None = None, kv_cache: str | None = None,
                       mma_peak_tflops: float | None = None) -> list[dict]:
    """Rows (one per protocol) for one model source; errors become rows with `error` set.
    steps_per_submit, kv_cache: the engine options (decode steps per GPU submit, the KV cache's
    values; None: the device's); the rows say what ran.
    profile_tokens: after the protocol, the last row also gets `kernel_profile` (akernel_profile
    over that many new tokens after its prompt).
    weight_format: the engine option (every matrix in that runtime format; the row's quant).
    progress(phase, done, total): "load", "tune" (queued kernel measurements) and "run".
    streams: also decode k streams together per protocol (row["streams"]);
    peak_tflops: the compute peak the float prefill GEMM's arithmetic runs at (f32), for each row's
    prefill_pct_compute (weights' FLOPs per token, profile/compute.py); int8_peak_tflops: the
    dot4I8Packed peak, used instead where the prefill runs the int8 GEMM; mma_peak_tflops: the matrix
    units' (Dawn's subgroup matrices), used where any prefill GEMM runs on them (None: no share
    reported, as their peak is unknown); prefill_kernels: the
    engine option (bench --prefill-kernels), the row says what ran (prefill_kernels, prefill_tile)."""
    from ..kernels import autotune as tuner
    from ..kernels.rope import kv_bytes as kv_value_bytes
    from ..models.footprint import decode_read_bytes, plan_weights
    from ..profile.roofline import decode_ceiling
    from .compute import prefill_flops_per_token
    log = log or (lambda s: None)
    progress = progress or (lambda phase, done, total: None)
    model, quant = model_label(src)
    quant = weight_format or quant
    cfg = src.config
    plans = plan_weights(src, weight_format)
    base = {"model": model, "quant": quant, "source": str(src.path),
            "params": sum(_numel(t.shape) for t in src.tensors.values()), "weight_bytes": sum(p.nbytes for p in plans)}
    max_ctx = max(max([p + m] + [streams_needed_context(p, m, k) for k in streams or []]) for p, m in protocols)
    max_ctx = max(max_ctx, protocols[-1][0] + profile_tokens)      # the kernel profile's generation
    if cfg.max_position and max_ctx > cfg.max_position:
        return [empty_row(base, p, m, error=f"needs a context of {max_ctx}; the model's is {cfg.max_position}")
                for p, m in protocols]
    gc.collect()
    before = dev.bytes_allocated
    dev.peak_bytes = before
    log(f"loading {model} ({quant}) ...")
    eng = None
    try:
        progress("load", 0, 1)
        eng, before = await build_tuned(
            dev, lambda: build_engine(dev, src, max_ctx, prefill_chunk, int8_activations, autotune, prefill_kernels,
                                      weight_format, steps_per_submit, kv_cache),
            before, log, lambda d, t: progress("tune", d, t))
        progress("load", 1, 1)
        base["prefill_kernels"], base["prefill_tile"] = prefill_kernels_used(eng)
        if base["prefill_kernels"] == "gemm_int8" and int8_peak_tflops:
            peak_tflops = int8_peak_tflops
        if prefill_uses_matrix_units(eng):   # the matrix units' peak (None where unmeasured: no share)
            peak_tflops = mma_peak_tflops
        base["prefill_chunk"] = eng.prefill_chunk
        base["int8_activations"] = eng.model.int8
        base["steps_per_submit"] = eng.steps_per_submit
        base["kv_cache"] = eng.model.kv_cache
        base["int8_roles"] = sorted(r for r, v in eng.model.int8_roles.items() if v)
        base["int8_chain"] = eng.model.int8_chain
        base["attention"] = decode_attention(eng)
        base["decode_gemv"] = decode_gemvs(eng)
        ids = prompt_ids(cfg.vocab_size, max(p for p, _ in protocols))
        # compile + warm every kernel, over the longest prompt: a first prefill of that size right
        # after the load ran at half speed (H100, 2026-11-23: 1B q4 4899 tok/s as a run's first row,
        # 10406 in the next run), so the timed runs come after one untimed run of it, decoding as
        # many tokens as the longest protocol: after a load's seconds of host work the GPU's first
        # timed decode ran slow too (H100, 2026-11-25: a 1B Q4_0 file 788.8 tok/s at depth 1024,
        # then 882.4 at 4096 in the same run, and 976.0 at 1024 in the next)
        await agenerate_ids(eng, ids, max(4, max(m for _, m in protocols)))
        rows = []
        runs, done = len(protocols) * max(1, repeats), 0
        for p, m in protocols:
            best = fastest_prefill = None
            for _ in range(max(1, repeats)):
                out = await agenerate_ids(eng, ids[:p], m)
                done += 1
                progress("run", done, runs)
                st = out.stats
                if st.new_tokens != m:
                    raise WebdriftError(f"generated {st.new_tokens} tokens, expected {m} ({st.finish_reason})")
                if best is None or st.decode_tokens_per_s > best.decode_tokens_per_s:
                    best = st
                if fastest_prefill is None or st.prefill_s < fastest_prefill.prefill_s:
                    fastest_prefill = st
            best = replace(best, prefill_s=fastest_prefill.prefill_s)   # each figure the best of the repeats
            read = decode_read_bytes(cfg, plans, p + (m - 1) / 2,            # mean cache length of the run
                                     kv_value_bytes(eng.model.kv_f16))
            ceil = decode_ceiling(bandwidth_GBps, read)
            dtps = best.decode_tokens_per_s
            rows.append(empty_row(base, p, m, prefill_tps=round(best.prefill_tokens_per_s, 2), decode_tps=round(dtps, 2),
                                  ttft_s=round(best.prefill_s, 5), read_bytes_per_token=int(read),
                                  roofline_decode_tps=round(ceil, 2),
                                  pct_roofline=round(100.0 * dtps / ceil, 2) if ceil else None,
                                  load_s=round(eng.load_s, 3),
                                  prefill_pct_compute=prefill_pct_compute(best.prefill_tokens_per_s,
                                                                          prefill_flops_per_token(src), peak_tflops)))
            log(f"  {p}/{m}: prefill {best.prefill_tokens_per_s:.1f} tok/s, decode {dtps:.1f} tok/s "
                f"({rows[-1]['pct_roofline']}% of the {ceil:.0f} tok/s roofline)")
            if streams:
                rows[-1]["streams"] = await abench_streams(eng, ids[:p], m, dtps, streams, log,
                                                           profile_tokens if (p, m) == protocols[-1] else 0,
                                                           repeats)
        if profile_tokens > 1:
            p = protocols[-1][0]
            rows[-1]["kernel_profile"] = kp = await akernel_profile(eng, ids[:p], profile_tokens)
            log_kernel_profile(log, f"decode step after {p} tokens", kp)
        peak = dev.peak_bytes - before
        for r in rows:
            r["peak_gpu_bytes"] = peak
    except Exception as e:  # noqa: BLE001 - one model failing (limits, device loss) must not lose the report
        log(f"  {type(e).__name__}: {e}")
        return [empty_row(base, p, m, error=f"{type(e).__name__}: {e}") for p, m in protocols]
    finally:
        tuner.forget(dev)               # queued measurements hold this engine's buffers
        del eng
        gc.collect()
    return rows


def make_report(*, version: str, date: str, command: str, machine: dict, protocols, prefill_chunk: int | None,
                repeats: int, roofline: dict, peers_note: str, results: list[dict]) -> dict:
    """The report: REPORT_FIELDS plus prefill_chunk and repeats (the same for every route)."""
    return {"webdrift_version": version, "date": date, "command": command, "machine": machine,
            "protocol": [{"prompt_tokens": p, "new_tokens": m} for p, m in protocols],
            "sampling": SAMPLING, "batch": 1, "prefill_chunk": prefill_chunk, "repeats": repeats,
            "roofline": roofline, "peers_note": peers_note, "results": results}


def mark_incomplete(report: dict, done: int, total: int) -> dict:
    """A report of the models done so far, written while the run goes on (so a run cut short keeps
    them): `incomplete` says how many of the run's models it holds."""
    report["incomplete"] = f"{done} of {total} models done"
    return report


def fill_skipped_peers(results: list[dict], peers_note: str, llama_note: str = "not run (no --llama-bench)") -> None:
    for r in results:
        r["peers"] = r["peers"] or {}
        for name in ("hf_eager", "cuda_graph"):
            r["peers"].setdefault(name, {"skipped": peers_note})
        r["peers"].setdefault("llama_cpp", {"skipped": llama_note})


def missing_fields(report: dict) -> list[str]:
    """Paths of required report fields that are absent (an empty list: the report is complete)."""
    miss = [f for f in REPORT_FIELDS if f not in report]
    miss += [f"machine.{f}" for f in MACHINE_FIELDS if f not in report.get("machine", {})]
    for f in ("best_GBps", "bytes", "method"):
        if f not in report.get("roofline", {}):
            miss.append(f"roofline.{f}")
    if not report.get("results"):
        miss.append("results[]")
    for i, r in enumerate(report.get("results", [])):
        miss += [f"results[{i}].{f}" for f in ROW_FIELDS if f not in r]
        if r.get("error") is None:
            miss += [f"results[{i}].{f}" for f in ROW_FIELDS if f != "error" and r.get(f) is None]
        peers = r.get("peers") or {}
        miss += [f"results[{i}].peers.{p}" for p in PEER_NAMES if p not in peers]
    return miss
