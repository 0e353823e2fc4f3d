// RMSNorm over channels, one workgroup per token row, with the residual add fused:
//   ADD_INPUT : x[t] += r[t] (written back: x is the residual stream), then normalise x[t]
//   y[t] = x[t] / sqrt(mean(x[t]^2) + EPS) * (w + W_OFFSET)
//   ACCUMULATE: out[t] += y[t] (Gemma's post-norms add the normalised branch into the stream)
//   LAST_ROW  : read row step.last_row of x, write row 0 of out (the LM head's input)
//   x, r, out: activations (T, C) through generated accessors; w: array<f32> (C)
{{STEP_DECL}}
{{X_DECL}}
{{OUT_DECL}}
{{W_DECL}}
{{R_DECL}}
const EPS: f32 = {{EPS}};
const W_OFFSET: f32 = {{W_OFFSET}};
const WG: u32 = 128u;
var<workgroup> red: array<f32, 128>;

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t_out = wid.x;
  if (t_out >= {{NT}}) { return; }
#if LAST_ROW
  let t = step.last_row;
#else
  let t = t_out;
#endif
  var ss = 0.0;
  for (var s = lid; s < x_S; s += WG) {
    var v = x_read(0u, t, 0u, s);
#if ADD_INPUT
    v += r_read(0u, t, 0u, s);
    x_write(0u, t, 0u, s, v);
#endif
    ss += dot(v, v);
  }
  red[lid] = ss;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) { red[lid] += red[lid + k]; }
    workgroupBarrier();
  }
  let inv = inverseSqrt(red[0] / f32(x_C) + EPS);
  for (var s = lid; s < x_S; s += WG) {
    let v = x_read(0u, t, 0u, s);   // sees this thread's own write above
    var wv = vec4<f32>(0.0);
    for (var k = 0u; k < 4u; k++) { if (4u * s + k < x_C) { wv[k] = w[4u * s + k] + W_OFFSET; } }
    var y = v * inv * wv;
#if ACCUMULATE
    y += out_read(0u, t_out, 0u, s);
#endif
    out_write(0u, t_out, 0u, s, y);
  }
}
