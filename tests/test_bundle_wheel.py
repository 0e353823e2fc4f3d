"""The webdrift wheel that the browser bundle installs into Pyodide (build_wasm's
build_webdrift_wheel, as `python -m build_wasm` and `webdrift serve` build it): the browser's
entry points and the core are in it; the desktop tools (webdrift/tools/: the CLI, bench and its
PyTorch peers, the profile command, serve), `python -m webdrift` and the console script are not,
and its RECORD lists exactly what is left.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile

import pytest

from build_wasm.build import (
    BROWSER_ENTRY_POINTS,
    REPO,
    BuildError,
    build_webdrift_wheel,
    check_webdrift_wheel,
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_webdrift_wheel(REPO, tmp_path_factory.mktemp("wheels"))


def test_browser_wheel_has_no_desktop_tools(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("cli", "bench", "bench_peers", "profile", "serve", "__init__"):
        assert f"webdrift/tools/{module}.py" not in names
    assert not [n for n in names if n.startswith("webdrift/tools/")]
    # the desktop wheel's package data for `webdrift serve` (web assets, the bundle builder) too
    assert not [n for n in names if n.endswith((".html", ".js", ".css")) or "build_wasm" in n]
    assert "webdrift/__main__.py" not in names
    assert not [n for n in names if n.endswith("entry_points.txt")]      # no `webdrift` script into tools
    for n in BROWSER_ENTRY_POINTS + ("webdrift/__init__.py", "webdrift/profile/profiler.py",
                                     "webdrift/tokenizer/tokenizer.py", "webdrift/wgsl/convert.wgsl"):
        assert n in names, n


def test_browser_wheel_record_matches_its_files(wheel):
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        rows = {r[0]: r[1:] for r in csv.reader(io.StringIO(z.read(record).decode())) if r}
        assert set(rows) == set(z.namelist())
        for name, (digest, size) in rows.items():
            if name == record:
                continue
            data = z.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data), name


def test_check_refuses_a_wheel_with_tools(wheel, tmp_path):
    bad = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for i in src.infolist():
            dst.writestr(i, src.read(i))
        dst.writestr("webdrift/tools/bench.py", "import wgpu\n")
    with pytest.raises(BuildError, match="webdrift/tools/bench.py"):
        check_webdrift_wheel(bad, REPO)
