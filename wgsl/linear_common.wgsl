// Shared by every linear_*.wgsl (decode GEMVs and the prefill GEMM): the optional bindings, the
// fused RMSNorm of the input, the gate activation and the per-output epilogue, so both stages
// compute exactly the same maths.
{{BIAS_DECL}}
#if PRE_NORM
// RMSNorm of the input fused in (norm + QKV, norm + gate/up, final norm + LM head):
// x_in = x / sqrt(mean(x^2) + EPS) * (nw + W_OFFSET), the mean taken over the whole row
{{NW_DECL}}
const EPS: f32 = {{EPS}};
const W_OFFSET: f32 = {{W_OFFSET}};
#endif

// the norm weights of input slice s (+ W_OFFSET), zero past the channel count
fn norm_w4(s: u32) -> vec4<f32> {
  var wv = vec4<f32>(0.0);
#if NW_ALIGNED
  // channels a multiple of 4 (the GEMVs read slices s < C / 4 only): four loads, no branches
  let i = 4u * s;
  wv = vec4<f32>(nw[i], nw[i + 1u], nw[i + 2u], nw[i + 3u]) + W_OFFSET;
#elif PRE_NORM
  for (var k = 0u; k < 4u; k++) { if (4u * s + k < x_C) { wv[k] = nw[4u * s + k] + W_OFFSET; } }
#endif
  return wv;
}

fn act(g: f32) -> f32 {
#if GELU
  let c = clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0);
  return 0.5 * g * (1.0 + tanh(c));
#else
  return g / (1.0 + exp(-g));
#endif
}

// output o of token t from its dot product(s): bias, gate/up activation, soft-cap, residual
fn epilogue(t: u32, o: u32, acc: f32, acc2: f32) {
  y_write1(0u, t, 0u, o, epilogue_value(t, o, acc, acc2));
}

fn epilogue_value(t: u32, o: u32, acc: f32, acc2: f32) -> f32 {
  var v = acc;
#if BIAS
  v += bias[o];
#endif
#if DUAL
  v = act(v) * acc2;
#endif
#if SOFTCAP
  v = {{CAP}} * tanh(clamp(v / {{CAP}}, -15.0, 15.0));
#endif
#if RESIDUAL
  v += y_read1(0u, t, 0u, o);
#endif
  return v;
}
