// FUSED (attention_tiled.wgsl; kernels/attention.py): attention_combine.wgsl's merge inside the
// phase-1 dispatch, which saves a dependent dispatch a layer (6-7 us of a decode step on an H100
// each, docs/BENCHMARKS.md session 21). Every workgroup, once its partials are written, counts
// itself in its (token row, KV head)'s counter; the last of the row's NSPLIT merges the row's
// partials and writes its GROUP heads, as f32 rows or int8 blocks (QUANT, and the f32 rows too
// with QUANT_F), as the combine does. The merge is latency-bound (one workgroup, data just
// written to L2 by the others), so it takes few round trips: each invocation's first loads of
// the accumulators it sums are issued with the (m, l) loads, before anything waits; the weights
// exp(m_s - M_h) / L_h are formed once per (head, split), by subgroup butterflies where the
// shapes allow (SCAN_LANES), and shared through workgroup memory.
// The partials are written and read as atomics (device-coherent), and storageBarrier (a
// device-scope fence in SPIR-V) releases them before the count and acquires them after, as
// linear_blk.wgsl's QLAST does. The counters start at zero; the merging workgroup leaves its
// counter so.
{{OUT_DECL}}
{{OUTF_DECL}}
{{CNT_DECL}}
#if QUANT
const QNB: u32 = {{QNB}}u;
const QNBP: u32 = {{QNBP}}u;
const QSTRIDE: u32 = {{QSTRIDE}}u;
#include quantize_block
#endif
const KVH: u32 = {{KVH}}u;
const GN: u32 = GROUP * NSPLIT;
var<workgroup> mm: array<f32, GN>;      // (GROUP, NSPLIT): the partials' maxima
var<workgroup> ml: array<f32, GN>;      // their sums l
var<workgroup> mw: array<f32, GN>;      // their weights exp(m - M_h) / L_h
var<workgroup> mlast: u32;

fn part_get(i: u32) -> f32 {
  return bitcast<f32>(atomicLoad(&part[i]));
}

// the weight of partial i (head h = i / NSPLIT): exp(m_i - M_h) / L_h, M_h the head's largest m,
// L_h = sum exp(m - M_h) l over its partials (those that saw no key: m = -3e38, weight 0), from
// mm / ml serially
fn merge_weight(i: u32) -> f32 {
  let h0 = (i / NSPLIT) * NSPLIT;
  var mx = -3.0e38;
  for (var s = 0u; s < NSPLIT; s++) { mx = max(mx, mm[h0 + s]); }
  var l = 0.0;
  for (var s = 0u; s < NSPLIT; s++) { l += select(0.0, exp(mm[h0 + s] - mx), mm[h0 + s] > -1.0e38) * ml[h0 + s]; }
  return select(0.0, exp(mm[i] - mx), mm[i] > -1.0e38) * select(0.0, 1.0 / l, l > 0.0);
}

// Called by every invocation of every workgroup of row t (uniform control flow) once its
// partials are written.
fn merge_row(lid: u32, lane: u32, t: u32, kvh: u32) {
  storageBarrier();
  if (lid == 0u) { mlast = u32(atomicAdd(&cnt[t * KVH + kvh], 1u) == NSPLIT - 1u); }
  if (workgroupUniformLoad(&mlast) == 0u) { return; }
  storageBarrier();
  let r0 = part_at(kvh, t * GROUP, 0u);    // head h's split s at r0 + h * PART_ROW + s * (DH + 2)
{{M_LOAD}}
#if SCAN_LANES
  // one (head, partial) per invocation, i = lid = h * NSPLIT + s (GN <= WG): where a subgroup's
  // lanes run along lid in whole heads (NSPLIT a power of two <= the smallest subgroup), a head's
  // M_h and L_h are butterflies over its NSPLIT lanes; elsewhere each scans its head serially
  var m = -3.0e38;
  var l = 0.0;
  if (lid < GN) {
    let a = r0 + (lid / NSPLIT) * PART_ROW + (lid % NSPLIT) * (DH + 2u) + DH;
    m = part_get(a);
    l = part_get(a + 1u);
    mm[lid] = m;
    ml[lid] = l;
  }
  workgroupBarrier();
  let off = lid - lane;
  var w = 0.0;
  if (subgroupAll(off % NSPLIT == 0u && off == subgroupBroadcastFirst(off))) {
    var mx = m;
    for (var st = 1u; st < NSPLIT; st <<= 1u) { mx = max(mx, subgroupShuffleXor(mx, st)); }
    w = select(0.0, exp(m - mx), m > -1.0e38);
    var ls = w * l;
    for (var st = 1u; st < NSPLIT; st <<= 1u) { ls += subgroupShuffleXor(ls, st); }
    w *= select(0.0, 1.0 / ls, ls > 0.0);
  } else if (lid < GN) {
    w = merge_weight(lid);
  }
  if (lid < GN) { mw[lid] = w; }
#else
  for (var i = lid; i < GN; i += WG) {
    let a = r0 + (i / NSPLIT) * PART_ROW + (i % NSPLIT) * (DH + 2u) + DH;
    mm[i] = part_get(a);
    ml[i] = part_get(a + 1u);
  }
  workgroupBarrier();
  for (var i = lid; i < GN; i += WG) { mw[i] = merge_weight(i); }
#endif
  workgroupBarrier();
  // output i (channel i % DH of head i / DH) = sum_s w_s acc_s
{{M_SUM}}
  if (lid == 0u) { atomicStore(&cnt[t * KVH + kvh], 0u); }
}
