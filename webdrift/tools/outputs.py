"""The files a tool writes after minutes of work (--json, --markdown, --plot, --trace, --out):
checked before the work starts, so a path that cannot be written is a clear error at once, not a
traceback at the end of a long run.
Must not: be imported by the core.
"""

from __future__ import annotations

import os

from ..errors import InvalidArgumentError, shown


def check_writable(path, option: str, make_dirs: bool = False) -> None:
    """`option PATH` names a file this process can write (its folder made first where make_dirs,
    as the writer does); else an InvalidArgumentError naming the option, the path and why. A file
    that did not exist is not left behind."""
    if path is None or path == "-":
        return
    path = os.fspath(path)
    if os.path.isdir(path):
        raise InvalidArgumentError(f"{option} {shown(path)}: is a folder")
    existed = os.path.exists(path)
    try:
        d = os.path.dirname(path)
        if make_dirs and d:
            os.makedirs(d, exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as e:
        raise InvalidArgumentError(f"{option} {shown(path)}: cannot write it ({e.strerror or e})") from None
    if not existed:
        os.remove(path)
