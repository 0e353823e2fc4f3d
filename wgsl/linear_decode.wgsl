// Shared by the float-input decode GEMVs (linear_split / _row / _subgroup / _wide.wgsl): the
// workgroup shape, the reduction memory and the input row as the GEMV reads it (RMS-normalised
// when PRE_NORM, inv = 1 / rms of the row).
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
