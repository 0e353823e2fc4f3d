"""The activation accessors (webdrift/tensor accessor_wgsl) read what numpy says they hold: the
vec4 read-only view (vec4_reads, whole-vec4 rows, column views included) and the scalar path it
falls back to, on a small kernel that copies every slice and every channel out."""

import numpy as np
import pytest

from tests.gpu_util import device, upload
from webdrift.gpu.base import Dispatch
from webdrift.kernels.bindings import Bindings
from webdrift.tensor import TensorDesc, linear_vec4


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
    pipe = dev.create_pipeline(wgsl, b.kinds, label="accessor_test")
    full = TensorDesc("x", desc.c_total or desc.c, w)
    xb = upload(full, arr)
    o4 = dev.create_buffer(16 * w * s, label="o4")
    o1 = dev.create_buffer(4 * w * c, label="o1")
    bg = dev.create_bind_group(pipe, b.buffers({"x": xb, "o4": o4, "o1": o1}))
    dev.submit([Dispatch(pipe, bg, (-(-max(s, c) // 64), w, 1), "accessor_test")])
    got4 = np.frombuffer(dev.read_buffer_sync(o4), np.float32)[:w * 4 * s].reshape(w, 4 * s)
    got1 = np.frombuffer(dev.read_buffer_sync(o1), np.float32)[:w * c].reshape(w, c)
    return got4, got1, wgsl


@pytest.mark.parametrize("c, c0, c_total", [(16, 0, 0), (8, 4, 16), (12, 0, 20), (6, 0, 0), (8, 2, 12)])
@pytest.mark.parametrize("vec4_reads", [False, True])
def test_linear_reads(c, c0, c_total, vec4_reads):
    rows = 3
    full = np.random.default_rng(c + c0).normal(size=(rows, c_total or c)).astype(np.float32)
    desc = TensorDesc("x", c, rows) if not c_total else TensorDesc("x", c_total, rows).columns(c0, c)
    got4, got1, wgsl = _read_all(desc, full, vec4_reads)
    want = full[:, c0:c0 + c]
    np.testing.assert_array_equal(got1, want)
    padded = np.zeros((rows, 4 * desc.s), np.float32)
    padded[:, :c] = want
    np.testing.assert_array_equal(got4, padded)    # padding channels of a partial slice read 0
    vec4 = vec4_reads and linear_vec4(desc)
    assert ("x_buf: array<vec4<f32>>" in wgsl) == vec4
    assert vec4 == (vec4_reads and c % 4 == 0 and c0 % 4 == 0 and (c_total or c) % 4 == 0)
    assert ("fn x_write1" in wgsl) == (not vec4)   # the vec4 view has no write accessors
