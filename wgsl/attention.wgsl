// Attention over the KV cache, split over the cache length (flash-decoding), phase 1 of 2.
// Scores = K . q is a matrix-vector product with the K cache as weights (O = position), and the
// output V . softmax is one with the V cache as weights (O = DH): the "KV cache as convolution
// weights" view. Each workgroup handles one query row (a query head of one token), one KV head
// and one CHUNK of key positions; it writes an unnormalised partial result:
//   part[(kvh, row, split)] = (acc[0..DH), running max m, sum l)
// Causal: the key at position kp is visible to the query at position p iff kp <= p (and
// kp > p - WINDOW when sliding); with TREE also only as the row's tree record says
// (attention_common.visible). Cache row k holds position key_pos(t, k) (= k for one sequence
// and for a tree block; streams: the shared prompt, then each stream's own chunk-aligned
// segment, other streams' keys are NO_KEY; kernels/step.py). Chunks with no visible key write
// m = -inf and are skipped by the combine, so a stream's partial sums are exactly a single
// sequence's.
// Dispatch: (NSPLIT, T * GROUP, KVH).
#include attention_common
var<workgroup> qs: array<vec4<f32>, {{DH4}}>;
var<workgroup> ss: array<f32, {{CHUNK}}>;      // exp(s - m) per key (ss4)
var<workgroup> red: array<f32, {{CHUNK}}>;

@compute @workgroup_size({{CHUNK}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let split = wid.x;
  let row = wid.y;
  let kvh = wid.z;
  if (row >= step.n_tokens * GROUP) { return; }
  let t = row / GROUP;
  let p = query_pos(t);                            // this query's position
  let out = part_at(kvh, row, split);
  let lo = window_lo(p);
  let k0 = split * CHUNK;
  let kp0 = key_pos(t, k0);                        // the chunk's keys: positions kp0 .. kp0 + CHUNK - 1
  if (!chunk_seen(kp0, p, lo)) { write_unseen(lid, 1u, out, 0u); return; }
  for (var d = lid; d < DH / 4u; d += CHUNK) { qs[d] = q_read(kvh, row, 0u, d); }
  workgroupBarrier();
  let k = k0 + lid;
  let kp = kp0 + lid;
  let vis = visible(p, lo, kp);
  var s = -3.0e38;
  if (vis) {
    let kb = (kvh * CAP + key_slot(t, k)) * (DH / 4u);
    var acc = 0.0;
    for (var d = 0u; d < DH / 4u; d++) { acc += dot(qs[d], vec4<f32>(kc[kb + d])); }
    s = score(acc);
  }
  red[lid] = s;
  workgroupBarrier();
  for (var st = CHUNK / 2u; st > 0u; st >>= 1u) {
    if (lid < st) { red[lid] = max(red[lid], red[lid + st]); }
    workgroupBarrier();
  }
  let m = red[0];
  workgroupBarrier();
  var e = 0.0;
  if (vis) { e = exp(s - m); }
  ss[lid] = e;
  red[lid] = e;
  workgroupBarrier();
  for (var st = CHUNK / 2u; st > 0u; st >>= 1u) {
    if (lid < st) { red[lid] += red[lid + st]; }
    workgroupBarrier();
  }
  let lsum = red[0];
  let nvis = min(p + 1u - kp0, CHUNK);             // cache rows k0 .. k0 + nvis - 1 may be visible
  // out[d] = sum_j e_j V[d][k0 + j]: invocation (d, g) sums its group's keys (each streams its own
  // contiguous run of V row d, four keys per load, in four independent chains), then the NJ group
  // sums are added through workgroup memory. Keys past nvis have e = 0 (JL and CAP are multiples
  // of 4, so the rounded-up run stays inside row d and inside the group).
  workgroupBarrier();
  let d = lid % DH;
  let g = lid / DH;
  var acc = 0.0;
  if (g < NJ) {
    let j0 = g * JL / 4u;
    let j1 = (min((g + 1u) * JL, nvis) + 3u) / 4u;
    var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;
    var j = j0;
    for (; j + 4u <= j1; j += 4u) {
      acc += dot(ss4(j), v_keys(kvh, d, t, k0 + 4u * j));
      a1 += dot(ss4(j + 1u), v_keys(kvh, d, t, k0 + 4u * j + 4u));
      a2 += dot(ss4(j + 2u), v_keys(kvh, d, t, k0 + 4u * j + 8u));
      a3 += dot(ss4(j + 3u), v_keys(kvh, d, t, k0 + 4u * j + 12u));
    }
    for (; j < j1; j++) { acc += dot(ss4(j), v_keys(kvh, d, t, k0 + 4u * j)); }
    acc += (a1 + a2) + a3;
  }
  red[lid] = acc;
  workgroupBarrier();
  if (lid < DH) {
    var tot = 0.0;
    for (var k = 0u; k < NJ; k++) { tot += red[k * DH + lid]; }
    part[out + lid] = tot;
  }
  if (lid == 0u) { part[out + DH] = m; part[out + DH + 1u] = lsum; }
}
