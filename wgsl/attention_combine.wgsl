// Attention phase 2: merge the per-chunk partials of each query row (log-sum-exp rescaling)
// and write the heads back to token-major order: out[t, h * DH + d], h = kvh * GROUP + g.
// The chunks' maxima and sums are read once, in parallel, into workgroup memory; each output
// channel then sums its NSPLIT partials in four independent chains.
// QUANT: instead of f32, write the head's channels as int8 32-blocks in QuantizeKernel's row
// layout (the O projection's integer-dot GEMV input; saves a quantize dispatch). Needs
// WG == DH, a multiple of 32.
// Dispatch: (T * GROUP, KVH), WG threads per workgroup.
{{STEP_DECL}}
{{PART_DECL}}
{{OUT_DECL}}
#if QUANT
const QNB: u32 = {{QNB}}u;
const QNBP: u32 = {{QNBP}}u;
const QSTRIDE: u32 = {{QSTRIDE}}u;
#include quantize_block
#endif
const DH: u32 = {{DH}}u;
const GROUP: u32 = {{GROUP}}u;
const NSPLIT: u32 = {{NSPLIT}}u;
const NSPLIT4: u32 = {{NSPLIT4}}u;
const ROWS_CAP: u32 = {{ROWS_CAP}}u;
const WG: u32 = {{WG}}u;
var<workgroup> ms: array<f32, {{NSPLIT4}}>;  // chunk maxima, then their weights exp(m_s - m); padded to 4
var<workgroup> ls: array<f32, {{NSPLIT4}}>;  // chunk sums, then weighted
var<workgroup> last: atomic<u32>;             // 1 + the last chunk with a visible key
var<workgroup> nused: u32;                    // the same, read uniformly

// output channel d: the weighted partials of chunks 0 .. n - 1 in four independent chains, over
// l; chunk s always goes to chain s % 4 (groups of four up to n: chunks past the last visible
// one weigh 0), so a row's sum does not depend on how far the cache's visible chunks reach (a
// stream's segment lies past other streams': its logits stay a single sequence's, bit for bit)
fn channel(base: u32, d: u32, l: f32, n: u32) -> f32 {
  var a0 = 0.0; var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;
  for (var s = 0u; s < n; s += 4u) {
    let p = base + s * (DH + 2u) + d;
    a0 += wpart(s, p);
    a1 += wpart(s + 1u, p + DH + 2u);
    a2 += wpart(s + 2u, p + 2u * (DH + 2u));
    a3 += wpart(s + 3u, p + 3u * (DH + 2u));
  }
  return ((a0 + a1) + (a2 + a3)) / l;
}

// weight s times partial p; a chunk with no visible key wrote only (m, l): its accumulator words
// hold whatever the arena had there (possibly NaN bit patterns), so they are selected away
fn wpart(s: u32, p: u32) -> f32 { return select(0.0, ms[s] * part[p], ms[s] > 0.0); }

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.x;
  let kvh = wid.y;
  if (row >= step.n_tokens * GROUP) { return; }
  let base = (kvh * ROWS_CAP + row) * NSPLIT * (DH + 2u);
  if (lid == 0u) { atomicStore(&last, 0u); }
  workgroupBarrier();
  for (var s = lid; s < NSPLIT4; s += WG) {
    var m_s = -3.0e38;   // the padding chunks: no visible key
    var l_s = 0.0;
    if (s < NSPLIT) {
      m_s = part[base + s * (DH + 2u) + DH];
      l_s = part[base + s * (DH + 2u) + DH + 1u];
    }
    ms[s] = m_s;
    ls[s] = l_s;
    if (m_s > -1.0e38) { atomicMax(&last, s + 1u); }
  }
  workgroupBarrier();
  // only the chunks up to the last visible key are read below: the cache's capacity (NSPLIT
  // chunks) is often many times the context so far
  if (lid == 0u) { nused = atomicLoad(&last); }
  let n = workgroupUniformLoad(&nused);
  var m = -3.0e38;
  for (var s = 0u; s < n; s++) { m = max(m, ms[s]); }
  workgroupBarrier();
  for (var s = lid; s < n; s += WG) {
    let w = select(0.0, exp(ms[s] - m), ms[s] > -1.0e38);   // chunks with no visible key weigh 0
    ms[s] = w;
    ls[s] = w * ls[s];
  }
  workgroupBarrier();
  var l = 0.0;
  for (var s = 0u; s < n; s++) { l += ls[s]; }
  let t = row / GROUP;
  let h = kvh * GROUP + row % GROUP;
#if QUANT
  let d = lid;                          // WG == DH: one channel per invocation, no loop (barriers)
  let v = channel(base, d, l, n);
  quant_blocks(lid, v, true, t * QSTRIDE, (h * DH + d) / 32u);
#else
  for (var d = lid; d < DH; d += WG) { out_write1(0u, t, 0u, h * DH + d, channel(base, d, l, n)); }
#endif
}
