"""`webdrift train-forecast`: fit DS2D forecast embeddings for a model (PyTorch on CPU).

Forecast embeddings (docs/FORECAST.md; the file format: webdrift/weights/forecast.py) are m
learned input vectors f_1 .. f_m. After a token x_t at position t they are fed as the input
embeddings (after any embedding scale) of positions t+1 .. t+m; row f_i sees x_0 .. x_t and
f_1 .. f_i, and its logits forecast the token at position t+1+i. The base model stays frozen;
only the m x hidden_size values are trained.

The recipe (self-distillation, as in the DS2D paper):
  1. data: the model's own sampled continuations (`length` tokens, temperature TEMPERATURE,
     seeded) of a set of prompts (PROMPTS, or one per line of a --prompts file), through the
     model's chat template where it has one; about 10 % of the sequences are held out;
  2. each step runs ONE forward over a training sequence x_0 .. x_{T-1} followed by S anchors x m
     forecast rows, with a custom 4-D attention mask (forecast_mask): the real tokens are causal
     among themselves and never see a forecast row, forecast row (a, i) sees x_0 .. x_{t_a} and
     f_1 .. f_i of its own anchor; its position id is t_a + i;
  3. loss: KL(teacher || forecast) per row, the teacher of row (a, i) being the same forward's
     logits at the real token x_{t_a + i} (the model's own distribution of position t_a+i+1),
     detached; Adam over the vectors only;
  4. report: on the held-out sequences, at every anchor, how often the model's greedy token at
     t+1+i (the argmax of the teacher) is f_i's top-1, and within its top-branching[i-1].
Before training, one check that the real rows' logits under the augmented input equal a plain
causal forward's (a mask bug would otherwise train on garbage unnoticed).

torch and transformers are imported inside the functions (`pip install torch transformers`).
Must not: be imported by the core.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from ..errors import InvalidArgumentError, UnsupportedModelError, WebdriftError, shown
from .outputs import check_writable

DEFAULT_BRANCHING = (3, 2)
TEMPERATURE = 0.8
MAX_ANCHORS = 32          # anchors per forward (bounds the rows: T + MAX_ANCHORS * m)
HELD_OUT = 0.1            # share of the sequences kept for the agreement report
CHECK_ATOL = 1e-4         # the augmented forward's real-row logits vs a plain forward's

PROMPTS = (
    "Explain how a rainbow forms.",
    "Write a short poem about the sea.",
    "What are three tips for staying focused while studying?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "How do I make a cup of green tea?",
    "Write a Python function that reverses a string.",
    "What is the difference between weather and climate?",
    "Give me a recipe for a simple tomato pasta.",
    "Why is the sky blue?",
    "Describe a typical day of a software engineer.",
    "What is photosynthesis?",
    "Write a short story about a robot who learns to paint.",
    "List five healthy breakfast ideas.",
    "How does a computer store numbers?",
    "What are the main causes of the French Revolution?",
    "Translate 'good morning, how are you?' into French and explain the words.",
    "Write an email asking a colleague to reschedule a meeting.",
    "What is the Pythagorean theorem? Give an example.",
    "How can I improve my sleep?",
    "Explain what a neural network is to a ten-year-old.",
    "What should I pack for a weekend hiking trip?",
    "Write a haiku about autumn leaves.",
    "Compare cats and dogs as pets.",
    "How does the internet work, in simple terms?",
    "What is the capital of Australia, and what is it known for?",
    "Give me three ideas for a birthday party.",
    "Explain recursion with a short code example.",
    "What are the benefits of regular exercise?",
    "Describe the water cycle.",
    "Write a limerick about a cat who loves cheese.",
    "How do vaccines work?",
    "What is the difference between a list and a tuple in Python?",
    "Suggest a name for a coffee shop and explain why.",
    "What happened during the Apollo 11 mission?",
    "How do I change a flat tire on a bicycle?",
    "Explain supply and demand.",
    "Write a motivational message for someone starting a new job.",
    "What are black holes?",
    "Give step-by-step instructions to plant a tree.",
    "Write a SQL query that counts the orders per customer.",
    "What is the meaning of the word 'serendipity'? Use it in a sentence.",
    "Describe the city of Paris to someone who has never been there.",
    "How do I calculate the area of a circle?",
    "Why do leaves change color in the fall?",
    "Write a dialogue between a teacher and a student about homework.",
    "What are some good habits for saving money?",
    "Explain how a bill becomes a law.",
    "Tell me a fun fact about octopuses.",
)


def _torch():
    try:
        import torch
        import transformers
    except ImportError:
        raise UnsupportedModelError("train-forecast needs PyTorch and transformers: pip install torch "
                                    "transformers") from None
    return torch, transformers


# ------------------------------------------------------------------------------ the model


def load_model(model):
    """A model reference (known name, .gguf path or HF folder) -> (torch model, HF tokenizer,
    webdrift's ModelConfig of the same file, a name). The torch model is float32 (a GGUF file
    is dequantized by transformers) and frozen."""
    from ..runtime.loading import open_source
    torch, transformers = _torch()
    source = open_source(model)
    path = source.path
    where, kw = (os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}) \
        if source.format == "gguf" else (path, {})
    try:
        tm = transformers.AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32,
                                                               attn_implementation="sdpa", **kw).eval()
        tok = transformers.AutoTokenizer.from_pretrained(where, **kw)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise UnsupportedModelError(f"train-forecast: transformers cannot load {shown(path)} "
                                    f"({shown(str(e).splitlines()[0] if str(e) else type(e).__name__)})") from None
    tm.requires_grad_(False)
    name = model if isinstance(model, str) and not os.path.exists(model) else os.path.basename(
        os.path.normpath(path))
    return tm, tok, source.config, name


def _sliding(tm) -> int | None:
    """The sliding window of a model with sliding-attention layers (Gemma 3), else None."""
    c = tm.config.get_text_config() if hasattr(tm.config, "get_text_config") else tm.config
    types = getattr(c, "layer_types", None) or ()
    return getattr(c, "sliding_window", None) if "sliding_attention" in types else None


def forecast_inputs(tm, ids, anchors, vectors):
    """The augmented input of one sequence: (inputs_embeds (1, N, d), attention mask, position_ids
    (1, N)) with N = T + S * m. ids: T token ids; anchors: S positions t (each with t + m < T for
    a teacher, though any t < T is fed); vectors: (m, d) forecast vectors.

    Rows 0 .. T-1 are the real tokens; row T + a*m + (i-1) is f_i after anchor a, at position
    t_a + i. The mask is additive float (0: attend, dtype min: not), shape (1, 1, N, N): real rows
    causal over real rows only; forecast row (a, i) sees real 0 .. t_a and its own f_1 .. f_i.
    For a model with sliding-attention layers, a dict {layer type: mask} with the window applied
    to position distances (q - k < window) for the sliding layers."""
    torch, _ = _torch()
    ids = torch.as_tensor(ids, dtype=torch.long)
    anchors = torch.as_tensor(anchors, dtype=torch.long)
    T, S, m = len(ids), len(anchors), vectors.shape[0]
    depth = torch.arange(1, m + 1)
    pos = torch.cat([torch.arange(T), (anchors[:, None] + depth[None, :]).reshape(-1)])
    sees_upto = torch.cat([torch.arange(T), anchors.repeat_interleave(m)])     # last real row seen
    group = torch.cat([torch.full((T,), -1), torch.arange(S).repeat_interleave(m)])
    dep = torch.cat([torch.zeros(T, dtype=torch.long), depth.repeat(S)])
    real_k = torch.arange(T + S * m) < T
    allowed = (real_k[None, :] & (torch.arange(T + S * m)[None, :] <= sees_upto[:, None])) | (
        ~real_k[None, :] & (group[None, :] == group[:, None]) & (dep[None, :] <= dep[:, None]))
    low = torch.finfo(torch.float32).min

    def additive(ok):
        return torch.zeros(ok.shape, dtype=torch.float32).masked_fill(~ok, low)[None, None]

    mask = additive(allowed)
    window = _sliding(tm)
    if window:
        mask = {"full_attention": mask,
                "sliding_attention": additive(allowed & (pos[:, None] - pos[None, :] < window))}
    emb = tm.get_input_embeddings()(ids[None])
    embeds = torch.cat([emb, vectors[None].repeat(1, S, 1)], dim=1)
    return embeds, mask, pos[None]


def forecast_logits(tm, ids, anchors, vectors):
    """One augmented forward: (teacher (S, m, V), forecast (S, m, V)) logits. teacher[a, i-1] is
    the model's logits at the real token x_{t_a+i} (needs t_a + m < T); forecast[a, i-1] is f_i's
    after anchor a. Only those rows go through the LM head."""
    torch, _ = _torch()
    T, S, m = len(ids), len(anchors), vectors.shape[0]
    embeds, mask, pos = forecast_inputs(tm, ids, anchors, vectors)
    teacher_rows = (torch.as_tensor(anchors)[:, None] + torch.arange(1, m + 1)[None, :]).reshape(-1)
    keep = torch.cat([teacher_rows, T + torch.arange(S * m)])
    out = tm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, logits_to_keep=keep, use_cache=False)
    logits = out.logits[0].float()
    return logits[:S * m].reshape(S, m, -1), logits[S * m:].reshape(S, m, -1)


def check_mask(tm, ids, anchors, vectors, atol: float = CHECK_ATOL) -> float:
    """The largest difference between the real rows' logits of the augmented forward and a plain
    causal forward over ids; WebdriftError above atol (relative to the logits' magnitude)."""
    torch, _ = _torch()
    with torch.no_grad():
        embeds, mask, pos = forecast_inputs(tm, ids, anchors, vectors)
        aug = tm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, use_cache=False).logits[0, :len(ids)]
        plain = tm(input_ids=torch.as_tensor([list(ids)]), use_cache=False).logits[0]
    diff = float((aug - plain).abs().max())
    scale = max(1.0, float(plain.abs().max()))
    if not diff <= atol * scale:
        raise WebdriftError(f"train-forecast: the augmented forward changes the real tokens' logits (max "
                            f"difference {diff:.3g}, logits up to {scale:.3g}): this transformers version does "
                            f"not take the custom 4-D attention mask as it is")
    return diff


def kl_loss(teacher, forecast):
    """Mean KL(softmax(teacher) || softmax(forecast)) over the rows; teacher detached."""
    torch, _ = _torch()
    lt = torch.log_softmax(teacher.detach(), dim=-1)
    ls = torch.log_softmax(forecast, dim=-1)
    return (lt.exp() * (lt - ls)).sum(-1).mean()


# ------------------------------------------------------------------------------ the data


def read_prompts(path) -> list[str]:
    """A --prompts file: one prompt per line (blank lines skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f]
    except OSError as e:
        raise InvalidArgumentError(f"--prompts {shown(str(path))}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"--prompts {shown(str(path))}: not UTF-8 text ({e.reason})") from None
    prompts = [ln for ln in lines if ln]
    if not prompts:
        raise InvalidArgumentError(f"--prompts {shown(str(path))}: no prompts (one per line)")
    return prompts


def prompt_ids(tok, prompt: str) -> list[int]:
    """A prompt's tokens: through the chat template as a user turn where the tokenizer has one."""
    if getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False)["input_ids"])
    return list(tok(prompt)["input_ids"])


def sample_sequences(tm, tok, prompts, n: int, length: int, seed: int, progress=None):
    """n sequences (prompt ids + up to `length` sampled tokens, cut after an end token) -> list of
    (ids, start) where start = the prompt's length. Prompts are used in turn (cycled)."""
    torch, _ = _torch()
    eos = tm.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    pad = tok.pad_token_id if tok.pad_token_id is not None else (min(eos) if eos else 0)
    torch.manual_seed(seed)
    encoded = [prompt_ids(tok, prompts[j % len(prompts)]) for j in range(n)]
    out, batch = [], 8
    for b0 in range(0, n, batch):
        group = encoded[b0:b0 + batch]
        width = max(map(len, group))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group])
        att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        with torch.no_grad():
            gen = tm.generate(input_ids=ids, attention_mask=att, do_sample=True, temperature=TEMPERATURE,
                              top_k=0, top_p=1.0, max_new_tokens=length, min_new_tokens=1, pad_token_id=pad)
        for p, row in zip(group, gen[:, width:].tolist()):
            cont = []
            for t in row:
                cont.append(t)
                if t in eos:
                    break
            out.append((p + cont, len(p)))
        if progress:
            progress("generate", min(b0 + batch, n), n, None)
    return out


def anchors_of(ids, start: int, m: int) -> list[int]:
    """The anchors t of a sequence: the last prompt token and every generated one with a teacher
    at t + m (t + m < len(ids))."""
    return list(range(max(start - 1, 0), len(ids) - m))


# ------------------------------------------------------------------------------ training


def initial_vectors(tm, m: int, seed: int):
    """The starting point: m copies of the mean input embedding over the vocabulary (as the model
    feeds it: after any embedding scale) plus 0.1 of its per-dimension spread as seeded noise."""
    torch, _ = _torch()
    emb = tm.get_input_embeddings()
    total, sq, n = 0.0, 0.0, emb.num_embeddings
    with torch.no_grad():
        for i in range(0, n, 8192):
            rows = emb(torch.arange(i, min(i + 8192, n)))
            total, sq = total + rows.sum(0), sq + (rows * rows).sum(0)
        mean = total / n
        std = (sq / n - mean * mean).clamp_min(0).sqrt()
        noise = torch.randn(m, mean.shape[0], generator=torch.Generator().manual_seed(seed))
        return mean[None].repeat(m, 1) + 0.1 * std[None] * noise


def agreement(tm, data, vectors, branching) -> dict:
    """Over every anchor of `data`: per depth i, how often the model's greedy token at t+1+i
    (argmax of the teacher) is f_i's top-1 / within its top-branching[i-1], and how often all
    depths 1..i are within their top-k (the draft tree holds the greedy path that far)."""
    torch, _ = _torch()
    m = len(branching)
    n, top1, topk, path, kl = 0, [0] * m, [0] * m, [0] * m, 0.0
    with torch.no_grad():
        for ids, start in data:
            anchors = anchors_of(ids, start, m)
            for a0 in range(0, len(anchors), MAX_ANCHORS):
                teacher, fc = forecast_logits(tm, ids, anchors[a0:a0 + MAX_ANCHORS], vectors)
                kl += float(kl_loss(teacher, fc)) * teacher.shape[0]
                want = teacher.argmax(-1)                                   # (S, m)
                ok_path = torch.ones(want.shape[0], dtype=torch.bool)
                for i, b in enumerate(branching):
                    hit1 = fc[:, i].argmax(-1) == want[:, i]
                    hitk = (fc[:, i].topk(b, dim=-1).indices == want[:, i, None]).any(-1)
                    ok_path &= hitk
                    top1[i] += int(hit1.sum())
                    topk[i] += int(hitk.sum())
                    path[i] += int(ok_path.sum())
                n += want.shape[0]
    d = max(n, 1)
    depths = [{"depth": i + 1, "k": b, "top1": round(top1[i] / d, 4), "topk": round(topk[i] / d, 4),
               "path": round(path[i] / d, 4)} for i, b in enumerate(branching)]
    return {"anchors": n, "loss": round(max(kl / d, 0.0), 4), "depths": depths,
            "drafted_accepted_per_step": round(sum(x["path"] for x in depths), 4)}


def _check_args(branching, sequences, length, steps, lr, seed):
    from ..weights.forecast import parse_branching
    branching = parse_branching(branching, "--branching")
    for name, v, low in (("--sequences", sequences, 2), ("--length", length, 1), ("--steps", steps, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise InvalidArgumentError(f"{name} {shown(v)}: must be an integer >= {low}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise InvalidArgumentError(f"--lr {shown(lr)}: must be a positive number")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidArgumentError(f"--seed {shown(seed)}: must be an integer")
    return branching


def train_forecast(model, out, *, branching=DEFAULT_BRANCHING, sequences: int = 48, length: int = 96,
                   steps: int = 150, lr: float = 0.01, seed: int = 0, prompts=None, progress=None) -> dict:
    """Fit forecast vectors for `model` (known name, .gguf path or HF folder) and write them to
    `out` (webdrift.weights.forecast format). prompts: a list of strings (default PROMPTS);
    progress(phase, done, total, loss) with phase "generate" | "train". Returns the report (the
    CLI's --json): the training loss (first step, last 10), the held-out loss and agreement of
    the initial and the trained vectors, seconds per phase ("train" includes the evaluations)."""
    from ..weights.forecast import model_meta, read_forecast, write_forecast
    branching = _check_args(branching, sequences, length, steps, lr, seed)
    if prompts is not None and (isinstance(prompts, str) or not prompts
                                or not all(isinstance(p, str) and p.strip() for p in prompts)):
        raise InvalidArgumentError("prompts: must be a non-empty list of non-empty strings")
    check_writable(out, "--out")
    torch, _ = _torch()
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    tm, tok, cfg, name = load_model(model)
    t_load = time.perf_counter()
    if tm.config.get_text_config().hidden_size != cfg.dim:
        raise UnsupportedModelError(f"train-forecast: transformers reads hidden size "
                                    f"{tm.config.get_text_config().hidden_size}, webdrift {cfg.dim}")
    m = len(branching)
    data = sample_sequences(tm, tok, list(prompts or PROMPTS), sequences, length, seed, progress)
    data = [d for d in data if anchors_of(d[0], d[1], m)]
    if len(data) < 2:
        raise InvalidArgumentError(f"train-forecast: only {len(data)} sampled sequences are longer than "
                                   f"{m} tokens; give a larger --length or more --sequences")
    n_hold = max(1, round(HELD_OUT * len(data)))
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    held, train = [data[j] for j in order[:n_hold]], [data[j] for j in order[n_hold:]]
    t_gen = time.perf_counter()

    init = initial_vectors(tm, m, seed)
    ids0, start0 = train[0]
    check_mask(tm, ids0, anchors_of(ids0, start0, m)[:8], init)
    before = agreement(tm, held, init, branching)

    vectors = torch.nn.Parameter(init.clone())
    opt = torch.optim.Adam([vectors], lr=lr)
    losses = []
    g = torch.Generator().manual_seed(seed + 1)
    for step in range(steps):
        if step % len(train) == 0:     # a new pass over the training sequences, in a new order
            train = [train[j] for j in torch.randperm(len(train), generator=g).tolist()]
        ids, start = train[step % len(train)]
        anchors = anchors_of(ids, start, m)
        if len(anchors) > MAX_ANCHORS:
            anchors = [anchors[j] for j in sorted(torch.randperm(len(anchors), generator=g)[:MAX_ANCHORS].tolist())]
        teacher, fc = forecast_logits(tm, ids, anchors, vectors)
        loss = kl_loss(teacher, fc)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if progress:
            progress("train", step + 1, steps, sum(losses[-10:]) / len(losses[-10:]))
    t_train = time.perf_counter()
    final = vectors.detach()
    after = agreement(tm, held, final, branching)
    write_forecast(out, final.reshape(-1).tolist(), branching, model_meta(cfg), model=name)
    read_forecast(out).check(cfg)
    t_end = time.perf_counter()
    return {
        "model": name, "out": os.fspath(out), "branching": list(branching),
        "sequences": {"train": len(train), "held_out": len(held), "tokens": sum(len(i) for i, _ in data)},
        "length": length, "steps": steps, "lr": lr, "seed": seed, "temperature": TEMPERATURE,
        "loss_first": round(max(losses[0], 0.0), 4),
        "loss_final": round(max(sum(losses[-10:]) / len(losses[-10:]), 0.0), 4),
        "held_out_initial": before, "held_out": after,
        "seconds": {"load": round(t_load - t0, 1), "generate": round(t_gen - t_load, 1), "train": round(t_train - t_gen, 1),
                    "total": round(t_end - t0, 1)},
    }


# ------------------------------------------------------------------------------ the CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="known name, .gguf path or HF folder")
    p.add_argument("--out", "-o", required=True, help="the forecast file to write (.safetensors)")
    p.add_argument("--branching", default="3,2", help="draft tree widths per depth; m = their count "
                                                      "(default %(default)s)")
    p.add_argument("--sequences", type=int, default=48, help="sampled sequences, ~10%% held out (default %(default)s)")
    p.add_argument("--length", type=int, default=96, help="tokens sampled per sequence (default %(default)s)")
    p.add_argument("--steps", type=int, default=150, help="Adam steps, one sequence each (default %(default)s)")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling, split and init seed (default %(default)s)")
    p.add_argument("--prompts", default=None, help="a file of prompts, one per line (default: built-in list)")
    p.add_argument("--threads", type=int, default=None,
                   help="PyTorch CPU threads (default PyTorch's; 1 is often faster on a busy machine)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.set_defaults(func=cmd_train_forecast)


def cmd_train_forecast(args) -> int:
    prompts = read_prompts(args.prompts) if args.prompts else None
    if args.threads is not None:
        if args.threads < 1:
            raise InvalidArgumentError(f"--threads {args.threads}: must be >= 1")
        _torch()[0].set_num_threads(args.threads)

    def show(phase, done, total, loss):
        tail = f", loss {loss:.4f}" if loss is not None else ""
        sys.stderr.write(f"\rtrain-forecast: {phase} {done}/{total}{tail}   ")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    rep = train_forecast(args.model, args.out, branching=args.branching, sequences=args.sequences,
                         length=args.length, steps=args.steps, lr=args.lr, seed=args.seed, prompts=prompts,
                         progress=show)
    agree = ", ".join(f"depth {d['depth']}: top-1 {d['top1']:.1%}, top-{d['k']} {d['topk']:.1%}"
                      for d in rep["held_out"]["depths"])
    line = (f"{rep['out']}: {rep['model']}, branching {','.join(map(str, rep['branching']))}, loss "
            f"{rep['loss_first']:.3f} -> {rep['loss_final']:.3f}; held-out {agree} "
            f"({rep['seconds']['total']:.0f} s)")
    if args.json:
        sys.stderr.write(line + "\n")
        print(json.dumps(rep))
    else:
        print(line)
    return 0
