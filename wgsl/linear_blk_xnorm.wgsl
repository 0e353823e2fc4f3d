  // 1/rms of the input row from the NP partial sums of x^2 its producer left in it
  var ssp = 0.0;
  for (var k = lid; k < NP; k += WG) { ssp += bitcast<f32>(xq[xr + (P0 + k) / 4u][(P0 + k) % 4u]); }
  red[lid] = ssp;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) { red[lid] += red[lid + k]; }
    workgroupBarrier();
  }
  inv = inverseSqrt(red[0] / {{XC}}.0 + {{XEPS}});
  workgroupBarrier();
