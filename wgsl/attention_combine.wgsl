#include subgroup_directives
// Attention phase 2: merge the per-chunk partials of each query row (log-sum-exp rescaling)
// and write the heads back to token-major order: out[t, h * DH + d], h = kvh * GROUP + g.
// A workgroup takes one query row and a slice of SL channels (32: one int8 block); its WG
// invocations are NG groups of SL, group g summing chunks g, g + NG, ... of its channel with
// eight loads in flight, then the groups' sums are added through workgroup memory. The chunks'
// maxima and sums are read once, in parallel, into workgroup memory and reduced as a tree, so a
// long context (hundreds of short chunks) costs a few rounds of loads, not one per chunk.
// QUANT: instead of f32, write the slice as an int8 32-block in QuantizeKernel's row layout
// (the O projection's integer-dot GEMV input; saves a quantize dispatch). Needs SL == 32.
// QUANT_F: also the f32 rows, `outf` (with LoRA: the O projection's shrink reads them).
// LPART (QUANT, one token row): also the blocks' shares of the O projection's LoRA shrink
// (quantize_block.wgsl).
// Dispatch: (T * GROUP, KVH, DH / SL), WG threads per workgroup.
{{STEP_DECL}}
{{PART_DECL}}
{{OUT_DECL}}
{{OUTF_DECL}}
#if QUANT
const QNB: u32 = {{QNB}}u;
const QNBP: u32 = {{QNBP}}u;
const QSTRIDE: u32 = {{QSTRIDE}}u;
#include quantize_block
#endif
const DH: u32 = {{DH}}u;
const GROUP: u32 = {{GROUP}}u;
const NSPLIT: u32 = {{NSPLIT}}u;
const NSPLIT4: u32 = {{NSPLIT4}}u;
const ROWS_CAP: u32 = {{ROWS_CAP}}u;
const WG: u32 = {{WG}}u;                      // a power of two
const SL: u32 = {{SL}}u;                      // channels per workgroup
const NG: u32 = {{NG}}u;                      // chunk groups (NG * SL <= WG)
var<workgroup> ms: array<f32, {{NSPLIT4}}>;  // chunk maxima, then their weights exp(m_s - m); padded to 4
var<workgroup> ls: array<f32, {{NSPLIT4}}>;  // chunk sums
var<workgroup> red: array<f32, {{WG}}>;      // tree reductions, then the groups' channel sums

// chunk s's weight times its word at p + s * (DH + 2) (0 for s >= n): the load is issued
// whatever s (clamped into the row), so a thread's eight loads are in flight together. A chunk
// with no visible key wrote only (m, l): its accumulator words hold whatever the arena had
// there (possibly NaN bit patterns), so they are selected away.
fn wpart(s: u32, n: u32, p: u32) -> f32 {
  let c = min(s, NSPLIT - 1u);
  let x = part[p + c * (DH + 2u)];
  let w = ms[c];
  return select(0.0, w * x, s < n && w > 0.0);
}

// the maximum (is_max) or sum of every invocation's v, returned to all (uniform control flow)
fn tree(lid: u32, lane: u32, sg: u32, v: f32, is_max: bool) -> f32 {
#if SUBGROUPS
  var r = 0.0;
  if (is_max) { r = subgroupMax(v); } else { r = subgroupAdd(v); }
  workgroupBarrier();
  if (lane == 0u) { red[lid / sg] = r; }
  workgroupBarrier();
  var tot = red[0];
  for (var k = 1u; k < WG / sg; k++) { tot = select(tot + red[k], max(tot, red[k]), is_max); }
  return tot;
#else
  workgroupBarrier();
  red[lid] = v;
  workgroupBarrier();
  for (var st = WG / 2u; st > 0u; st >>= 1u) {
    if (lid < st) { red[lid] = select(red[lid] + red[lid + st], max(red[lid], red[lid + st]), is_max); }
    workgroupBarrier();
  }
  return red[0];
#endif
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32
#if SUBGROUPS
        , @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg: u32
#endif
        ) {
#if !SUBGROUPS
  let lane = 0u;
  let sg = 1u;
#elif QUANT
  q_lane = lane;
  q_sg = sg;
#endif
  let row = wid.x;
  let kvh = wid.y;
  if (row >= step.n_tokens * GROUP) { return; }
#if LPART
  lora_entry0();
#endif
  let base = (kvh * ROWS_CAP + row) * NSPLIT * (DH + 2u);
  var m = -3.0e38;
  var last = 0u;                               // 1 + the last chunk with a visible key
  for (var s = lid; s < NSPLIT4; s += WG) {
    var m_s = -3.0e38;   // the padding chunks: no visible key
    var l_s = 0.0;
    if (s < NSPLIT) {
      m_s = part[base + s * (DH + 2u) + DH];
      l_s = part[base + s * (DH + 2u) + DH + 1u];
    }
    ms[s] = m_s;
    ls[s] = l_s;
    m = max(m, m_s);
    if (m_s > -1.0e38) { last = s + 1u; }
  }
  // only the chunks up to the last visible key are read below: the cache's capacity (NSPLIT
  // chunks) is often many times the context so far
  let n = u32(tree(lid, lane, sg, f32(last), true));
  m = tree(lid, lane, sg, m, true);
  var lp = 0.0;
  for (var s = lid; s < n; s += WG) {
    let w = select(0.0, exp(ms[s] - m), ms[s] > -1.0e38);   // chunks with no visible key weigh 0
    ms[s] = w;
    lp += w * ls[s];
  }
  let l = tree(lid, lane, sg, lp, false);                // (its barriers also publish the weights)
  let t = row / GROUP;
  let h = kvh * GROUP + row % GROUP;
  let c = lid % SL;
  let g = lid / SL;
  let d = wid.z * SL + c;
  var v = 0.0;
  if (g < NG) {
    let p = base + d;
    var a0 = 0.0; var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;
    var a4 = 0.0; var a5 = 0.0; var a6 = 0.0; var a7 = 0.0;
    for (var s = g; s < n; s += 8u * NG) {
      a0 += wpart(s, n, p);
      a1 += wpart(s + NG, n, p);
      a2 += wpart(s + 2u * NG, n, p);
      a3 += wpart(s + 3u * NG, n, p);
      a4 += wpart(s + 4u * NG, n, p);
      a5 += wpart(s + 5u * NG, n, p);
      a6 += wpart(s + 6u * NG, n, p);
      a7 += wpart(s + 7u * NG, n, p);
    }
    v = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
  }
  workgroupBarrier();
  red[lid] = v;
  workgroupBarrier();
  var tot = 0.0;
  if (lid < SL) {
    for (var k = 0u; k < NG; k++) { tot += red[k * SL + lid]; }
    tot /= l;
  }
#if QUANT
#if LPART
  lora_a_load(lid, (h * DH + wid.z * SL) / 32u);
#endif
  quant_blocks(lid, tot, lid < SL, t * QSTRIDE, (h * DH + d) / 32u);
#if LPART
  lora_partials(lid, t, (h * DH + wid.z * SL) / 32u);
#endif
#if QUANT_F
  if (lid < SL) { outf_write1(0u, t, 0u, h * DH + d, tot); }
#endif
#else
  if (lid < SL) { out_write1(0u, t, 0u, h * DH + d, tot); }
#endif
}
