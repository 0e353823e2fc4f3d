"""The activation accessors (webdrift/tensor accessor_wgsl) read and write what numpy says, in
both storages: the vec4 read-only view (vec4_reads: whole-vec4 rows, column views included), the
f32-word declaration every writable tensor gets (one word a store), on small kernels that copy
every slice and every channel out or write them."""

import numpy as np
import pytest

from tests.gpu_util import device, physical_index, upload
from webdrift.gpu.base import Dispatch
from webdrift.kernels.bindings import Bindings
from webdrift.tensor import TensorDesc, host_index, linear_vec4


def _run(b: Bindings, wgsl: str, buffers: dict, workgroups: tuple[int, int, int]) -> None:
    """Compile `wgsl` (the declarations of `b` and an entry point) and dispatch it once."""
    dev = device()
    pipe = dev.create_pipeline(wgsl, b.kinds, label="accessor_test")
    dev.submit([Dispatch(pipe, dev.create_bind_group(pipe, b.buffers(buffers)), workgroups, "accessor_test")])


def _read_all(desc: TensorDesc, arr: np.ndarray, vec4_reads: bool) -> tuple[np.ndarray, np.ndarray, str]:
    """(x_read of every row's slices as (W, 4 S), x_read1 of every channel as (W, C), the WGSL)."""
    dev = device()
    b = Bindings()
    decl = b.tensor("x", desc, vec4_reads=vec4_reads)
    decl += b.array("o4", "array<vec4<f32>>", "(W, S) x_read", writable=True)
    decl += b.array("o1", "array<f32>", "(W, C) x_read1", writable=True)
    w, s, c = desc.w, desc.s, desc.c
    wgsl = decl + f"""
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
  let r = g.y;
  if (g.x < {s}u) {{ o4[r * {s}u + g.x] = x_read(0u, r, 0u, g.x); }}
  if (g.x < {c}u) {{ o1[r * {c}u + g.x] = x_read1(0u, r, 0u, g.x); }}
}}
"""
    xb = upload(TensorDesc("x", desc.c_total or desc.c, w, layout=desc.layout), arr)
    o4 = dev.create_buffer(16 * w * s, label="o4")
    o1 = dev.create_buffer(4 * w * c, label="o1")
    _run(b, wgsl, {"x": xb, "o4": o4, "o1": o1}, (-(-max(s, c) // 64), w, 1))
    got4 = np.frombuffer(dev.read_buffer_sync(o4), np.float32)[:w * 4 * s].reshape(w, 4 * s)
    got1 = np.frombuffer(dev.read_buffer_sync(o1), np.float32)[:w * c].reshape(w, c)
    return got4, got1, wgsl


@pytest.mark.parametrize("layout, c, c0, c_total", [("linear", 16, 0, 0), ("linear", 8, 4, 16), ("linear", 12, 0, 20),
                                                    ("linear", 6, 0, 0), ("linear", 8, 2, 12), ("sliced", 16, 0, 0),
                                                    ("sliced", 6, 0, 0), ("sliced", 8, 4, 16)])
@pytest.mark.parametrize("vec4_reads", [False, True])
def test_reads(layout, c, c0, c_total, vec4_reads):
    rows = 3
    full = np.random.default_rng(c + c0).normal(size=(rows, c_total or c)).astype(np.float32)
    desc = TensorDesc("x", c, rows, layout=layout)
    if c_total:
        desc = TensorDesc("x", c_total, rows, layout=layout).columns(c0, c)
    got4, got1, wgsl = _read_all(desc, full, vec4_reads)
    want = full[:, c0:c0 + c]
    np.testing.assert_array_equal(got1, want)
    padded = np.zeros((rows, 4 * desc.s), np.float32)
    padded[:, :c] = want
    np.testing.assert_array_equal(got4, padded)    # padding channels of a partial slice read 0
    vec4 = vec4_reads and (layout == "sliced" or linear_vec4(desc))
    assert ("x_buf: array<vec4<f32>>" in wgsl) == vec4
    assert ("x_buf: array<f32>" in wgsl) == (not vec4)
    if layout == "linear":
        assert vec4 == (vec4_reads and c % 4 == 0 and c0 % 4 == 0 and (c_total or c) % 4 == 0)
    assert ("fn x_write1" in wgsl) == (not vec4)   # the vec4 view has no write accessors


@pytest.mark.parametrize("layout", ["linear", "sliced"])
@pytest.mark.parametrize("c", [12, 6])
def test_writes(layout, c):
    """Each invocation stores one channel (write1) of one row, or one slice (write: padding
    channels of a partial slice stored as zero); every other word keeps its value."""
    dev = device()
    rows = 3
    desc = TensorDesc("y", c, rows, layout=layout)
    b = Bindings()
    decl = b.tensor("y", desc)
    s = desc.s
    wgsl = decl + f"""
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
  let r = g.y;
  if (r == 1u) {{
    if (g.x < {s}u) {{ y_write(0u, r, 0u, g.x, vec4<f32>(f32(4u * g.x), f32(4u * g.x + 1u), f32(4u * g.x + 2u), f32(4u * g.x + 3u)) + 100.0); }}
  }} else if (g.x < {c}u) {{
    y_write1(0u, r, 0u, g.x, f32(r * 1000u + g.x));
  }}
}}
"""
    assert "y_buf: array<f32>" in wgsl
    words = desc.nbytes // 4
    yb = dev.create_buffer(desc.nbytes, label="y")
    dev.write_buffer(yb, np.full(words, -7.0, np.float32))    # padding words too
    _run(b, wgsl, {"y": yb}, (1, rows, 1))
    got = np.frombuffer(dev.read_buffer_sync(yb), np.float32)[:words]
    want = np.full(words, -7.0, np.float32)
    idx = physical_index(desc)[0, 0]                 # (W, C) word of each logical element
    want[idx[0]] = np.arange(c)
    want[idx[2]] = 2000 + np.arange(c)
    want[idx[1]] = 100 + np.arange(c)
    if layout == "sliced":   # row 1's slice padding words: stored as zero
        want[[host_index(desc, 0, 1, 0, k) for k in range(c, 4 * s)]] = 0.0
    np.testing.assert_array_equal(got, want)
