// Copies of prompt rows into the streams' own cache segments (kernels/rope.py
// KVSegmentCopyKernel): cache rows [seg_base, pos0) are copied to the same rows of stream s's
// segment (+ s * seg_stride) in the K and V caches: the prompt's last partial attention chunk
// for every stream (a shared prompt), or a whole prompt for one stream (streams with their own
// LoRA adapters: step.seg_stride = that stream's offset), so each stream's attention chunks hold
// exactly the keys a single sequence's would (kernels/step.py key_pos).
// Invocation i (grid-stride): (kv head, row r < pos0 - seg_base, channel d); s = workgroup_id.y + 1.
{{STEP_DECL}}
{{KC_DECL}}
{{VC_DECL}}
const KVH: u32 = {{KVH}}u;
const DH: u32 = {{DH}}u;
const CAP: u32 = {{CAP}}u;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
  let rows = step.pos0 - step.seg_base;
  let shift = (wid.y + 1u) * step.seg_stride;
  for (var i = gid.x; i < KVH * rows * DH; i += nwg.x * 256u) {
    let h = i / (rows * DH);
    let src = step.seg_base + (i / DH) % rows;
    let d = i % DH;
    let dst = src + shift;
    kc[(h * CAP + dst) * DH + d] = kc[(h * CAP + src) * DH + d];
    vc[(h * DH + d) * CAP + dst] = vc[(h * DH + d) * CAP + src];
  }
}
