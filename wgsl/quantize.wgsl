// Activation rows -> int8 blocks for the integer-dot GEMV (matvec_blk.wgsl). 8 invocations per
// 32-block (one 4-channel slice each), BPW blocks per workgroup, grid (ceil(NB / BPW), rows):
//   u = x (PRE_NORM: x * (nw + W_OFFSET), the RMSNorm without its 1/rms factor),
//   per 32-block b: d_b = max|u| / 127, q = round(u / d_b) (half to even) as int8, s_b = sum(u).
// With PRE_NORM each workgroup also writes its partial sum of x^2; the GEMV adds those up and
// scales its result by 1/rms (the int8 values do not depend on that scalar), so no pass over the
// whole row is needed here.
// Row layout (u32 words, row stride STRIDE, a multiple of 4): [8 NB: q, four int8 per word,
// PACKING order][NBP: d][NBP: s][NWP: partial sums of x^2], NBP / NWP rounded up to 4.
//   natural (q8 weights): word k holds q[4k .. 4k+3];
//   q4: per 8 values (word pair 2j, 2j+1): the even ones then the odd ones, matching q4's nibble
//       order under `w & 0x0F0F0F0F` / `(w >> 4) & 0x0F0F0F0F`.
// LAST_ROW: read row step.last_row, write row 0 (the LM head's input).
{{STEP_DECL}}
{{X_DECL}}
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
#if PRE_NORM
@group(0) @binding(3) var<storage, read> nw: array<f32>;
const W_OFFSET: f32 = {{W_OFFSET}};
#endif
const NB: u32 = {{NB}}u;
const NBP: u32 = {{NBP}}u;
const STRIDE: u32 = {{STRIDE}}u;
const WG: u32 = {{WG}}u;
var<workgroup> sh: array<f32, {{WG}}>;
var<workgroup> sw: array<u32, {{WG}}>;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t_out = wid.y;
  if (t_out >= {{NT}}) { return; }
#if LAST_ROW
  let t = step.last_row;
#else
  let t = t_out;
#endif
  let s = wid.x * WG + lid;           // this invocation's slice
  let b = s / 8u;                     // its block
  let k = s % 8u;                     // its word in the block
  var x4 = vec4<f32>(0.0);
  if (b < NB) { x4 = x_read(0u, t, 0u, s); }
#if PRE_NORM
  var u = vec4<f32>(0.0);
  if (b < NB) {
    u = x4 * vec4<f32>(nw[4u * s] + W_OFFSET, nw[4u * s + 1u] + W_OFFSET, nw[4u * s + 2u] + W_OFFSET, nw[4u * s + 3u] + W_OFFSET);
  }
#else
  let u = x4;
#endif
  let a4 = abs(u);
  sh[lid] = max(max(a4.x, a4.y), max(a4.z, a4.w));
  workgroupBarrier();
  let l0 = lid - k;                   // first invocation of this block
  var amax = 0.0;
  for (var j = 0u; j < 8u; j++) { amax = max(amax, sh[l0 + j]); }
  let qs = select(0.0, 127.0 / amax, amax > 0.0);
  let q = vec4<i32>(round(u * qs));
  sw[lid] = pack4xI8(q);
  workgroupBarrier();
  sh[lid] = (u.x + u.y) + (u.z + u.w);
  workgroupBarrier();
  let base = t_out * STRIDE;
  if (b < NB) {
#if Q4
    // word k: evens (k even) or odds (k odd) of slices 2 (k / 2) and 2 (k / 2) + 1
    let p = unpack4xI8(sw[l0 + (k & 6u)]);
    let r = unpack4xI8(sw[l0 + (k & 6u) + 1u]);
    var wv: u32;
    if ((k & 1u) == 0u) { wv = pack4xI8(vec4<i32>(p.x, p.z, r.x, r.z)); } else { wv = pack4xI8(vec4<i32>(p.y, p.w, r.y, r.w)); }
    xq[base + s] = wv;
#else
    xq[base + s] = sw[lid];
#endif
    if (k == 0u) {
      var sum = 0.0;
      for (var j = 0u; j < 8u; j++) { sum += sh[l0 + j]; }
      xq[base + 8u * NB + b] = bitcast<u32>(amax / 127.0);
      xq[base + 8u * NB + NBP + b] = bitcast<u32>(sum);
    }
  }
#if PRE_NORM
  workgroupBarrier();
  sh[lid] = dot(x4, x4);
  workgroupBarrier();
  for (var h = WG / 2u; h > 0u; h >>= 1u) {
    if (lid < h) { sh[lid] += sh[lid + h]; }
    workgroupBarrier();
  }
  if (lid == 0u) { xq[base + 8u * NB + 2u * NBP + wid.x] = bitcast<u32>(sh[0]); }
#endif
}
