// Shared by the float-input decode GEMVs (linear_split / _row / _subgroup / _wide.wgsl): the
// workgroup shape, the reduction memory and the input row as the GEMV reads it (RMS-normalised
// when PRE_NORM, inv = 1 / rms of the row); x_row: the input row token row t reads (the LM
// head of a step reads the step's last row).
const ROWS: u32 = {{ROWS}}u;
const NCOL: u32 = {{NCOL}}u;   // token rows per workgroup (subgroup / wide variants)
const WG: u32 = {{WG}}u;
var<workgroup> red: array<f32, {{RED}}>;

fn x_row(t: u32) -> u32 { return {{XROW}}; }

fn load_x(t: u32, s: u32, inv: f32) -> vec4<f32> {
  let v = x_read(0u, t, 0u, s);
#if PRE_NORM
  return v * inv * norm_w4(s);
#else
  return v;
#endif
}
