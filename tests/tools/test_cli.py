"""The `webdrift` command as a user runs it: JSON output equal to the Python API, the chat-turn
option, and bad input exiting 2 with a one-line error (no traceback)."""

import json

import pytest

import webdrift
from webdrift.tools.cli import main


@pytest.fixture(scope="module")
def engine(smollm2_gguf_path):
    return webdrift.load(str(smollm2_gguf_path), max_context=256)


def test_generate_json_matches_api(engine, smollm2_gguf_path, capsys):
    rc = main(["generate", "--model", str(smollm2_gguf_path), "--max-context", "256", "--prompt",
               "The capital of France is", "--max-new-tokens", "5", "--no-stop-at-eos", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    ref = engine.generate("The capital of France is", max_new_tokens=5, stop_at_eos=False)
    assert out["token_ids"] == ref.token_ids and out["text"] == ref.text
    assert out["prompt_token_ids"] == engine.tokenizer.encode("The capital of France is")
    assert out["stats"]["new_tokens"] == 5 and out["stats"]["decode_tokens_per_s"] > 0


def test_generate_chat_uses_template(engine, smollm2_gguf_path, capsys):
    rc = main(["generate", "--chat", "--model", str(smollm2_gguf_path), "--max-context", "256",
               "Why is the sky blue?", "--max-new-tokens", "4", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    chat_ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Why is the sky blue?"}], add_generation_prompt=True), add_special_tokens=False)
    assert out["token_ids"] == engine.generate(chat_ids, max_new_tokens=4).token_ids
    assert len(out["token_ids"]) == 4


@pytest.mark.parametrize("argv,needle", [
    (["generate", "--model", "no-such-model", "hi"], "no-such-model"),
    (["generate", "--model", __file__, "hi"], "test_cli.py"),
])
def test_bad_model_exits_2_with_message(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("webdrift: error:") and needle in err and "Traceback" not in err


def test_bad_sampling_exits_2(smollm2_gguf_path, capsys):
    assert main(["generate", "--model", str(smollm2_gguf_path), "--max-context", "64", "hi", "--top-p", "2"]) == 2
    assert "top_p" in capsys.readouterr().err
