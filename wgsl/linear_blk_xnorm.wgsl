  // 1/rms of the input row(s) from the NP partial sums of x^2 their producer left in them: lane k
  // summed partials k, k + WG, ... (x_partials: ssp; ssq0, ssq1, .. per column), then a tree over the first XP lanes
  // (XP: min(WG, NP rounded up to a power of two); the lanes past it hold 0, so this is the tree
  // over all WG lanes, bit for bit). Several columns: XCG columns' trees side by side, sharing
  // their barriers (linear_blk.py xnorm_cols); each column's 1/rms, in xinv, is the one-row
  // kernel's, bit for bit. With subgroups: subgroupAdd and the subgroups' sums instead of the
  // tree (a barrier per level: +40% on the 1B QKV of 8 streams, H100).
#if COLS
{{XNORM_COLS}}
#elif SUBGROUPS
  // with subgroups: each subgroup's subgroupAdd, then the subgroups' sums in order (the same for
  // every column of the several-column kernel)
  let sss = subgroupAdd(ssp);
  if (lane == 0u) { red[lid / sg] = sss; }
  workgroupBarrier();
  var ss = 0.0;
  for (var k = 0u; k < WG / sg; k++) { ss += red[k]; }
  inv = rms_inv(ss);
  workgroupBarrier();
#else
  if (lid < XP) { red[lid] = ssp; }
  workgroupBarrier();
  for (var k = XP / 2u; k > 0u; k >>= 1u) {
    if (lid < k) { red[lid] += red[lid + k]; }
    workgroupBarrier();
  }
  inv = rms_inv(red[0]);
  workgroupBarrier();
#endif
