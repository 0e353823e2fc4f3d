// Shared by linear_subgroup.wgsl and linear_wide.wgsl (one subgroup per output row).
#if PRE_NORM
// 1 / rms of input row t: a subgroupAdd per subgroup, then the subgroups' sums through
// workgroup memory (called in uniform control flow: it has a barrier)
fn sg_row_inv(t: u32, lid: u32, lane: u32, sg: u32) -> f32 {
  var ss = 0.0;
  for (var s = lid; s < x_S; s += WG) { let v = x_read(0u, t, 0u, s); ss += dot(v, v); }
  ss = subgroupAdd(ss);
  if (lane == 0u) { red[lid / sg] = ss; }
  workgroupBarrier();
  var tot = 0.0;
  for (var k = 0u; k < WG / sg; k++) { tot += red[k]; }
  return inverseSqrt(tot / f32(x_C) + EPS);
}
#endif
