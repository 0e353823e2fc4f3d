#include subgroup_directives
// Activation rows -> int8 blocks for the integer-dot GEMV (linear_blk.wgsl). One invocation per
// channel, QWG channels (QWG / 32 blocks) per workgroup, grid (ceil(C / QWG), rows):
//   u = x (PRE_NORM: x * (nw + W_OFFSET), the RMSNorm without its 1/rms factor),
//   per 32-block b: d_b = max|u| / 127, q = round(u / d_b) (half to even) as int8, s_b = sum(u)
//   (quantize_block.wgsl, shared with the kernels that write such rows in their epilogues).
// With PRE_NORM each workgroup also writes its partial sum of x^2; the GEMV adds those up and
// scales its result by 1/rms (the int8 values do not depend on that scalar), so no pass over the
// whole row is needed here. WHOLE (the LM head, whose GEMV has many small workgroups for which the
// 1/rms trees of several rows took a quarter of their time): each workgroup reads the whole row for
// its sum of x^2 (all in the same order, so every workgroup's 1/rms is the same) and quantizes
// the normalised u = x / rms(x) * (nw + W_OFFSET); the GEMV applies nothing.
// Row layout (u32 words, row stride QSTRIDE, a multiple of 4): [8 NB: q, four int8 per word,
// PACKING order][NBP: d][NBP: s][NBP: partial sums of x^2], NBP = NB rounded up to 4.
//   natural (q8 weights): word k holds q[4k .. 4k+3];
//   q4: per 8 values (word pair 2j, 2j+1): the even ones then the odd ones, matching q4's nibble
//       order under `w & 0x0F0F0F0F` / `(w >> 4) & 0x0F0F0F0F`.
// LAST_ROW: read row step.last_row, write row 0 (the LM head's input).
{{STEP_DECL}}
{{X_DECL}}
{{XQ_DECL}}
{{NW_DECL}}
#if PRE_NORM
const W_OFFSET: f32 = {{W_OFFSET}};
#endif
const QNB: u32 = {{QNB}}u;
const QNBP: u32 = {{QNBP}}u;
const QSTRIDE: u32 = {{QSTRIDE}}u;
const QP0: u32 = {{QP0}}u;
const QWG: u32 = {{QWG}}u;
#include quantize_block

@compute @workgroup_size({{QWG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32
#if SUBGROUPS
        , @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg: u32
#endif
        ) {
#if SUBGROUPS
  q_lane = lane;
  q_sg = sg;
#endif
  let t_out = wid.y;
  if (t_out >= {{NT}}) { return; }
#if LAST_ROW
  let t = step.last_row;
#else
  let t = t_out;
#endif
  let c = wid.x * QWG + lid;          // this invocation's channel
  let valid = c < x_C;
  var x = 0.0;
  if (valid) { x = x_read1(0u, t, 0u, c); }
  var u = x;
#if PRE_NORM
  if (valid) { u = x * (nw[c] + W_OFFSET); }
#endif
#if WHOLE
  var ss = 0.0;
  for (var k = lid; k < x_C; k += QWG) {
    let v = x_read1(0u, t, 0u, k);
    ss += v * v;
  }
  qa[lid] = ss;
  workgroupBarrier();
  for (var h = QWG / 2u; h > 0u; h >>= 1u) {
    if (lid < h) { qa[lid] += qa[lid + h]; }
    workgroupBarrier();
  }
  u *= inverseSqrt(qa[0] / f32(x_C) + {{EPS}});
  workgroupBarrier();
#endif
  let base = t_out * QSTRIDE;
  quant_blocks(lid, u, valid, base, c / 32u);
#if PARTIALS
  workgroupBarrier();
  qa[lid] = x * x;
  workgroupBarrier();
  for (var h = QWG / 2u; h > 0u; h >>= 1u) {
    if (lid < h) { qa[lid] += qa[lid + h]; }
    workgroupBarrier();
  }
  if (lid == 0u) { qout[base + QP0 + wid.x] = bitcast<u32>(qa[0]); }
#endif
}
