#include subgroup_directives
// Attention over the KV cache for decode, phase 1 of 2 (attention.wgsl's partials, same layout,
// read by attention_combine.wgsl): few partials a row, each workgroup streaming a run of tiles.
// One workgroup per (split, token, KV head) serves the GROUP query heads of its KV head, as
// attention_split.wgsl with ADAPT, but its loop is software-pipelined: the next tile's K rows and
// V runs are loaded into registers before the current tile's scores are computed, so a
// workgroup always has a tile's loads in flight (a deep context is DRAM-bound, not bound by the
// latency of one tile after another), and each tile costs two barriers. The split kernel's
// 16-key chunks read V (stored channel-major, (KVH, DH, CAP)) 32 bytes of a channel at a time;
// a 64-key tile reads 128.
//   part[(kvh, t * GROUP + h, split)] = (acc[0..DH), running max m, sum l)
// The row's tiles (CHUNK keys each, from its window's first to its last key) are dealt out to
// the NSPLIT splits in runs of ceil(tiles / NSPLIT).
// Scores: lane group kg (LK consecutive lanes; LK <= the adapter's smallest subgroup) takes key
// rows kg, kg + KPR, ... of the tile (consecutive lanes read consecutive vec4s of a row), reduced
// with subgroup shuffles. V (channel-major): VL consecutive lanes take one channel's tile run
// (KPL keys each: every load instruction of a subgroup reads whole runs, not one 8-byte piece
// of 32 runs), channels cgi, cgi + CG, ...; each lane sums its keys over every tile and the VL
// lanes' sums are added with shuffles at the end.
// FUSED: the last workgroup of a row's splits merges them (attention_merge.wgsl): no combine
// dispatch.
// Dispatch: (NSPLIT, T, KVH), WG threads.
#include attention_common
const WG: u32 = {{WG}}u;
const LK: u32 = {{LK}}u;                          // lanes per key row (a power of two)
const KPR: u32 = WG / LK;                         // key rows of a round
const NW: u32 = {{NW}}u;                          // the most subgroups a workgroup can have
var<workgroup> qs: array<vec4<f32>, {{QS}}>;      // (GROUP, DH4)
var<workgroup> ss: array<f32, {{SS}}>;            // (GROUP, CHUNK): the tile's scores (ss4)
var<workgroup> ex: array<vec4<f32>, {{SC}}>;      // (GROUP, CHUNK4): exp(score - running max)
var<workgroup> wm: array<f32, {{WM}}>;            // (GROUP, NW): each subgroup's maximum score
const VL: u32 = {{VL}}u;                          // lanes per channel run of V (a power of two)
const CG: u32 = WG / VL;                          // channels a round
const KPL: u32 = CHUNK / VL;                      // keys per lane of a channel run
#if FUSED
#include attention_merge
#endif

// the K row vec4 `c` of tile key kk (clamped into the cache: keys past it are not visible)
fn k_at(kvh: u32, t: u32, k0: u32, kk: u32, c: u32) -> vec4<{{KT}}> {
  return kc[(kvh * CAP + key_slot(t, min(k0 + kk, CAP - 1u))) * DH4 + c];
}

// V[d][k .. k + 3] as stored (k a multiple of 4, clamped into the cache; v_keys without the
// conversion: half the registers a prefetched run holds with f16 caches)
fn v_raw(kvh: u32, d: u32, t: u32, k: u32) -> vec4<{{KT}}> {
  let kk = min(k, CAP - 4u);
  let b = (kvh * DH + d) * CAP;
#if TREE
  if (kk + 3u >= tree[t * TREE_ROW + 1u]) {
    var v: vec4<{{KT}}>;
    for (var i = 0u; i < 4u; i++) { let s = b + key_slot(t, kk + i); v[i] = vc[s / 4u][s % 4u]; }
    return v;
  }
#endif
  return vc[(b + kk) / 4u];
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg: u32) {
  let split = wid.x;
  let t = wid.y;
  let kvh = wid.z;
  if (t >= step.n_tokens) { return; }
#if FUSED
#if QUANT
  q_lane = lane;
  q_sg = sg;
#endif
#endif
  let p = query_pos(t);
  let out0 = part_at(kvh, t * GROUP, split);
  let lo = window_lo(p);
#if TREE
  let kmax = p;
#else
  let kmax = row_cache(t);
#endif
  // the row's tiles: from its window's first key (a lower bound of its tile in every layout) to
  // its last cache row, in runs of `per` a split
  let tlo = lo / CHUNK;
  let thi = min(kmax / CHUNK + 1u, (CAP + CHUNK - 1u) / CHUNK);
  let per = (thi - tlo + NSPLIT - 1u) / NSPLIT;
  let c0 = tlo + split * per;
  let c1 = min(c0 + per, thi);
  for (var i = lid; i < GROUP * DH4; i += WG) { qs[i] = q_read(kvh, t * GROUP + i / DH4, 0u, i % DH4); }
  let sub = lane % LK;
  let kg = (lid / sg) * (sg / LK) + lane / LK;      // this lane group's first key row
  let wi = lid / sg;                                // this invocation's subgroup
  let vsub = lid % VL;                              // this lane's keys of a V run: vsub * KPL ..
  let cgi = lid / VL;                               // its first channel
{{DECL}}
  if (c0 < c1) {
    let k0 = c0 * CHUNK;
{{LOAD_NEXT}}
  }
  workgroupBarrier();                               // qs
  for (var c = c0; c < c1; c++) {
    let k0 = c * CHUNK;
    let kp0 = key_pos(t, k0);                       // positions of the tile's keys (attention.wgsl)
{{TAKE}}
    if (c + 1u < c1) {
      let k0 = (c + 1u) * CHUNK;
{{LOAD_NEXT}}
    }
    // scores, reduced over each lane group with shuffles; the subgroup's maximum per head
{{K_MATH}}
    workgroupBarrier();
    // the running maximum per head (the subgroups' maxima), the sums so far rescaled to it
{{M_NEW}}
    for (var i = lid; i < GROUP * CHUNK4; i += WG) {
      let h = i / CHUNK4;
{{M_PICK}}
      let s = ss4(i);
      ex[i] = select(vec4<f32>(0.0), exp(s - mh), s > vec4<f32>(-1.0e38));
    }
    workgroupBarrier();
    // out[h][c] += sum_j e[h][j] V[c][k0 + j] over this lane's keys, for each of its channels
{{V_MATH}}
    if (lid < GROUP) {
{{L_ALPHA}}
      var l = 0.0;
      for (var j = 0u; j < CHUNK4; j++) { l += dot(ex[lid * CHUNK4 + j], vec4<f32>(1.0)); }
      lsum = lsum * alh + l;
    }
  }
{{W_O}}
  if (lid < GROUP) { part_set(out0 + lid * PART_ROW + DH + 1u, lsum); }
{{W_M}}
#if FUSED
  merge_row(lid, lane, t, kvh);
#endif
}
