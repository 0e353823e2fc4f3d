// The fused RMSNorm's prologue of the float prefill GEMMs (linear_gemm.wgsl, linear_gemm_mma.wgsl):
// 1/rms of each of the tile's BM rows into xinv, RP invocations per row, RS rows per pass.
var<workgroup> xinv: array<f32, {{BM}}>;
var<workgroup> nss: array<f32, {{WG}}>;
const RP: u32 = {{RP}}u;   // invocations per row
const RS: u32 = {{RS}}u;   // rows per pass

fn tile_inv_rms(lid: u32, t0: u32, T: u32) {
  for (var r0 = 0u; r0 < BM; r0 += RS) {
    let r = r0 + lid / RP;
    var ss = 0.0;
    if (t0 + r < T) {
      for (var s = lid % RP; s < x_S; s += RP) { let v = x_read(0u, t0 + r, 0u, s); ss += dot(v, v); }
    }
    nss[lid] = ss;
    workgroupBarrier();
    if (lid % RP == 0u) {
      var tot = 0.0;
      for (var k = 0u; k < RP; k++) { tot += nss[lid + k]; }
      xinv[r] = inverseSqrt(tot / f32(x_C) + EPS);
    }
    workgroupBarrier();
  }
}
