// Prefill-stage linear layer (GEMM-like "convolution" kernel), same maths and fusions as the
// decode GEMVs (linear_split.wgsl): y[t, o] = x[t, :] . W[o, :] (+bias) (DUAL: act(x.Wg) * x.Wu) (+residual).
// A workgroup of 256 threads computes a 64-token x 64-output tile; each thread a 4 x 4 block.
// K advances 16 inputs (4 slices) at a time through workgroup-memory tiles of vec4.
// Dispatch: (ceil(O / 64), ceil(tokens / 64)).
{{STEP_DECL}}
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
{{W2_DECL}}
#include linear_common
#if PRE_NORM
var<workgroup> nss: array<f32, 256>;     // per-invocation partial sums of squares of the tile's rows
#endif
var<workgroup> xs: array<vec4<f32>, 256>;   // (64 tokens, 4 slices)
var<workgroup> ws: array<vec4<f32>, 256>;   // (64 outputs, 4 slices)
#if DUAL
var<workgroup> ws2: array<vec4<f32>, 256>;
#endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let T = {{NT}};
  let t0 = wid.y * 64u;
  let o0 = wid.x * 64u;
  if (t0 >= T) { return; }
  let ty = lid / 16u;
  let tx = lid % 16u;
  let lr = lid / 4u;
  let ls = lid % 4u;
  // accumulators: c_i[j] = y[t0 + 4ty + i, o0 + 4tx + j] (named vec4s, no arrays: arrays indexed
  // in loops can land in local memory)
  var c0 = vec4<f32>(0.0); var c1 = vec4<f32>(0.0); var c2 = vec4<f32>(0.0); var c3 = vec4<f32>(0.0);
#if DUAL
  var d0 = vec4<f32>(0.0); var d1 = vec4<f32>(0.0); var d2 = vec4<f32>(0.0); var d3 = vec4<f32>(0.0);
#endif
#if PRE_NORM
  // 1/rms of the tile's 64 rows: 4 invocations per row, then one sums them
  var ss = 0.0;
  if (t0 + lr < T) {
    for (var s = ls; s < x_S; s += 4u) { let v = x_read(0u, t0 + lr, 0u, s); ss += dot(v, v); }
  }
  nss[lid] = ss;
  workgroupBarrier();
  let inv = inverseSqrt((nss[lr * 4u] + nss[lr * 4u + 1u] + nss[lr * 4u + 2u] + nss[lr * 4u + 3u]) / f32(x_C) + EPS);
#endif
  for (var k0 = 0u; k0 < w_SI; k0 += 4u) {
    let s = k0 + ls;
    var xv = vec4<f32>(0.0);
    if (t0 + lr < T && s < w_SI) {
      xv = x_read(0u, t0 + lr, 0u, s);
#if PRE_NORM
      xv = xv * inv * norm_w4(s);
#endif
    }
    xs[lid] = xv;
    var wv = vec4<f32>(0.0);
#if DUAL
    var wv2 = vec4<f32>(0.0);
#endif
    if (o0 + lr < w_O && s < w_SI) {
      wv = w_read4(o0 + lr, s);
#if DUAL
      wv2 = w2_read4(o0 + lr, s);
#endif
    }
    ws[lid] = wv;
#if DUAL
    ws2[lid] = wv2;
#endif
    workgroupBarrier();
    for (var k = 0u; k < 4u; k++) {
      let a0 = xs[(ty * 4u) * 4u + k];
      let a1 = xs[(ty * 4u + 1u) * 4u + k];
      let a2 = xs[(ty * 4u + 2u) * 4u + k];
      let a3 = xs[(ty * 4u + 3u) * 4u + k];
      let b0 = ws[(tx * 4u) * 4u + k];
      let b1 = ws[(tx * 4u + 1u) * 4u + k];
      let b2 = ws[(tx * 4u + 2u) * 4u + k];
      let b3 = ws[(tx * 4u + 3u) * 4u + k];
      c0 += vec4<f32>(dot(a0, b0), dot(a0, b1), dot(a0, b2), dot(a0, b3));
      c1 += vec4<f32>(dot(a1, b0), dot(a1, b1), dot(a1, b2), dot(a1, b3));
      c2 += vec4<f32>(dot(a2, b0), dot(a2, b1), dot(a2, b2), dot(a2, b3));
      c3 += vec4<f32>(dot(a3, b0), dot(a3, b1), dot(a3, b2), dot(a3, b3));
#if DUAL
      let e0 = ws2[(tx * 4u) * 4u + k];
      let e1 = ws2[(tx * 4u + 1u) * 4u + k];
      let e2 = ws2[(tx * 4u + 2u) * 4u + k];
      let e3 = ws2[(tx * 4u + 3u) * 4u + k];
      d0 += vec4<f32>(dot(a0, e0), dot(a0, e1), dot(a0, e2), dot(a0, e3));
      d1 += vec4<f32>(dot(a1, e0), dot(a1, e1), dot(a1, e2), dot(a1, e3));
      d2 += vec4<f32>(dot(a2, e0), dot(a2, e1), dot(a2, e2), dot(a2, e3));
      d3 += vec4<f32>(dot(a3, e0), dot(a3, e1), dot(a3, e2), dot(a3, e3));
#endif
    }
    workgroupBarrier();
  }
#if DUAL
  store_row(T, t0 + ty * 4u, o0 + tx * 4u, c0, d0);
  store_row(T, t0 + ty * 4u + 1u, o0 + tx * 4u, c1, d1);
  store_row(T, t0 + ty * 4u + 2u, o0 + tx * 4u, c2, d2);
  store_row(T, t0 + ty * 4u + 3u, o0 + tx * 4u, c3, d3);
#else
  store_row(T, t0 + ty * 4u, o0 + tx * 4u, c0, c0);
  store_row(T, t0 + ty * 4u + 1u, o0 + tx * 4u, c1, c1);
  store_row(T, t0 + ty * 4u + 2u, o0 + tx * 4u, c2, c2);
  store_row(T, t0 + ty * 4u + 3u, o0 + tx * 4u, c3, c3);
#endif
}

// the epilogue for four outputs o .. o+3 of token t (g: gate/plain sums, u: up sums when DUAL)
fn store_row(T: u32, t: u32, o: u32, g: vec4<f32>, u: vec4<f32>) {
  if (t >= T) { return; }
  for (var j = 0u; j < 4u; j++) {
    if (o + j < w_O) { epilogue(t, o + j, g[j], u[j]); }
  }
}
