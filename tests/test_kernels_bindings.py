"""The binding allocator (webdrift/kernels/bindings.py): bindings numbered once, in declaration
order, from the same list that gives the pipeline its binding kinds; bind groups built by name.
No template in wgsl/ writes a binding number itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.gpu_util import device, f32_buffer, make_weight
from webdrift.gpu.base import READ, RW, UNI
from webdrift.kernels.bindings import Bindings
from webdrift.kernels.norm import RMSNormKernel
from webdrift.tensor import TensorDesc

WGSL = Path(__file__).resolve().parent.parent / "wgsl"


def test_no_binding_number_in_templates():
    files = sorted(WGSL.glob("*.wgsl"))
    assert files
    found = [f"{p.name}:{n}" for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"@binding\s*\(\s*\d", line)]
    assert not found, f"binding numbers written in templates (declare them through Bindings): {found}"


def test_numbers_kinds_and_declarations_come_from_one_list():
    import numpy as np
    w, _ = make_weight(np.zeros((4, 32), np.float32), "q4")
    b = Bindings()
    decls = [b.step(), b.tensor("x", TensorDesc("x", 32, 2)), b.weight("w", w, lambda n, k: w.wgsl(n, k)),
             b.array("kc", "array<vec4<f32>>", "(2, 8, 4)", writable=True), b.array("nw", "array<f32>", "(32)")]
    assert b.names == ("step", "x", "w", "kc", "nw")
    assert b.kinds == (UNI, RW, READ, READ, RW, READ)
    numbers = [[int(n) for n in re.findall(r"@binding\((\d+)\)", d)] for d in decls]
    assert numbers == [[0], [1], [2, 3], [4], [5]]
    assert "var<storage, read_write> kc: array<vec4<f32>>;" in decls[3] and "// (2, 8, 4)" in decls[3]
    with pytest.raises(ValueError, match="declared twice"):
        b.array("kc", "array<f32>", "(1)")
    with pytest.raises(ValueError, match="binds"):    # a declaration must use exactly its numbers
        b.declare("bad", (READ,), lambda n: f"@group(0) @binding({n + 1}) var<storage, read> bad: array<f32>;\n")


def test_buffers_by_name():
    b = Bindings()
    b.step()
    b.declare("w", (READ, READ), lambda n: f"@binding({n}) @binding({n + 1})")
    b.array("out", "array<f32>", "(4)", writable=True)
    s, w0, w1, o = object(), object(), object(), object()
    assert b.buffers({"out": (o, 0, 16), "w": [w0, w1], "step": s}) == [s, w0, w1, (o, 0, 16)]
    with pytest.raises(ValueError, match=r"missing \['out'\]; unknown \['y'\]"):
        b.buffers({"step": s, "w": [w0, w1], "y": o})
    with pytest.raises(ValueError, match="'w' takes 2 buffers, got 1"):
        b.buffers({"step": s, "w": w0, "out": o})


def test_kernel_bind_names_its_bindings():
    dev = device()
    xd, od = TensorDesc("x", 8, 2), TensorDesc("out", 8, 2)
    k = RMSNormKernel(dev, xd, od, 1e-5, add_input=TensorDesc("r", 8, 2))
    assert k.binding_names == ("step", "x", "out", "w", "r")
    assert k.pipeline.bindings == (UNI, RW, RW, READ, RW)
    bufs = {"x": f32_buffer([0.0] * 16), "out": f32_buffer([0.0] * 16), "w": f32_buffer([1.0] * 8)}
    with pytest.raises(ValueError, match=r"missing \['step', 'r'\]"):
        k.bind(dev, bufs)
    from tests.gpu_util import step_buffer
    assert k.bind(dev, {"step": step_buffer(), "r": f32_buffer([0.0] * 16), **bufs}) is not None
