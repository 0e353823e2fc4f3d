// Greedy sampling, phase 1 of 2: each workgroup finds the largest logit (ties -> lowest id) in
// its SPAN of the vocabulary, scanning it strided (coalesced), and writes (value bits, id) to
// part[2 wid], part[2 wid + 1]; sample.wgsl's greedy branch reduces the NPART partials. A span
// holding a NaN or an infinity (tested on the bits: compilers may assume floats are finite)
// writes the id NONFINITE instead, which sample.wgsl turns into the NONFINITE token. One
// workgroup over a 128k vocabulary took ~170 us on an H100 (latency of ~500 dependent loads per
// invocation); 32 workgroups take a few us. Dispatch: (NPART, 1, 1); PER_ROW (the streams'
// sampler, tree verification: every row's argmax): (NPART, T, 1), row r = workgroup_id.y
// writing its spans at part[2 NPART r ..].
// TOPK (K > 1; tree verification, whose DS2D forecast rows draft a node's K best tokens): the K
// largest logits of the span, best first (ties: lowest id first), at part[2 K (NPART r + span)
// ..]; entries past the span's size keep id NONFINITE - 1 (no token); a non-finite span marks
// its first entry's id NONFINITE.
{{STEP_DECL}}
{{L_DECL}}
{{PART_DECL}}
const V: u32 = {{V}}u;
const SPAN: u32 = {{SPAN}}u;
const NPART: u32 = {{NPART}}u;
const WG: u32 = 256u;
const NONFINITE: u32 = 0xffffffffu;   // id of a span with a non-finite logit (never a token id)
const LOWEST: f32 = -3.4028234663852886e38;   // the lowest finite f32 (exactly: Tint rejects -3.4028235e38): no ids yet
#if TOPK
const K: u32 = {{K}}u;
var<workgroup> rv: array<f32, 256 * {{K}}>;
var<workgroup> ri: array<u32, 256 * {{K}}>;
#else
var<workgroup> rv: array<f32, 256>;
var<workgroup> ri: array<u32, 256>;
#endif
var<workgroup> bad: atomic<u32>;      // 1: a logit of this span is NaN or inf (cleared first: not
                                      // every driver zeroes workgroup memory per dispatch)

fn finite(v: f32) -> bool { return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u; }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
#if PER_ROW
  if (wid.y >= step.n_tokens) { return; }
#endif
  if (lid == 0u) { atomicStore(&bad, 0u); }
  workgroupBarrier();
  let r = wid.y;
  let i0 = wid.x * SPAN;
  let i1 = min(i0 + SPAN, V);
#if TOPK
  // each invocation's K best of its strided ids (visited in increasing order: an equal value
  // never displaces an earlier id), then a tree of pairwise merges of sorted K-lists
  var bv: array<f32, K>;
  var bi: array<u32, K>;
  for (var j = 0u; j < K; j++) { bv[j] = LOWEST; bi[j] = NONFINITE - 1u; }
  for (var i = i0 + lid; i < i1; i += WG) {
    let v = l_read1(0u, {{LROW}}, 0u, i);
    if (!finite(v)) { atomicOr(&bad, 1u); continue; }
    if (v <= bv[K - 1u] && bi[K - 1u] != NONFINITE - 1u) { continue; }
    var p = K - 1u;
    while (p > 0u && (v > bv[p - 1u] || bi[p - 1u] == NONFINITE - 1u)) {
      bv[p] = bv[p - 1u]; bi[p] = bi[p - 1u]; p--;
    }
    bv[p] = v; bi[p] = i;
  }
  for (var j = 0u; j < K; j++) { rv[lid * K + j] = bv[j]; ri[lid * K + j] = bi[j]; }
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) {
      var a = lid * K;
      var b = (lid + k) * K;
      let ea = a + K;
      let eb = b + K;
      for (var j = 0u; j < K; j++) {   // K picks from 2 K entries: neither list runs out first
        let from_b = b < eb && (a >= ea || rv[b] > rv[a] || (rv[b] == rv[a] && ri[b] < ri[a]));
        if (from_b) { bv[j] = rv[b]; bi[j] = ri[b]; b++; } else { bv[j] = rv[a]; bi[j] = ri[a]; a++; }
      }
    }
    workgroupBarrier();
    if (lid < k) {
      for (var j = 0u; j < K; j++) { rv[lid * K + j] = bv[j]; ri[lid * K + j] = bi[j]; }
    }
    workgroupBarrier();
  }
  if (lid < K) {
    let o = 2u * ((r * NPART + wid.x) * K + lid);
    part[o] = bitcast<u32>(rv[lid]);
    part[o + 1u] = select(ri[lid], NONFINITE, lid == 0u && atomicLoad(&bad) != 0u);
  }
#else
  var best = LOWEST;
  var bi = NONFINITE - 1u;             // no id yet: loses every tie (ids are lower)
  for (var i = i0 + lid; i < i1; i += WG) {
    let v = l_read1(0u, {{LROW}}, 0u, i);
    if (!finite(v)) { atomicOr(&bad, 1u); }
    if (v > best || (v == best && i < bi)) { best = v; bi = i; }
  }
  rv[lid] = best;
  ri[lid] = bi;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) {
      let ov = rv[lid + k];
      let oi = ri[lid + k];
      if (ov > rv[lid] || (ov == rv[lid] && oi < ri[lid])) { rv[lid] = ov; ri[lid] = oi; }
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    let o = 2u * (r * NPART + wid.x);
    part[o] = bitcast<u32>(rv[0]);
    part[o + 1u] = select(ri[0], NONFINITE, atomicLoad(&bad) != 0u);
  }
#endif
}
