"""The `webdrift` command: generate | chat | pull | bench | profile | serve (a desktop tool).

Entry points: the `webdrift` script (pyproject.toml) and `python -m webdrift` both call `main`.
generate and chat load through `webdrift.load` (the core's assembly path); bench, profile and
serve register their own sub-commands from their modules beside this one.
Errors a user can cause print one line (`webdrift: error: ...`) and exit 2; nothing here
prints a traceback for a WebdriftError.
Must not: import wgpu or js; be imported by the core.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import WebdriftError
from ..hub import DEFAULT_MODEL


def _progress_printer(label: str):
    def cb(done, total, name):
        if sys.stderr.isatty() or done == total:
            sys.stderr.write(f"\r{label}: {done}/{total} tensors ({100 * done // max(total, 1)}%)")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()
    return cb


def _load(args):
    import webdrift
    return webdrift.load(args.model, max_context=args.max_context, weight_format=args.weight_format,
                         progress=_progress_printer("loading"))


def _add_model_args(p):
    p.add_argument("--model", default=DEFAULT_MODEL, help="known name, .gguf path or HF folder (default %(default)s)")
    p.add_argument("--max-context", type=int, default=None, help="KV cache length (default min(model, 2048))")
    p.add_argument("--weight-format", choices=["f32", "f16", "q8", "q4"], default=None,
                   help="runtime weight format (default follows the file; q8/q4 re-quantize on the GPU)")


def _add_sampling_args(p):
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-stop-at-eos", dest="stop_at_eos", action="store_false")


def _sampling(args) -> dict:
    return {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
            "top_p": args.top_p, "seed": args.seed, "stop_at_eos": args.stop_at_eos}


def cmd_generate(args) -> int:
    prompt = args.prompt if args.prompt is not None else " ".join(args.words)
    if not prompt:
        raise SystemExit("webdrift generate: give a prompt (--prompt TEXT or as arguments)")
    eng = _load(args)
    text_prompt = prompt
    if args.chat:   # wrap the prompt as a user turn in the model's chat template
        prompt = eng.chat_prompt([{"role": "user", "content": prompt}])
    if args.json:
        out = eng.generate(prompt, **_sampling(args))
        print(json.dumps({"model": args.model, "adapter": eng.dev.info.adapter, "prompt": text_prompt,
                          "chat": args.chat,
                          "prompt_token_ids": eng.encode_prompt(prompt), "token_ids": out.token_ids,
                          "text": out.text, "stats": out.stats.as_dict(), "load_s": round(eng.load_s, 3)}))
        return 0
    wrote = False
    for piece in eng.stream(prompt, **_sampling(args)):
        sys.stdout.write(piece)
        sys.stdout.flush()
        wrote = wrote or bool(piece)
    sys.stdout.write("\n")
    if not wrote and not args.chat:
        sys.stderr.write("webdrift: the model ended its text at once (end-of-sequence token); for an instruct "
                         "model add --chat to send the prompt as a chat turn, or use `webdrift chat`\n")
    return 0


def cmd_chat(args) -> int:
    eng = _load(args)
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    sys.stderr.write(f"webdrift chat with {args.model} on {eng.dev.info.adapter} (empty line or Ctrl-D quits)\n")
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        reply = []
        for piece in eng.stream(eng.chat_prompt(messages), **_sampling(args)):
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0


def cmd_pull(args) -> int:
    from ..hub import pull
    path = pull(args.name, progress=True)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="webdrift", description="LLM inference on the GPU through WebGPU")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("words", nargs="*", help="the prompt (or use --prompt)")
    g.add_argument("--prompt", default=None)
    g.add_argument("--json", action="store_true", help="print token ids, text and timings as JSON")
    g.add_argument("--chat", action="store_true",
                   help="send the prompt as a user turn through the model's chat template (instruct models)")
    _add_model_args(g)
    _add_sampling_args(g)
    g.set_defaults(func=cmd_generate)
    c = sub.add_parser("chat", help="interactive chat using the model's chat template")
    c.add_argument("--system", default=None, help="system prompt")
    _add_model_args(c)
    _add_sampling_args(c)
    c.set_defaults(func=cmd_chat, max_new_tokens=256)
    p = sub.add_parser("pull", help="download a known model into the cache")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    p.set_defaults(func=cmd_pull)
    from .serve import add_serve_parser
    add_serve_parser(sub)
    from .bench import add_arguments as add_bench_arguments
    add_bench_arguments(sub.add_parser("bench", help="ML Drift protocol: prefill/decode tok/s, roofline, peers"))
    from .profile import add_arguments as add_profile_arguments
    add_profile_arguments(sub.add_parser("profile", help="time host phases and GPU kernels; Chrome trace"))
    from .perplexity import add_arguments as add_perplexity_arguments
    add_perplexity_arguments(sub.add_parser("perplexity", help="perplexity over a text, as llama-perplexity does"))
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except WebdriftError as e:
        sys.stderr.write(f"webdrift: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        return 130
