"""`webdrift perplexity`: a model's perplexity over a text, computed the way llama.cpp's
`llama-perplexity` computes it, so the two figures can be compared on the same GGUF file.

The recipe (llama.cpp tools/perplexity/perplexity.cpp, `perplexity()`, the default mode):
  1. the whole text is tokenized once, with the model's special prefix (BOS where the model's
     tokenizer adds one: Gemma yes, SmolLM2 no), like `common_tokenize(ctx, text, true)`;
  2. it is cut into n_chunk = len(tokens) // ctx non-overlapping windows of ctx tokens (the tail
     that fills no window is dropped; at least 2 * ctx tokens are required);
  3. where the model adds BOS, each window's first token is replaced by BOS;
  4. each window is run from an empty KV cache (teacher forced), and only its second half is
     scored: the logits at positions first = ctx // 2 ... ctx - 2 predict tokens first+1 ... ctx-1,
     i.e. ctx - 1 - ctx // 2 tokens per window;
  5. nll = logsumexp(logits) - logits[target] per scored token (float32 logits, float64 sums);
     perplexity = exp(mean nll); the uncertainty is llama.cpp's: ppl * sqrt(var(nll) / (n - 1)).
`--file` is read like llama.cpp's `-f`: the file's bytes as UTF-8, one trailing newline removed.

Logits come from `Engine.logits(ids, first)`: the first half of each window goes through the
layers but not through the LM head nor back to the host; the log-softmax runs in numpy here.
Progress goes to stderr. Also callable from Python: `perplexity(engine_or_model, text, ctx=512)`.
Must not: import wgpu or js; be imported by the core.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field

from ..errors import InvalidArgumentError
from .outputs import check_writable

DEFAULT_CTX = 512


@dataclass
class PerplexityResult:
    """One perplexity measurement; `as_dict()` is what `--json` writes."""

    model: str
    weight_format: str | None       # the option the engine was loaded with (None: follows the file)
    weight_bytes: int               # the weights' size on the GPU (eng.model.weight_bytes)
    adapter: str
    ctx: int
    n_text_tokens: int              # the whole text, BOS included where the model adds one
    n_chunks: int
    n_scored: int                   # n_chunks * (ctx - 1 - ctx // 2)
    add_bos: bool
    ppl: float
    ppl_stderr: float               # llama.cpp's "+/-"
    nll_mean: float
    chunk_ppl: list[float] = field(default_factory=list)   # running ppl after each window, as llama.cpp prints
    seconds: float = 0.0
    kv_cache: str = "f32"           # the KV cache's values the engine ran with (EngineOptions.kv_cache)

    def as_dict(self) -> dict:
        d = asdict(self)
        for k in ("ppl", "ppl_stderr", "nll_mean"):
            d[k] = round(d[k], 6)
        d["chunk_ppl"] = [round(v, 4) for v in self.chunk_ppl]
        d["seconds"] = round(self.seconds, 2)
        return d


def read_text(path) -> str:
    """A text file as llama.cpp's `-f` reads it: its bytes as UTF-8 (line ends kept as they are),
    one trailing newline removed."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InvalidArgumentError(f"--file {path}: cannot read it ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"--file {path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    return text.removesuffix("\n")


def check_ctx(ctx, model_context: int | None, where: str = "ctx") -> int:
    """ctx: an integer >= 4 (a window's second half is scored) within the model's context length."""
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 4:
        raise InvalidArgumentError(f"{where}={ctx!r}: must be an integer >= 4")
    if model_context is not None and ctx > model_context:
        raise InvalidArgumentError(f"{where}={ctx} exceeds the model's context length {model_context}")
    return ctx


def windows(tokens: list[int], ctx: int, bos_id: int | None) -> list[list[int]]:
    """llama.cpp's non-overlapping windows: len(tokens) // ctx of them, each of ctx tokens, the
    first replaced by BOS where bos_id is given. Fewer than 2 * ctx tokens is an error (llama.cpp
    refuses them too)."""
    if len(tokens) < 2 * ctx:
        raise InvalidArgumentError(f"the text has {len(tokens)} tokens; perplexity with ctx={ctx} needs at least "
                                   f"{2 * ctx} (two windows): give a longer text or a smaller --ctx")
    out = []
    for i in range(len(tokens) // ctx):
        w = list(tokens[i * ctx:(i + 1) * ctx])
        if bos_id is not None:
            w[0] = bos_id
        out.append(w)
    return out


def window_nll(logits, targets):
    """-log softmax(logits)[target] per row, in float64 (llama.cpp's log_softmax: max-shifted
    float32 exponentials summed in double). logits: float32 [n, vocab]; targets: n ids."""
    import numpy as np
    lg = np.asarray(logits, dtype=np.float32)
    t = np.asarray(targets, dtype=np.int64)
    m = lg.max(axis=1)
    picked = lg[np.arange(len(t)), t]
    lg = lg - m[:, None]                       # a copy: the caller's array is left as it is
    np.exp(lg, out=lg)
    s = lg.sum(axis=1, dtype=np.float64)
    return np.log(s) + (m.astype(np.float64) - picked.astype(np.float64))


def perplexity(model, text: str, ctx: int = DEFAULT_CTX, *, weight_format: str | None = None,
               n_chunks: int | None = None, progress=None, device=None, **options) -> PerplexityResult:
    """Perplexity of `model` over `text` with windows of `ctx` tokens (llama-perplexity's recipe).

    model: an Engine (max_context >= ctx), or a model reference for webdrift.load (a known name,
    .gguf path, HF folder), then loaded with max_context=ctx, weight_format and the other
    EngineOptions given as keywords (e.g. prefill_kernels="gemm"), on `device` if given.
    Bad input (an empty or too short text, a ctx beyond the model's context, an unknown format or
    option) raises InvalidArgumentError before any weight is uploaded.
    n_chunks: score only the first n windows (None: all, like llama.cpp's default).
    progress(done, total, running_ppl) is called after each window."""
    from ..runtime.engine import Engine
    from ..runtime.loading import EngineOptions, assemble, make_tokenizer, open_source
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise InvalidArgumentError("the text is empty: perplexity needs at least two windows of text")
    if n_chunks is not None and (isinstance(n_chunks, bool) or not isinstance(n_chunks, int) or n_chunks < 1):
        raise InvalidArgumentError(f"n_chunks={n_chunks!r}: must be None or a positive integer")
    t0 = time.perf_counter()
    if isinstance(model, Engine):
        if weight_format is not None or options or device is not None:
            raise InvalidArgumentError("weight_format, device and engine options apply when a model is loaded, "
                                       "not to an Engine given ready-made")
        eng = model
        check_ctx(ctx, eng.config.max_position)
        if ctx > eng.max_context:
            raise InvalidArgumentError(f"ctx={ctx} exceeds this engine's max_context {eng.max_context} "
                                       f"(load it with max_context={ctx})")
        tokens, wins = tokenize_windows(eng.tokenizer, text, ctx)
        return score_windows(eng, tokens, wins, ctx, n_chunks, progress, str(eng.path), t0)
    check_ctx(ctx, None)
    unknown = sorted(set(options) - set(EngineOptions.names()))
    if unknown:
        raise InvalidArgumentError(f"unknown engine option(s) {', '.join(unknown)}; "
                                   f"the options are {', '.join(EngineOptions.names())}")
    # score chunks (at most 64 tokens) that start at the scored half, so no unscored row goes
    # through the LM head: it is most of the work for a large vocabulary (Gemma 3: 262k rows)
    options.setdefault("prefill_chunk", min(256, ctx // 2))
    opts = EngineOptions(max_context=ctx, weight_format=weight_format, **options)   # checked here
    source = open_source(model)
    check_ctx(ctx, source.config.max_position)
    tokenizer = make_tokenizer(source)
    tokens, wins = tokenize_windows(tokenizer, text, ctx)                    # too short: fails here
    if device is None:
        from ..gpu.native import get_device
        device = get_device()
    eng = assemble(source, opts, device, tokenizer=tokenizer)
    return score_windows(eng, tokens, wins, ctx, n_chunks, progress, str(model), t0)


def tokenize_windows(tokenizer, text: str, ctx: int) -> tuple[list[int], list[list[int]]]:
    """The whole text tokenized with the model's own prefix (BOS where it adds one), and its
    windows (BOS first in each where the model adds BOS)."""
    tokens = tokenizer.encode(text)
    return tokens, windows(tokens, ctx, tokenizer.bos_token_id if tokenizer.add_bos else None)


def score_windows(eng, tokens: list[int], wins: list[list[int]], ctx: int, n_chunks: int | None = None,
                  progress=None, name: str = "", t0: float | None = None) -> PerplexityResult:
    """Score the second half of each window on a loaded engine (max_context >= ctx)."""
    import numpy as np
    t0 = time.perf_counter() if t0 is None else t0
    if n_chunks is not None:
        wins = wins[:n_chunks]
    first = ctx // 2
    nll_sum = nll2_sum = 0.0
    count = 0
    running = []
    for k, w in enumerate(wins):
        logits = eng.logits(w, first=first)                 # rows first .. ctx-1
        nll = window_nll(logits[:ctx - 1 - first], w[first + 1:])
        nll_sum += float(nll.sum())
        nll2_sum += float(np.square(nll).sum())
        count += len(nll)
        running.append(math.exp(nll_sum / count))
        if progress is not None:
            progress(k + 1, len(wins), running[-1])
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    ppl = math.exp(mean)
    err = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    return PerplexityResult(
        model=name or str(eng.path), weight_format=eng.options.weight_format, weight_bytes=eng.model.weight_bytes,
        adapter=eng.dev.info.adapter, ctx=ctx, n_text_tokens=len(tokens), n_chunks=len(wins), n_scored=count,
        add_bos=bool(eng.tokenizer.add_bos), ppl=ppl, ppl_stderr=err, nll_mean=mean, chunk_ppl=running,
        seconds=time.perf_counter() - t0, kv_cache=eng.model.kv_cache)


# -- the command ---------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..runtime.options import WEIGHT_FORMATS
    p.add_argument("model", help="known name, .gguf path or HF folder")
    p.add_argument("--file", "-f", required=True, help="the text (UTF-8), read like llama-perplexity's -f")
    p.add_argument("--ctx", "-c", type=int, default=DEFAULT_CTX,
                   help="window length in tokens; the second half of each is scored (default %(default)s)")
    p.add_argument("--chunks", type=int, default=None, help="score only the first N windows (default all)")
    p.add_argument("--weight-format", default=None,
                   help=f"runtime weight format: {', '.join(WEIGHT_FORMATS)} (default follows the file)")
    p.add_argument("--kv-cache", choices=("f16", "f32"), default=None,
                   help="the KV cache's values (default f16 where the adapter has shader-f16): what rounding K "
                        "and V to f16 costs")
    p.add_argument("--json", metavar="PATH", default=None, help="write the result as JSON ('-' for stdout)")
    p.set_defaults(func=cmd_perplexity)


def cmd_perplexity(args) -> int:
    text = read_text(args.file)
    check_writable(args.json, "--json")      # before the windows, not after them

    def show(done, total, ppl):
        sys.stderr.write(f"\rperplexity: window {done}/{total}, running ppl {ppl:.4f}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    res = perplexity(args.model, text, args.ctx, weight_format=args.weight_format, n_chunks=args.chunks,
                     progress=show, kv_cache=args.kv_cache)
    line = (f"{res.model}: PPL = {res.ppl:.4f} +/- {res.ppl_stderr:.5f} over {res.n_scored} tokens "
            f"({res.n_chunks} windows of {res.ctx}; weights {res.weight_bytes / 2**20:.1f} MiB, "
            f"{res.weight_format or 'file formats'}; KV cache {res.kv_cache})")
    if args.json == "-":
        sys.stderr.write(line + "\n")
        print(json.dumps(res.as_dict()))
        return 0
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res.as_dict(), f, indent=1)
            f.write("\n")
    return 0
