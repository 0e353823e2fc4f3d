"""The webdrift wheel that the browser bundle installs into Pyodide (build_wasm's
build_webdrift_wheel, as `python -m build_wasm` and `webdrift serve` build it): the browser's
entry points and the core are in it; the desktop tools (webdrift/tools/: the CLI, bench and its
PyTorch peers, the profile command, serve), `python -m webdrift` and the console script are not,
and its RECORD lists exactly what is left. The bytecode step (precompile_bytecode, run by the
bundle's own Pyodide in Node.js) adds an unchecked-hash .pyc beside every module of a wheel (its
RECORD still exact) and beside the stdlib modules the given imports load, and reports a module
that does not compile with Python's own SyntaxError.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import pathlib
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


# -- the bundle's bytecode step (build_wasm.precompile_bytecode: the bundle's own Pyodide in Node.js) --

@pytest.fixture(scope="module")
def pyodide_stage(tmp_path_factory):
    """A staged bundle's pyodide/ (npm's package, from build_wasm's cache) and the markupsafe wheel."""
    import shutil

    from build_wasm.build import PYODIDE_FILES, cache_dir, fetch_markupsafe, fetch_pyodide
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed")
    try:
        pyo, whl = fetch_pyodide(cache_dir()), fetch_markupsafe(cache_dir())
    except BuildError as e:
        pytest.skip(f"pyodide / markupsafe not available: {e}")
    def stage(name):
        d = tmp_path_factory.mktemp(name)
        (d / "pyodide").mkdir()
        for f in PYODIDE_FILES:
            shutil.copy2(pyo / f, d / "pyodide" / f)
        (d / "wheels").mkdir()
        shutil.copy2(whl, d / "wheels" / whl.name)
        return d, f"wheels/{whl.name}"
    return stage


def test_precompiled_wheel_and_stdlib(pyodide_stage):
    from build_wasm.build import precompile_bytecode
    stage, whl = pyodide_stage("ok")
    stdlib_before = set(zipfile.ZipFile(stage / "pyodide" / "python_stdlib.zip").namelist())
    got = precompile_bytecode(stage, [whl], imports=("markupsafe", "json"))
    tag = got["cache_tag"]
    with zipfile.ZipFile(stage / whl) as z:
        names = set(z.namelist())
        pycs = sorted(n for n in names if n.endswith(".pyc"))
        assert pycs == sorted(f"markupsafe/__pycache__/{n.split('/')[-1][:-3]}.{tag}.pyc"
                              for n in names if n.endswith(".py")) and got["wheels"] == {whl: len(pycs)}
        for n in pycs:      # PEP 552 unchecked-hash (flags 0b01; the e2e test checks the hash in the page)
            assert int.from_bytes(z.read(n)[4:8], "little") == 1, n
    test_browser_wheel_record_matches_its_files(stage / whl)
    after = set(zipfile.ZipFile(stage / "pyodide" / "python_stdlib.zip").namelist())
    assert stdlib_before < after and "json/__init__.pyc" in after and "json/decoder.pyc" in after
    assert all(n.endswith(".pyc") and n[:-1] in stdlib_before for n in after - stdlib_before)
    assert "difflib.pyc" not in after and len(after - stdlib_before) == got["stdlib_modules"]


def test_precompile_reports_a_syntax_error(pyodide_stage):
    from build_wasm.build import precompile_bytecode
    stage, whl = pyodide_stage("bad")
    with zipfile.ZipFile(stage / whl, "a") as z:
        z.writestr("markupsafe/broken.py", "def f(:\n    pass\n")
    with pytest.raises(BuildError, match=r"(?s)SyntaxError.*broken\.py|broken\.py.*SyntaxError"):
        precompile_bytecode(stage, [whl], imports=("markupsafe",))


@pytest.mark.parametrize("where, code", [("{blk}/r.json", "ENOTDIR"), ("/proc/webdrift-none/r.json", "ENOENT"),
                                         ("{tmp}", "EISDIR")])
def test_node_bench_refuses_an_unwritable_json_at_once(tmp_path, where, code):
    """node_bench.mjs --json: a path it cannot write is refused before Dawn, Pyodide or the run (a
    first version's recursive mkdir spun forever on /proc/x), one line, exit 2."""
    import shutil
    import subprocess
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed")
    (tmp_path / "blk").write_text("")
    target = where.format(blk=tmp_path / "blk", tmp=tmp_path)
    script = pathlib.Path(__file__).resolve().parent.parent / "web" / "node_bench.mjs"
    r = subprocess.run(["node", str(script), "--json", target],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"webdrift: error: --json {target}: cannot write it ({code})\n"
