  // 1/rms of the input row(s) from the NP partial sums of x^2 their producer left in them: lane k
  // summed partials k, k + WG, ... (x_partials: ssp; ssq[c] per column), then a tree over the first XP lanes
  // (XP: min(WG, NP rounded up to a power of two); the lanes past it hold 0, so this is the tree
  // over all WG lanes, bit for bit). Several columns: XCG columns' trees side by side, sharing
  // their barriers; each column's 1/rms is the one-row kernel's, bit for bit.
#if COLS
  for (var c0 = 0u; c0 < nc; c0 += XCG) {
    for (var j = 0u; j < XCG; j++) {
      if (lid < XP) { red[j * XP + lid] = ssq[min(c0 + j, NCOL - 1u)]; }
    }
    workgroupBarrier();
    for (var k = XP / 2u; k > 0u; k >>= 1u) {
      if (lid < k) {
        for (var j = 0u; j < XCG; j++) { red[j * XP + lid] += red[j * XP + lid + k]; }
      }
      workgroupBarrier();
    }
    for (var j = 0u; j < XCG; j++) {
      if (c0 + j < NCOL) { invs[c0 + j] = inverseSqrt(red[j * XP] / {{XC}}.0 + {{XEPS}}); }
    }
    workgroupBarrier();
  }
#else
  if (lid < XP) { red[lid] = ssp; }
  workgroupBarrier();
  for (var k = XP / 2u; k > 0u; k >>= 1u) {
    if (lid < k) { red[lid] += red[lid + k]; }
    workgroupBarrier();
  }
  inv = inverseSqrt(red[0] / {{XC}}.0 + {{XEPS}});
  workgroupBarrier();
#endif
