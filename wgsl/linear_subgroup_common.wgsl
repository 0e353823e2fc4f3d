// Shared by linear_subgroup.wgsl and linear_wide.wgsl (one subgroup per output row, or the
// workgroup per row group with KSPLIT).
// load_xs: input slice s of token row t as the block loop multiplies it; with PRE_NORM it is the
// norm weight times x, and x's squares are added to *ss: the loop's slices of a row are all of
// x, so after the sums meet, rms_inv(ss) is 1 / rms of the row and scales the row's dot products
// (the norm is linear in x). No prologue pass over x and no barrier before the weights stream
// (the prologue it replaces cost 8-9 us of an 8B QKV GEMV's 28 on an H200).
fn load_xs(t: u32, s: u32, ss: ptr<function, f32>) -> vec4<f32> {
  let v = x_read(0u, t, 0u, s);
#if PRE_NORM
  *ss += dot(v, v);
  return v * norm_w4(s);
#else
  return v;
#endif
}
#if PRE_NORM
fn rms_inv(ss: f32) -> f32 { return inverseSqrt(ss / f32(x_C) + EPS); }
#endif
