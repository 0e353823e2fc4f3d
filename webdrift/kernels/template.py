"""Loads WGSL kernel templates from wgsl/ and specialises them.

Template syntax (deliberately tiny, no jinja2 so kernels need nothing beyond the stdlib):
  {{NAME}}                   replaced by str(defines[NAME])
  #if NAME / #elif NAME / #else / #endif   on their own lines; NAME is truthy in defines
  (`#if !NAME` negates). Nesting is allowed.
  #include NAME               on its own line: the text of wgsl/NAME.wgsl (shared pieces)
  #repeat NAME / #endrepeat    the lines between, int(defines[NAME]) times, `{{#}}` in them
                               replaced by the copy's index (0, 1, ...); not nested. Unrolled
                               per-column statements with named variables (arrays indexed in
                               loops can end up in local memory)
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from functools import cache
from pathlib import Path

from ..errors import GPUError

_SUB = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def _template_dirs() -> list:
    """Where the templates may be: package data webdrift/wgsl, the source tree's wgsl/, then
    importlib.resources' view of the package."""
    here = Path(__file__).resolve().parent.parent
    dirs = [here / "wgsl", here.parent / "wgsl"]
    with contextlib.suppress(ImportError):      # webdrift.wgsl is not a package here
        from importlib.resources import files
        dirs.append(files("webdrift.wgsl"))
    return dirs


@cache
def load_template(name: str) -> str:
    """Text of wgsl/<name>.wgsl (installed as package data webdrift/wgsl, or the source tree)."""
    for d in _template_dirs():
        try:
            p = d / f"{name}.wgsl"
            if p.is_file():
                return p.read_text()
        except OSError:
            continue
    raise GPUError(f"kernel template wgsl/{name}.wgsl not found")


@cache
def kernels_id() -> str:
    """A short hash of every kernel template (wgsl/*.wgsl) and of the code that specialises and
    tunes them (webdrift/kernels/*.py): part of each cached kernel choice's key (autotune.py), so
    choices measured on other kernels (another webdrift version, an edited template) are measured
    again instead of applied to these. "0" where the files cannot be listed."""
    h = hashlib.sha256()
    try:
        tdir = next((d for d in _template_dirs() if d.is_dir()), None)
        files = sorted(Path(__file__).resolve().parent.glob("*.py"))
        files += sorted((p for p in tdir.iterdir() if p.name.endswith(".wgsl")), key=lambda p: p.name) if tdir else []
        if not files:
            return "0"
        for p in files:
            h.update(p.name.encode())
            h.update(p.read_bytes())
    except OSError:
        return "0"
    return h.hexdigest()[:12]


def _truthy(cond: str, defines: dict) -> bool:
    cond = cond.strip()
    if cond.startswith("!"):
        return not _truthy(cond[1:], defines)
    return bool(defines.get(cond))


def _expand_repeats(text: str, defines: dict) -> str:
    out: list[str] = []
    body: list[str] | None = None
    n = 0
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#repeat "):
            if body is not None:
                raise GPUError("#repeat blocks do not nest in kernel templates")
            name = s[8:].strip()
            if name not in defines:
                raise GPUError(f"kernel template repeats {name} times but it was not defined")
            body, n = [], int(defines[name])
        elif s == "#endrepeat":
            if body is None:
                raise GPUError("#endrepeat without #repeat in kernel template")
            out += [b.replace("{{#}}", str(i)) for i in range(n) for b in body]
            body = None
        elif body is not None:
            body.append(line)
        else:
            out.append(line)
    if body is not None:
        raise GPUError("unclosed #repeat in kernel template")
    return "\n".join(out)


def render(text: str, defines: dict) -> str:
    text = _expand_repeats(text, defines)
    out: list[str] = []
    stack: list[list[bool]] = []  # [this branch active, some branch taken, parent active]
    active = True
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#if "):
            taken = active and _truthy(s[4:], defines)
            stack.append([taken, taken, active])
            active = taken
        elif s.startswith("#elif "):
            top = stack[-1]
            take = top[2] and not top[1] and _truthy(s[6:], defines)
            top[0] = take
            top[1] = top[1] or take
            active = take
        elif s == "#else":
            top = stack[-1]
            top[0] = top[2] and not top[1]
            top[1] = True
            active = top[0]
        elif s == "#endif":
            stack.pop()
            active = stack[-1][0] if stack else True
        elif active:
            out.append(line)
    if stack:
        raise GPUError("unbalanced #if in kernel template")

    def sub(m):
        k = m.group(1)
        if k not in defines:
            raise GPUError(f"kernel template needs {{{{{k}}}}} but it was not defined")
        return str(defines[k])
    return _SUB.sub(sub, "\n".join(out)) + "\n"


def _expand_includes(text: str, depth: int = 0) -> str:
    if depth > 4:
        raise GPUError("kernel template #include nests too deeply")
    out = []
    for line in text.splitlines():
        s = line.strip()
        out.append(_expand_includes(load_template(s[9:].strip()), depth + 1) if s.startswith("#include ") else line)
    return "\n".join(out)


def specialise(name: str, defines: dict) -> str:
    return render(_expand_includes(load_template(name)), defines)
