#if SUBGROUP_ENABLE
enable subgroups;
// Tint's uniformity analysis rejects subgroupAdd after the loops' lane-dependent trip counts;
// every lane of a subgroup reaches the reduction (loops only differ in trip count), so the
// result is well defined. naga (wgpu-native) has no such check and rejects the directive.
diagnostic(off, subgroup_uniformity);
#endif
// Decode-stage linear layer (GEMV), variant "wide": linear_subgroup.wgsl with each lane reading
// a whole quant block (16-32 bytes of q4 / q8, 8 halves of row-major f16) per iteration through
// the generated `w_dot` (weights.wide_accessor_wgsl; no arrays: they can end up in local memory);
// the block's input slices are loaded once (`x_blk`) and shared by a pair's two weights.
// UNROLL4: four blocks in flight per lane. MROWS: that many consecutive rows per subgroup at a
// time (not with ROPE). Same maths, fusions and ROPE epilogue as linear_subgroup.wgsl.
// Dispatch: (ceil(O / ROWS), tokens).
{{STEP_DECL}}
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
{{W2_DECL}}
#include linear_common
#if ROPE
#include rope_epilogue
// the pair's second row comes from the same weight
fn w2_dot(o: u32, b: u32, x: XB) -> f32 { return w_dot(o, b, x); }
#endif
#include linear_decode
{{XB_DECL}}
#include linear_subgroup_common

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
#if MROWS
  // MROWS consecutive rows per subgroup at a time: each block's input slices are loaded once
  // for all of them, and MROWS (x2 with PAIR) weight blocks are in flight per lane
  for (var r = sgi * {{MROWS}}u; r < ROWS; r += nsg * {{MROWS}}u) {
    let o = wid.x * ROWS + r;
    if (o >= w_O) { break; }
{{MR_DECL}}
    for (var b = lane; b < w_NB; b += sg) {
      let xb = x_blk({{XROW}}, b, inv);
{{MR_ACC}}
    }
{{MR_RED}}
    if (lane == 0u) {
{{MR_EPI}}
    }
  }
#else
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
    var b = lane;
#if UNROLL4
    // four blocks in flight per lane (16-32 bytes each), in four independent chains
    var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;
#if PAIR
    var b1 = 0.0; var b2 = 0.0; var b3 = 0.0;
#endif
    for (; b + 3u * sg < w_NB; b += 4u * sg) {
      let x0 = x_blk({{XROW}}, b, inv);
      let x1 = x_blk({{XROW}}, b + sg, inv);
      let x2 = x_blk({{XROW}}, b + 2u * sg, inv);
      let x3 = x_blk({{XROW}}, b + 3u * sg, inv);
      acc += w_dot(o, b, x0);
      a1 += w_dot(o, b + sg, x1);
      a2 += w_dot(o, b + 2u * sg, x2);
      a3 += w_dot(o, b + 3u * sg, x3);
#if PAIR
      acc2 += w2_dot(o2, b, x0);
      b1 += w2_dot(o2, b + sg, x1);
      b2 += w2_dot(o2, b + 2u * sg, x2);
      b3 += w2_dot(o2, b + 3u * sg, x3);
#endif
    }
    acc += a1 + a2 + a3;
#if PAIR
    acc2 += b1 + b2 + b3;
#endif
#endif
    for (; b < w_NB; b += sg) {
      let xb = x_blk({{XROW}}, b, inv);
      acc += w_dot(o, b, xb);
#if PAIR
      acc2 += w2_dot(o2, b, xb);
#endif
    }
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
#endif
}
