// KV-cache compaction after tree verification: the accepted path's K/V rows move from their
// block slots to consecutive slots, in place (no copy of the cache).
//   moves : (1 + 2 * MAX_MOVES) u32 = (n, src_0, dst_0, src_1, dst_1, ...), dst ascending,
//           dst_i < src_i; then no move overwrites a later move's source (src_j > dst_j >
//           dst_i for j > i), so each invocation may apply the moves in order.
//   kc    : (KVH, CAP, DH)  K cache, O = cache position
//   vc    : (KVH, DH, CAP)  V cache, I = cache position
// One invocation per (KV head, channel) applies every move to its K and V element.
// Dispatch: (ceil(KVH * DH / 64), 1, 1).
{{MOVES_DECL}}
{{KC_DECL}}
{{VC_DECL}}
const KVH: u32 = {{KVH}}u;
const DH: u32 = {{DH}}u;
const CAP: u32 = {{CAP}}u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= KVH * DH) { return; }
  let kvh = i / DH;
  let d = i % DH;
  let n = moves[0];
  for (var m = 0u; m < n; m++) {
    let src = moves[1u + 2u * m];
    let dst = moves[2u + 2u * m];
    kc[(kvh * CAP + dst) * DH + d] = kc[(kvh * CAP + src) * DH + d];
    vc[(kvh * DH + d) * CAP + dst] = vc[(kvh * DH + d) * CAP + src];
  }
}
