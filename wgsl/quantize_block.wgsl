// Shared by kernels that write their outputs as int8 32-blocks of a QuantizeKernel row (the
// layout described in quantize.wgsl): invocations 32k .. 32k+31 of the workgroup hold the 32
// values of block b (valid = false: not part of a block; such lanes count as 0 and write
// nothing). Call from uniform control flow (it has barriers). Needs `qout: array<u32>` and the
// consumer row's QNB / QNBP; QPACK_Q4 packs for q4 weights (evens then odds per 8 values).
// QuantizeKernel (quantize.wgsl) uses it too, so every producer gives the same words for the
// same values.
var<workgroup> qa: array<f32, {{QWG}}>;
var<workgroup> qw: array<u32, {{QWG}}>;

fn quant_blocks(lid: u32, u: f32, valid: bool, base: u32, b: u32) {
  qa[lid] = select(0.0, abs(u), valid);
  workgroupBarrier();
  let l0 = lid - lid % 32u;
  var amax = 0.0;
  for (var j = 0u; j < 32u; j++) { amax = max(amax, qa[l0 + j]); }
  workgroupBarrier();
  qa[lid] = select(0.0, u, valid);
  let q = i32(round(u * select(0.0, 127.0 / amax, amax > 0.0)));
  qw[lid] = u32(q & 0xff);
  workgroupBarrier();
  if (valid && lid % 4u == 0u) {
    let k = (lid % 32u) / 4u;          // word in the block
#if QPACK_Q4
    let w0 = l0 + 8u * (k / 2u) + (k % 2u);
    let wv = qw[w0] | (qw[w0 + 2u] << 8u) | (qw[w0 + 4u] << 16u) | (qw[w0 + 6u] << 24u);
#else
    let wv = qw[lid] | (qw[lid + 1u] << 8u) | (qw[lid + 2u] << 16u) | (qw[lid + 3u] << 24u);
#endif
    qout[base + 8u * b + k] = wv;
  }
  if (valid && lid % 32u == 0u) {
    var sum = 0.0;
    for (var j = 0u; j < 32u; j++) { sum += qa[l0 + j]; }
    qout[base + 8u * QNB + b] = bitcast<u32>(amax / 127.0);
    qout[base + 8u * QNB + QNBP + b] = bitcast<u32>(sum);
  }
}
