"""`webdrift bench`: ML Drift's protocol on this adapter, with the roofline and PyTorch peers.

Protocol (ML Drift): batch 1, greedy, a prompt of 1024 token ids then 256 generated tokens, and
128 / 128; token ids are fed directly (no tokenizer), EOS is ignored so every run generates all
its tokens. Per model and weight format it reports prefill tokens/s (prompt / time to first token
on the host), decode tokens/s ((new - 1) / time after the first token), the decode ceiling of the
memory roofline and the % of it reached, the peak of GPU memory webdrift allocated (the native
device's live-buffer high-water mark: weights, KV cache, arena, staging uploads) and load time.
Models: `--model NAME` (a real model, through the hub / a GGUF path), `--synthetic NAME` (random
weights in a real model's shapes, weights/synthetic.py) with `--quant f16|q8|q4`.
The roofline is measured in the same run (profile/roofline.py); PyTorch peers run where torch
has a CUDA device (bench_peers.py); llama.cpp runs on the very same GGUF files with
`--llama-bench PATH` (its llama-bench binary: pp P at depth 0, tg M at depth P, flash attention,
every layer on the GPU; llama_cpp.py). Output: a table, `--json`, `--markdown` (appends a section
with the machine, date and exact command) and `--plot` (matplotlib, skipped if missing).
The protocol, one model's rows and the report schema are the core's (profile/benchmark.py),
shared with the browser's bench page (bench.html, `bench()` of webdrift.js), whose reports have
the same fields; this desktop tool adds the peers, the table, markdown and plot. Engines come
from the core's assembly path (runtime/loading.py), the machine's facts from the device object;
the report itself is plain JSON.
Must not: import wgpu or js; be imported by the core.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import time

from ..errors import InvalidArgumentError, WebdriftError
from ..hub import DEFAULT_MODEL
from ..kernels.base import ceil_div
from ..models.manifest import WEIGHT_FORMATS as WEIGHT_FORMAT_CHOICES
from ..profile.benchmark import (  # the protocol and schema, shared with the browser's bench page
    DAWN_ROUTE,
    DESKTOP_ROUTE,
    MACHINE_FIELDS,
    PEER_NAMES,
    PROTOCOL,
    QUICK_PROTOCOL,
    REPORT_FIELDS,
    ROW_FIELDS,
    abench_model,
    ameasure_rooflines,
    build_engine,
    fill_skipped_peers,
    make_report,
    mark_incomplete,
    missing_fields,
    model_label,
    parse_protocol,
    prompt_ids,
)
from ..runtime.options import PREFILL_KERNELS
from ..weights.synthetic import PRESETS, QUANTS, check_choice
from .outputs import check_writable

BIG_SHAPES = ["llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"]
# the schema and helpers come from the core (profile/benchmark.py) and are re-exported for scripts
__all__ = ["MACHINE_FIELDS", "PEER_NAMES", "PROTOCOL", "QUICK_PROTOCOL", "REPORT_FIELDS", "ROW_FIELDS", "bench_model",
           "build_engine", "cmd_bench", "compare_table", "format_table", "machine_info", "main", "missing_fields", "run_bench",
           "write_markdown", "write_plot"]


# -- models --------------------------------------------------------------------------------------

def parse_list(values, what: str, choices=None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        for item in str(v).split(","):
            item = item.strip()
            if not item:
                continue
            if what == "synthetic model" and item == "all":
                out.extend(["smollm2-135m"] + BIG_SHAPES)
                continue
            if choices is not None:
                check_choice(what, item, choices)
            out.append(item)
    return out


def parse_streams(text: str | None) -> list[int] | None:
    """--streams K[,K...]: stream counts in [2, MAX_STREAMS]."""
    from ..runtime.streams import MAX_STREAMS
    if not text:
        return None
    ks = []
    for item in parse_list([text], "streams"):
        if not item.isdigit() or not 2 <= int(item) <= MAX_STREAMS:
            raise InvalidArgumentError(f"--streams {item!r}: stream counts are integers in [2, {MAX_STREAMS}]")
        ks.append(int(item))
    return ks


def open_real_source(name: str, auto_pull: bool = True):
    """A real model's ModelSource: a known name through webdrift.hub, or a .gguf path / HF folder
    (runtime/loading.open_source, the path webdrift.load takes)."""
    from ..runtime.loading import open_source
    return open_source(name, auto_pull=auto_pull)


model_spec_label = model_label


INT8_CHOICES = {"auto": None, "on": True, "off": False}


def generate_ids(eng, ids: list[int], new_tokens: int, lora: str | None = None):
    from ..profile.benchmark import agenerate_ids
    from ..runtime.engine import _run
    return _run(agenerate_ids(eng, ids, new_tokens, lora=lora))


def random_lora(cfg, rank: int, seed: int):
    """A random LoRA adapter of rank `rank` on all seven targets of the model `cfg` (speed does not
    depend on the values)."""
    from array import array

    import numpy as np

    from ..weights.lora import LoraAdapter, LoraTarget, expected_shapes
    rng = np.random.default_rng(seed)
    ad = LoraAdapter(f"<random rank-{rank} adapter {seed}>")
    for layer in range(cfg.n_layers):
        for tgt, (n_out, n_in) in expected_shapes(cfg).items():
            a = rng.normal(0, n_in ** -0.5, rank * n_in).astype(np.float32)
            b = rng.normal(0, 0.01, n_out * rank).astype(np.float32)
            ad.targets[(layer, tgt)] = LoraTarget(array("f", a.tobytes()), array("f", b.tobytes()), rank, n_in,
                                                  n_out, 1.0)
    return ad


def bench_lora(dev, src, protocols, rank: int, prefill_chunk: int | None, int8_activations, log,
               streams: list[int] | None = None, repeats: int = 1, fused_shrink: bool = False) -> dict:
    """Decode tok/s per protocol with a random rank-`rank` adapter on all seven targets, and on
    the same engine with no adapter (field slots_no_adapter_decode_tps: the engine with LoRA
    slots runs its programs without them for such a request); the host time of switching adapters; with
    streams, the aggregate decode tok/s of k streams each with its own adapter (generate(n=k,
    lora=[...]): no shared prompt, so the context holds k copies of it). Each figure the best of
    `repeats` generations (one generation's adapter figure read 494 and 613 tok/s in two runs of
    the same code on the same H100, 2026-11-24). fused_shrink: EngineOptions.lora_fused_shrink."""
    from ..profile.benchmark import astreams_tps
    from ..runtime.engine import SamplingParams, _run
    from ..runtime.loading import EngineOptions, assemble
    from ..weights.synthetic import NullTokenizer
    ks = streams or []
    ctx = max(max([p + m] + [k * (ceil_div(p + m, 64) + 1) * 64 for k in ks]) for p, m in protocols)
    options = EngineOptions(max_context=min(ctx, src.config.max_position or ctx), prefill_chunk=prefill_chunk,
                            int8_activations=int8_activations, enable_lora=True, max_lora_rank=rank,
                            lora_pool_rank=rank * max([2, *ks]), lora_fused_shrink=fused_shrink)
    eng = assemble(src, options, dev, tokenizer=NullTokenizer())
    try:
        for name, seed in (("a", 1), ("b", 2)):
            eng.add_lora(name, random_lora(src.config, rank, seed))
        for i in range(2, max(ks, default=0)):
            eng.add_lora(f"s{i}", random_lora(src.config, rank, 10 + i))
        names = ("a", "b") + tuple(f"s{i}" for i in range(2, max(ks, default=0)))
        ids = prompt_ids(src.config.vocab_size, max(p for p, _ in protocols))
        generate_ids(eng, ids[:min(len(ids), eng.prefill_chunk + 1)], 4, lora="a")     # compile + warm
        out = {}
        for p, m in protocols:
            on = max(generate_ids(eng, ids[:p], m, lora="a").stats.decode_tokens_per_s for _ in range(repeats))
            off = max(generate_ids(eng, ids[:p], m).stats.decode_tokens_per_s for _ in range(repeats))
            out[f"{p}/{m}"] = {"decode_tps": round(on, 2), "slots_no_adapter_decode_tps": round(off, 2)}
            log(f"  {p}/{m} LoRA rank {rank}: decode {on:.1f} tok/s with the adapter, {off:.1f} without")
            for k in ks:   # k streams, one adapter each
                total = _run(astreams_tps(eng, ids[:p], m, k, lora=names[:k], repeats=repeats))
                out[f"{p}/{m}"].setdefault("streams", {})[str(k)] = {"decode_tps_total": round(total, 2)}
                log(f"    {k} streams, one adapter each: {total:.1f} tok/s together")
        n = 200
        t0 = time.perf_counter()
        for k in range(n):   # what a request does to switch: point entry 0 at the other adapter
            eng._apply_lora(SamplingParams(lora="ab"[k % 2]))
        out["switch_ms"] = round(1000 * (time.perf_counter() - t0) / n, 4)
        out["pool_bytes"] = eng.lora_pool.nbytes
        log(f"  LoRA switch: {out['switch_ms']} ms host time")
        return out
    finally:
        del eng
        gc.collect()


# -- machine -------------------------------------------------------------------------------------

def machine_info(dev) -> dict:
    from ..profile.benchmark import machine_info as info
    route = DAWN_ROUTE if dev.info.backend.startswith("Dawn") else DESKTOP_ROUTE
    return info(dev, route, f"{platform.node()} {platform.machine()} {platform.system()} {platform.release()}, "
                f"{os.cpu_count()} CPUs", platform.python_version())


# -- one model -----------------------------------------------------------------------------------

def bench_model(dev, src, protocols, bandwidth_GBps: float, repeats: int = 1, prefill_chunk: int | None = None,
                peers: bool = False, log=None, peer_cache: dict | None = None,
                int8_activations: bool | None = None, llama_bench: str | None = None,
                streams: list[int] | None = None, peak_tflops: float | None = None,
                lora_rank: int | None = None, lora_fused_shrink: bool = False, prefill_kernels: str = "auto",
                int8_peak_tflops: float | None = None, weight_format: str | None = None,
                profile_tokens: int = 0, steps_per_submit: int | None = None, kv_cache: str | None = None,
                mma_peak_tflops: float | None = None) -> list[dict]:
    """Rows (one per protocol) for one model source; errors become rows with `error` set.
    weight_format: load every matrix in that runtime format (the rows' quant).
    profile_tokens: the last row's kernel_profile (akernel_profile: where a decode step goes).
    streams: also decode k streams together per protocol (row["streams"]).
    peer_cache: PyTorch results by model shape, so the fp16 peers run once per shape, not per quant.
    llama_bench: the llama-bench binary to run on the same GGUF file (a real .gguf source only)."""
    from ..models.footprint import decode_read_bytes, plan_weights
    from ..models.manifest import kv_cache_bytes
    from ..profile.roofline import decode_ceiling
    from ..runtime.engine import _run
    log = log or (lambda s: None)
    rows = _run(abench_model(dev, src, protocols, bandwidth_GBps, repeats, prefill_chunk, log=log,
                             int8_activations=int8_activations, streams=streams, peak_tflops=peak_tflops,
                             prefill_kernels=prefill_kernels, int8_peak_tflops=int8_peak_tflops,
                             weight_format=weight_format, profile_tokens=profile_tokens,
                             steps_per_submit=steps_per_submit, kv_cache=kv_cache,
                             mma_peak_tflops=mma_peak_tflops))
    if any(r["error"] for r in rows):
        return rows
    cfg = src.config
    model = rows[0]["model"]
    ids = prompt_ids(cfg.vocab_size, max(p for p, _ in protocols))
    if lora_rank:
        try:
            lr = bench_lora(dev, src, protocols, lora_rank, prefill_chunk, int8_activations, log, streams, repeats,
                            fused_shrink=lora_fused_shrink)
            for r in rows:
                v = dict(lr.get(f"{r['prompt_tokens']}/{r['new_tokens']}", {}), rank=lora_rank, fused_shrink=lora_fused_shrink,
                         switch_ms=lr["switch_ms"], pool_bytes=lr["pool_bytes"])
                if v.get("decode_tps") and r.get("decode_tps"):
                    v["decode_ratio"] = round(v["decode_tps"] / r["decode_tps"], 3)   # target >= 0.85
                for sv in v.get("streams", {}).values():   # vs one stream without an adapter (target >= 2.5 at k=4)
                    if r.get("decode_tps"):
                        sv["vs_single"] = round(sv["decode_tps_total"] / r["decode_tps"], 3)
                r["lora"] = v
        except Exception as e:  # noqa: BLE001 - keep the base rows
            log(f"  LoRA: {type(e).__name__}: {e}")
            for r in rows:
                r["lora"] = {"rank": lora_rank, "error": f"{type(e).__name__}: {e}"}
    if llama_bench:
        from .llama_cpp import attach_llama_cpp
        extra = 2 if rows[0].get("kv_cache") == "f32" else 0   # bytes a value beyond llama.cpp's f16 cache
        attach_llama_cpp(rows, llama_bench, src, protocols, repeats,
                         kv_extra=lambda kv_len: kv_cache_bytes(cfg, kv_len, value_bytes=extra), log=log)
    if peers:
        from .bench_peers import run_peers
        cache_key = (model, tuple(protocols))
        res = None if peer_cache is None else peer_cache.get(cache_key)
        if res is None:
            log("  PyTorch peers ...")
            res = run_peers(cfg, ids, protocols)
            if peer_cache is not None:
                peer_cache[cache_key] = res
        plans16 = plan_weights(src, "f16")
        for r in rows:
            key = f"{r['prompt_tokens']}/{r['new_tokens']}"
            kv_len = r["prompt_tokens"] + (r["new_tokens"] - 1) / 2
            read16 = decode_read_bytes(cfg, plans16, kv_len, 2)   # the peers: fp16 weights and KV cache
            ceil16 = decode_ceiling(bandwidth_GBps, read16)
            r["peers"] = r.get("peers") or {}
            for name in ("hf_eager", "cuda_graph"):
                pr = res.get(name, {})
                if "error" in pr:
                    r["peers"][name] = {"error": pr["error"]}
                    continue
                v = dict(pr.get(key, {}))
                v["read_bytes_per_token"] = int(read16)
                if v.get("decode_tps"):
                    v["decode_ratio"] = round(r["decode_tps"] / v["decode_tps"], 3)
                    v["pct_roofline"] = round(100.0 * v["decode_tps"] / ceil16, 2) if ceil16 else None
                if v.get("prefill_tps"):
                    v["prefill_ratio"] = round(r["prefill_tps"] / v["prefill_tps"], 3)
                r["peers"][name] = v
    return rows


# -- the run -------------------------------------------------------------------------------------

def run_bench(args, dev=None, log=None, partial=None) -> dict:
    """The report of `webdrift bench` (args: its options); partial(report), where given, after each
    model but the last with the rows so far (report["incomplete"] says how many runs are done), so a
    run cut short (a time limit, a lost machine) leaves what it measured."""
    log = log or (lambda s: sys.stderr.write(s + "\n"))
    quick = bool(getattr(args, "quick", False))
    synthetic = parse_list(args.synthetic, "synthetic model", PRESETS)
    quants = parse_list(args.quant, "quant", QUANTS) or (["f16", "q8", "q4"] if quick else ["q4"])
    models = list(args.model or [])
    if quick and not synthetic and not models:
        synthetic = ["tiny"]
    protocols = parse_protocol(args.protocol) if args.protocol else (QUICK_PROTOCOL if quick else PROTOCOL)
    if dev is None:
        from ..gpu.native import get_device
        dev = get_device()
    from ..runtime.engine import _run
    mib = args.roofline_mib or (16 if quick else 1024)
    log(f"adapter: {dev.info.adapter} ({dev.info.backend}); streaming read over {mib} MiB, compute peaks ...")
    roof = _run(ameasure_rooflines(dev, mib, quick))
    log(f"  {roof['best_GBps']} GB/s (best of {roof['reps']}, {roof['bytes'] >> 20} MiB, {roof['method']}); "
        + ", ".join(peak_text(k, v, method=False) for k, v in roof["compute"].items()))
    peers_ok, peers_note = (False, "disabled (--no-peers)") if args.no_peers else _peer_availability(dev)
    if not peers_ok:
        log(f"peers: {peers_note}")
    sources = []
    if not synthetic and not models:
        models = [DEFAULT_MODEL]
    for name in models:
        try:
            src = open_real_source(name, auto_pull=bool(args.model))   # the default only if cached
            src.bench_name = name if not os.path.exists(name) else os.path.basename(name)
            sources.append(src)
        except WebdriftError as e:
            if args.model:
                raise
            log(f"the default real model is not available ({e}); using --synthetic {DEFAULT_MODEL}")
            synthetic = [DEFAULT_MODEL]      # its shape, random weights
    from ..weights.synthetic import synthetic_source
    for name in synthetic:
        for q in quants:
            sources.append(synthetic_source(name, q))
    results, peer_cache = [], {}
    formats = parse_list(getattr(args, "weight_format", None), "weight format", WEIGHT_FORMAT_CHOICES) or [None]
    kvs = parse_list(getattr(args, "kv_cache", None), "KV cache", ("f16", "f32")) or [None]
    from .. import __version__

    def report_of(rows: list) -> dict:
        fill_skipped_peers(rows, peers_note)
        return make_report(version=__version__,
                           date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                           command=getattr(args, "command_line", None) or "webdrift bench", machine=machine_info(dev),
                           protocols=protocols, prefill_chunk=args.prefill_chunk, repeats=args.repeats, roofline=roof,
                           peers_note=peers_note, results=list(rows))

    runs = [(s, f, k) for s in sources for f in formats for k in kvs]
    for n, (src, wf, kv) in enumerate(runs, 1):
        if n > 1 and partial is not None:
            partial(mark_incomplete(report_of(results), n - 1, len(runs)))
        results += bench_model(dev, src, protocols, roof["best_GBps"], args.repeats, args.prefill_chunk,
                               peers=peers_ok, log=log, peer_cache=peer_cache,
                               int8_activations=INT8_CHOICES[getattr(args, "int8_activations", "auto")],
                               llama_bench=getattr(args, "llama_bench", None),
                               streams=parse_streams(getattr(args, "streams", None)),
                               peak_tflops=roof["compute"]["f32"]["tflops"],
                               lora_rank=getattr(args, "lora_rank", None),
                               lora_fused_shrink=getattr(args, "lora_fused_shrink", False),
                               prefill_kernels=getattr(args, "prefill_kernels", "auto"),
                               int8_peak_tflops=(roof["compute"].get("int8") or {}).get("tflops"),
                               weight_format=wf, profile_tokens=getattr(args, "profile_tokens", 0) or 0,
                               steps_per_submit=getattr(args, "steps_per_submit", None), kv_cache=kv,
                               mma_peak_tflops=(roof["compute"].get("mma_f16") or {}).get("tflops"))
    return report_of(results)


def _peer_availability(dev) -> tuple[bool, str]:
    ai = dev.adapter_info
    if ai.get("vendor_id") != 0x10DE and "nvidia" not in (dev.info.adapter + dev.info.vendor).lower():
        return False, f"the adapter ({dev.info.adapter}) is not an NVIDIA GPU, so CUDA peers could not share it; skipped"
    from .bench_peers import availability
    return availability()


# -- output --------------------------------------------------------------------------------------

def _fmt(v, spec: str = ".1f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _gib(n) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _peer_cell(p: dict | None) -> str:
    if not p:
        return "-"
    if "skipped" in p:
        return "not run" if p["skipped"].startswith("not run") else "skipped"
    if "error" in p:
        return "error"
    return (f"{_fmt(p.get('decode_tps'))} ({_fmt(p.get('decode_ratio'), '.2f')}x) / "
            f"{_fmt(p.get('prefill_tps'), '.0f')} ({_fmt(p.get('prefill_ratio'), '.2f')}x)")


def _prefill_cell(r: dict) -> str:
    """The prefill's % of the compute peak, with the kernels and tile that ran."""
    what = ", ".join(str(v) for v in (r.get("prefill_kernels"), r.get("prefill_tile")) if v)
    return f"{_fmt(r.get('prefill_pct_compute'), '.2f')}" + (f" ({what})" if what else "")


def format_table(report: dict, markdown: bool = False) -> str:
    head = ["model", "quant", "prompt/new", "prefill tok/s", "prefill % peak (kernels, tile)", "decode tok/s", "% roofline",
            "ceiling tok/s", "peak GPU mem", "load s", "ttft s", "llama.cpp decode / prefill tok/s (wd/peer)",
            "HF eager decode / prefill tok/s (wd/peer)", "CUDA graph decode / prefill tok/s (wd/peer)"]
    rows = []
    for r in report["results"]:
        pr = r.get("peers") or {}
        if r.get("error"):
            rows.append([r["model"], r["quant"], f"{r['prompt_tokens']}/{r['new_tokens']}",
                         "error: " + r["error"][:90], "", "", "", "", "", "", "", "", "", ""])
            continue
        rows.append([r["model"], r["quant"], f"{r['prompt_tokens']}/{r['new_tokens']}", _fmt(r["prefill_tps"]),
                     _prefill_cell(r), _fmt(r["decode_tps"]), _fmt(r["pct_roofline"]), _fmt(r["roofline_decode_tps"], ".0f"),
                     _gib(r["peak_gpu_bytes"]), _fmt(r["load_s"], ".2f"), _fmt(r["ttft_s"], ".3f"),
                     _peer_cell(pr.get("llama_cpp")), _peer_cell(pr.get("hf_eager")), _peer_cell(pr.get("cuda_graph"))])
    if any(r.get("lora") for r in report["results"]):   # bench --lora-rank
        head.append("LoRA decode tok/s (ratio) / switch ms")
        for row, r in zip(rows, report["results"]):
            lo = r.get("lora") or {}
            row.append(f"error: {lo['error'][:60]}" if lo.get("error") else
                       f"r{lo.get('rank')}: {_fmt(lo.get('decode_tps'))} ({_fmt(lo.get('decode_ratio'), '.2f')}) / "
                       f"{_fmt(lo.get('switch_ms'), '.3f')}" if lo else "")
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        return "\n".join(lines)
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = "  ".join(h.ljust(n) for h, n in zip(head, w))
    out = [line, "-" * len(line)]
    out += ["  ".join(str(c).ljust(n) for c, n in zip(row, w)).rstrip() for row in rows]
    roof = report["roofline"]
    out.append(f"streaming read: {roof['best_GBps']} GB/s best, {roof['median_GBps']} GB/s median "
               f"({roof['bytes'] >> 20} MiB, {roof['reps']} reps, {roof['method']}); peers: {report['peers_note']}")
    out.append(compute_line(roof))
    return "\n".join(out)


def compute_line(roof: dict) -> str:
    """The compute peaks of a report (reports before issue 11 have none)."""
    peaks = roof.get("compute") or {}
    if not peaks:
        return "compute peaks: not measured in this report"
    return "compute peaks (multiply-adds x 2, best): " + ", ".join(peak_text(k, v) for k, v in peaks.items())


def peak_text(name: str, peak: dict, method: bool = True) -> str:
    """One compute peak of a report: its TFLOP/s (and how it was timed), or why it was not measured
    (a probe the adapter refused, e.g. the matrix units)."""
    if peak.get("tflops") is None:
        return f"{name} not measured ({str(peak.get('error', '?'))[:120]})"
    return f"{name} {peak['tflops']} TFLOP/s" + (f" ({peak['method']})" if method else "")


def write_markdown(path: str, report: dict) -> None:
    m = report["machine"]
    roof = report["roofline"]
    proto = ", ".join(f"{p['prompt_tokens']}/{p['new_tokens']}" for p in report["protocol"])
    sec = [f"## {report['date'][:10]}: {m['adapter']} ({m['backend']}, {m['driver'] or 'driver unknown'})", "",
           f"Command: `{report['command']}`", "",
           (f"Machine: {m['adapter']} ({m['adapter_type'] or m['vendor']}), driver {m['driver'] or '?'}, "
            f"wgpu {m['wgpu']}, Python {m['python']}, host {m['host']}; max binding "
            f"{_gib(m['max_binding_bytes'])}. Peers: {report['peers_note']}."), "",
           (f"Protocol: prompt/new tokens {proto}, batch {report['batch']}, {report['sampling']}, prefill chunk "
            f"{report['prefill_chunk'] or 'chosen by the engine (each row: prefill_chunk)'}, best of {report['repeats']}. Streaming read (the roofline): "
            f"**{roof['best_GBps']} GB/s** ({roof['bytes'] >> 20} MiB, {roof['method']}). "
            "% roofline = decode tok/s / (bandwidth / bytes read per token: weights + f32 KV cache at the "
            "mean position). Peer cells: decode / prefill tok/s with the ratio webdrift / peer in brackets; "
            "llama.cpp (llama-bench, CUDA) on the same GGUF file: tg at depth = prompt, pp at depth 0; "
            "PyTorch fp16 on the same GPU (fp16 weights whatever webdrift's quant). Prefill % f32 peak = "
            "prefill tok/s x 2 x the weights' multiply-adds per token / the f32 peak below."), "",
           compute_line(roof) + ".", "", format_table(report, markdown=True), ""]
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "a") as f:
        if new:
            f.write("# Benchmarks\n\nWritten by `webdrift bench --markdown`: ML Drift's protocol (batch 1, "
                    "greedy, 1024 prompt + 256 generated tokens, and 128/128), decode against the memory "
                    "roofline measured in the same run, and PyTorch peers on the same GPU.\n\n")
        else:
            f.write("\n")
        f.write("\n".join(sec))


def write_plot(path: str, report: dict) -> str:
    """Decode tok/s vs bytes read per token, beside the roofline; returns a note."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"plot skipped: matplotlib is not available ({type(e).__name__})"
    rows = [r for r in report["results"] if not r.get("error") and r.get("decode_tps")]
    if not rows:
        return "plot skipped: no successful results"
    bw = report["roofline"]["best_GBps"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["read_bytes_per_token"] / 1e9 for r in rows] + [
        p["read_bytes_per_token"] / 1e9 for r in rows for p in (r.get("peers") or {}).values()
        if isinstance(p, dict) and p.get("read_bytes_per_token")]
    lo, hi = min(xs) / 1.5, max(xs) * 1.5
    grid = [lo * (hi / lo) ** (k / 50) for k in range(51)]
    ax.plot(grid, [bw / x for x in grid], "k--", label=f"roofline {bw:.0f} GB/s")
    marks = {"f16": "o", "q8": "s", "q4": "^"}
    for q in sorted({r["quant"] for r in rows}):
        sel = [r for r in rows if r["quant"] == q]
        ax.scatter([r["read_bytes_per_token"] / 1e9 for r in sel], [r["decode_tps"] for r in sel],
                   marker=marks.get(q, "D"), label=f"webdrift {q}")
        for r in sel:
            if r is not next(x for x in sel if x["model"] == r["model"]):
                continue          # one label per model
            ax.annotate(r["model"],
                        (r["read_bytes_per_token"] / 1e9, r["decode_tps"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
    for name, mk in (("llama_cpp", "*"), ("hf_eager", "x"), ("cuda_graph", "+")):
        pts = [(p["read_bytes_per_token"] / 1e9, p["decode_tps"]) for p in
               ((r.get("peers") or {}).get(name, {}) for r in rows) if p.get("decode_tps")]
        if pts:
            ax.scatter(*zip(*pts), marker=mk, label="llama.cpp (same GGUF)" if name == "llama_cpp"
                       else f"PyTorch {name} (fp16)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GB read per decode token (weights + KV)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"decode vs roofline: {report['machine']['adapter']}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return f"plot written to {path}"


# -- the command ---------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", default=None,
                   help=f"a real model (known name, .gguf path or HF folder); repeatable (default {DEFAULT_MODEL} "
                        "when no --synthetic is given)")
    p.add_argument("--synthetic", action="append", default=None,
                   help=f"random-weight model shapes, comma list or repeatable: {', '.join(PRESETS)}, or 'all'")
    p.add_argument("--quant", action="append", default=None,
                   help=f"synthetic storage formats, comma list: {', '.join(QUANTS)} (the GGUF blocks: "
                        + ", ".join(f"{q} {t}" for q, t in QUANTS.items()) + "; default q4; --quick: f16, q8, q4)")
    p.add_argument("--weight-format", action="append", default=None,
                   help="load every model with each of these runtime weight formats, comma list: "
                        f"{', '.join(WEIGHT_FORMAT_CHOICES)} (default: as the file / --quant)")
    p.add_argument("--protocol", default=None,
                   help="PROMPT/NEW pairs (default 1024/256,128/128; --quick: 32/16,16/8)")
    p.add_argument("--repeats", type=int, default=1, help="runs per protocol, the best is reported (default 1)")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="engine prefill chunk (default: the engine's choice, 1024 on GPUs where it fits)")
    p.add_argument("--roofline-mib", type=int, default=None,
                   help="streaming-read buffer (default 1024, --quick 16; capped by the binding limit)")
    p.add_argument("--no-peers", action="store_true", help="skip the PyTorch peers")
    p.add_argument("--llama-bench", default=None, metavar="PATH",
                   help="llama.cpp's llama-bench binary: run it on the same GGUF files (--model FILE.gguf) with "
                        "the same protocol and report it beside webdrift (default: not run)")
    p.add_argument("--streams", default=None, metavar="K[,K...]",
                   help="also decode K streams together per protocol (generate n=K): aggregate decode tok/s and "
                        "its ratio to one stream")
    p.add_argument("--prefill-kernels", choices=PREFILL_KERNELS, default="auto",
                   help="prefill kernels: auto, gemm (int8 GEMM on q4/q8 where the GPU has integer dot products), "
                        "gemm_float / gemm_int8 (forced), gemv (default auto)")
    p.add_argument("--kv-cache", action="append", default=None, metavar="F16,F32",
                   help="the KV cache's values, f16 or f32, or both comma-separated (each model loaded once per "
                        "value; default: f16 where the adapter has shader-f16)")
    p.add_argument("--steps-per-submit", type=int, default=None, metavar="N",
                   help="decode steps per GPU submit, 1-32 (default: the device's; the rows say what ran)")
    p.add_argument("--int8-activations", choices=sorted(INT8_CHOICES), default="auto",
                   help="decode q4/q8 layers from int8 activations (default auto: on GPUs, layers >= 8 MiB)")
    p.add_argument("--speculative", default=None, metavar="MODE",
                   help="instead of the protocol: speculative decoding (e.g. 'lookup') vs plain greedy on a "
                        "~500-token rewriting task and a free-form chat, real models only (bench_spec.py)")
    p.add_argument("--lora-rank", type=int, default=None, metavar="R",
                   help="also decode with a random rank-R LoRA adapter on all seven targets (and on that engine "
                        "with no adapter), and time switching adapters (row field `lora`); with --streams, "
                        "also K streams with one adapter each (lora.streams)")
    p.add_argument("--lora-fused-shrink", action="store_true",
                   help="with --lora-rank: the engine's lora_fused_shrink option (the decode step's LoRA shrinks "
                        "in the producers' epilogues)")
    p.add_argument("--profile-tokens", type=int, default=0, metavar="N",
                   help="after each model's protocol, profile N tokens after the last prompt (the last row's "
                        "kernel_profile: GPU us per decode step by kernel family, the step timed whole, host "
                        "phases; --compare lists them); default 0: no profile")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes on any adapter (CI): checks the report is complete, < 60 s on lavapipe")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON")
    p.add_argument("--compare", nargs="+", default=None, metavar="REPORT",
                   help="print the rows of saved reports side by side (e.g. desktop and browser / node_bench.mjs "
                        "on the same GPU: ratios to the first) instead of running")
    p.add_argument("--markdown", default=None, metavar="PATH", help="append a section to a markdown file")
    p.add_argument("--plot", default=None, metavar="PATH", help="decode tok/s vs size beside the roofline (png)")
    p.set_defaults(func=cmd_bench)


def compare_table(reports: list[dict]) -> str:
    """Rows of several reports side by side (markdown): per (model, quant, prompt/new), each
    report's route, adapter, decode / prefill tok/s, ttft, load s and peak GPU memory, with decode
    and prefill as a ratio of the first report's (e.g. browser / desktop on the same GPU); then the
    kernel choices that differ between them (_compare_kernels) and the kernel profiles."""
    def key(r):
        return (r["model"], r["quant"], r["prompt_tokens"], r["new_tokens"])

    first = {key(r): r for r in reports[0]["results"]}
    order = list(dict.fromkeys(key(r) for rep in reports for r in rep["results"]))
    head = ["model", "quant", "prompt/new", "route", "adapter", "decode tok/s", "prefill tok/s", "ttft s", "load s",
            "peak GPU mem", "decode / first", "prefill / first"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for k in order:
        for rep in reports:
            m = rep.get("machine", {})
            for r in (r for r in rep["results"] if key(r) == k):
                base = first.get(k) or {}

                def ratio(f, r=r, base=base):
                    a, b = r.get(f), base.get(f)
                    return f"{a / b:.2f}" if a and b else "-"
                cells = [k[0], k[1], f"{k[2]}/{k[3]}", m.get("route", "desktop (wgpu-native)"), m.get("adapter", "?")]
                cells += (["error: " + r["error"][:60], "", "", "", "", "", ""] if r.get("error") else
                          [_fmt(r["decode_tps"]), _fmt(r["prefill_tps"]), _fmt(r["ttft_s"], ".3f"), _fmt(r["load_s"], ".2f"),
                           _gib(r["peak_gpu_bytes"]), ratio("decode_tps"), ratio("prefill_tps")])
                lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines + _compare_kernels(reports, key) + _compare_profiles(reports, key))


# the kernel choices a row names (load-time choices: a fresh tuning can pick others, and with
# them run at another speed: docs/BENCHMARKS.md, session 34)
_KERNEL_FIELDS = ("attention", "prefill_kernels", "prefill_tile", "int8_roles", "int8_chain")


def _compare_kernels(reports: list[dict], key) -> list[str]:
    """Per (model, quant, prompt/new) whose rows ran different kernels in different reports: each
    choice that differs (the decode attention, each decode GEMV op family, the prefill GEMM, the
    int8 roles / chain), one column per report; nothing where they all ran the same, or where
    only one report has the row."""
    def choices(r):
        if r is None:
            return {}
        got = {f: r[f] for f in _KERNEL_FIELDS if r.get(f) is not None}
        got |= {f"decode GEMV {fam}": v for fam, v in (r.get("decode_gemv") or {}).items()}
        return {k: ", ".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in got.items()}
    out = []
    for k in dict.fromkeys(key(r) for rep in reports for r in rep["results"]):
        rows = [choices(next((r for r in rep["results"] if key(r) == k and not r.get("error")), None)) for rep in reports]
        if sum(bool(c) for c in rows) < 2:
            continue
        differ = [f for f in dict.fromkeys(f for c in rows for f in c) if len({c.get(f, "-") for c in rows if c}) > 1]
        if differ:
            out += ["", f"Kernels that differ, {k[0]} {k[1]} {k[2]}/{k[3]}:", "",
                    "| | " + " | ".join(f"report {i + 1}" for i in range(len(reports))) + " |",
                    "|---|" + "---|" * len(reports)]
            out += [f"| {f} | " + " | ".join(c.get(f, "-") for c in rows) + " |" for f in differ]
    return out


_PROFILE_ROWS = {   # kernel_profile fields shown by --compare before the kernel families
    "step wall time, host phases only": ("host", "step_us"), "host work per step": ("host", "host_work_us"),
    "encode + submit a step": ("host", "submit_us"), "wait for a token": ("host", "readback_wait_us"),
    "decode steps per submit": ("host", "steps_per_submit"),
    "step wall time, step timed whole": (None, "whole_step_wall_us"),
    "GPU busy, step timed whole": (None, "whole_step_gpu_us"),
    "sum of kernels, each timed": (None, "gpu_us_per_step")}


def _compare_profiles(reports: list[dict], key) -> list[str]:
    """Per (model, quant, prompt/new) with a kernel_profile in some report: where a decode step
    goes (us), one column per report: host phases, the step timed whole, then GPU us per step by
    kernel family (in the first profiled report's order)."""
    def cell(p, row):
        if p is None:
            return "-"
        if row in _PROFILE_ROWS:
            part, field = _PROFILE_ROWS[row]
            return _fmt((p.get(part, {}) if part else p).get(field))
        return _fmt(p["families_us_per_step"].get(row))
    out = []
    keys = list(dict.fromkeys(key(r) for rep in reports for r in rep["results"] if r.get("kernel_profile")))
    for k in keys:
        profs = [next((r.get("kernel_profile") for r in rep["results"] if key(r) == k), None) for rep in reports]
        fams = list(dict.fromkeys(f for p in profs if p for f in p["families_us_per_step"]))
        routes = [rep.get("machine", {}).get("route", "desktop (wgpu-native)") for rep in reports]
        out += ["", f"Where a decode step goes (us), {k[0]} {k[1]} {k[2]}/{k[3]} (kernel_profile):", "",
                "| | " + " | ".join(routes) + " |", "|---|" + "---|" * len(reports)]
        out += [f"| {row} | " + " | ".join(cell(p, row) for p in profs) + " |" for row in [*_PROFILE_ROWS, *fams]]
    return out


def cmd_compare(paths: list[str]) -> int:
    reports = []
    for p in paths:
        try:
            with open(p) as f:
                rep = json.load(f)
        except (OSError, ValueError) as e:
            raise InvalidArgumentError(f"--compare {p}: cannot read a report ({type(e).__name__}: {e})") from None
        miss = missing_fields(rep)
        if miss:
            raise InvalidArgumentError(f"--compare {p}: not a complete bench report (missing {', '.join(miss[:5])})")
        reports.append(rep)
    print(compare_table(reports))
    return 0


def cmd_bench(args) -> int:
    if getattr(args, "compare", None):
        return cmd_compare(args.compare)
    if args.repeats < 1:
        raise InvalidArgumentError(f"--repeats {args.repeats}: must be >= 1")
    if getattr(args, "profile_tokens", 0) < 0:
        raise InvalidArgumentError(f"--profile-tokens {args.profile_tokens}: must be >= 0")
    if not hasattr(args, "command_line"):
        args.command_line = _command_line()
    check_writable(args.json, "--json", make_dirs=True)     # before the run, not after it
    check_writable(getattr(args, "markdown", None), "--markdown", make_dirs=True)
    check_writable(getattr(args, "plot", None), "--plot", make_dirs=True)
    if args.speculative is not None:
        return cmd_bench_speculative(args)
    t0 = time.perf_counter()

    def write_json(rep: dict) -> None:       # whole or not at all (a run cut short keeps the last one)
        d = os.path.dirname(args.json)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(args.json + ".tmp", "w") as f:
            json.dump({**rep, "wall_s": round(time.perf_counter() - t0, 2)}, f, indent=1)
        os.replace(args.json + ".tmp", args.json)

    report = run_bench(args, partial=write_json if args.json else None)
    report["wall_s"] = round(time.perf_counter() - t0, 2)
    print(format_table(report))
    if args.json:
        write_json(report)
        print(f"report written to {args.json}")
    if args.markdown:
        write_markdown(args.markdown, report)
        print(f"section appended to {args.markdown}")
    if args.plot:
        print(write_plot(args.plot, report))
    lc_errors = {r["peers"]["llama_cpp"]["error"] for r in report["results"] if "error" in r["peers"]["llama_cpp"]}
    for e in sorted(lc_errors):
        sys.stderr.write(f"webdrift: error: {e}\n")
    if args.quick:
        miss = missing_fields(report)
        if miss:
            print(f"bench --quick: the report is incomplete: missing {', '.join(miss)}")
            return 1
        bad = [r for r in report["results"] if r.get("error")]
        if bad:
            print(f"bench --quick: {len(bad)} runs failed: {bad[0]['error']}")
            return 1
        print(f"bench --quick: report complete ({len(report['results'])} rows) in {report['wall_s']} s")
    return 1 if lc_errors else 0


def cmd_bench_speculative(args) -> int:
    """`webdrift bench --speculative MODE`: bench_spec.py's tasks for each --model (exit 1 if a
    speculative output differs from the plain one)."""
    from .bench_spec import format_rows, run_speculative_bench
    if args.synthetic:
        raise InvalidArgumentError("--speculative needs real models (--model): drafts come from text")
    log = lambda s: sys.stderr.write(s + "\n")
    new_tokens = 32 if args.quick else 256
    from .. import __version__
    report = {"webdrift_version": __version__, "command": args.command_line, "new_tokens": new_tokens,
              "sampling": "greedy (temperature 0), chat template, EOS ends a run", "results": []}
    for model in args.model or [DEFAULT_MODEL]:
        log(f"{model}: speculative={args.speculative} vs plain ...")
        for r in run_speculative_bench(model, args.speculative, new_tokens, args.repeats, log,
                                       INT8_CHOICES[getattr(args, "int8_activations", "auto")]):
            report["results"].append(dict(r, model=model))
    print(format_rows(report["results"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"report written to {args.json}")
    differ = [r for r in report["results"] if not r.get("identical", True)]
    for r in differ:
        sys.stderr.write(f"webdrift: error: {r['model']} {r['task']}: speculative output differs from plain greedy\n")
    return 1 if differ else 0


def _command_line() -> str:
    """The command as typed: `webdrift bench ...` / `python -m webdrift bench ...`."""
    import shlex
    argv = sys.argv[1:]
    if argv[:1] == ["bench"]:
        return "webdrift " + shlex.join(argv)
    if sys.argv[0].endswith("bench.py"):
        return "webdrift bench " + shlex.join(argv)
    return "webdrift bench (called from Python)"


def main(argv: list[str] | None = None) -> int:  # python -m webdrift.tools.bench
    ap = argparse.ArgumentParser(prog="webdrift bench")
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return cmd_bench(args)
    except WebdriftError as e:
        sys.stderr.write(f"webdrift: error: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
