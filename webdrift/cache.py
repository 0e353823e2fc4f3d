"""The one folder where webdrift keeps files between runs, and its sub-folders.

    $WEBDRIFT_CACHE (default ~/.cache/webdrift)/
        models/       model files pulled by webdrift.hub
        autotune/     kernel choices measured per adapter (kernels/autotune.py)
        build_wasm/   downloads of the browser bundle's build (build_wasm/build.py)

Every reader of WEBDRIFT_CACHE goes through `cache_dir`, so they cannot disagree about where a
sub-folder is.
Must not: import anything beyond the standard library (the kernel tuner runs in Pyodide too),
or create folders (a caller that writes creates its own sub-folder).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "cache_root"]


def cache_root() -> Path:
    """$WEBDRIFT_CACHE, or ~/.cache/webdrift."""
    env = os.environ.get("WEBDRIFT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "webdrift"


def cache_dir(sub: str) -> Path:
    """The cache's sub-folder `sub` (one name, e.g. "models"); not created here."""
    if not sub or sub in (".", "..") or "/" in sub or os.sep in sub:
        raise ValueError(f"cache_dir({sub!r}): give one folder name, e.g. 'models'")
    return cache_root() / sub
