// Attention over the KV cache, split over the cache length, phase 1 of 2 (attention.wgsl's
// partials, same layout, read by attention_combine.wgsl): the grouped-query variant. One
// workgroup handles ALL the GROUP query heads that share a KV head (for one token and one
// CHUNK of keys), so each K row and each V load serve GROUP heads (attention.wgsl reads the
// cache once per query head), and its barriers serve GROUP heads at once. Per-head registers
// are unrolled ({{GROUP}} heads; `hN` below), no per-invocation arrays.
//   part[(kvh, t * GROUP + h, split)] = (acc[0..DH), running max m, sum l)
// Dispatch: (NSPLIT, T, KVH), CHUNK threads.
#include attention_common
var<workgroup> qs: array<vec4<f32>, {{QS}}>;     // (GROUP, DH / 4)
var<workgroup> ss: array<f32, {{SS}}>;           // (GROUP, CHUNK): exp(s - m) per key (ss4)
var<workgroup> red: array<f32, {{RED}}>;         // (GROUP, CHUNK)
var<workgroup> ml: array<f32, {{ML}}>;           // (2, GROUP): m, l per head

// tree reduction of red[h * CHUNK ..] for every head at once (max or sum), then ml[off + h]
fn reduce_heads(lid: u32, is_max: bool, off: u32) {
  workgroupBarrier();
  for (var st = CHUNK / 2u; st > 0u; st >>= 1u) {
    if (lid < st) {
      for (var h = 0u; h < GROUP; h++) {
        let a = red[h * CHUNK + lid];
        let b = red[h * CHUNK + lid + st];
        red[h * CHUNK + lid] = select(a + b, max(a, b), is_max);
      }
    }
    workgroupBarrier();
  }
  if (lid < GROUP) { ml[off + lid] = red[lid * CHUNK]; }
  workgroupBarrier();
}

@compute @workgroup_size({{CHUNK}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let split = wid.x;
  let t = wid.y;
  let kvh = wid.z;
  if (t >= step.n_tokens) { return; }
  let p = query_pos(t);                            // this token's position
  let out0 = part_at(kvh, t * GROUP, split);
  let lo = window_lo(p);
  let k0 = split * CHUNK;
  let kp0 = key_pos(t, k0);                        // positions of the chunk's keys (attention.wgsl)
  if (!chunk_seen(kp0, p, lo)) { write_unseen(lid, GROUP, out0, PART_ROW); return; }
  for (var i = lid; i < GROUP * DH4; i += CHUNK) { qs[i] = q_read(kvh, t * GROUP + i / DH4, 0u, i % DH4); }
  workgroupBarrier();
  let k = k0 + lid;
  let kp = kp0 + lid;
  let vis = visible(p, lo, kp);
{{S_DECL}}
  if (vis) {
    let kb = (kvh * CAP + key_slot(t, k)) * DH4;
{{A_DECL}}
    for (var d = 0u; d < DH4; d++) {
      let kv = vec4<f32>(kc[kb + d]);
{{A_ACC}}
    }
{{S_SET}}
  }
{{RED_S}}
  reduce_heads(lid, true, 0u);
{{E_SET}}
  reduce_heads(lid, false, GROUP);
  // out[h][d] = sum_j e[h][j] V[d][k0 + j]: invocation (d, g) streams its run of V row d four
  // keys per load, each load serving every head (see attention.wgsl for the run bounds)
  let nvis = min(p + 1u - kp0, CHUNK);
  let d = lid % DH;
  let g = lid / DH;
{{O_DECL}}
  if (g < NJ) {
    let j1 = (min((g + 1u) * JL, nvis) + 3u) / 4u;
    for (var j = g * JL / 4u; j < j1; j++) {
      let v = v_keys(kvh, d, t, k0 + 4u * j);
{{O_ACC}}
    }
  }
{{RED_O}}
  workgroupBarrier();
  if (lid < DH) {
    for (var h = 0u; h < GROUP; h++) {
      var tot = 0.0;
      for (var q = 0u; q < NJ; q++) { tot += red[h * CHUNK + q * DH + lid]; }
      part[out0 + h * PART_ROW + lid] = tot;
    }
  }
  if (lid < GROUP) { part[out0 + lid * PART_ROW + DH] = ml[lid]; part[out0 + lid * PART_ROW + DH + 1u] = ml[GROUP + lid]; }
}
