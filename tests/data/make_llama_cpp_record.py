"""Make tests/data/llama_cpp_perplexity.json: llama.cpp's perplexity figures for the two real models
over tests/data/alice29.txt (run once, by hand; the tests only read the result).

    # llama.cpp from the llama-cpp-python sdist (its vendored copy), CPU build, three targets
    python3 -m pip download --no-deps --no-binary=:all: llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    cmake -S /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/lcpp-build -DGGML_NATIVE=OFF \\
          -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build /tmp/lcpp-build --target llama-perplexity llama-tokenize llama-quantize -j2
    python3 tests/data/make_llama_cpp_record.py --bin /tmp/lcpp-build/bin --work /tmp/ppl

For each model and each slice (ctx, chunks) it runs `llama-perplexity -m GGUF -f alice29.txt -c CTX
--chunks N -t 2` on the file and on its float32 dequantization (`llama-quantize --allow-requantize
GGUF OUT F32`), and `llama-tokenize` over the text (the text without its final newline, as
llama-perplexity's -f reads it; no special-token parsing, no escapes). A log already in --work
is reused, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).parent
TEXT = HERE / "alice29.txt"
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}
TEST_SLICE = {"ctx": 32, "chunks": 2}
SLICES = [(32, 2), (512, 4), (512, None)]   # (ctx, chunks); chunks None = the whole text
HEAD = 64                             # token ids kept for the tokenization check
# Where webdrift's tokenizer (which follows transformers') and llama-tokenize split the text
# differently, found by comparing the two id lists (the test checks the counts add up):
TOKEN_DIFFERENCES = {
    "gemma3-270m": [
        {"llama_cpp_index": 31218, "webdrift_index": 31218, "text": "a run of 54 spaces before 'sea!'",
         "llama_cpp": [167, 159], "webdrift": [152, 152, 158]},
        {"llama_cpp_index": 31239, "webdrift_index": 31240, "text": "a run of 55 spaces before 'askance'",
         "llama_cpp": [167, 160], "webdrift": [152, 152, 159]},
    ],
}
TOKEN_DIFFERENCES_NOTE = ("two long runs of spaces (the indented lines of the Lobster Quadrille song): llama.cpp's "
                          "SentencePiece merges give 31 + 23 (24) spaces, transformers (AutoTokenizer from the GGUF) "
                          "and webdrift 16 + 16 + 22 (23); every other token is the same")


def sha256(p: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def run(cmd: list[str], log: pathlib.Path) -> str:
    if not log.exists():
        print("$", " ".join(cmd), file=sys.stderr)
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        log.write_text(out.stdout + out.stderr)
    return log.read_text()


def parse(log: str) -> dict:
    chunk = [float(v) for v in re.findall(r"\[\d+\]([0-9.]+),", log)]
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    n = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)", log)
    if not (chunk and m and n):
        raise SystemExit(f"no perplexity in the log:\n{log[-2000:]}")
    n_chunks, ctx = int(n.group(1)), int(n.group(2))
    return {"ppl": float(m.group(1)), "ppl_stderr": float(m.group(2)), "chunk_ppl": chunk, "n_chunks": n_chunks,
            "n_scored": n_chunks * (ctx - 1 - ctx // 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, type=pathlib.Path, help="llama.cpp's build/bin")
    ap.add_argument("--work", required=True, type=pathlib.Path, help="logs and the F32 GGUFs")
    ap.add_argument("--models", default=str(pathlib.Path.home() / ".cache/webdrift/models"), type=pathlib.Path)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    stripped = args.work / "alice29.stripped.txt"        # what llama-perplexity's -f tokenizes
    stripped.write_bytes(TEXT.read_bytes().removesuffix(b"\n"))
    version = run([str(args.bin / "llama-perplexity"), "--version"], args.work / "version.log")
    record = {
        "about": "llama.cpp's llama-perplexity over tests/data/alice29.txt, made by tests/data/make_llama_cpp_record.py",
        "date": datetime.date.today().isoformat(),
        "llama_cpp": {
            "source": "llama-cpp-python 0.3.36 sdist (PyPI), vendor/llama.cpp",
            "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
            "version": " ".join(line.strip() for line in version.splitlines() if line.strip()),
            "build": "cmake -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release; targets llama-perplexity, "
                     "llama-tokenize, llama-quantize; CPU backend (x86-64, AVX2/FMA/F16C), 2 threads",
        },
        "text": {"path": "tests/data/alice29.txt", "sha256": sha256(TEXT)},
        "test_slice": TEST_SLICE,
        "models": {},
    }
    for key, fname in MODELS.items():
        gguf = args.models / fname
        f32 = args.work / (gguf.stem + ".F32.gguf")
        if not f32.exists():
            run([str(args.bin / "llama-quantize"), "--allow-requantize", str(gguf), str(f32), "F32", "2"],
                args.work / f"{key}_quantize.log")
        tok_log = run([str(args.bin / "llama-tokenize"), "-m", str(gguf), "-f", str(stripped), "--ids",
                       "--no-parse-special", "--no-escape", "--log-disable"], args.work / f"{key}_tokenize.log")
        ids = ast.literal_eval(tok_log.strip().splitlines()[-1])
        m = {"file": fname, "sha256": sha256(gguf),
             "llama_tokenize": {"n_tokens": len(ids), "head_ids": ids[:HEAD],
                                "differences": TOKEN_DIFFERENCES.get(key, []),
                                **({"note": TOKEN_DIFFERENCES_NOTE} if key in TOKEN_DIFFERENCES else {})},
             "runs": []}
        for ctx, chunks in SLICES:
            for weights, path in (("file", gguf), ("f32-dequantized", f32)):
                cmd = [str(args.bin / "llama-perplexity"), "-m", str(path), "-f", str(TEXT), "-c", str(ctx), "-t", "2"]
                if chunks is not None:
                    cmd += ["--chunks", str(chunks)]
                log = run(cmd, args.work / f"{key}_{weights}_c{ctx}x{chunks or 'all'}.log")
                r = {"weights": weights, "ctx": ctx, "chunks": chunks,
                     "command": " ".join(["llama-perplexity", "-m", path.name, "-f", "tests/data/alice29.txt"]
                                         + cmd[5:]), **parse(log)}
                m["runs"].append(r)
        record["models"][key] = m
    out = HERE / "llama_cpp_perplexity.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
