"""`webdrift bench --llama-bench PATH`: llama.cpp's llama-bench on the same GGUF file, parsed and set
beside webdrift. The real binary runs on the GPU machine (docs/BENCHMARKS.md); here a stand-in
script prints llama-bench's JSON format (fields model_filename, n_prompt, n_gen, n_depth, avg_ts,
stddev_ts) after checking it was called the way llama-bench must be."""

from __future__ import annotations

import json
import os
import stat
import sys
from types import SimpleNamespace as NS

import pytest

from tests.tiny_model import write_tiny_gguf
from webdrift.tools import llama_cpp
from webdrift.tools.bench import add_arguments, cmd_bench, format_table

PP, TG = 4321.5, 123.25     # the stand-in's tokens/s

STAND_IN = f"""#!{sys.executable}
import json, sys
a = sys.argv[1:]
opt = {{a[i]: a[i + 1] for i in range(0, len(a) - 1, 2)}}
assert opt["-ngl"] == "99" and opt["-fa"] == "1" and opt["-o"] == "json", a
p, n = int(opt["-p"]), int(opt["-n"])
assert opt["-d"] == f"0,{{p}}", a
recs = []
for d in (0, p):
    recs.append(dict(model_filename=opt["-m"], n_prompt=p, n_gen=0, n_depth=d, avg_ts={PP} - d, stddev_ts=1.5))
    recs.append(dict(model_filename=opt["-m"], n_prompt=0, n_gen=n, n_depth=d, avg_ts={TG} - d / 1000, stddev_ts=0.5))
print(json.dumps(recs, indent=2))
"""


def _script(tmp_path, text: str, name: str = "llama-bench") -> str:
    p = tmp_path / name
    p.write_text(text)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_parse_json_array_and_jsonl_and_pick():
    recs = [{"model_filename": "m.gguf", "n_prompt": 1024, "n_gen": 0, "n_depth": 0, "avg_ts": 9000.0, "stddev_ts": 12.0},
            {"model_filename": "m.gguf", "n_prompt": 0, "n_gen": 256, "n_depth": 0, "avg_ts": 310.0, "stddev_ts": 1.0},
            {"model_filename": "m.gguf", "n_prompt": 0, "n_gen": 256, "n_depth": 1024, "avg_ts": 300.0, "stddev_ts": 2.0}]
    as_array = json.dumps(recs)
    as_lines = "ggml_cuda_init: found 1 CUDA devices\n" + "\n".join(json.dumps(r) for r in recs)
    for text in (as_array, as_lines):
        got = llama_cpp.pick(llama_cpp.parse_llama_bench(text), 1024, 256)
        assert got == {"prefill_tps": 9000.0, "prefill_std": 12.0, "decode_tps": 300.0, "decode_std": 2.0}
    with pytest.raises(ValueError, match="no llama-bench records"):
        llama_cpp.parse_llama_bench("main: error: failed to load model")
    with pytest.raises(ValueError, match="tg128@d1024"):
        llama_cpp.pick(recs, 1024, 128)


def _rows(gguf: str):
    src = NS(path=gguf, format="gguf")
    rows = [{"prompt_tokens": 16, "new_tokens": 4, "decode_tps": 61.6125, "prefill_tps": 1000.0, "read_bytes_per_token": 10_000,
                 "error": None, "peers": None}]
    return src, rows


def test_attach_sets_values_and_ratios(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    src, rows = _rows(str(gguf))
    # kv_extra: an f32 cache reads 200 bytes a position more than llama.cpp's f16 one
    llama_cpp.attach_llama_cpp(rows, _script(tmp_path, STAND_IN), src, [(16, 4)], 3, kv_extra=lambda n: 200 * n)
    v = rows[0]["peers"]["llama_cpp"]
    assert v["prefill_tps"] == PP and v["decode_tps"] == round(TG - 16 / 1000, 2)   # pp at depth 0, tg at depth P
    assert v["decode_ratio"] == round(61.6125 / v["decode_tps"], 3) == 0.5
    assert v["prefill_ratio"] == round(1000.0 / PP, 3)
    assert v["read_bytes_per_token"] == int(10_000 - 200 * (16 + 1.5))
    assert "-d 0,16" in v["command"] and "-r 3" in v["command"]


def test_attach_errors_name_the_binary_and_synthetic_is_not_run(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    missing = str(tmp_path / "no-such-llama-bench")
    src, rows = _rows(str(gguf))
    llama_cpp.attach_llama_cpp(rows, missing, src, [(16, 4)], 1, kv_extra=lambda n: 0)
    assert rows[0]["peers"]["llama_cpp"] == {"error": f"--llama-bench {missing!r}: no such executable file"}
    failing = _script(tmp_path, f"#!{sys.executable}\nimport sys\nsys.stderr.write('error: unknown model arch')\n"
                                "sys.exit(3)\n", "failing-bench")
    src, rows = _rows(str(gguf))
    llama_cpp.attach_llama_cpp(rows, failing, src, [(16, 4)], 1, kv_extra=lambda n: 0)
    err = rows[0]["peers"]["llama_cpp"]["error"]
    assert failing in err and "exit status 3" in err and "unknown model arch" in err
    _, rows = _rows(str(gguf))
    llama_cpp.attach_llama_cpp(rows, failing, NS(path="tiny", format="synthetic"), [(16, 4)], 1, kv_extra=lambda n: 0)
    assert rows[0]["peers"]["llama_cpp"]["skipped"].startswith("not run: llama.cpp reads GGUF files")


def _args(tmp_path, *extra):
    import argparse
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    return ap.parse_args(["--protocol", "16/4", "--no-peers", "--roofline-mib", "4",
                          "--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "b.md"), *extra])


def test_bench_reports_llama_cpp_beside_webdrift(tmp_path, smollm2_gguf_path, capsys):
    """The real SmolLM2 GGUF through webdrift and the stand-in llama-bench: the row carries both and the
    ratio in the JSON, the table and the markdown; a missing binary is an error naming it, with the
    report still written (exit status 1). The second run only checks that error path, which does
    not depend on the model, so it benches the tiny GGUF (tests/tiny_model.py; seconds) instead
    of loading SmolLM2 a second time."""
    args = _args(tmp_path, "--model", str(smollm2_gguf_path), "--llama-bench", _script(tmp_path, STAND_IN))
    assert cmd_bench(args) == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    (r,) = rep["results"]
    v = r["peers"]["llama_cpp"]
    assert r["error"] is None and v["decode_tps"] == round(TG - 16 / 1000, 2) and v["prefill_tps"] == PP
    assert v["decode_ratio"] == round(r["decode_tps"] / v["decode_tps"], 3) and r["ttft_s"] > 0
    cell = f"{v['decode_tps']:.1f} ({v['decode_ratio']:.2f}x) / {PP:.0f} ({v['prefill_ratio']:.2f}x)"
    assert cell in format_table(rep) and cell in (tmp_path / "b.md").read_text()
    missing = str(tmp_path / "missing" / "llama-bench")
    os.remove(tmp_path / "r.json")
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    args = _args(tmp_path, "--model", tiny, "--llama-bench", missing)
    assert cmd_bench(args) == 1
    assert f"webdrift: error: --llama-bench {missing!r}: no such executable file" in capsys.readouterr().err
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["results"][0]["decode_tps"] > 0 and "error" in rep["results"][0]["peers"]["llama_cpp"]


def test_without_the_option_the_column_says_not_run(tmp_path):
    args = _args(tmp_path, "--synthetic", "tiny", "--quant", "q4")
    assert cmd_bench(args) == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["results"][0]["peers"]["llama_cpp"] == {"skipped": "not run (no --llama-bench)"}
    assert "not run" in format_table(rep)
