"""`webdrift train-forecast` (webdrift/tools/forecast.py) on tiny random HF llama models (PyTorch
on CPU): the augmented forward's custom 4-D mask leaves the real tokens' logits as a plain
forward's; training lowers the loss and beats the untrained vectors on held-out text; the file
round-trips with webdrift's own config of the model; the forecast logits of the batched
many-anchor forward equal an independent plain transformers forward (the vectors appended as
inputs_embeds after the anchor); bad input gives one-line errors (exit 2); read_forecast refuses
malformed files."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from webdrift.errors import InvalidArgumentError, ModelFileError, WebdriftError
from webdrift.runtime.loading import open_source
from webdrift.tools import forecast as fc
from webdrift.tools.cli import main
from webdrift.weights.forecast import model_meta, read_forecast, write_forecast

VOCAB = 320
TEMPLATE = "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}<|assistant|>"


def make_model(d, hidden: int, seed: int, sticky: bool = False):
    """A random 2-layer llama (GQA) and a small byte-level BPE tokenizer with a chat template,
    saved as an HF folder. sticky: tied embeddings much larger than the layers' weights, so the
    model repeats its last token (its generations, after every prompt, repeat the template's last
    token: a forecast that can be learned, unlike a random model's)."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, initializer_range=0.02 if sticky else 0.2,
                                   rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=sticky)
    m = transformers.LlamaForCausalLM(cfg).eval()
    if sticky:
        with torch.no_grad():
            m.get_input_embeddings().weight.normal_(0.0, 1.0)
    m.save_pretrained(d, safe_serialization=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(fc.PROMPTS, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                               unk_token="<unk>", pad_token="</s>")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("fc_train")
    d = make_model(root / "tiny", 64, 0)
    tm, tok, cfg, _ = fc.load_model(str(d))
    return d, tm, tok, cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("fc_sticky")
    d = make_model(root / "sticky", 64, 2, sticky=True)
    torch.set_num_threads(1)
    rep = fc.train_forecast(str(d), root / "sticky.safetensors", branching=(3, 2), sequences=10, length=24,
                            steps=40, lr=0.1, seed=0)
    return d, root / "sticky.safetensors", rep


def sample_ids(n=30, seed=1):
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_mask_keeps_real_tokens_as_a_plain_forward(tiny):
    _, tm, _, cfg = tiny
    ids = sample_ids()
    vec = torch.randn(2, cfg.dim, generator=torch.Generator().manual_seed(3))
    anchors = [0, 5, 6, 17, 27]
    embeds, mask, pos = fc.forecast_inputs(tm, ids, anchors, vec)
    assert embeds.shape == (1, 30 + 5 * 2, cfg.dim) and mask.shape == (1, 1, 40, 40)
    assert pos[0, 30:].tolist() == [1, 2, 6, 7, 7, 8, 18, 19, 28, 29]
    with torch.no_grad():
        aug = tm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos).logits[0, :30]
        plain = tm(input_ids=torch.tensor([ids])).logits[0]
    assert (aug - plain).abs().max() < 1e-4
    assert fc.check_mask(tm, ids, anchors, vec) < 1e-4
    # a planted mask bug (every row sees every row) must be caught
    real = fc.forecast_inputs

    def leaky(*a):
        e, m, p = real(*a)
        return e, torch.zeros_like(m), p

    fc.forecast_inputs = leaky
    try:
        with pytest.raises(WebdriftError, match="changes the real tokens' logits"):
            fc.check_mask(tm, ids, anchors, vec)
    finally:
        fc.forecast_inputs = real


def test_training_lowers_loss_and_beats_untrained(trained):
    rep = trained[2]
    before, after = rep["held_out_initial"], rep["held_out"]
    assert after["anchors"] == before["anchors"] > 20
    assert after["loss"] < 0.5 * before["loss"] and rep["loss_final"] < rep["loss_first"]
    assert [d["k"] for d in after["depths"]] == [3, 2]
    score = lambda r: sum(d["top1"] + d["topk"] for d in r["depths"])
    assert score(after) > score(before) + 0.5
    assert rep["sequences"]["held_out"] == 1 and rep["sequences"]["train"] == 9


def test_file_round_trips_with_webdrift_config(trained, tmp_path):
    d, out, _ = trained
    cfg = open_source(str(d)).config
    ff = read_forecast(out)
    assert ff.branching == (3, 2) and ff.m == 2 and ff.hidden_size == 64 == cfg.dim
    assert {k: ff.meta[k] for k in ("hidden_size", "vocab_size", "n_layers", "architecture")} == model_meta(cfg)
    assert ff.meta["format"] == "webdrift.forecast" and ff.meta["model"] == "sticky"
    assert all(math.isfinite(v) for v in ff.vectors)
    ff.check(cfg)
    other = open_source(str(make_model(tmp_path / "other", 32, 1))).config
    with pytest.raises(InvalidArgumentError, match="for another model: hidden_size '64'"):
        ff.check(other)


def test_batched_forecast_equals_plain_forward(trained, tiny):
    d, out, _ = trained
    ff = read_forecast(out)
    vec = torch.tensor(list(ff.vectors)).reshape(ff.m, ff.hidden_size)
    ids = sample_ids(25, seed=7)
    anchors = [2, 9, 10, 14, 20]
    for tm in (tiny[1], fc.load_model(str(d))[0]):
        with torch.no_grad():
            teacher, forecast = fc.forecast_logits(tm, ids, anchors, vec)
            plain = tm(input_ids=torch.tensor([ids])).logits[0]
            for a, t in enumerate(anchors):
                emb = tm.get_input_embeddings()(torch.tensor([ids[:t + 1]]))
                ref = tm(inputs_embeds=torch.cat([emb, vec[None]], dim=1)).logits[0, t + 1:]
                assert (forecast[a] - ref).abs().max() < 1e-4, t
                assert (teacher[a] - plain[t + 1:t + 3]).abs().max() < 1e-4, t


@pytest.mark.parametrize("args, message", [
    (["--branching", "5,5"], "branching"),
    (["--branching", "x"], "branching"),
    (["--steps", "0"], "--steps"),
    (["--sequences", "-1"], "--sequences"),
    (["--lr", "nan"], "--lr"),
])
def test_cli_bad_input_exits_2(tiny, tmp_path, capsys, args, message):
    rc = main(["train-forecast", str(tiny[0]), "--out", str(tmp_path / "f.safetensors"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("webdrift: error:") and message in err and err.count("\n") == 1
    assert not (tmp_path / "f.safetensors").exists()


def test_cli_bad_model_and_out(tiny, tmp_path, capsys):
    assert main(["train-forecast", "no-such-model", "--out", str(tmp_path / "f.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "not a known model name" in err and err.count("\n") == 1
    assert main(["train-forecast", str(tiny[0]), "--out", str(tmp_path / "no" / "f.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot write" in err and err.count("\n") == 1
    (tmp_path / "empty.txt").write_text("\n\n")
    assert main(["train-forecast", str(tiny[0]), "--out", str(tmp_path / "f.safetensors"),
                 "--prompts", str(tmp_path / "empty.txt")]) == 2
    assert "no prompts" in capsys.readouterr().err


def test_cli_json_report(tiny, tmp_path, capsys):
    (tmp_path / "p.txt").write_text("Hello there\nWhat is a cat?\n")
    out = tmp_path / "f.safetensors"
    rc = main(["train-forecast", str(tiny[0]), "--out", str(out), "--branching", "2", "--sequences", "2",
               "--length", "8", "--steps", "2", "--threads", "1", "--prompts", str(tmp_path / "p.txt"), "--json"])
    cap = capsys.readouterr()
    assert rc == 0
    rep = json.loads(cap.out)
    assert rep["branching"] == [2] and rep["steps"] == 2 and len(rep["held_out"]["depths"]) == 1
    assert "train-forecast: train 2/2" in cap.err
    assert read_forecast(out).branching == (2,)


def _file(path, meta_over=None, shape=(2, 8), data=None):
    meta = {"format": "webdrift.forecast", "version": "1", "branching": "3,2", "hidden_size": "8",
            "vocab_size": "320", "n_layers": "2", "architecture": "llama"} | (meta_over or {})
    n = shape[0] * shape[1]
    data = data if data is not None else struct.pack(f"<{n}f", *([0.25] * n))
    header = json.dumps({"forecast": {"dtype": "F32", "shape": list(shape), "data_offsets": [0, len(data)]},
                         "__metadata__": meta}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_read_forecast_refuses_malformed_files(tmp_path):
    assert read_forecast(_file(tmp_path / "ok.st")).branching == (3, 2)
    with pytest.raises(ModelFileError, match="not a webdrift forecast file"):
        read_forecast(_file(tmp_path / "tag.st", {"format": "something.else"}))
    with pytest.raises(ModelFileError, match="version '2' is not supported"):
        read_forecast(_file(tmp_path / "ver.st", {"version": "2"}))
    with pytest.raises(ModelFileError, match="shape \\[3, 8\\]"):
        read_forecast(_file(tmp_path / "rows.st", shape=(3, 8)))
    with pytest.raises(ModelFileError, match="hidden size '16'"):
        read_forecast(_file(tmp_path / "dim.st", {"hidden_size": "16"}))
    with pytest.raises(ModelFileError, match="branching"):
        read_forecast(_file(tmp_path / "br.st", {"branching": "9,9"}))
    with pytest.raises(ModelFileError, match="NaN"):
        read_forecast(_file(tmp_path / "nan.st", data=struct.pack("<16f", *([float("nan")] * 16))))
    raw = (tmp_path / "ok.st").read_bytes()
    (tmp_path / "cut.st").write_bytes(raw[:-12])
    with pytest.raises(ModelFileError):
        read_forecast(tmp_path / "cut.st")
    with pytest.raises(InvalidArgumentError, match="no such file"):
        read_forecast(tmp_path / "missing.st")
    with pytest.raises(InvalidArgumentError, match="branching"):
        write_forecast(tmp_path / "w.st", [0.0] * 16, (3, 2, 2, 2), _meta8())


def _meta8():
    return {"hidden_size": "8", "vocab_size": "320", "n_layers": "2", "architecture": "llama"}
