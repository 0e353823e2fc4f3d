// Evicts the GPU's last-level cache between the autotuner's timed runs (kernels/autotune.py):
// writes a buffer larger than any L2 with a grid-stride loop, so the kernel timed next reads its
// weights from memory, as a decode step does (every other layer's weights pass through the
// cache between two reads of one weight).
{{BUF_DECL}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let stride = n.x * 256u;
  for (var i = g.x; i < arrayLength(&buf); i += stride) { buf[i] = vec4<u32>(i); }
}
