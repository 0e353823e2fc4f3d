#if SUBGROUP_ENABLE
enable subgroups;
// every lane of a subgroup reaches each shuffle (the key loop's bounds are the workgroup's)
diagnostic(off, subgroup_uniformity);
#endif
// Causal attention of a prompt chunk in one pass (flash attention, no partials): each query row
// (token t, query head h of KV head kvh) is owned by LANES consecutive invocations, lane l holding
// the row's channels 4 (l + LANES i) .. + 3 (i < NV) of q and of its output in registers. The
// keys are visited KB at a time with an online softmax: their scores are the lanes' partial dot
// products summed with subgroup shuffles (a row's lanes lie in one subgroup), then
//   m' = max(m, s), o = o e^(m - m') + sum_j e^(s_j - m') V[:, k + j], l likewise,
// and o / l is written token-major: out[t, (kvh GROUP + h) DH + d]. A workgroup holds BQ
// consecutive tokens x all GROUP heads of one KV head (their K and V loads hit the same lines);
// its key loop runs from the first key its first token's window sees (a multiple of 4; KB divides
// the cache rows, which the kernel's caller checks) to its last token, each row
// masking what it may not see, so the loop is uniform. Keys are cache rows (prefill: one sequence,
// row k = position k); K (KVH, CAP, DH / 4) vec4, V transposed (KVH, DH, CAP / 4) vec4.
// Dispatch: (ceil(T / BQ), KVH), WG = LANES GROUP BQ invocations.
{{STEP_DECL}}
{{Q_DECL}}
{{KC_DECL}}
{{VC_DECL}}
{{OUT_DECL}}
const DH: u32 = {{DH}}u;
const DH4: u32 = {{DH4}}u;
const GROUP: u32 = {{GROUP}}u;
const CAP: u32 = {{CAP}}u;
const LANES: u32 = {{LANES}}u;
const BQ: u32 = {{BQ}}u;
const KB: u32 = {{KB}}u;           // keys an iteration (4 or 8)
const SCALE: f32 = {{SCALE}};
const WINDOW: u32 = {{WINDOW}}u;   // 0: no sliding window

fn score(a: f32) -> f32 {
  var s = a * SCALE;
#if SOFTCAP
  s = {{CAP_ATTN}} * tanh(clamp(s / {{CAP_ATTN}}, -15.0, 15.0));
#endif
  return s;
}

fn window_lo(p: u32) -> u32 {
  if (WINDOW > 0u && p + 1u > WINDOW) { return p + 1u - WINDOW; }
  return 0u;
}

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
  // the workgroup's keys: from its first token's window start (a multiple of 4) to its last token
  let k_lo = window_lo(row_pos(t0)) / KB * KB;
  let k_hi = row_pos(min(t0 + BQ, T) - 1u) + 1u;
{{Q_LOAD}}
  var m = -3.0e38;
  var l = 0.0;
{{O_DECL}}
  let kb = kvh * CAP;
  for (var k = k_lo; k < k_hi; k += KB) {
{{K_MATH}}
{{S_MATH}}
    let corr = exp(m - mn);
    l = l * corr;
{{E_MATH}}
    m = mn;
{{V_MATH}}
  }
  if (t < T) {
    let inv = 1.0 / l;
    let c0 = (kvh * GROUP + h) * DH;
{{O_WRITE}}
  }
}
