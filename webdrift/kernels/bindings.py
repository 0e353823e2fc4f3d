"""The binding allocator: a kernel declares its bindings once, in order, by name; this numbers
them, writes each one's WGSL declaration (what the template's `{{..._DECL}}` placeholders
receive), gives the pipeline its binding kinds from the same list, and later turns a
{name: buffer} dict into the bind group's buffer list. No binding number is written anywhere
else: the templates in wgsl/ hold none (tests/test_kernels_bindings.py checks).

    b = Bindings()
    d = {"STEP_DECL": b.step(),                       # the Step uniform, "step"
         "X_DECL": b.tensor("x", x_desc),             # an activation through its generated accessor
         "W_DECL": b.weight("w", w, w.wgsl),          # a weight: one binding per buffer
         "KC_DECL": b.array("kc", "array<f32>", "(KVH, CAP, DH)", writable=True)}
    kernel.bind(dev, {"step": step_buf, "x": (arena, off, size), "w": w.buffers, "kc": k_cache})

A name's value is a Buffer, a (Buffer, offset, size) range, or a list spreading over the name's
several bindings (a q4 / q8 weight's data and scales). A binding's name is its role in the
kernel; the WGSL identifier it declares is the same unless `var` says otherwise.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..gpu.base import READ, RW, UNI
from ..tensor import TensorDesc, accessor_wgsl
from .step import STEP_STRUCT

_BINDING = re.compile(r"@binding\((\d+)\)")


@dataclass(frozen=True)
class Binding:
    name: str                 # the kernel's name for it (a key of bind()'s dict)
    first: int                # its first @binding number
    kinds: tuple[str, ...]    # one per @binding (READ / RW / UNI): a weight has one per buffer


class Bindings:
    """The bindings of one kernel, numbered in declaration order from 0 in @group(0)."""

    def __init__(self):
        self._list: list[Binding] = []

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self._list)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The pipeline layout: the kind of @binding(0), (1), ..."""
        return tuple(k for b in self._list for k in b.kinds)

    # -- declaring ---------------------------------------------------------------------------
    def declare(self, name: str, kinds: tuple[str, ...], emit: Callable[[int], str]) -> str:
        """Bindings first .. first + len(kinds) - 1 under one name; emit(first) is their WGSL,
        which must declare exactly those numbers."""
        if name in self.names:
            raise ValueError(f"binding {name!r} declared twice")
        first = len(self.kinds)
        text = emit(first)
        got = [int(n) for n in _BINDING.findall(text)]
        if got != list(range(first, first + len(kinds))):
            raise ValueError(f"the declaration of {name!r} binds {got}, not {first} .. {first + len(kinds) - 1}")
        self._list.append(Binding(name, first, tuple(kinds)))
        return text

    def step(self) -> str:
        """The per-step uniform (kernels/step.py), WGSL `step`."""
        return self.declare("step", (UNI,), lambda n: STEP_STRUCT + f"@group(0) @binding({n}) var<uniform> step: Step;\n")

    def tensor(self, name: str, t: TensorDesc, var: str | None = None, vec4_reads: bool = False) -> str:
        """An activation through its generated accessor (`{var}_read`, `{var}_write`, ...). Bound
        read_write: activations share the arena buffer, and WebGPU forbids read-only and
        writable views of one buffer in one dispatch. vec4_reads: the kernel only reads it
        (tensor.accessor_wgsl: 16-byte loads where its rows allow)."""
        return self.declare(name, (RW,), lambda n: accessor_wgsl(t, n, var or name, vec4_reads=vec4_reads))

    def weight(self, name: str, w, emit: Callable[[str, int], str], writable: bool = False) -> str:
        """A GPUWeight (one binding per buffer), declared by emit(name, first): w.wgsl,
        weights.wide_accessor_wgsl or linear_blk.weight_decl, bound to w.fmt and w's shape."""
        return self.declare(name, (RW if writable else READ,) * w.n_bindings, lambda n: emit(name, n))

    def array(self, name: str, wgsl_type: str, shape: str, writable: bool = False, var: str | None = None) -> str:
        """A raw storage array, `var<storage, read|read_write> {var}: {wgsl_type}`, commented with
        its shape."""
        mode = "read_write" if writable else "read"
        return self.declare(name, (RW if writable else READ,),
                            lambda n: f"@group(0) @binding({n}) var<storage, {mode}> {var or name}: {wgsl_type};"
                                      f"   // {shape}\n")

    # -- binding -----------------------------------------------------------------------------
    def buffers(self, values: dict, label: str = "") -> list:
        """The bind group's buffer list (in @binding order) from {name: buffer | (buffer,
        offset, size) | [buffers]}; ValueError naming every missing or unknown name."""
        missing = [b.name for b in self._list if b.name not in values]
        unknown = [n for n in values if n not in self.names]
        if missing or unknown:
            raise ValueError(f"kernel {label!r} binds {list(self.names)}: "
                             + "; ".join(s for s in (f"missing {missing}" if missing else "",
                                                     f"unknown {unknown}" if unknown else "") if s))
        out = []
        for b in self._list:
            v = values[b.name]
            vs = list(v) if isinstance(v, list) else [v]
            if len(vs) != len(b.kinds):
                raise ValueError(f"kernel {label!r}: {b.name!r} takes {len(b.kinds)} buffers, got {len(vs)}")
            out += vs
        return out
