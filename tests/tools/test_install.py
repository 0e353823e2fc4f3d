"""`pip install` users can serve (issue 15): the wheel carries the web assets and the bundle
builder, and `webdrift serve` finds them in the installed package, outside any source checkout.

The test builds the wheel from a clean copy of the checkout (`pip wheel --no-deps`), installs it
into a fresh venv (system site-packages reused for the dependencies, `pip install --no-deps`),
and from a folder outside the checkout runs `python -m webdrift serve --help` and then the
server itself: it builds its bundle from the installed files (Pyodide and the jinja2/markupsafe
wheels come from a prepared download cache of stand-in files, so nothing is fetched) and serves
it; the pages it answers must equal the checkout's web/ files, and the browser's webdrift wheel
inside must hold the core and no desktop tool, web asset or builder file.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False, **kw)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"        # a clean copy: no stale build/ or egg-info of the checkout in the wheel
    src.mkdir()
    for f in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / f).is_file():
            shutil.copy2(REPO / f, src / f)
    for folder in ("webdrift", "wgsl", "web", "build_wasm"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)])
    (wheel,) = dist.glob("webdrift-*-py3-none-any.whl")
    env_dir = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(env_dir)])
    py = env_dir / "bin" / "python"
    # the system pip, run by the venv's python, installs into the venv
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)])
    work = tmp / "elsewhere"             # not the checkout: `python -m` must not find ./webdrift
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WEBDRIFT_CACHE")}
    env["WEBDRIFT_CACHE"] = str(tmp / "cache")
    return {"python": py, "wheel": wheel, "cwd": work, "env": env, "tmp": tmp, "prefix": env_dir}


def test_wheel_carries_web_assets_and_builder(venv):
    names = set(zipfile.ZipFile(venv["wheel"]).namelist())
    for f in ("webdrift.js", "worker.js", "index.html", "app.js", "style.css", "bench.html", "bench.js",
              "node_bench.mjs"):
        assert f"webdrift/tools/web/{f}" in names, f
    for f in ("build.py", "__init__.py", "__main__.py"):
        assert f"webdrift/tools/build_wasm/{f}" in names, f
    assert "webdrift/tools/serve.py" in names
    kernels = sorted(f.name for f in (Path(__file__).resolve().parents[2] / "wgsl").glob("*.wgsl"))
    assert kernels, "no kernel templates found in the checkout"
    missing = [k for k in kernels if f"webdrift/wgsl/{k}" not in names]
    assert not missing, f"kernel templates missing from the wheel: {missing}"


def test_installed_package_resolves_its_own_assets(venv):
    code = ("import json, webdrift, webdrift.tools.serve as s\n"
            "b = s.bundle_builder(); src = b.Sources.of(b.REPO)\n"
            "print(json.dumps({'webdrift': webdrift.__file__, 'checkout': str(s.source_checkout()),\n"
            "  'builder': b.__file__, 'web': str(src.web), 'wgsl': str(src.wgsl),\n"
            "  'bundle': str(s.default_bundle_dir())}))\n")
    r = _run([str(venv["python"]), "-c", code], cwd=venv["cwd"], env=venv["env"])
    got = json.loads(r.stdout)
    prefix = str(venv["prefix"].resolve())
    assert got["checkout"] == "None"
    for key in ("webdrift", "builder", "web", "wgsl"):
        assert got[key].startswith(prefix), (key, got[key])
    assert got["bundle"] == str(Path(venv["env"]["WEBDRIFT_CACHE"]) / "bundle")
    for f in ("webdrift.js", "worker.js", "index.html"):
        assert (Path(got["web"]) / f).read_bytes() == (REPO / "web" / f).read_bytes()


def test_module_help_runs_outside_the_checkout(venv):
    r = _run([str(venv["python"]), "-m", "webdrift", "serve", "--help"], cwd=venv["cwd"], env=venv["env"])
    assert "--bundle" in r.stdout and "--port" in r.stdout and "--no-build" in r.stdout


def _stand_in_downloads(cache: Path) -> None:
    """What build_wasm downloads (npm's pyodide, PyPI's jinja2, markupsafe), as small stand-ins."""
    sys.path.insert(0, str(REPO))
    from build_wasm.build import JINJA2_VERSION, MARKUPSAFE_VERSION, PYODIDE_FILES, PYODIDE_VERSION
    pkg = cache / "build_wasm" / f"npm-pyodide-{PYODIDE_VERSION}" / "node_modules" / "pyodide"
    pkg.mkdir(parents=True)
    for f in PYODIDE_FILES:
        (pkg / f).write_text(f"stand-in {f}\n")
    (pkg / "package.json").write_text(json.dumps({"version": PYODIDE_VERSION}))
    wheels = cache / "build_wasm" / "wheels"
    wheels.mkdir(parents=True)
    for name in (f"jinja2-{JINJA2_VERSION}-py3-none-any.whl", f"markupsafe-{MARKUPSAFE_VERSION}-py3-none-any.whl"):
        (wheels / name).write_bytes(b"PK stand-in")


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read()


def test_installed_serve_builds_and_serves_its_bundle(venv):
    _stand_in_downloads(Path(venv["env"]["WEBDRIFT_CACHE"]))
    model = venv["tmp"] / "tiny model.gguf"
    model.write_bytes(b"GGUF" + bytes(200))
    # no Node.js on PATH: the stand-in Pyodide cannot precompile the bundle's Python, and without
    # node the build skips that step (build_wasm.precompile_bytecode)
    env = dict(venv["env"], PATH=str(Path(venv["python"]).parent))
    p = subprocess.Popen([str(venv["python"]), "-m", "webdrift", "serve", "--port", "0", "--model", str(model)],
                         cwd=venv["cwd"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()          # "webdrift: open http://127.0.0.1:PORT/ ..." once listening
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, (line, p.stderr.read() if p.poll() is not None else "")
        base = f"http://127.0.0.1:{m.group(1)}"
        for f in ("webdrift.js", "worker.js", "index.html", "app.js", "style.css", "bench.html", "bench.js",
                  "node_bench.mjs"):
            assert _get(f"{base}/{f}") == (200, (REPO / "web" / f).read_bytes()), f
        assert _get(f"{base}/bench") == (200, (REPO / "web" / "bench.html").read_bytes())
        manifest = json.loads(_get(f"{base}/manifest.json")[1])
        assert manifest["model"] is None and len(manifest["wheels"]) == 3
        status, whl = _get(f"{base}/{manifest['wheels'][2]}")
        names = set(zipfile.ZipFile(io.BytesIO(whl)).namelist())
        assert status == 200 and "webdrift/browser_api.py" in names and "webdrift/runtime/engine.py" in names
        assert {f"webdrift/wgsl/{w.name}" for w in (REPO / "wgsl").glob("*.wgsl")} <= names
        assert not [n for n in names if n.startswith("webdrift/tools/") or n == "webdrift/__main__.py"]
        assert _get(f"{base}/pyodide/pyodide.mjs") == (200, b"stand-in pyodide.mjs\n")
        d = json.loads(_get(f"{base}/models/default.json")[1])
        assert d["url"] == "tiny%20model.gguf" and _get(f"{base}/models/{d['url']}") == (200, model.read_bytes())
        bundle = Path(venv["env"]["WEBDRIFT_CACHE"]) / "bundle"
        assert (bundle / "manifest.json").is_file()
    finally:
        p.send_signal(signal.SIGINT)
        try:
            rc = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        err = p.stderr.read()
    assert rc == 0, err
    assert "Traceback" not in err, err
    # a second start finds the bundle current (the fingerprint of the installed files): no rebuild
    code = "import webdrift.tools.serve as s; b = s.bundle_builder(); print(b.bundle_is_current(s.default_bundle_dir(), b.REPO))"
    r = _run([str(venv["python"]), "-c", code], cwd=venv["cwd"], env=venv["env"])
    assert r.stdout.strip() == "True"
