// Evicts the GPU's last-level cache between the autotuner's timed runs (kernels/autotune.py):
// reads a buffer larger than any L2 with a grid-stride loop, so the kernel timed next reads its
// weights from memory, as a decode step does (every other layer's weights pass through the
// cache between two reads of one weight). Reads, not writes: written lines would stay dirty in
// the cache and be written back during the timed kernel. The loads are kept by a store that
// only a marker value (never in the zero-filled scratch buffer) triggers.
// `sync` is the timed kernel's output buffer, bound read_write and never written: two dispatches
// that bind one buffer writable are ordered (WebGPU's usage rules put a barrier between them), so
// the timed kernel starts after the flush ends and the next flush after the kernel. Without it
// nothing orders them (Dawn and wgpu-native on an H100 ran them in order anyway: the async
// tuner's figures came out the same with and without, 2026-11-24).
{{BUF_DECL}}
{{SYNC_DECL}}
const MARK = vec4<u32>(0xdeadbeefu, 0x0badf00du, 0x12345678u, 0x9abcdef0u);

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let stride = n.x * 256u;
  var acc = vec4<u32>(0u);
  for (var i = g.x; i < arrayLength(&buf); i += stride) { acc ^= buf[i]; }
  if (all(acc == MARK)) { buf[g.x] = ~acc; sync[0] = acc.x; }
}
