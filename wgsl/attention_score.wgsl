// Shared by the attention kernels (attention_common.wgsl, attention_prefill.wgsl): the score
// (scaled, optionally soft-capped) and the sliding window's first key.
const SCALE: f32 = {{SCALE}};
const WINDOW: u32 = {{WINDOW}}u;   // 0: no sliding window

fn score(a: f32) -> f32 {
  var s = a * SCALE;
#if SOFTCAP
  s = {{CAP_ATTN}} * tanh(clamp(s / {{CAP_ATTN}}, -15.0, 15.0));
#endif
  return s;
}

// The first key a sliding window lets a query at position p see.
fn window_lo(p: u32) -> u32 {
  if (WINDOW > 0u && p + 1u > WINDOW) { return p + 1u - WINDOW; }
  return 0u;
}
