#if SUBGROUP_ENABLE
enable subgroups;
// Tint's uniformity analysis rejects subgroupAdd after the loops' lane-dependent trip counts;
// every lane of a subgroup reaches the reduction (loops only differ in trip count), so the
// result is well defined. naga (wgpu-native) has no such check and rejects the directive.
diagnostic(off, subgroup_uniformity);
#endif
// Decode-stage linear layer (GEMV-like "fully connected" kernel):
//   y[t, o] = sum_i x[t, i] * W[o, i]  (+ bias[o]) (+ y[t, o] when RESIDUAL)
//   DUAL: y[t, o] = act(x.Wg[o]) * (x.Wu[o])  (fused gate/up + SiLU or GELU-tanh)
//   SOFTCAP: y = CAP * tanh(y / CAP)  (Gemma's final logit soft-capping)
// Variants, chosen per device and shape by measurement (kernels/autotune.py):
//   split (default): one workgroup computes ROWS outputs of one token; its WG threads split the
//     input slices and reduce through workgroup memory. Dispatch: (ceil(O / ROWS), tokens).
//   SUBGROUP / WIDE (SG_VARIANT): each subgroup computes one output at a time, its lanes striding
//     the input (4-channel slices, or whole quant blocks for WIDE; UNROLL4: four in flight per
//     lane), reduced with subgroupAdd; a workgroup covers ROWS rows. The only barrier is in the
//     fused-norm prologue.
//     Dispatch: (ceil(O / ROWS), tokens).
//   ROPE (SUBGROUP / WIDE, the QKV projection): each subgroup computes a pair of rotation
//     partners (rope_epilogue.wgsl's rperm) and applies RoPE + the Q relayout + the KV append
//     instead of writing y (the unfused path's rope_qkv dispatch).
//   ROW_PER_THREAD: each invocation computes one output over all inputs; no barriers (CPU
//     adapters such as lavapipe run barriers slowly). Dispatch: (ceil(O / WG), tokens).
{{STEP_DECL}}
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
#if DUAL
{{W2_DECL}}
#endif
#include linear_common
#if ROPE
#include rope_epilogue
// the pair's second row comes from the same weight
#if WIDE
fn w2_blk(o: u32, b: u32, t: u32, inv: f32) -> f32 { return w_blk(o, b, t, inv); }
#else
fn w2_read4(o: u32, s: u32) -> vec4<f32> { return w_read4(o, s); }
#endif
#endif
const ROWS: u32 = {{ROWS}}u;
const WG: u32 = {{WG}}u;
var<workgroup> red: array<f32, {{RED}}>;

fn load_x(t: u32, s: u32, inv: f32) -> vec4<f32> {
  let v = x_read(0u, t, 0u, s);
#if PRE_NORM
  return v * inv * norm_w4(s);
#else
  return v;
#endif
}

// 1 / rms of input row t, summed by this invocation alone (barrier-free variants)
fn row_inv_alone(t: u32) -> f32 {
#if PRE_NORM
  var ss = 0.0;
  for (var s = 0u; s < x_S; s++) { let v = x_read(0u, t, 0u, s); ss += dot(v, v); }
  return inverseSqrt(ss / f32(x_C) + EPS);
#else
  return 1.0;
#endif
}

#if SG_VARIANT
#if PRE_NORM
// 1 / rms of input row t for the subgroup variants: a subgroupAdd per subgroup, then the
// subgroups' sums through workgroup memory (called in uniform control flow: it has a barrier)
fn sg_row_inv(t: u32, lid: u32, lane: u32, sg: u32) -> f32 {
  var ss = 0.0;
  for (var s = lid; s < x_S; s += WG) { let v = x_read(0u, t, 0u, s); ss += dot(v, v); }
  ss = subgroupAdd(ss);
  if (lane == 0u) { red[lid / sg] = ss; }
  workgroupBarrier();
  var tot = 0.0;
  for (var k = 0u; k < WG / sg; k++) { tot += red[k]; }
  return inverseSqrt(tot / f32(x_C) + EPS);
}
#endif
#endif

#if SG_VARIANT
// SUBGROUP and WIDE: each subgroup computes one output at a time and reduces it with
// subgroupAdd; a workgroup covers ROWS rows whatever the subgroup size. SUBGROUP lanes stride the
// input's 4-channel slices (4x unrolled with UNROLL4); WIDE lanes read a whole quant block
// (16-32 bytes) per iteration through the generated `w_blk` (no arrays: they can end up in local
// memory). Dispatch: (ceil(O / ROWS), tokens).
@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg: u32) {
  let t = wid.y;
  if (t >= {{NT}}) { return; }
  let nsg = WG / sg;
  let sgi = lid / sg;
  var inv = 1.0;
#if PRE_NORM
  inv = sg_row_inv({{XROW}}, lid, lane, sg);
#endif
#if ROPE
  // pairs of outputs (i0, i0 + 1) = weight rows (o, o2), rotation partners, in one subgroup
  for (var r = 2u * sgi; r < ROWS; r += 2u * nsg) {
    let i0 = wid.x * ROWS + r;
    if (i0 >= w_O) { break; }
    let o = rperm(i0);
    let o2 = rperm(i0 + 1u);
#else
  for (var r = sgi; r < ROWS; r += nsg) {
    let o = wid.x * ROWS + r;
    if (o >= w_O) { break; }
    let o2 = o;
#endif
    var acc = 0.0;
    var acc2 = 0.0;
#if WIDE
    var b = lane;
#if UNROLL4
    // four blocks in flight per lane (16-32 bytes each), in four independent chains
    var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;
#if PAIR
    var b1 = 0.0; var b2 = 0.0; var b3 = 0.0;
#endif
    for (; b + 3u * sg < w_NB; b += 4u * sg) {
      acc += w_blk(o, b, {{XROW}}, inv);
      a1 += w_blk(o, b + sg, {{XROW}}, inv);
      a2 += w_blk(o, b + 2u * sg, {{XROW}}, inv);
      a3 += w_blk(o, b + 3u * sg, {{XROW}}, inv);
#if PAIR
      acc2 += w2_blk(o2, b, {{XROW}}, inv);
      b1 += w2_blk(o2, b + sg, {{XROW}}, inv);
      b2 += w2_blk(o2, b + 2u * sg, {{XROW}}, inv);
      b3 += w2_blk(o2, b + 3u * sg, {{XROW}}, inv);
#endif
    }
    acc += a1 + a2 + a3;
#if PAIR
    acc2 += b1 + b2 + b3;
#endif
#endif
    for (; b < w_NB; b += sg) {
      acc += w_blk(o, b, {{XROW}}, inv);
#if PAIR
      acc2 += w2_blk(o2, b, {{XROW}}, inv);
#endif
    }
#else
    var s = lane;
#if UNROLL4
    // four independent chains: four loads in flight per lane (memory-level parallelism)
    var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;
#if PAIR
    var b1 = 0.0; var b2 = 0.0; var b3 = 0.0;
#endif
    for (; s + 3u * sg < w_SI; s += 4u * sg) {
      let x0 = load_x({{XROW}}, s, inv);
      let x1 = load_x({{XROW}}, s + sg, inv);
      let x2 = load_x({{XROW}}, s + 2u * sg, inv);
      let x3 = load_x({{XROW}}, s + 3u * sg, inv);
      acc += dot(x0, w_read4(o, s));
      a1 += dot(x1, w_read4(o, s + sg));
      a2 += dot(x2, w_read4(o, s + 2u * sg));
      a3 += dot(x3, w_read4(o, s + 3u * sg));
#if PAIR
      acc2 += dot(x0, w2_read4(o2, s));
      b1 += dot(x1, w2_read4(o2, s + sg));
      b2 += dot(x2, w2_read4(o2, s + 2u * sg));
      b3 += dot(x3, w2_read4(o2, s + 3u * sg));
#endif
    }
    acc += a1 + a2 + a3;
#if PAIR
    acc2 += b1 + b2 + b3;
#endif
#endif
    for (; s < w_SI; s += sg) {
      let xv = load_x({{XROW}}, s, inv);
      acc += dot(xv, w_read4(o, s));
#if PAIR
      acc2 += dot(xv, w2_read4(o2, s));
#endif
    }
#endif
    acc = subgroupAdd(acc);
#if PAIR
    acc2 = subgroupAdd(acc2);
#endif
#if ROPE
    if (lane == 0u) {
      let va = epilogue_value(t, o, acc, 0.0);
      let vb = epilogue_value(t, o2, acc2, 0.0);
      rope_out(t, i0, va, vb);
      rope_out(t, i0 + 1u, vb, va);
    }
#else
    if (lane == 0u) { epilogue(t, o, acc, acc2); }
#endif
  }
}
#elif ROW_PER_THREAD
@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.y;
  let o = wid.x * WG + lid;
  if (t >= {{NT}} || o >= w_O) { return; }
  var acc = 0.0;
  var acc2 = 0.0;
  let inv = row_inv_alone({{XROW}});
  for (var s = 0u; s < w_SI; s++) {
    let xv = load_x({{XROW}}, s, inv);
    acc += dot(xv, w_read4(o, s));
#if DUAL
    acc2 += dot(xv, w2_read4(o, s));
#endif
  }
  epilogue(t, o, acc, acc2);
}
#else
@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.y;
  if (t >= {{NT}}) { return; }
  let o0 = wid.x * ROWS;
  var inv = 1.0;
#if PRE_NORM
  var ss = 0.0;
  for (var s = lid; s < x_S; s += WG) { let v = x_read(0u, {{XROW}}, 0u, s); ss += dot(v, v); }
  red[lid] = ss;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) { red[lid] += red[lid + k]; }
    workgroupBarrier();
  }
  inv = inverseSqrt(red[0] / f32(x_C) + EPS);
  workgroupBarrier();
#endif
  var acc: array<f32, {{ROWS}}>;
#if DUAL
  var acc2: array<f32, {{ROWS}}>;
#endif
  for (var s = lid; s < w_SI; s += WG) {
    let xv = load_x({{XROW}}, s, inv);
    for (var r = 0u; r < ROWS; r++) {
      let o = min(o0 + r, w_O - 1u);
      acc[r] += dot(xv, w_read4(o, s));
#if DUAL
      acc2[r] += dot(xv, w2_read4(o, s));
#endif
    }
  }
#if DUAL
  for (var r = 0u; r < ROWS; r++) { red[r * WG + lid] = acc[r]; red[(ROWS + r) * WG + lid] = acc2[r]; }
  let NRED = 2u * ROWS;
#else
  for (var r = 0u; r < ROWS; r++) { red[r * WG + lid] = acc[r]; }
  let NRED = ROWS;
#endif
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) {
      for (var r = 0u; r < NRED; r++) { red[r * WG + lid] += red[r * WG + lid + k]; }
    }
    workgroupBarrier();
  }
  if (lid < ROWS && o0 + lid < w_O) {
#if DUAL
    epilogue(t, o0 + lid, red[lid * WG], red[(ROWS + lid) * WG]);
#else
    epilogue(t, o0 + lid, red[lid * WG], 0.0);
#endif
  }
}
#endif
