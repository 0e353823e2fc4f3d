"""llama.cpp as a peer of `webdrift bench`: its llama-bench binary run on the very same GGUF file.

For each prompt/new pair (P, M) of the protocol: `llama-bench -m FILE -ngl 99 -fa 1 -p P -n M
-d 0,P -r R -o json` (every layer on the GPU, flash attention on); prefill is its pp P at depth
0 (a prompt into an empty cache, as webdrift's prefill), decode its tg M at depth P (M tokens
generated after a P-token context, as webdrift's decode). Fields read from its JSON:
model_filename, n_prompt, n_gen, n_depth, avg_ts, stddev_ts.
A failing or missing binary becomes an `error` in the peer cell of every row it concerns (the
rest of the report is still written); synthetic models have no file and say so.
Must not: be imported by the core; run anything but the binary it is given.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

TIMEOUT_S = 1800          # one llama-bench invocation (4 tests x repetitions on the largest model)
MAX_MESSAGE = 400         # characters of a failing binary's output quoted in an error


def llama_bench_command(binary: str, gguf: str, prompt: int, new: int, repeats: int) -> list[str]:
    return [binary, "-m", gguf, "-ngl", "99", "-fa", "1", "-p", str(prompt), "-n", str(new),
            "-d", f"0,{prompt}", "-r", str(max(1, repeats)), "-o", "json"]


def parse_llama_bench(text: str) -> list[dict]:
    """llama-bench's records from its `-o json` (one array) or `-o jsonl` (one object a line)
    output; ValueError when there are none."""
    text = text.strip()
    try:
        data = json.loads(text)
        recs = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        recs = []
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    need = ("n_prompt", "n_gen", "n_depth", "avg_ts")
    recs = [r for r in recs if isinstance(r, dict) and all(k in r for k in need)]
    if not recs:
        raise ValueError("no llama-bench records (n_prompt, n_gen, n_depth, avg_ts) in its output")
    return recs


def pick(recs: list[dict], prompt: int, new: int) -> dict:
    """{prefill_tps, prefill_std, decode_tps, decode_std} of one protocol pair from the records."""
    pp = [r for r in recs if r["n_prompt"] == prompt and r["n_gen"] == 0 and r["n_depth"] == 0]
    tg = [r for r in recs if r["n_gen"] == new and r["n_prompt"] == 0 and r["n_depth"] == prompt]
    if not pp or not tg:
        raise ValueError(f"llama-bench reported no pp{prompt}@d0 / tg{new}@d{prompt} test")
    return {"prefill_tps": round(float(pp[0]["avg_ts"]), 2), "prefill_std": round(float(pp[0].get("stddev_ts", 0)), 2),
            "decode_tps": round(float(tg[0]["avg_ts"]), 2), "decode_std": round(float(tg[0].get("stddev_ts", 0)), 2)}


def run_llama_bench(binary: str, gguf: str, prompt: int, new: int, repeats: int) -> dict:
    """One protocol pair through llama-bench; {"error": ...} naming the binary when it fails."""
    exe = shutil.which(binary)     # a path, or a name on PATH
    if exe is None:
        return {"error": f"--llama-bench {binary!r}: no such executable file"}
    cmd = llama_bench_command(exe, gguf, prompt, new, repeats)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"--llama-bench {binary!r} could not run: {type(e).__name__}: {str(e)[:MAX_MESSAGE]}"}
    if out.returncode != 0:
        tail = (out.stderr or out.stdout or "").strip()[-MAX_MESSAGE:]
        return {"error": f"--llama-bench {binary!r} failed with exit status {out.returncode}: {tail}"}
    try:
        res = pick(parse_llama_bench(out.stdout), prompt, new)
    except ValueError as e:
        return {"error": f"--llama-bench {binary!r}: {e}"}
    res["command"] = " ".join(cmd)
    return res


def attach_llama_cpp(rows: list[dict], binary: str, src, protocols, repeats: int, kv_extra, log=None) -> None:
    """Run llama-bench for each row's protocol pair on src's GGUF file and put the result, with the
    ratios webdrift / llama.cpp, into row["peers"]["llama_cpp"]. kv_extra(kv_len): the KV bytes a
    webdrift decode step reads at that length beyond llama.cpp's f16 cache (0 with webdrift's f16
    cache), for the plot's x position."""
    log = log or (lambda s: None)
    path = str(getattr(src, "path", ""))
    for r in rows:
        r["peers"] = r.get("peers") or {}
        if getattr(src, "format", "") == "synthetic" or not path.endswith(".gguf") or not os.path.isfile(path):
            r["peers"]["llama_cpp"] = {"skipped": "not run: llama.cpp reads GGUF files (use --model FILE.gguf)"}
            continue
        if r.get("error"):
            r["peers"]["llama_cpp"] = {"skipped": "not run: webdrift's run failed"}
            continue
        p, m = r["prompt_tokens"], r["new_tokens"]
        log(f"  llama.cpp {p}/{m} ...")
        v = run_llama_bench(binary, path, p, m, repeats)
        if "error" in v:
            log(f"  {v['error']}")
        else:
            v["decode_ratio"] = round(r["decode_tps"] / v["decode_tps"], 3) if v["decode_tps"] else None
            v["prefill_ratio"] = round(r["prefill_tps"] / v["prefill_tps"], 3) if v["prefill_tps"] else None
            kv_len = p + (m - 1) / 2
            v["read_bytes_per_token"] = int(r["read_bytes_per_token"] - kv_extra(kv_len))
            log(f"  llama.cpp {p}/{m}: prefill {v['prefill_tps']} tok/s, decode {v['decode_tps']} tok/s "
                f"(webdrift / llama.cpp: decode {v['decode_ratio']}x, prefill {v['prefill_ratio']}x)")
        r["peers"]["llama_cpp"] = v
