// Prefill-stage linear layer (GEMM-like "convolution" kernel), same maths and fusions as
// matvec.wgsl: y[t, o] = x[t, :] . W[o, :] (+bias) (DUAL: act(x.Wg) * x.Wu) (+residual).
// A workgroup of 256 threads computes a 64-token x 64-output tile; each thread a 4 x 4 block.
// K advances 16 inputs (4 slices) at a time through workgroup-memory tiles of vec4.
// Dispatch: (ceil(O / 64), ceil(tokens / 64)).
{{STEP_DECL}}
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
#if DUAL
{{W2_DECL}}
#endif
#if BIAS
@group(0) @binding({{BIAS_BINDING}}) var<storage, read> bias: array<f32>;
#endif
#if PRE_NORM
// RMSNorm of the input rows fused in (see matvec.wgsl)
@group(0) @binding({{NW_BINDING}}) var<storage, read> nw: array<f32>;
const EPS: f32 = {{EPS}};
const W_OFFSET: f32 = {{W_OFFSET}};
var<workgroup> nss: array<f32, 256>;
#endif
var<workgroup> xs: array<vec4<f32>, 256>;   // (64 tokens, 4 slices)
var<workgroup> ws: array<vec4<f32>, 256>;   // (64 outputs, 4 slices)
#if DUAL
var<workgroup> ws2: array<vec4<f32>, 256>;
#endif

fn act(g: f32) -> f32 {
#if GELU
  let c = clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0);
  return 0.5 * g * (1.0 + tanh(c));
#else
  return g / (1.0 + exp(-g));
#endif
}

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
  var acc: array<vec4<f32>, 4>;
#if DUAL
  var acc2: array<vec4<f32>, 4>;
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
      var wv = vec4<f32>(0.0);
      for (var k = 0u; k < 4u; k++) { if (4u * s + k < x_C) { wv[k] = nw[4u * s + k] + W_OFFSET; } }
      xv = xv * inv * wv;
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
      var a: array<vec4<f32>, 4>;
      for (var i = 0u; i < 4u; i++) { a[i] = xs[(ty * 4u + i) * 4u + k]; }
      for (var j = 0u; j < 4u; j++) {
        let b = ws[(tx * 4u + j) * 4u + k];
#if DUAL
        let b2 = ws2[(tx * 4u + j) * 4u + k];
#endif
        for (var i = 0u; i < 4u; i++) {
          acc[i][j] += dot(a[i], b);
#if DUAL
          acc2[i][j] += dot(a[i], b2);
#endif
        }
      }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let t = t0 + ty * 4u + i;
    if (t >= T) { continue; }
    for (var j = 0u; j < 4u; j++) {
      let o = o0 + tx * 4u + j;
      if (o >= w_O) { continue; }
      var v = acc[i][j];
#if BIAS
      v += bias[o];
#endif
#if DUAL
      v = act(v) * acc2[i][j];
#endif
#if SOFTCAP
      v = {{CAP}} * tanh(clamp(v / {{CAP}}, -15.0, 15.0));
#endif
#if RESIDUAL
      v += y_read1(0u, t, 0u, o);
#endif
      y_write1(0u, t, 0u, o, v);
    }
  }
}
