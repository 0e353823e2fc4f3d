"""The package's import layering, read statically (ast over every module under webdrift/, relative
imports resolved, imports inside functions included):

  (a) tools above the core: no module outside webdrift/tools/ imports webdrift.tools (the one
      exception, `python -m webdrift`, is listed below with its reason);
  (b) one GPU boundary: nothing under webdrift/ but webdrift/gpu/ imports wgpu, wgpudawn, js or pyodide;
  (c) no numpy where the browser runs: the browser installs every module but tools/ (see
      build_wasm's DESKTOP_ONLY) and has no numpy. A module "needs numpy" when it imports numpy
      at module level, or at module level imports a module that needs it. Outside tools/ only the
      modules in NUMPY_MODULES may need numpy; a function-level import of numpy (or of a module
      that needs it) is allowed only in the (module, function) pairs of NUMPY_FUNCTIONS, each a
      function the browser never calls. That cannot be proven statically, so each is listed
      with its reason: a new one fails here until someone has looked.

The checker itself is tested on planted violations, so a broken checker cannot pass silently.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "webdrift"

# (a) modules outside tools/ that may import webdrift.tools
TOOLS_IMPORTERS = {
    "webdrift.__main__": "`python -m webdrift` is the CLI's entry point; the browser wheel leaves it out",
}
# (b) the only package whose modules may import the GPU APIs
GPU_PACKAGE = "webdrift.gpu"
GPU_APIS = ("wgpu", "wgpudawn", "js", "pyodide")
# (c) modules outside tools/ that may need numpy at import time
NUMPY_MODULES = {
    "webdrift.weights.quant": "GGML block formats in numpy (conversion, reference checks, tests); the "
                              "run-time path converts on the GPU and never imports it",
}
# (c) functions outside tools/ that may import numpy (or a module that needs it) when called
NUMPY_FUNCTIONS = {
    ("webdrift.runtime.engine", "Engine.logits"): "teacher-forced logits as a numpy array: a desktop and "
                                                  "test API; the browser API never calls it",
    ("webdrift.weights.source", "SourceTensor.to_numpy"): "host dequantization (webdrift.weights.quant) "
                                                          "for reference checks on the desktop",
}


@dataclass(frozen=True)
class Import:
    importer: str          # dotted module name
    target: str            # dotted name imported (a module, or module.attribute for `from m import a`)
    line: int
    function: str | None   # qualified name of the enclosing function; None: runs at import time

    def where(self) -> str:
        return f"{self.importer}:{self.line}" + (f" (in {self.function})" if self.function else "")


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute name of `from <level dots><module> import ...` written in `importer`."""
    parts = importer.split(".") if is_package else importer.split(".")[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


class _Collector(ast.NodeVisitor):
    def __init__(self, importer: str, is_package: bool):
        self.importer, self.is_package = importer, is_package
        self.scope: list[tuple[str, bool]] = []     # (name, is_function)
        self.found: list[Import] = []

    def _function(self) -> str | None:
        if not any(is_fn for _, is_fn in self.scope):
            return None       # module or class body: runs when the module is imported
        return ".".join(name for name, _ in self.scope)

    def _add(self, target: str, node: ast.AST) -> None:
        self.found.append(Import(self.importer, target, node.lineno, self._function()))

    def _scoped(self, node, is_function: bool):
        self.scope.append((node.name, is_function))
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node):
        self._scoped(node, True)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self._scoped(node, False)

    def visit_Import(self, node):
        for a in node.names:
            self._add(a.name, node)

    def visit_ImportFrom(self, node):
        base = _resolve(self.importer, self.is_package, node.level, node.module) if node.level else node.module
        self._add(base, node)
        for a in node.names:
            if a.name != "*":
                self._add(f"{base}.{a.name}", node)     # `from pkg import submodule` imports pkg.submodule

    def visit_Call(self, node):
        # importlib.import_module("x") / __import__("x") with a literal absolute name
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."):
            self._add(node.args[0].value, node)
        self.generic_visit(node)


def imports_of(module: str, source: str, is_package: bool = False) -> list[Import]:
    c = _Collector(module, is_package)
    c.visit(ast.parse(source))
    return c.found


def package_sources() -> dict[str, tuple[str, bool]]:
    """{dotted module name: (source, is_package)} for every module under webdrift/."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(REPO).with_suffix("").parts
        is_pkg = rel[-1] == "__init__"
        out[".".join(rel[:-1] if is_pkg else rel)] = (p.read_text(encoding="utf-8"), is_pkg)
    return out


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _root(name: str) -> str:
    return name.split(".")[0]


def violations(sources: dict[str, tuple[str, bool]], tools_importers=None, numpy_modules=None,
               numpy_functions=None) -> list[str]:
    """Every import in `sources` that breaks a rule, as readable lines (empty: layering holds)."""
    tools_importers = TOOLS_IMPORTERS if tools_importers is None else tools_importers
    numpy_modules = NUMPY_MODULES if numpy_modules is None else numpy_modules
    numpy_functions = NUMPY_FUNCTIONS if numpy_functions is None else numpy_functions
    found = {m: imports_of(m, src, pkg) for m, (src, pkg) in sources.items()}
    out, seen = [], set()

    def report(rule: str, i: Import, text: str) -> None:       # once per import statement and rule
        if (rule, i.importer, i.line) not in seen:
            seen.add((rule, i.importer, i.line))
            out.append(f"({rule}) {i.where()} imports {i.target}: {text}")

    for m, imps in found.items():
        for i in imps:
            if _within(i.target, "webdrift.tools") and not _within(m, "webdrift.tools") and m not in tools_importers:
                report("a", i, "the core must not import the tools")
            if _root(i.target) in GPU_APIS and not _within(m, GPU_PACKAGE):
                report("b", i, f"only {GPU_PACKAGE} may import {', '.join(GPU_APIS)}")

    # (c) modules that need numpy when imported: numpy at module level, then by module-level imports
    needs = {m: f"imports numpy (line {i.line})" for m, imps in found.items() for i in imps
             if i.function is None and _root(i.target) == "numpy"}
    changed = True
    while changed:
        changed = False
        for m, imps in found.items():
            if m in needs:
                continue
            for i in imps:
                if i.function is None and i.target in needs and i.target != m:
                    needs[m] = f"imports {i.target} (line {i.line}), which {needs[i.target]}"
                    changed = True
                    break
    for m, why in sorted(needs.items()):
        if not _within(m, "webdrift.tools") and m not in numpy_modules:
            out.append(f"(c) {m} needs numpy at import time: it {why}")
    used = set()
    for m, imps in found.items():
        if _within(m, "webdrift.tools"):
            continue
        for i in imps:
            if i.function is not None and (_root(i.target) == "numpy" or i.target in needs):
                if (m, i.function) in numpy_functions:
                    used.add((m, i.function))
                else:
                    report("c", i, "numpy in a function the browser may call (not in NUMPY_FUNCTIONS)")
    for m, fn in sorted(set(numpy_functions) - used):      # an allowance nobody uses is a hole
        out.append(f"(c) NUMPY_FUNCTIONS lists {m} {fn}, which does not import numpy (any more): drop it")
    for m in sorted(set(numpy_modules) - set(needs)):
        out.append(f"(c) NUMPY_MODULES lists {m}, which does not need numpy (any more): drop it")
    return out


# -- the package ----------------------------------------------------------------------------------

def test_package_layering_holds():
    sources = package_sources()
    assert "webdrift.runtime.loading" in sources and "webdrift.tools.cli" in sources   # read the real tree
    bad = violations(sources)
    assert not bad, "import layering broken:\n" + "\n".join(bad)


def test_the_browser_wheel_leaves_out_exactly_the_tools():
    """What the layering calls "the browser's modules" is what build_wasm ships: all but tools/ and
    the `python -m webdrift` entry point that imports them."""
    from build_wasm.build import desktop_only
    shipped = {m for m in package_sources() if not desktop_only(m.replace(".", "/") + ".py")
               and not desktop_only(m.replace(".", "/") + "/")}
    assert not any(_within(m, "webdrift.tools") for m in shipped)
    assert set(TOOLS_IMPORTERS) <= set(package_sources()) - shipped
    assert {"webdrift.browser_api", "webdrift.runtime.loading", "webdrift.gpu.browser"} <= shipped


# -- the checker, on planted violations ------------------------------------------------------------

PLANTED = {
    "webdrift": ("", True),
    "webdrift.runtime": ("", True),
    "webdrift.runtime.bad": (('"""x"""\nfrom ..tools import cli\nimport wgpu\n\n\ndef f():\n    import numpy as np\n'
                              '    from pyodide.ffi import to_js\n'), False),
    "webdrift.runtime.sneaky": (("import importlib\n\n\nclass K:\n    import numpy\n\n\ndef g():\n"
                                 "    importlib.import_module('webdrift.tools.bench')\n"), False),
    "webdrift.weights": ("", True),
    "webdrift.weights.heavy": ("import numpy as np\n", False),
    "webdrift.weights.reader": ("from . import heavy\n", False),
    "webdrift.weights.ok": ("def allowed():\n    from .heavy import np\n\n\ndef other():\n    from . import heavy\n",
                            False),
    "webdrift.gpu": ("", True),
    "webdrift.gpu.native": ("import wgpu\n", False),
    "webdrift.tools": ("", True),
    "webdrift.tools.bench": ("import numpy\nimport torch\nfrom ..runtime import bad\n\n\ndef h():\n    import js\n",
                             False),
    "webdrift.__main__": ("from .tools.cli import main\n", False),
}


def test_checker_finds_planted_violations():
    bad = violations(PLANTED, numpy_modules={"webdrift.weights.heavy": "test"},
                     numpy_functions={("webdrift.weights.ok", "allowed"): "test"})
    text = "\n".join(bad)
    assert "(a) webdrift.runtime.bad:2 imports webdrift.tools" in text                    # relative, resolved
    assert "(a) webdrift.runtime.sneaky:9 (in g) imports webdrift.tools.bench" in text     # import_module
    assert "(c) webdrift.runtime.sneaky:9 (in g) imports webdrift.tools.bench" in text     # which needs numpy
    assert "(b) webdrift.runtime.bad:3 imports wgpu" in text
    assert "(b) webdrift.runtime.bad:8 (in f) imports pyodide.ffi" in text                # inside a function
    assert "(b) webdrift.tools.bench:7 (in h) imports js" in text                         # tools too
    assert "(c) webdrift.runtime.sneaky needs numpy at import time" in text               # a class body runs
    assert "(c) webdrift.weights.reader needs numpy at import time: it imports webdrift.weights.heavy" in text
    assert "(c) webdrift.runtime.bad:7 (in f) imports numpy" in text
    assert "(c) webdrift.weights.ok:6 (in other) imports webdrift.weights.heavy" in text  # a module that needs it
    assert "(c) webdrift.runtime.bad needs numpy" not in text                             # only inside f
    assert "webdrift.weights.ok:2" not in text                                            # the listed function
    assert not [b for b in bad if b.startswith("(a) webdrift.__main__")]                  # the listed importer
    assert not [b for b in bad if "webdrift.gpu.native" in b or "webdrift.weights.heavy needs" in b]
    assert not [b for b in bad if b.startswith(("(a) webdrift.tools", "(c) webdrift.tools"))]
    assert len(bad) == 10, text                                                           # nothing else


def test_checker_flags_stale_allowances():
    bad = violations({"webdrift.x": ("import json\n", False)}, numpy_modules={"webdrift.x": "was numpy"},
                     numpy_functions={("webdrift.x", "f"): "was numpy", ("webdrift.gone", "g"): "removed"})
    assert bad == ["(c) NUMPY_FUNCTIONS lists webdrift.gone g, which does not import numpy (any more): drop it",
                   "(c) NUMPY_FUNCTIONS lists webdrift.x f, which does not import numpy (any more): drop it",
                   "(c) NUMPY_MODULES lists webdrift.x, which does not need numpy (any more): drop it"]
