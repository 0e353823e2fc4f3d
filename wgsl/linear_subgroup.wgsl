#if SUBGROUP_ENABLE
enable subgroups;
// Tint's uniformity analysis rejects subgroupAdd after the loops' lane-dependent trip counts;
// every lane of a subgroup reaches the reduction (loops only differ in trip count), so the
// result is well defined. naga (wgpu-native) has no such check and rejects the directive.
diagnostic(off, subgroup_uniformity);
#endif
// Decode-stage linear layer (GEMV), variant "subgroup": each subgroup computes one output at a
// time, its lanes striding the input's 4-channel slices (UNROLL4: four in flight per lane),
// reduced with subgroupAdd; a workgroup covers ROWS rows whatever the subgroup size. The only
// barrier is in the fused-norm prologue. Same maths and fusions as linear_split.wgsl.
//   ROPE (the QKV projection): each subgroup computes a pair of rotation partners
//     (rope_epilogue.wgsl's rperm) and applies RoPE + the Q relayout + the KV append instead of
//     writing y (the unfused path's rope_qkv dispatch); PAIR: a second row per subgroup (DUAL's
//     up projection or ROPE's partner).
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
fn w2_read4(o: u32, s: u32) -> vec4<f32> { return w_read4(o, s); }
#endif
#include linear_decode
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
