"""Issue 15, the `webdrift` command as a hostile (or new) user drives it: a missing prompt, zero
new tokens, a pipe closed early, text that is not UTF-8, a conversation that outgrows the
context, --help, and what the command shows while it waits and when it is done (items 7, 8, 10).
Each test failed before its fix (what it saw is in the docstring). The model is the tiny GGUF of
tests/tiny_model.py; the references are the Python API on the same file and argparse's own table.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import time

import pytest

import webdrift
from tests.tiny_model import write_tiny_gguf
from webdrift.tools import cli
from webdrift.tools.cli import Status, build_parser, main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("cli") / "tiny.gguf")


@pytest.fixture(scope="module")
def eng(tiny):
    return webdrift.load(tiny, max_context=128)


def test_missing_prompt_exits_2(tiny, capsys):
    """Before: SystemExit with a message: exit 1, not the documented 2."""
    assert main(["generate", "--model", tiny]) == 2
    err = capsys.readouterr().err
    assert err.startswith("webdrift: error: generate: give a prompt") and "Traceback" not in err
    assert main(["generate", "--model", tiny, "--prompt", "a", "b"]) == 2
    assert "not both" in capsys.readouterr().err


def test_max_new_tokens_0_claims_no_end_of_sequence(tiny, capsys):
    """Before: zero tokens were reported as "the model ended its text at once (end-of-sequence)"."""
    assert main(["generate", "--model", tiny, "--max-context", "128", "--max-new-tokens", "0", "hello"]) == 0
    cap = capsys.readouterr()
    assert cap.out == "\n"
    assert "end-of-sequence" not in cap.err
    assert re.search(r"^webdrift: 0 tokens in .*--max-new-tokens reached$", cap.err, re.MULTILINE), cap.err


def test_end_of_sequence_note_only_when_true(tiny, capsys, monkeypatch):
    from webdrift.runtime.engine import GenerationResult, GenerationStats
    for reason, note in (("eos", True), ("length", False), ("context", False)):
        monkeypatch.setattr(cli, "_run_generation", lambda *a, r=reason, **k: GenerationResult(
            "", [], GenerationStats(prompt_tokens=3, finish_reason=r)))
        assert main(["generate", "--model", tiny, "--max-context", "128", "hello"]) == 0
        assert ("end-of-sequence token" in capsys.readouterr().err) is note


def test_summary_line_quiet_and_json(tiny, eng, capsys):
    """Before: a generation ended without saying how many tokens or how fast."""
    argv = ["generate", "--model", tiny, "--max-context", "128", "--max-new-tokens", "7", "--no-stop-at-eos", "hello"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    ref = eng.generate("hello", max_new_tokens=7, stop_at_eos=False)
    assert cap.out == ref.text + "\n"
    last = cap.err.strip().splitlines()[-1]
    m = re.fullmatch(r"webdrift: 7 tokens in ([\d.]+) s \(([\d.]+) tokens/s, ([\d.]+) after the first\); "
                     r"prompt (\d+) tokens in ([\d.]+) s; --max-new-tokens reached", last)
    assert m, last
    assert int(m.group(4)) == len(eng.tokenizer.encode("hello"))
    assert float(m.group(2)) == pytest.approx(7 / float(m.group(1)), rel=0.02, abs=0.02)
    assert main(argv + ["--quiet"]) == 0
    cap = capsys.readouterr()
    assert cap.out == ref.text + "\n" and cap.err == ""
    assert main(argv + ["--json"]) == 0
    cap = capsys.readouterr()
    assert "tokens/s" not in cap.err
    import json
    assert json.loads(cap.out)["token_ids"] == ref.token_ids


def test_prompt_that_is_not_utf8(tiny, capsys):
    """Before: a raw UnicodeEncodeError traceback (argv decoded with surrogateescape)."""
    assert main(["generate", "--model", tiny, "--max-context", "128", "caf\udcff"]) == 2
    err = capsys.readouterr().err
    assert "webdrift: error: prompt is not valid Unicode: character 3 is U+DCFF" in err and "Traceback" not in err


def test_pipe_closed_early(tiny):
    """`webdrift generate ... | head -c 1`. Before: BrokenPipeError tracebacks (and 'Exception
    ignored' at exit). Now: quiet, exit 141 as SIGPIPE would, in bounded time."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "webdrift", "generate", "--model", tiny, "--max-context", "512",
                          "--max-new-tokens", "400", "--no-stop-at-eos", "hello"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    first = p.stdout.read(1)
    p.stdout.close()
    try:
        err = p.stderr.read().decode()
        rc = p.wait(timeout=120)
    finally:
        p.kill()
    assert first and rc == 141, (rc, err)
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipe" not in err, err


def test_every_option_says_what_it_does_and_its_default():
    """Before: --prompt, --max-new-tokens, --top-k, --top-p, --seed, --no-stop-at-eos, pull's name and
    profile's --prompt-tokens/--new-tokens/--prefill-chunk had no help, or no default in it."""
    missing = []

    def walk(parser: argparse.ArgumentParser, path: str):
        for a in parser._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(sp, f"{path} {name}")
                continue
            name = f"{path} {'/'.join(a.option_strings) or a.dest}"
            if not a.help:
                missing.append(f"{name}: no help")
            elif a.nargs != 0 and a.default is not None and "default" not in a.help.lower():
                missing.append(f"{name}: default {a.default!r} not in the help")
    walk(build_parser(), "webdrift")
    assert not missing, missing


def test_chat_keeps_the_system_prompt_and_drops_old_turns(eng, monkeypatch, capsys):
    """Before: the session ended (ContextLengthError, exit 2) once the history outgrew the
    context. Now every turn is answered; the oldest turns go (said on stderr), the system prompt
    stays, and each prompt holds as many of the newest messages as fit with room for a reply."""
    lines = iter([f"message number {i} about the cat in the hat" for i in range(8)] + [""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    monkeypatch.setattr(cli, "_load", lambda args, status: eng)
    prompts = []
    real = eng.aevents

    def recording(prompt, sp):
        prompts.append(list(prompt))
        return real(prompt, sp)
    monkeypatch.setattr(eng, "aevents", recording)
    system = {"role": "system", "content": "be brief"}
    assert main(["chat", "--model", "tiny", "--system", "be brief", "--max-new-tokens", "6", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert len(prompts) == 8                                     # every message was answered
    assert "outgrew the context (128 tokens): dropped the oldest 2 messages, kept the system prompt" in err
    # a reference of the policy: whole (user, assistant) pairs go, oldest first, until the
    # prompt leaves room for the reply; the replies are the engine's greedy ones for each prompt
    history: list[dict] = []
    monkeypatch.setattr(eng, "aevents", real)
    for i, ids in enumerate(prompts):
        user = {"role": "user", "content": f"message number {i} about the cat in the hat"}
        while len(eng.chat_prompt([system, *history, user])) + 6 > 128:
            history = history[2:]
        assert ids == eng.chat_prompt([system, *history, user]), i
        reply = eng.generate(ids, max_new_tokens=6).text
        history += [user, {"role": "assistant", "content": reply}]
    assert "message number 7" in eng.tokenizer.decode(prompts[-1])
    assert "message number 0" not in eng.tokenizer.decode(prompts[-1])


def test_status_shows_waits_over_a_second():
    """Every wait over a second shows what is being done, how far and for how long: a log gets a
    line (then one every 15 s), a terminal a line redrawn in place and erased at the end."""
    log = io.StringIO()
    s = Status(stream=log)
    s.set("loading the weights", "3/10 tensors")
    time.sleep(0.3)
    assert log.getvalue() == ""                              # under a second: nothing in a log
    time.sleep(1.0)
    s.set("loading the weights", "9/10 tensors")
    time.sleep(0.3)
    s.close()
    assert re.fullmatch(r"webdrift: loading the weights: \d+/10 tensors \(1 s\)\n", log.getvalue()), log.getvalue()

    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty = Tty()
    s = Status(stream=tty)
    s.set("reading the prompt", "36 tokens")
    time.sleep(1.3)
    s.done()
    out = tty.getvalue()
    assert out.startswith("\r\x1b[Kreading the prompt: 36 tokens") and "(1 s)" in out and out.endswith("\r\x1b[K")
    s.close()
    quiet = io.StringIO()
    s = Status(enabled=False, stream=quiet)
    s.set("x")
    time.sleep(1.1)
    s.close()
    assert quiet.getvalue() == ""
