"""The `webdrift` command: generate | chat | pull | bench | profile | serve | api (a desktop tool).

Entry points: the `webdrift` script (pyproject.toml) and `python -m webdrift` both call `main`.
generate and chat assemble their engine through the core's assembly path (runtime/loading.py,
step by step so that each wait can say what it is); bench, profile, serve and api register
their own sub-commands from their modules beside this one.
What the user sees: errors a user can cause print one line (`webdrift: error: ...`) and exit 2
(nothing here prints a traceback for a WebdriftError); every wait over a second shows on stderr
what is being done and how far (a status line on a terminal, a line per phase otherwise); a
generation ends with a one-line summary on stderr (tokens, tokens/s) unless --quiet or --json; a
reader that goes away (`| head`) ends the program quietly (exit 141, as SIGPIPE would); Ctrl-C
exits 130 (in `chat`, it stops the reply and the conversation goes on).
Must not: import wgpu or js; be imported by the core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time

from ..errors import ContextLengthError, InvalidArgumentError, WebdriftError
from ..gpu.base import DESKTOP_APIS
from ..hub import DEFAULT_MODEL
from ..runtime.options import WEIGHT_FORMATS
from ..runtime.streams import FIRST_TOKENS, MAX_STREAMS

EXIT_USAGE = 2           # a bad argument, model file or prompt (argparse's own code too)
EXIT_BROKEN_PIPE = 141   # 128 + SIGPIPE: the reader of stdout went away
EXIT_INTERRUPTED = 130   # 128 + SIGINT


# -- waiting, visibly -------------------------------------------------------------------------

class Status:
    """One status line on stderr for the waits of a command: what is being done, how far, and for
    how long. On a terminal the line is redrawn in place (by a ticker thread, so a long GPU wait
    still counts its seconds) and erased when the wait ends; elsewhere (a log) a wait that lasts
    over a second prints one line, and another every 15 s while it goes on. quiet: nothing."""

    TICK = 0.25
    LOG_EVERY = 15.0

    def __init__(self, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and _isatty(self.stream)
        self._lock = threading.Lock()
        self._what: str | None = None
        self._detail = ""
        self._t0 = 0.0
        self._logged = 0.0          # elapsed seconds of the last log line of this wait (0: none yet)
        self._drawn = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set(self, what: str, detail: str = "") -> None:
        """Begin (or, with the same `what`, update) a wait."""
        if not self.enabled:
            return
        with self._lock:
            if what != self._what:
                self._what, self._t0, self._logged = what, time.perf_counter(), 0.0
            self._detail = detail
            self._show(force=True)
        if self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="webdrift-status", daemon=True)
            self._thread.start()

    def done(self) -> None:
        """The wait is over: erase the line (terminal)."""
        if not self.enabled:
            return
        with self._lock:
            self._what = None
            self._erase()

    def close(self) -> None:
        self.done()
        self._stop.set()

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK):
            with self._lock:
                self._show(force=False)

    def _show(self, force: bool) -> None:   # with the lock held
        if self._what is None:
            return
        el = time.perf_counter() - self._t0
        line = f"{self._what}{': ' + self._detail if self._detail else ''}"
        try:
            if self.tty:
                self.stream.write(f"\r\x1b[K{line} ({el:.0f} s)" if el >= 1 else f"\r\x1b[K{line}")
                self.stream.flush()
                self._drawn = True
            elif el >= 1 and (self._logged == 0.0 or el - self._logged >= self.LOG_EVERY):
                self.stream.write(f"webdrift: {line} ({el:.0f} s)\n")
                self.stream.flush()
                self._logged = el
        except (OSError, ValueError):   # stderr closed: nothing to show progress on
            self.enabled = False

    def _erase(self) -> None:   # with the lock held
        if self.tty and self._drawn:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            self._drawn = False


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class _Phases:
    """The engine's phase hooks (the protocol of webdrift.profile.Profiler: `phase(name, **args)`
    as a context manager, `gpu_timer(...)`) turned into status: the prompt's prefill, then the
    token count while it generates (only where the text is not streamed to the same terminal)."""

    def __init__(self, status: Status, max_new_tokens: int, count_tokens: bool):
        self.status, self.max_new, self.count = status, max_new_tokens, count_tokens
        self.enabled = status.enabled

    def phase(self, name: str, **args):
        return _Hook(self, name, args)

    def gpu_timer(self, *a, **k):
        return None

    def _enter(self, name: str, args: dict) -> None:
        if name == "prefill.submit":
            n = args.get("tokens", 0)
            self.status.set("reading the prompt", f"{n} token{'s' if n != 1 else ''}")

    def _exit(self, name: str, args: dict) -> None:
        if name == "readback":
            k = args.get("token", 0) + 1
            if self.count:
                self.status.set("generating", f"{k}/{self.max_new} tokens")
            elif k == 1:
                self.status.done()


class _Hook:
    __slots__ = ("args", "name", "owner")

    def __init__(self, owner: _Phases, name: str, args: dict):
        self.owner, self.name, self.args = owner, name, args

    def __enter__(self):
        self.owner._enter(self.name, self.args)
        return self

    def __exit__(self, *exc):
        self.owner._exit(self.name, self.args)
        return False


def _progress_printer(label: str):
    """progress(done, total, name) printing "label: d/t tensors (p%)" on stderr (a terminal: in
    place; otherwise only the last): for commands that load through webdrift.load (api)."""
    def cb(done, total, name):
        if sys.stderr.isatty() or done == total:
            sys.stderr.write(f"\r{label}: {done}/{total} tensors ({100 * done // max(total, 1)}%)")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()
    return cb


def _load(args, status: Status):
    """The engine for generate / chat, through the core's assembly path one step at a time (what
    webdrift.load does), each step a visible wait."""
    from ..runtime.loading import EngineOptions, assemble, make_tokenizer, open_source
    lora = _lora_paths(args)
    options = EngineOptions(max_context=args.max_context, weight_format=args.weight_format,
                            enable_lora=bool(lora), max_lora_rank=getattr(args, "max_lora_rank", 64))
    source = open_source(args.model)       # a known model not in the cache yet: hub.pull shows its own progress
    tokenizer = make_tokenizer(source)
    status.set("starting the GPU device")
    from ..gpu.native import get_device
    dev = get_device()
    if dev.info.is_cpu and status.enabled:
        status.done()
        sys.stderr.write(f"webdrift: {dev.info.adapter} is a software (CPU) adapter: expect generation to be slow\n")

    def tensors(done, total, name):
        status.set("loading the weights", f"{done}/{total} tensors")
    eng = assemble(source, options, dev, tokenizer=tokenizer, progress=tensors, loras=lora or None)
    status.done()
    return eng


# -- generation ---------------------------------------------------------------------------------

def _events(eng, prompt, sampling: dict):
    """The engine's generation events ("text", piece) ... ("done", GenerationResult) as a sync
    generator (Engine.stream, keeping the result). Close it to end the generation early."""
    from ..runtime.engine import SamplingParams
    sp = SamplingParams.make(**sampling)
    loop = asyncio.new_event_loop()
    agen = eng.aevents(prompt, sp)
    try:
        while True:
            try:
                ev = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
            yield ev
    finally:
        try:
            loop.run_until_complete(agen.aclose())
        finally:
            loop.close()


FINISH = {"eos": "end of text", "length": "--max-new-tokens reached", "context": "the context is full",
          "stopped": "stopped"}


def summary_line(stats) -> str:
    """One line for stderr after a generation: tokens and tokens/s, the prompt's, why it ended."""
    gen_s = stats.prefill_s + stats.decode_s
    rate = stats.new_tokens / gen_s if gen_s > 0 else 0.0
    return (f"webdrift: {stats.new_tokens} token{'s' if stats.new_tokens != 1 else ''} in {gen_s:.2f} s "
            f"({rate:.2f} tokens/s, {stats.decode_tokens_per_s:.2f} after the first); prompt "
            f"{stats.prompt_tokens} tokens in {stats.prefill_s:.2f} s; {FINISH.get(stats.finish_reason, stats.finish_reason)}"
            + (f"; speculative: {stats.accepted_tokens} of {stats.drafted_tokens} drafted tokens accepted in "
               f"{stats.spec_passes} passes, {stats.plain_steps} plain steps"
               if stats.spec_passes or stats.plain_steps else ""))


def _run_generation(eng, prompt, sampling: dict, status: Status, on_text=None):
    """Generate with the status hooks on the engine; on_text(piece) per piece; the result."""
    eng.profiler = _Phases(status, sampling["max_new_tokens"], count_tokens=on_text is None)
    result = None
    try:
        with contextlib.closing(_events(eng, prompt, sampling)) as events:
            for kind, value in events:
                if kind == "text" and on_text is not None:
                    status.done()
                    on_text(value)
                elif kind == "done":
                    result = value
    finally:
        status.done()
    return result


def _lora_paths(args) -> dict:
    """--lora PATH (repeatable): {adapter name: path}; one path applies to every response, one
    per response (-n K, K paths) gives each response its own adapter."""
    paths = getattr(args, "lora", None) or []
    n = getattr(args, "n", 1)
    if len(paths) > 1 and len(paths) != n:
        raise InvalidArgumentError(f"--lora given {len(paths)} times: once (every response) or once per "
                                   f"response (-n {n})")
    return {f"lora{i}" if len(paths) > 1 else "lora": p for i, p in enumerate(paths)}


def _sampling(args) -> dict:
    names = list(_lora_paths(args))
    return {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
            "top_p": args.top_p, "seed": args.seed, "stop_at_eos": args.stop_at_eos, "speculative": args.speculative,
            "lora": names if len(names) > 1 else (names[0] if names else None), "lora_scale": args.lora_scale}


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def cmd_generate(args) -> int:
    if args.prompt is not None and args.words:
        raise InvalidArgumentError("generate: give the prompt as arguments or with --prompt, not both")
    prompt = args.prompt if args.prompt is not None else " ".join(args.words)
    if not prompt:
        raise InvalidArgumentError("generate: give a prompt (as arguments, or --prompt TEXT)")
    status = Status(enabled=not args.quiet)
    try:
        eng = _load(args, status)
        text_prompt = prompt
        if args.chat:   # wrap the prompt as a user turn in the model's chat template
            prompt = eng.chat_prompt([{"role": "user", "content": prompt}])
        sampling = _sampling(args)
        if args.n > 1:
            return _generate_streams(args, eng, prompt, text_prompt, sampling | {"n": args.n,
                                                                                 "first_tokens": args.first_tokens},
                                     status)
        if args.json:
            out = _run_generation(eng, prompt, sampling, status)
            print(json.dumps({"model": args.model, "adapter": eng.dev.info.adapter, "prompt": text_prompt,
                              "chat": args.chat,
                              "prompt_token_ids": eng.encode_prompt(prompt), "token_ids": out.token_ids,
                              "text": out.text, "stats": out.stats.as_dict(), "load_s": round(eng.load_s, 3)}))
            return 0
        out = _run_generation(eng, prompt, sampling, status, on_text=_write)
        _write("\n")
    finally:
        status.close()
    if not args.quiet:
        sys.stderr.write(summary_line(out.stats) + "\n")
        if not out.text and out.stats.finish_reason == "eos" and not args.chat:
            sys.stderr.write("webdrift: the model ended its text at once (end-of-sequence token); for an instruct "
                             "model add --chat to send the prompt as a chat turn, or use `webdrift chat`\n")
    return 0


def _generate_streams(args, eng, prompt, text_prompt, sampling: dict, status: Status) -> int:
    """generate -n K: the K responses (decoded together) one after another, each under a header;
    --json: a "responses" list."""
    outs = _run_generation(eng, prompt, sampling, status)
    if args.json:
        print(json.dumps({"model": args.model, "adapter": eng.dev.info.adapter, "prompt": text_prompt,
                          "chat": args.chat, "prompt_token_ids": eng.encode_prompt(prompt),
                          "responses": [{"token_ids": o.token_ids, "text": o.text, "stats": o.stats.as_dict()}
                                        for o in outs], "load_s": round(eng.load_s, 3)}))
        return 0
    for i, o in enumerate(outs):
        _write(f"--- response {i + 1} of {len(outs)} ({FINISH.get(o.stats.finish_reason, o.stats.finish_reason)}) "
               f"---\n{o.text}\n")
    if not args.quiet:
        st = outs[0].stats
        total = sum(o.stats.new_tokens for o in outs)
        gen_s = st.prefill_s + st.decode_s
        sys.stderr.write(f"webdrift: {len(outs)} responses, {total} tokens in {gen_s:.2f} s "
                         f"({total / gen_s if gen_s > 0 else 0.0:.2f} tokens/s together); prompt "
                         f"{st.prompt_tokens} tokens in {st.prefill_s:.2f} s\n")
    return 0


# -- chat -----------------------------------------------------------------------------------------

def fit_history(eng, messages: list[dict], reply_tokens: int) -> tuple[list[int], int]:
    """The prompt ids of the conversation, dropping its oldest turns (never the system prompt, nor
    the newest message) until the prompt plus `reply_tokens` fits the engine's context; returns
    (ids, messages dropped from the front of `messages`, which is shortened in place). Drops go on
    to the next user message, so the conversation still starts with a user turn. A newest message
    that leaves no room for even one token is a ContextLengthError."""
    sys_n = 1 if messages and messages[0].get("role") == "system" else 0
    dropped = 0
    ids = eng.chat_prompt(messages)
    while len(ids) + reply_tokens > eng.max_context and len(messages) - sys_n > 1:
        del messages[sys_n]
        dropped += 1
        while len(messages) - sys_n > 1 and messages[sys_n].get("role") != "user":
            del messages[sys_n]
            dropped += 1
        ids = eng.chat_prompt(messages)
    if len(ids) >= eng.max_context:
        raise ContextLengthError(f"this message makes a prompt of {len(ids)} tokens; the context is "
                                 f"{eng.max_context} (start with a larger --max-context)")
    return ids, dropped


def cmd_chat(args) -> int:
    status = Status(enabled=not args.quiet)
    try:
        eng = _load(args, status)
    finally:
        status.close()
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    # room kept for a reply when old turns must go: the reply's limit, at most half the context
    reply_room = max(1, min(args.max_new_tokens, eng.max_context // 2))
    sys.stderr.write(f"webdrift chat with {args.model} on {eng.dev.info.adapter} (empty line or Ctrl-D quits; "
                     "Ctrl-C stops a reply)\n")
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        try:
            ids, dropped = fit_history(eng, messages, reply_room)
        except WebdriftError as e:     # this message cannot be sent (too long, not valid text): say so, go on
            messages.pop()
            sys.stderr.write(f"webdrift: error: {e}\n")
            continue
        if dropped:
            sys.stderr.write(f"webdrift: the conversation outgrew the context ({eng.max_context} tokens): dropped "
                             f"the oldest {dropped} message{'s' if dropped != 1 else ''}"
                             f"{', kept the system prompt' if args.system else ''}\n")
        reply: list[str] = []
        status = Status(enabled=not args.quiet)
        try:
            out = _run_generation(eng, ids, _sampling(args), status, on_text=_tee(reply))
        except KeyboardInterrupt:
            out = None
            sys.stderr.write("\nwebdrift: reply stopped (Ctrl-C)\n")
            ctrl_c.handled()
        finally:
            status.close()
        _write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})
        if out is not None and not args.quiet:
            sys.stderr.write(summary_line(out.stats) + "\n")
    return 0


def _tee(pieces: list[str]):
    def show(piece: str) -> None:
        pieces.append(piece)
        _write(piece)
    return show


def cmd_pull(args) -> int:
    from ..hub import pull
    path = pull(args.name, progress=True)
    print(path)
    return 0


# -- arguments ----------------------------------------------------------------------------------

def _add_model_args(p):
    p.add_argument("--model", default=DEFAULT_MODEL, help="known name, .gguf path or HF folder (default %(default)s)")
    p.add_argument("--max-context", type=int, default=None,
                   help="KV cache length in tokens (default: the model's, at most 2048)")
    p.add_argument("--weight-format", choices=WEIGHT_FORMATS, default=None,
                   help="runtime weight format, see docs/QUANTIZATION.md (default: follows the file; "
                        "the quantized ones re-quantize on the GPU)")
    p.add_argument("--quiet", action="store_true", help="no progress and no summary on stderr")


def _add_sampling_args(p, max_new_tokens: int):
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                   help="most tokens to generate (default %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0 = greedy)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens (default: all)")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample from the smallest set of tokens with probability >= p (default 1: all)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: a random one)")
    p.add_argument("--no-stop-at-eos", dest="stop_at_eos", action="store_false",
                   help="keep generating after the model's end-of-sequence token")
    p.add_argument("--speculative", default=None, metavar="MODE",
                   help="speculative decoding: 'lookup' drafts tokens from earlier text (prompt lookup), "
                        "'forecast:FILE' from DS2D forecast embeddings (webdrift train-forecast); the drafts are "
                        "verified as a tree in one pass; the same output (default: off)")
    p.add_argument("--lora", action="append", default=None, metavar="PATH",
                   help="apply a LoRA adapter: a PEFT folder (adapter_config.json + adapter_model.safetensors) "
                        "or a llama.cpp GGUF LoRA file; with -n K, give it K times for one adapter per response")
    p.add_argument("--lora-scale", type=float, default=1.0, help="the adapter's strength (default 1; 0: the base model)")
    p.add_argument("--max-lora-rank", type=int, default=64, help="the largest adapter rank (default %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="webdrift", description="LLM inference on the GPU through WebGPU")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("words", nargs="*", help="the prompt (or use --prompt)")
    g.add_argument("--prompt", default=None, help="the prompt (instead of giving it as arguments)")
    g.add_argument("--json", action="store_true",
                   help="print token ids, text and timings as JSON (no summary line)")
    g.add_argument("-n", "--num-responses", dest="n", type=int, default=1,
                   help=f"responses decoded together from one prompt, 1 to {MAX_STREAMS} (default %(default)s)")
    g.add_argument("--first-tokens", choices=FIRST_TOKENS, default="distinct",
                   help="with -n: the responses start with the n most likely distinct tokens, or with "
                        "independently sampled ones (default %(default)s)")
    g.add_argument("--chat", action="store_true",
                   help="send the prompt as a user turn through the model's chat template (instruct models)")
    _add_model_args(g)
    _add_sampling_args(g, 64)
    g.set_defaults(func=cmd_generate)
    c = sub.add_parser("chat", help="interactive chat using the model's chat template")
    c.add_argument("--system", default=None, help="system prompt (default: none; the template's own, if any)")
    _add_model_args(c)
    _add_sampling_args(c, 256)
    c.set_defaults(func=cmd_chat)
    p = sub.add_parser("pull", help="download a known model into the cache")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL, help="known model name (default %(default)s)")
    p.set_defaults(func=cmd_pull)
    from .serve import add_serve_parser
    add_serve_parser(sub)
    from .api import add_api_parser
    add_api_parser(sub)
    from .bench import add_arguments as add_bench_arguments
    add_bench_arguments(sub.add_parser("bench", help="ML Drift protocol: prefill/decode tok/s, roofline, peers"))
    from .profile import add_arguments as add_profile_arguments
    add_profile_arguments(sub.add_parser("profile", help="time host phases and GPU kernels; Chrome trace"))
    from .perplexity import add_arguments as add_perplexity_arguments
    add_perplexity_arguments(sub.add_parser("perplexity", help="perplexity over a text, as llama-perplexity does"))
    from .forecast import add_arguments as add_forecast_arguments
    add_forecast_arguments(sub.add_parser("train-forecast", help="fit DS2D forecast embeddings for speculative "
                                                                 "decoding (PyTorch on CPU)"))
    for parser in (ap, *sub.choices.values()):   # before or after the command
        parser.add_argument("--gpu-api", choices=DESKTOP_APIS, default=argparse.SUPPRESS,
                            help="the WebGPU implementation on the desktop: wgpu (wgpu-native, the default) or "
                                 "dawn (Dawn, Chrome's, through the wgpudawn package: its matrix units for prefill "
                                 "where the GPU has them); also WEBDRIFT_GPU_API")
    return ap


class CtrlC:
    """The commands' SIGINT handler: the first Ctrl-C raises KeyboardInterrupt (the command stops
    what it is doing and exits 130; chat stops the reply); another one while that unwinds exits
    at once with 130, so a second Ctrl-C never interrupts the clean-up half-way (which would end
    in a traceback) and still lets an impatient user out."""

    def __init__(self):
        self.unwinding = False

    def __call__(self, signum, frame):
        if self.unwinding:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write("\nwebdrift: interrupted\n")
                sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        self.unwinding = True
        raise KeyboardInterrupt

    def handled(self) -> None:
        self.unwinding = False


ctrl_c = CtrlC()


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if getattr(args, "gpu_api", None):
        os.environ["WEBDRIFT_GPU_API"] = args.gpu_api   # gpu.native.get_device's default
    # our SIGINT handler while a command runs (only where Python's own is in place: main thread)
    ours = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        ctrl_c.handled()
        signal.signal(signal.SIGINT, ctrl_c)
    try:
        return args.func(args)
    except WebdriftError as e:
        sys.stderr.write(f"webdrift: error: {e}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("\nwebdrift: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader of stdout went away (`webdrift generate ... | head -c 1`): stop quietly; point
        # stdout at /dev/null so the interpreter's final flush does not fail again
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    finally:
        # restored; unless the command was interrupted: the process is on its way out with 130,
        # and a late Ctrl-C must not turn that into a death by SIGINT (ignored, not a Python
        # handler: the interpreter resets those to the default at exit)
        if ours:
            signal.signal(signal.SIGINT, signal.SIG_IGN if ctrl_c.unwinding else signal.default_int_handler)
