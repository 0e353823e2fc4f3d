"""LoRA on a real model: SmolLM2-135M-Instruct (Q4_1 GGUF; transformers reads and dequantizes
it) with a random PEFT adapter made by `peft` in the test (all seven targets, r = 16, rsLoRA):
webdrift's teacher-forced logits with the adapter vs transformers + peft. The GGUF base holds
Q / K rows in llama.cpp's RoPE order; PEFT's B rows are in HF's, which webdrift's pool permutes."""

import copy
import math

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

import webdrift

SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def models(smollm2_gguf_path, smollm2_hf, tmp_path_factory):
    p = smollm2_gguf_path
    shared, tok = smollm2_hf
    base = copy.deepcopy(shared)     # peft changes the model it wraps; the session's reference stays as it is
    pm = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, use_rslora=True, target_modules=SEVEN,
                                         lora_dropout=0.0, init_lora_weights=False))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, prm in pm.named_parameters():
            if "lora_A" in n:
                prm.copy_(torch.randn(prm.shape, generator=g) / math.sqrt(prm.shape[1]))
            elif "lora_B" in n:
                prm.copy_(torch.randn(prm.shape, generator=g) * 0.02)
    d = tmp_path_factory.mktemp("smollm2_lora")
    pm.save_pretrained(d)
    eng = webdrift.load(str(p), max_context=256, loras={"a": str(d)}, max_lora_rank=16)
    return pm.eval(), tok, eng


def test_teacher_forced_logits_with_adapter(models):
    pm, tok, eng = models
    ids = tok.encode("The capital of France is Paris. def fibonacci(n): return n if n < 2 else "
                     "fibonacci(n - 1) + fibonacci(n - 2) <|im_start|>user\nWhy is the sky blue?<|im_end|>")[:64]
    got = eng.logits(ids, lora="a")
    with torch.no_grad():
        want = pm(torch.tensor([ids])).logits[0].numpy()
        with pm.disable_adapter():
            base = pm(torch.tensor([ids])).logits[0].numpy()
    assert (want.argmax(1) != base.argmax(1)).mean() > 0.2     # the adapter matters
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    top1 = (got.argmax(1) == want.argmax(1)).mean()
    assert cos.min() >= 0.999, cos.min()
    assert top1 >= 0.98, top1
    # and without it, the base model again
    plain = eng.logits(ids)
    assert (plain.argmax(1) == base.argmax(1)).mean() >= 0.98
