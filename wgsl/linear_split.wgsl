// Decode-stage linear layer (GEMV), variant "split": one workgroup computes ROWS outputs of one
// token; its WG invocations split the input slices and reduce through workgroup memory.
//   y[t, o] = sum_i x[t, i] * W[o, i]  (+ bias[o]) (+ y[t, o] when RESIDUAL)
//   DUAL: y[t, o] = act(x.Wg[o]) * (x.Wu[o])  (fused gate/up + SiLU or GELU-tanh)
//   SOFTCAP: y = CAP * tanh(y / CAP)  (Gemma's final logit soft-capping)
//   PRE_NORM: x RMS-normalised first (linear_common.wgsl), its 1/rms reduced by the workgroup
// Dispatch: (ceil(O / ROWS), tokens).
{{STEP_DECL}}
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
{{W2_DECL}}
#include linear_common
#include linear_decode

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
