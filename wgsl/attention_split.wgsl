#include subgroup_directives
// Attention over the KV cache, split over the cache length, phase 1 of 2 (attention.wgsl's
// partials, same layout, read by attention_combine.wgsl): the decode variant with short chunks.
// One workgroup per (CHUNK keys, token, KV head) serves the GROUP query heads of its KV head
// (as attention_gqa.wgsl does), but its threads are not tied to keys: the scores are computed
// by groups of LK lanes per key row (consecutive lanes read consecutive vec4s of the row: every
// load instruction of a subgroup is one contiguous run of the K cache), reduced with subgroup
// shuffles, and the V product by one invocation per channel over the chunk's keys. Short chunks
// (16-64 keys against attention_gqa's 64-256) give a decode step several times more
// workgroups, each with little work between its barriers: a 1024-key context is 64 chunks of
// 16 keys per KV head, enough to keep every SM of a large GPU streaming.
// ADAPT (n): a workgroup takes ceil(chunks up to its row's last key / n) consecutive chunks in a
// loop, merged by an online softmax, so a row has at most n partials at any depth.
//   part[(kvh, t * GROUP + h, split)] = (acc[0..DH), running max m, sum l)
// Dispatch: (NSPLIT, T, KVH), WG threads (a multiple of the subgroup size).
#include attention_common
const WG: u32 = {{WG}}u;
const LK: u32 = {{LK}}u;                          // lanes per key row (a power of two <= DH4)
var<workgroup> qs: array<vec4<f32>, {{QS}}>;      // (GROUP, DH4)
var<workgroup> ss: array<f32, {{SS}}>;            // (GROUP, CHUNK): the scores (ss4)
var<workgroup> sc: array<vec4<f32>, {{SC}}>;      // (GROUP, CHUNK / 4): exp(s - m), four keys per vec4
var<workgroup> red: array<f32, {{RED}}>;          // (GROUP, NJ * DH): the key groups' V sums

// whether row t (position p, window start lo) sees a key of chunk c (of the cache's NSPLIT)
fn chunk_index_seen(t: u32, c: u32, p: u32, lo: u32) -> bool {
  return c < NSPLIT && chunk_seen(key_pos(t, c * CHUNK), p, lo);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg: u32) {
  let split = wid.x;
  let t = wid.y;
  let kvh = wid.z;
  if (t >= step.n_tokens) { return; }
  let p = query_pos(t);                            // this token's position
  let out0 = part_at(kvh, t * GROUP, split);
  let lo = window_lo(p);
#if ADAPT
  // ADAPT: each workgroup takes PER consecutive chunks, PER = the chunks up to the row's last
  // cache row / ADAPT rounded up, so a deep context is ADAPT partials a row (not one per chunk)
  // while a short one keeps a chunk per workgroup; the chunks merge by an online softmax
#if TREE
  let kmax = p;
#else
  let kmax = row_cache(t);
#endif
  let per = (kmax / CHUNK + {{ADAPT}}u) / {{ADAPT}}u;
#else
  let per = 1u;
#endif
  var seen = false;
  for (var ci = 0u; ci < per; ci++) {
    seen = seen || chunk_index_seen(t, split * per + ci, p, lo);
  }
  if (!seen) { write_unseen(lid, GROUP, out0, PART_ROW); return; }
  let d = lid % DH;
  let g = lid / DH;
  let sub = lane % LK;
  let kg = (lid / sg) * (sg / LK) + lane / LK;
{{M_DECL}}
{{O_DECL}}
#if ADAPT
  var lsum = 0.0;                                  // invocation h < GROUP: head h's sum of e so far
#endif
  var qs_loaded = false;
  for (var ci = 0u; ci < per; ci++) {
    let k0 = (split * per + ci) * CHUNK;
    let kp0 = key_pos(t, k0);                        // positions of the chunk's keys (attention.wgsl)
#if ADAPT
    if (!chunk_index_seen(t, split * per + ci, p, lo)) { continue; }
#endif
    // every load of the chunk's scores is issued before the first product (the K rows' and the
    // queries' latencies overlap): with PREFETCH_V first the V run of invocation (d, g) (see
    // below; more registers held through the scores: fewer workgroups fit an SM), then the K
    // rows of lane group kg (LK lanes: keys kg, kg + KPS, ..., its lanes the rows' vec4s sub,
    // sub + LK, ...), then the queries
    let nvis = min(p + 1u - kp0, CHUNK);
    let j0 = min(g, NJ - 1u) * JL / 4u;
    let j1 = select(j0, (min((g + 1u) * JL, nvis) + 3u) / 4u, g < NJ);   // past the run's end: zeros
#if PREFETCH_V
{{V_LOAD}}
#endif
{{K_DECL}}
    if (sg >= LK) {
{{K_LOAD}}
    }
    if (!qs_loaded) {
      for (var i = lid; i < GROUP * DH4; i += WG) { qs[i] = q_read(kvh, t * GROUP + i / DH4, 0u, i % DH4); }
      qs_loaded = true;
    }
    workgroupBarrier();
    // scores, reduced over each lane group with shuffles
    if (sg >= LK) {
{{K_MATH}}
    } else {                                         // subgroups narrower than LK lanes: a loop
      let kps = WG / sg;
      for (var kk = lid / sg; kk < CHUNK; kk += kps) {
        let vis = visible(p, lo, kp0 + kk);
{{A_DECL}}
        if (vis) {
          let kb = (kvh * CAP + key_slot(t, k0 + kk)) * DH4;
          for (var c = lane; c < DH4; c += sg) {
            let kv = vec4<f32>(kc[kb + c]);
{{A_ACC}}
          }
        }
{{A_RED}}
        if (lane == 0u) {
{{S_SET}}
        }
      }
    }
    workgroupBarrier();
    // each head's maximum over the chunk (every invocation: four-key loads of workgroup memory);
    // ADAPT: the running maximum, the sums so far rescaled to it
#if ADAPT
{{M_SAVE}}
#endif
    for (var j = 0u; j < CHUNK4; j++) {
{{M_ACC}}
    }
#if ADAPT
{{M_ALPHA}}
#endif
    workgroupBarrier();
    for (var i = lid; i < GROUP * CHUNK4; i += WG) {
{{E_SET}}
    }
    workgroupBarrier();
    // out[h][d] = sum_j e[h][j] V[d][k0 + j]: invocation (d, g) has its run of V row d, four keys
    // per load (attention.wgsl's run bounds), each load serving every head
#if !PREFETCH_V
{{V_LOAD}}
#endif
{{V_MATH}}
#if ADAPT
    if (lid < GROUP) {
{{L_ALPHA}}
      var l = 0.0;
      for (var j = 0u; j < CHUNK4; j++) { l += dot(sc[lid * CHUNK4 + j], vec4<f32>(1.0)); }
      lsum = lsum * alh + l;
    }
    workgroupBarrier();                              // sc read: the next chunk rewrites it
#endif
  }
#if MULTI_J
  if (g < NJ) {
{{RED_O}}
  }
  workgroupBarrier();
  if (lid < DH) {
    for (var h = 0u; h < GROUP; h++) {
      var tot = 0.0;
      for (var q = 0u; q < NJ; q++) { tot += red[h * NJ * DH + q * DH + lid]; }
      part[out0 + h * PART_ROW + lid] = tot;
    }
  }
#else
  if (g < NJ) {
{{W_O}}
  }
#endif
  if (lid < GROUP) {                               // the head's sum of e over the chunk(s)
#if ADAPT
    part[out0 + lid * PART_ROW + DH + 1u] = lsum;
#else
    var l = 0.0;
    for (var j = 0u; j < CHUNK4; j++) { l += dot(sc[lid * CHUNK4 + j], vec4<f32>(1.0)); }
    part[out0 + lid * PART_ROW + DH + 1u] = l;
#endif
  }
{{W_M}}
}
