// Greedy sampling, phase 1 of 2: each workgroup finds the largest logit (ties -> lowest id) in
// its SPAN of the vocabulary, scanning it strided (coalesced), and writes (value bits, id) to
// part[2 wid], part[2 wid + 1]; sample.wgsl's greedy branch reduces the NPART partials. A span
// holding a NaN or an infinity (tested on the bits: compilers may assume floats are finite)
// writes the id NONFINITE instead, which sample.wgsl turns into the NONFINITE token. One
// workgroup over a 128k vocabulary took ~170 us on an H100 (latency of ~500 dependent loads per
// invocation); 32 workgroups take a few us. Dispatch: (NPART, 1, 1).
{{STEP_DECL}}
{{L_DECL}}
{{PART_DECL}}
const V: u32 = {{V}}u;
const SPAN: u32 = {{SPAN}}u;
const WG: u32 = 256u;
const NONFINITE: u32 = 0xffffffffu;   // id of a span with a non-finite logit (never a token id)
const LOWEST: f32 = -3.4028235e38;    // the lowest finite f32: an invocation with no ids yet
var<workgroup> rv: array<f32, 256>;
var<workgroup> ri: array<u32, 256>;
var<workgroup> bad: atomic<u32>;      // 1: a logit of this span is NaN or inf (cleared first: not
                                      // every driver zeroes workgroup memory per dispatch)

fn finite(v: f32) -> bool { return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u; }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  if (lid == 0u) { atomicStore(&bad, 0u); }
  workgroupBarrier();
  let i0 = wid.x * SPAN;
  let i1 = min(i0 + SPAN, V);
  var best = LOWEST;
  var bi = NONFINITE - 1u;             // no id yet: loses every tie (ids are lower)
  for (var i = i0 + lid; i < i1; i += WG) {
    let v = l_read1(0u, {{LROW}}, 0u, i);
    if (!finite(v)) { atomicOr(&bad, 1u); }
    if (v > best || (v == best && i < bi)) { best = v; bi = i; }
  }
  rv[lid] = best;
  ri[lid] = bi;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) {
      let ov = rv[lid + k];
      let oi = ri[lid + k];
      if (ov > rv[lid] || (ov == rv[lid] && oi < ri[lid])) { rv[lid] = ov; ri[lid] = oi; }
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    part[2u * wid.x] = bitcast<u32>(rv[0]);
    part[2u * wid.x + 1u] = select(ri[0], NONFINITE, atomicLoad(&bad) != 0u);
  }
}
