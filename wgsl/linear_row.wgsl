// Decode-stage linear layer (GEMV), variant "row": each invocation computes one output over all
// inputs; no barriers (CPU adapters such as lavapipe run barriers slowly). Same maths and
// fusions as linear_split.wgsl.
// Dispatch: (ceil(O / WG), tokens).
{{STEP_DECL}}
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
{{W2_DECL}}
#include linear_common
#include linear_decode

// 1 / rms of input row t, summed by this invocation alone
fn row_inv_alone(t: u32) -> f32 {
#if PRE_NORM
  var ss = 0.0;
  for (var s = 0u; s < x_S; s++) { let v = x_read(0u, t, 0u, s); ss += dot(v, v); }
  return inverseSqrt(ss / f32(x_C) + EPS);
#else
  return 1.0;
#endif
}

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
