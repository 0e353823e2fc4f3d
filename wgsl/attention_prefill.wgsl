#include subgroup_directives
// Causal attention of a prompt chunk in one pass (flash attention, no partials): each query row
// (token t, query head h of KV head kvh) is owned by LANES consecutive invocations, lane l holding
// the row's channels 4 (l + LANES i) .. + 3 (i < NV) of q and of its output in registers. The
// workgroup (BQ consecutive tokens x all GROUP heads of one KV head) walks the keys in blocks of
// BK: each block's K rows and V columns are loaded once, coalesced, into workgroup memory
//   ks[j][c] = K[k0 + j][4c .. 4c + 3]       vs[j][c] = V[4c .. 4c + 3][k0 + j]
// (rows DH4 + 1 vec4s apart against bank conflicts), then every row visits them KB at a time
// with an online softmax: their scores are the lanes' partial dot products summed with subgroup
// shuffles (a row's lanes lie in one subgroup), then
//   m' = max(m, s), o = o e^(m - m') + sum_j e^(s_j - m') V[:, k + j], l likewise,
// and o / l is written token-major: out[t, (kvh GROUP + h) DH + d]. The key loop runs from the
// block holding the first key the first token's window sees to the last token, each row masking
// what it may not see, so the loop (and its barriers and shuffles) is uniform. Keys are cache rows
// (prefill: one sequence, row k = position k); K (KVH, CAP, DH / 4) vec4, V transposed
// (KVH, DH, CAP / 4) vec4; a block reaching past the workgroup's last key loads zeros there (so
// whatever the cache holds past it, even from an earlier sequence, cannot reach the sums).
// Dispatch: (ceil(T / BQ), KVH), WG = LANES GROUP BQ invocations.
#include attention_inputs
{{OUT_DECL}}
const LANES: u32 = {{LANES}}u;
const BQ: u32 = {{BQ}}u;
const KB: u32 = {{KB}}u;           // keys an iteration (4 or 8)
const BK: u32 = {{BK}}u;           // keys a block in workgroup memory (a multiple of KB)
const DH4P: u32 = DH4 + 1u;
const WG: u32 = {{WG}}u;
var<workgroup> ks: array<vec4<f32>, {{BK}} * {{DH4P}}>;
var<workgroup> vs: array<vec4<f32>, {{BK}} * {{DH4P}}>;
#include attention_score

// the sum of a over the row's LANES lanes
fn row_sum(a: f32) -> f32 {
  var s = a;
{{ROW_SUM}}
  return s;
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let T = step.n_tokens;
  let t0 = wid.x * BQ;
  let kvh = wid.y;
  let r = lid / LANES;
  let lane = lid % LANES;
  let t = t0 + r / GROUP;
  let h = r % GROUP;
  let tc = min(t, T - 1u);                     // rows past the chunk compute row T - 1, write nothing
  let p = row_pos(tc);
  let lo = window_lo(p);
  // the workgroup's keys: from its first token's window start (rounded down to a block) to its last token
  let k_lo = window_lo(row_pos(t0)) / BK * BK;
  let k_hi = row_pos(min(t0 + BQ, T) - 1u) + 1u;
{{Q_LOAD}}
  var m = -3.0e38;
  var l = 0.0;
{{O_DECL}}
  for (var k0 = k_lo; k0 < k_hi; k0 += BK) {
    workgroupBarrier();
    for (var i = lid; i < BK * DH4; i += WG) {
      let j = i / DH4;
      let c = i % DH4;
      ks[j * DH4P + c] = select(vec4<f32>(0.0), vec4<f32>(kc[(kvh * CAP + min(k0 + j, CAP - 1u)) * DH4 + c]), k0 + j < k_hi);
    }
    // channels 4 c .. 4 c + 3 of keys 4 g .. 4 g + 3: four runs of V loaded, transposed in
    // registers and stored as whole vec4s (a store to one component of a vec4 in workgroup memory
    // may write the whole vec4: WGSL, "Component Reference from Vector Memory View")
    for (var i = lid; i < DH4 * (BK / 4u); i += WG) {
      let c = i / (BK / 4u);
      let g = i % (BK / 4u);
      let kg = k0 + 4u * g;
      let live = vec4<bool>(kg < k_hi, kg + 1u < k_hi, kg + 2u < k_hi, kg + 3u < k_hi);
      let r = ((kvh * DH + 4u * c) * CAP + min(kg, CAP - 4u)) / 4u;
      let v0 = select(vec4<f32>(0.0), vec4<f32>(vc[r]), live);
      let v1 = select(vec4<f32>(0.0), vec4<f32>(vc[r + CAP / 4u]), live);
      let v2 = select(vec4<f32>(0.0), vec4<f32>(vc[r + CAP / 2u]), live);
      let v3 = select(vec4<f32>(0.0), vec4<f32>(vc[r + 3u * CAP / 4u]), live);
      let o = 4u * g * DH4P + c;
      vs[o] = vec4<f32>(v0.x, v1.x, v2.x, v3.x);
      vs[o + DH4P] = vec4<f32>(v0.y, v1.y, v2.y, v3.y);
      vs[o + 2u * DH4P] = vec4<f32>(v0.z, v1.z, v2.z, v3.z);
      vs[o + 3u * DH4P] = vec4<f32>(v0.w, v1.w, v2.w, v3.w);
    }
    workgroupBarrier();
    for (var kk = 0u; kk < BK; kk += KB) {
      let k = k0 + kk;
{{K_MATH}}
{{S_MATH}}
      let corr = exp(m - mn);
      l = l * corr;
{{E_MATH}}
      m = mn;
{{V_MATH}}
    }
  }
  if (t < T) {
    let inv = 1.0 / l;
    let c0 = (kvh * GROUP + h) * DH;
{{O_WRITE}}
  }
}
