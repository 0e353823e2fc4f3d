"""Assemble webdrift's browser bundle: a static folder any web server can serve.

    python -m build_wasm --out bundle/ [--model smollm2-135m | --model path/to/model.gguf]
    python -m webdrift.tools.build_wasm --out DIR     (the same, from an installed webdrift)

It runs from a source checkout (the repository root) or from an installed webdrift: the wheel
carries this folder as `webdrift/tools/build_wasm/` and web/ as `webdrift/tools/web/` (package
data, pyproject.toml), so `webdrift serve` can build the bundle after `pip install webdrift`.
`Sources` says where the inputs are in either layout.

What goes in (everything from package registries, nothing from a CDN at run time):
    pyodide/          Pyodide's core runtime from the npm package `pyodide` (version pinned below):
                      pyodide.mjs, pyodide.asm.mjs, pyodide.asm.wasm, python_stdlib.zip, lock file
    wheels/           webdrift (pure Python: `pip wheel --no-deps` of the checkout, or the installed
                      package's files zipped; WGSL templates as package data; without the desktop
                      tools: webdrift/tools/ with the web assets and this builder, and __main__.py),
                      jinja2 (PyPI's py3-none-any wheel) and markupsafe (a pure-Python
                      wheel assembled here from PyPI's sdist: Pyodide's own markupsafe lives on a CDN
                      we do not use, and markupsafe falls back to `_native.py` without its C speedups)
    webdrift.js, worker.js, index.html, app.js, style.css,  from web/
    bench.html, bench.js, node_bench.mjs (the bench in Node.js with Dawn: docs/BROWSER.md)
    manifest.json     versions, wheel list (install order) and the inputs' fingerprint
    models/           only with --model: the GGUF and models/default.json {url (relative to it),
                      sha256, size, name}
                      (`webdrift serve` serves the model itself and does not copy it)

Downloads are cached in $WEBDRIFT_CACHE/build_wasm (default ~/.cache/webdrift/build_wasm).
Must not: be imported by the webdrift core (only webdrift/tools/serve.py uses it: it shells out
to npm and pip); put any desktop tool, web asset or itself into the browser's webdrift wheel.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from webdrift.cache import cache_dir as webdrift_cache_dir
from webdrift.hub import sha256_file

PYODIDE_VERSION = "314.0.7"     # npm package `pyodide` (CPython 3.14 in WebAssembly)
JINJA2_VERSION = "3.1.6"        # chat templates
MARKUPSAFE_VERSION = "3.0.3"    # jinja2's only dependency

_HERE = Path(__file__).resolve().parent
# The source root: the checkout (holding pyproject.toml) this file is in, or, installed, the webdrift
# package folder (this file is webdrift/tools/build_wasm/build.py there). Functions take it as `repo`.
REPO = _HERE.parent if (_HERE.parent / "pyproject.toml").is_file() else _HERE.parents[1]
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip",
                 "pyodide-lock.json", "package.json")
WEB_FILES = ("webdrift.js", "worker.js", "index.html", "app.js", "style.css", "bench.html", "bench.js",
             "node_bench.mjs")
BUNDLE_FORMAT = 1
# What the browser's webdrift wheel leaves out: the desktop tools wing (the CLI, bench and its
# PyTorch peers, the profile command, serve, and the package data under it: the web assets in
# webdrift/tools/web/ and this builder in webdrift/tools/build_wasm/) and `python -m webdrift`,
# which starts it. The core never imports them (tests/test_layering.py), so the browser cannot
# miss them.
DESKTOP_ONLY = ("webdrift/tools/", "webdrift/__main__.py")
# What it must hold: the browser's entry point and the core it runs on
BROWSER_ENTRY_POINTS = ("webdrift/browser_api.py", "webdrift/runtime/loading.py", "webdrift/runtime/engine.py",
                        "webdrift/gpu/browser.py", "webdrift/gpu/base.py")


def desktop_only(name: str) -> bool:
    """True for a package path (webdrift/...) that the browser wheel leaves out."""
    return name.startswith(DESKTOP_ONLY)


@dataclass(frozen=True)
class Sources:
    """Where the bundle's inputs are, in a source checkout or in an installed webdrift."""

    package: Path            # the webdrift package folder
    wgsl: Path               # the kernel templates (*.wgsl)
    web: Path                # webdrift.js, worker.js and the demo page
    builder: Path            # this folder
    checkout: Path | None    # the checkout's root (pyproject.toml); None for an installed package

    @classmethod
    def of(cls, repo: Path) -> Sources:
        """`repo`: a checkout's root, or an installed webdrift package folder."""
        repo = Path(repo)
        if (repo / "pyproject.toml").is_file():
            return cls(repo / "webdrift", repo / "wgsl", repo / "web", repo / "build_wasm", repo)
        return cls(repo, repo / "wgsl", repo / "tools" / "web", repo / "tools" / "build_wasm", None)


def default_out(repo: Path = REPO) -> Path:
    """Where the bundle goes by default: bundle/ in a checkout; $WEBDRIFT_CACHE/bundle installed
    (site-packages is no place for build output)."""
    src = Sources.of(repo)
    return src.checkout / "bundle" if src.checkout else webdrift_cache_dir("bundle")


class BuildError(RuntimeError):
    """A build step failed; the message says which and what to do."""


def cache_dir() -> Path:
    """$WEBDRIFT_CACHE/build_wasm (default ~/.cache/webdrift/build_wasm), through webdrift/cache.py."""
    return webdrift_cache_dir("build_wasm")


def _log(msg: str) -> None:
    sys.stderr.write(f"build_wasm: {msg}\n")
    sys.stderr.flush()


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    try:
        r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    except FileNotFoundError as e:
        hint = " (Debian: apt-get install nodejs npm)" if cmd[0] == "npm" else ""
        raise BuildError(f"{what}: {cmd[0]} is not installed{hint} ({e})") from e
    if r.returncode != 0:
        raise BuildError(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}")


# -- inputs and their fingerprint -------------------------------------------------------------

def _input_files(repo: Path) -> list[tuple[str, Path]]:
    """(name, path) of every input: names as in a checkout (webdrift/..., wgsl/..., web/...,
    build_wasm/...), whichever layout the files come from."""
    src = Sources.of(repo)
    files = [(n, src.checkout / n) for n in ("pyproject.toml", "README.md")] if src.checkout else []
    for folder, root, pattern in (("webdrift", src.package, "*.py"), ("wgsl", src.wgsl, "*.wgsl"),
                                  ("web", src.web, "*"), ("build_wasm", src.builder, "*.py")):
        for p in sorted(root.rglob(pattern)):
            name = f"{folder}/{p.relative_to(root).as_posix()}"
            if p.is_file() and "__pycache__" not in p.parts and not (folder == "webdrift" and desktop_only(name)):
                files.append((name, p))
    return [(n, p) for n, p in files if p.is_file()]


def fingerprint(repo: Path = REPO, model: dict | None = None) -> str:
    """Hash of every input file, the pinned versions and the packed model (if any)."""
    h = hashlib.sha256()
    h.update(f"{BUNDLE_FORMAT}|{PYODIDE_VERSION}|{JINJA2_VERSION}|{MARKUPSAFE_VERSION}|".encode())
    h.update(json.dumps(model, sort_keys=True).encode())
    for name, p in _input_files(repo):
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


# -- pyodide from npm ---------------------------------------------------------------------------

def fetch_pyodide(cache: Path) -> Path:
    """The folder of npm's `pyodide` package (npm install into the cache on first use)."""
    prefix = cache / f"npm-pyodide-{PYODIDE_VERSION}"
    pkg = prefix / "node_modules" / "pyodide"
    if all((pkg / f).is_file() for f in PYODIDE_FILES):
        return pkg
    _log(f"npm install pyodide@{PYODIDE_VERSION} -> {prefix}")
    prefix.mkdir(parents=True, exist_ok=True)
    _run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save",
          "--ignore-scripts", f"pyodide@{PYODIDE_VERSION}"], f"installing pyodide@{PYODIDE_VERSION} with npm")
    missing = [f for f in PYODIDE_FILES if not (pkg / f).is_file()]
    if missing:
        raise BuildError(f"npm's pyodide@{PYODIDE_VERSION} lacks {missing} (looked in {pkg})")
    got = json.loads((pkg / "package.json").read_text())["version"]
    if got != PYODIDE_VERSION:
        raise BuildError(f"npm installed pyodide {got}, expected {PYODIDE_VERSION}")
    return pkg


# -- wheels ---------------------------------------------------------------------------------------

def _pip_download(path: Path, spec: str, kind: str, what: str) -> Path:
    """path, fetched with `pip download --no-deps` of spec into its folder unless already there;
    kind: "--only-binary" (a wheel) or "--no-binary" (an sdist)."""
    if not path.is_file():
        _log(f"pip download {spec}" + (" (sdist)" if kind == "--no-binary" else ""))
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", kind, ":all:",
              "-d", str(path.parent), spec], what)
    if not path.is_file():
        raise BuildError(f"pip did not produce {path.name}")
    return path


def fetch_jinja2(cache: Path) -> Path:
    d = cache / "wheels"
    whl = d / f"jinja2-{JINJA2_VERSION}-py3-none-any.whl"
    return _pip_download(whl, f"jinja2=={JINJA2_VERSION}", "--only-binary", "downloading jinja2")


def _wheel_record(files: dict[str, bytes], record_name: str) -> bytes:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        w.writerow([name, f"sha256={digest}", len(data)])
    w.writerow([record_name, "", ""])
    return out.getvalue().encode()


def pure_wheel_from_sdist(sdist: Path, dist: str, version: str, package: str, out_dir: Path) -> Path:
    """A py3-none-any wheel holding the sdist's src/<package>/ Python files (C sources left out)."""
    files: dict[str, bytes] = {}
    pkg_info = b""
    with tarfile.open(sdist) as tf:
        for m in tf.getmembers():
            if not m.isfile():
                continue
            parts = m.name.split("/")
            if parts[1:] == ["PKG-INFO"]:
                pkg_info = tf.extractfile(m).read()
            elif len(parts) >= 4 and parts[1] == "src" and parts[2] == package:
                rel = "/".join(parts[2:])
                if rel.endswith((".py", ".pyi", "py.typed")):
                    files[rel] = tf.extractfile(m).read()
    if f"{package}/__init__.py" not in files or not pkg_info:
        raise BuildError(f"{sdist.name}: no src/{package}/__init__.py or PKG-INFO")
    info = f"{dist}-{version}.dist-info"
    files[f"{info}/METADATA"] = pkg_info
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: webdrift build_wasm\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{info}/top_level.txt"] = package.encode() + b"\n"
    files[f"{info}/RECORD"] = _wheel_record(files, f"{info}/RECORD")
    whl = out_dir / f"{dist}-{version}-py3-none-any.whl"
    tmp = whl.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    os.replace(tmp, whl)
    return whl


def fetch_markupsafe(cache: Path) -> Path:
    d = cache / "wheels"
    whl = d / f"markupsafe-{MARKUPSAFE_VERSION}-py3-none-any.whl"
    if whl.is_file():
        return whl
    sd = cache / "sdist"
    sdist = sd / f"markupsafe-{MARKUPSAFE_VERSION}.tar.gz"
    _pip_download(sdist, f"markupsafe=={MARKUPSAFE_VERSION}", "--no-binary", "downloading the markupsafe sdist")
    d.mkdir(parents=True, exist_ok=True)
    return pure_wheel_from_sdist(sdist, "markupsafe", MARKUPSAFE_VERSION, "markupsafe", d)


def build_webdrift_wheel(repo: Path, out_dir: Path) -> Path:
    """The browser's webdrift wheel: from a checkout, `pip wheel --no-deps` of a clean copy of it
    (no stale build/ from earlier builds) with the desktop-only files stripped; from an installed
    package, its files zipped (installed_package_wheel)."""
    if Sources.of(repo).checkout is None:
        return installed_package_wheel(repo, out_dir)
    with tempfile.TemporaryDirectory(prefix="webdrift-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for f in ("pyproject.toml", "README.md", "LICENSE"):
            if (repo / f).is_file():
                shutil.copy2(repo / f, src / f)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        # every folder pyproject.toml maps into the package (web/ and build_wasm/ are package data
        # of webdrift.tools: stripped below, like the rest of the tools)
        for folder in ("webdrift", "wgsl", "web", "build_wasm"):
            shutil.copytree(repo / folder, src / folder, ignore=ignore)
        wdir = Path(tmp) / "dist"
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wdir), str(src)]
        try:
            _run(cmd[:4] + ["--no-build-isolation"] + cmd[4:], "pip wheel (no build isolation)")
        except BuildError:
            _run(cmd, "pip wheel of webdrift")
        wheels = list(wdir.glob("webdrift-*-py3-none-any.whl"))
        if len(wheels) != 1:
            raise BuildError(f"pip wheel produced {[w.name for w in wdir.iterdir()]}, expected one "
                             "webdrift-*-py3-none-any.whl (is the package still pure Python?)")
        strip_desktop_only(wheels[0])
        check_webdrift_wheel(wheels[0], repo)
        out_dir.mkdir(parents=True, exist_ok=True)
        dst = out_dir / wheels[0].name
        shutil.copy2(wheels[0], dst)
        return dst


def _package_version(package: Path) -> str:
    m = re.search(r'^__version__ = "([^"]+)"', (package / "__init__.py").read_text(), re.MULTILINE)
    if not m:
        raise BuildError(f"{package / '__init__.py'} names no __version__")
    return m.group(1)


def installed_package_wheel(package: Path, out_dir: Path) -> Path:
    """A py3-none-any wheel of an installed webdrift package folder (no source checkout to run pip
    on): its modules and WGSL templates, without the DESKTOP_ONLY files; METADATA names it."""
    package = Path(package)
    version = _package_version(package)
    files: dict[str, bytes] = {}
    for p in sorted(package.rglob("*")):
        name = f"webdrift/{p.relative_to(package).as_posix()}"
        if (p.is_file() and "__pycache__" not in p.parts and not desktop_only(name)
                and (p.suffix == ".py" or (p.suffix == ".wgsl" and p.parent == package / "wgsl"))):
            files[name] = p.read_bytes()
    info = f"webdrift-{version}.dist-info"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: webdrift\nVersion: {version}\n"
                                 "Summary: webdrift's browser core (built from an installed package)\n").encode()
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: webdrift build_wasm\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{info}/top_level.txt"] = b"webdrift\n"
    files[f"{info}/RECORD"] = _wheel_record(files, f"{info}/RECORD")
    out_dir.mkdir(parents=True, exist_ok=True)
    whl = out_dir / f"webdrift-{version}-py3-none-any.whl"
    tmp = whl.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    os.replace(tmp, whl)
    check_webdrift_wheel(whl, package)
    return whl


def strip_desktop_only(whl: Path) -> None:
    """Rewrite the wheel without the DESKTOP_ONLY modules and without its console script (which
    points into webdrift.tools); RECORD is written anew for what is left."""
    with zipfile.ZipFile(whl) as z:
        infos = z.infolist()
        data = {i.filename: z.read(i) for i in infos}
    record = next((n for n in data if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        raise BuildError(f"{whl.name} has no .dist-info/RECORD")
    keep = [i for i in infos if i.filename != record and not desktop_only(i.filename)
            and not i.filename.endswith(".dist-info/entry_points.txt")]
    files = {i.filename: data[i.filename] for i in keep}
    tmp = whl.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for i in keep:
            z.writestr(i, files[i.filename])
        zi = zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0))
        zi.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(zi, _wheel_record(files, record))
    os.replace(tmp, whl)


def check_webdrift_wheel(whl: Path, repo: Path) -> None:
    """The wheel must carry every WGSL template and the browser entry points, and none of the
    desktop tools."""
    names = set(zipfile.ZipFile(whl).namelist())
    want = {f"webdrift/wgsl/{p.name}" for p in Sources.of(repo).wgsl.glob("*.wgsl")}
    want |= set(BROWSER_ENTRY_POINTS)
    missing = sorted(want - names)
    if missing:
        raise BuildError(f"{whl.name} lacks {missing}: add the package / package data in pyproject.toml")
    extra = sorted(n for n in names if desktop_only(n) or n.endswith(".dist-info/entry_points.txt"))
    if extra:
        raise BuildError(f"{whl.name} holds desktop-only files {extra}: the browser bundle leaves them out")


# -- bytecode: the Python a page runs, compiled here by the bundle's own Pyodide -------------------
# Pyodide's python_stdlib.zip and the wheels hold source only, so every page load compiled each
# module it imports (Pyodide's own start-up included) from source: about 1.2 s of a 2-core
# machine's 2.0 s boot and 0.25 s of `import webdrift.browser_api` (docs/BROWSER.md). The build
# runs the bundle's Pyodide in Node.js once and adds unchecked-hash .pyc files (PEP 552: never
# compared with their source, which stays for tracebacks): `__pycache__/*.cpython-3XX.pyc` beside
# every module of the wheels, and `<module>.pyc` (zipimport's first choice) beside the stdlib
# modules that Pyodide's start-up and the page's imports (PRECOMPILED_IMPORTS) load. Compiled by
# the same interpreter that runs them, so the bytecode always matches; a .pyc of another Python
# would be ignored (bad magic) and its source compiled as before.

PRECOMPILED_IMPORTS = ("webdrift.browser_api", "webdrift.gpu.browser", "webdrift.profile.benchmark",
                       "webdrift.weights.synthetic", "jinja2", "jinja2.sandbox")

_PYCOMPILE_NODE = r"""
// build_wasm's bytecode step: node pycompile.mjs PYODIDE_DIR STAGE_DIR SCRIPT.py WHEEL... -> JSON on stdout
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
const [pyodideDir, stage, script, ...wheels] = process.argv.slice(2);
const { loadPyodide } = await import(pathToFileURL(path.join(pyodideDir, "pyodide.mjs")).href);
const py = await loadPyodide({ indexURL: pyodideDir + "/", stdout: (s) => process.stderr.write(s + "\n"),
                               stderr: (s) => process.stderr.write(s + "\n") });
py.FS.mkdirTree("/stage");
py.FS.mount(py.FS.filesystems.NODEFS, { root: stage }, "/stage");
py.globals.set("WHEELS", py.toPy(wheels));
process.stdout.write(py.runPython(fs.readFileSync(script, "utf8")));
"""

_PYCOMPILE_PY = r"""
import base64, csv, hashlib, importlib, importlib.util, io, json, os, site, sys, zipfile
from importlib._bootstrap_external import _code_to_hash_pyc

TAG = sys.implementation.cache_tag
SITE = site.getsitepackages()[0]
STDLIB = next(p for p in sys.path if p.endswith(".zip"))
DATE = (2020, 1, 1, 0, 0, 0)

def pyc(source, filename):
    code = compile(source, filename, "exec", dont_inherit=True)
    return _code_to_hash_pyc(code, importlib.util.source_hash(source), checked=False)

def record(files, name):
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for n, d in files.items():
        w.writerow([n, "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode(), len(d)])
    w.writerow([name, "", ""])
    return out.getvalue().encode()

def rewrite(path, infos, data, added, record_name=None):
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for i in infos:
            if i.filename != record_name:
                z.writestr(i, data[i.filename])
        extra = dict(added)
        if record_name:
            files = {i.filename: data[i.filename] for i in infos if i.filename != record_name}
            files.update(added)
            extra[record_name] = record(files, record_name)
        for n, d in extra.items():
            zi = zipfile.ZipInfo(n, DATE)
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    os.replace(tmp, path)

def main():
    summary = {"cache_tag": TAG, "wheels": {}}
    for whl in WHEELS:
        path = "/stage/" + whl
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            data = {i.filename: z.read(i) for i in infos}
            z.extractall(SITE)              # installed here too, for the imports below
        rec = next(n for n in data if n.endswith(".dist-info/RECORD"))
        added = {}
        for n, d in data.items():
            if n.endswith(".py"):
                head, _, mod = n.rpartition("/")
                added[(head + "/" if head else "") + f"__pycache__/{mod[:-3]}.{TAG}.pyc"] = pyc(d, f"{SITE}/{n}")
        rewrite(path, infos, data, added, rec)
        summary["wheels"][whl] = len(added)

    importlib.invalidate_caches()
    for m in IMPORTS:
        importlib.import_module(m)
    used = set()
    for m in list(sys.modules.values()):
        origin = getattr(getattr(m, "__spec__", None), "origin", None)
        if isinstance(origin, str) and origin.startswith(STDLIB + "/") and origin.endswith(".py"):
            used.add(origin[len(STDLIB) + 1:])
    path = "/stage/pyodide/python_stdlib.zip"
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        data = {i.filename: z.read(i) for i in infos}
    missing = sorted(used - set(data))
    if missing:
        raise RuntimeError(f"modules imported from the stdlib zip but not in it: {missing[:5]}")
    rewrite(path, infos, data, {n[:-3] + ".pyc": pyc(data[n], f"{STDLIB}/{n}") for n in sorted(used)})
    summary["stdlib_modules"] = len(used)
    return summary

try:
    result = main()
except BaseException:                   # the build shows Python's own traceback
    import traceback
    result = {"error": traceback.format_exc()[-4000:]}
json.dumps(result)
"""


def precompile_bytecode(stage: Path, wheels: list[str], node: str | None = None,
                        imports: tuple[str, ...] = PRECOMPILED_IMPORTS) -> dict | None:
    """Add .pyc files to the staged bundle (see above): the wheels (paths relative to `stage`)
    and python_stdlib.zip, in place. Returns {"cache_tag", "wheels": {name: .pyc count},
    "stdlib_modules"}; None (with a note on stderr) where Node.js is not installed: the bundle
    then works as before, compiling its Python at every page load. imports: the modules whose
    stdlib imports get .pyc files (a module that fails to compile or import fails the build)."""
    node = node or shutil.which("node")
    if node is None:
        _log("node (Node.js) is not installed: the bundle's Python is not precompiled (each page load "
             "compiles it, about 1 s more before ready)")
        return None
    with tempfile.TemporaryDirectory(prefix="webdrift-pyc-") as tmp:
        js = Path(tmp) / "pycompile.mjs"
        js.write_text(_PYCOMPILE_NODE)
        script = Path(tmp) / "pycompile.py"
        script.write_text(f"IMPORTS = {list(imports)!r}\n" + _PYCOMPILE_PY)
        cmd = [node, str(js), str(stage / "pyodide"), str(stage), str(script), *wheels]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BuildError(f"compiling the bundle's Python: running {node} failed ({e})") from e
        if r.returncode != 0:
            raise BuildError(f"compiling the bundle's Python with its Pyodide failed (exit {r.returncode}): "
                             f"{' '.join(cmd)}\n{(r.stderr or r.stdout)[-3000:]}")
        try:
            summary = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError) as e:
            raise BuildError(f"compiling the bundle's Python: unexpected output {r.stdout[-500:]!r}") from e
        if "error" in summary:
            raise BuildError(f"compiling the bundle's Python with its Pyodide failed:\n{summary['error']}")
    for f in [*wheels, "pyodide/python_stdlib.zip"]:     # written through Node's file system: rw for all
        os.chmod(stage / f, 0o644)
    return summary


# -- the bundle -----------------------------------------------------------------------------------

def model_entry(path: Path, name: str, sha256: str | None = None) -> dict:
    """models/default.json's content for a GGUF file served at models/<file name> (`url` relative to
    it and percent-encoded: a `#` or space in the name would break the URL the page resolves)."""
    return {"name": name, "url": quote(path.name), "file": path.name, "size": path.stat().st_size,
            "sha256": sha256 or sha256_file(path)}


def _resolve_model(model: str) -> tuple[Path, str, str | None]:
    """(gguf path, display name, known sha256 or None) for a known model name or a .gguf path."""
    p = Path(model)
    if p.is_file():
        return p.resolve(), p.stem, None
    try:
        from webdrift import hub
    except ImportError as e:
        raise BuildError(f"--model {model}: not a file, and webdrift.hub is unavailable ({e})") from e
    path = Path(hub.pull(model))
    known = getattr(hub, "KNOWN_MODELS", {}).get(model)
    sha = getattr(known, "sha256", None) if known is not None and not isinstance(known, dict) else (
        known.get("sha256") if isinstance(known, dict) else None)
    return path, model, sha


def build(out: Path, model: str | None = None, repo: Path = REPO) -> Path:
    """Build the bundle into `out` (replaced whole, atomically where the OS allows)."""
    t0 = time.time()
    out = Path(out).resolve()
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    pyo = fetch_pyodide(cache)
    jinja2_whl = fetch_jinja2(cache)
    markupsafe_whl = fetch_markupsafe(cache)
    model_info = None
    model_path = None
    if model:
        model_path, model_name, sha = _resolve_model(model)
        model_info = model_entry(model_path, model_name, sha)
    stage = out.parent / f".{out.name}.building-{os.getpid()}"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    try:
        (stage / "pyodide").mkdir()
        for f in PYODIDE_FILES:
            shutil.copy2(pyo / f, stage / "pyodide" / f)
        wheels = stage / "wheels"
        wheels.mkdir()
        shutil.copy2(markupsafe_whl, wheels / markupsafe_whl.name)
        shutil.copy2(jinja2_whl, wheels / jinja2_whl.name)
        webdrift_whl = build_webdrift_wheel(repo, wheels)
        web = Sources.of(repo).web
        for f in WEB_FILES:
            src = web / f
            if not src.is_file():
                raise BuildError(f"{src} is missing (web/{f} of the source checkout)")
            shutil.copy2(src, stage / f)
        if model_info:
            (stage / "models").mkdir()
            dst = stage / "models" / model_path.name
            try:
                os.link(model_path, dst)
            except OSError:
                shutil.copy2(model_path, dst)
            (stage / "models" / "default.json").write_text(json.dumps(model_info, indent=1))
        manifest = {
            "format": BUNDLE_FORMAT,
            "webdrift": webdrift_whl.name.split("-")[1],
            "pyodide": PYODIDE_VERSION,
            "wheels": [f"wheels/{w.name}" for w in (markupsafe_whl, jinja2_whl, webdrift_whl)],
            "model": model_info,
            "fingerprint": fingerprint(repo, model_info),
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        manifest["bytecode"] = precompile_bytecode(stage, manifest["wheels"])
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=1))
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
            os.replace(stage, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    _log(f"bundle ready in {out} ({time.time() - t0:.1f} s)")
    return out


def bundle_is_current(out: Path, repo: Path = REPO) -> bool:
    """True if `out` was built from the current inputs (same fingerprint, all files present)."""
    try:
        m = json.loads((Path(out) / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if m.get("format") != BUNDLE_FORMAT or m.get("fingerprint") != fingerprint(repo, m.get("model")):
        return False
    need = [f"pyodide/{f}" for f in PYODIDE_FILES] + list(WEB_FILES) + m.get("wheels", [])
    return all((Path(out) / f).is_file() for f in need)


def ensure_bundle(out: Path, repo: Path = REPO) -> Path:
    """Build `out` unless it is current (used by `webdrift serve`)."""
    if not bundle_is_current(out, repo):
        build(out, None, repo)
    return Path(out).resolve()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m build_wasm", description="Assemble webdrift's browser bundle")
    ap.add_argument("--out", default=str(default_out()), help="output folder (default: %(default)s)")
    ap.add_argument("--model", default=None,
                    help="also pack a model: a known name (webdrift.hub) or a .gguf path -> models/")
    ap.add_argument("--if-needed", action="store_true", help="skip the build when the bundle is current")
    args = ap.parse_args(argv)
    try:
        if args.if_needed and not args.model and bundle_is_current(Path(args.out)):
            _log(f"{args.out} is current")
        else:
            build(Path(args.out), args.model)
    except BuildError as e:
        sys.stderr.write(f"build_wasm: error: {e}\n")
        return 2
    print(Path(args.out).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
