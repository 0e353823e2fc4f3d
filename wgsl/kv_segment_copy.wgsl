// The streams' own copies of the prompt's last, partial attention chunk (kernels/rope.py
// KVSegmentCopyKernel): cache rows [seg_base, pos0) are copied to the same rows of stream s's
// segment (+ s * seg_stride) in the K and V caches, so each stream's attention chunks hold
// exactly the keys a single sequence's would (kernels/step.py key_pos).
// Invocation i: (kv head, row r < CHUNK, channel d); stream s = workgroup_id.y + 1.
{{STEP_DECL}}
{{KC_DECL}}
{{VC_DECL}}
const KVH: u32 = {{KVH}}u;
const DH: u32 = {{DH}}u;
const CAP: u32 = {{CAP}}u;
const CHUNK: u32 = {{CHUNK}}u;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let i = gid.x;
  if (i >= KVH * CHUNK * DH) { return; }
  let h = i / (CHUNK * DH);
  let r = (i / DH) % CHUNK;
  let d = i % DH;
  let src = step.seg_base + r;
  if (src >= step.pos0) { return; }
  let dst = src + (wid.y + 1u) * step.seg_stride;
  kc[(h * CAP + dst) * DH + d] = kc[(h * CAP + src) * DH + d];
  vc[(h * DH + d) * CAP + dst] = vc[(h * DH + d) * CAP + src];
}
