// Attention phase 2: merge the per-chunk partials of each query row (log-sum-exp rescaling)
// and write the heads back to token-major order: out[t, h * DH + d], h = kvh * GROUP + g.
// The chunks' maxima and sums are read once, in parallel, into workgroup memory; each output
// channel then sums its NSPLIT partials in four independent chains.
// QUANT: instead of f32, write the head's channels as int8 32-blocks in QuantizeKernel's row
// layout (the O projection's integer-dot GEMV input; saves a quantize dispatch). Needs
// WG == DH, a multiple of 32.
// Dispatch: (T * GROUP, KVH), WG threads per workgroup.
{{STEP_DECL}}
@group(0) @binding(1) var<storage, read_write> part: array<f32>;  // (KVH, ROWS_CAP, NSPLIT, DH + 2)
#if QUANT
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
const NB: u32 = {{NB}}u;
const NBP: u32 = {{NBP}}u;
const STRIDE: u32 = {{STRIDE}}u;
var<workgroup> qa: array<f32, {{WG}}>;
var<workgroup> qw: array<u32, {{WG}}>;
#else
{{OUT_DECL}}
#endif
const DH: u32 = {{DH}}u;
const GROUP: u32 = {{GROUP}}u;
const NSPLIT: u32 = {{NSPLIT}}u;
const ROWS_CAP: u32 = {{ROWS_CAP}}u;
const WG: u32 = {{WG}}u;
var<workgroup> ms: array<f32, {{NSPLIT}}>;   // chunk maxima, then their weights exp(m_s - m)
var<workgroup> ls: array<f32, {{NSPLIT}}>;   // chunk sums, then weighted

// weight s times partial p; a chunk with no visible key wrote only (m, l): its accumulator words
// hold whatever the arena had there (possibly NaN bit patterns), so they are selected away
fn wpart(s: u32, p: u32) -> f32 { return select(0.0, ms[s] * part[p], ms[s] > 0.0); }

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.x;
  let kvh = wid.y;
  if (row >= step.n_tokens * GROUP) { return; }
  let base = (kvh * ROWS_CAP + row) * NSPLIT * (DH + 2u);
  for (var s = lid; s < NSPLIT; s += WG) {
    ms[s] = part[base + s * (DH + 2u) + DH];
    ls[s] = part[base + s * (DH + 2u) + DH + 1u];
  }
  workgroupBarrier();
  var m = -3.0e38;
  for (var s = 0u; s < NSPLIT; s++) { m = max(m, ms[s]); }
  workgroupBarrier();
  for (var s = lid; s < NSPLIT; s += WG) {
    let w = select(0.0, exp(ms[s] - m), ms[s] > -1.0e38);   // chunks with no visible key weigh 0
    ms[s] = w;
    ls[s] = w * ls[s];
  }
  workgroupBarrier();
  var l = 0.0;
  for (var s = 0u; s < NSPLIT; s++) { l += ls[s]; }
  let t = row / GROUP;
  let h = kvh * GROUP + row % GROUP;
  for (var d = lid; d < DH; d += WG) {
    var a0 = 0.0; var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;
    var s = 0u;
    for (; s + 4u <= NSPLIT; s += 4u) {
      let p = base + s * (DH + 2u) + d;
      a0 += wpart(s, p);
      a1 += wpart(s + 1u, p + DH + 2u);
      a2 += wpart(s + 2u, p + 2u * (DH + 2u));
      a3 += wpart(s + 3u, p + 3u * (DH + 2u));
    }
    for (; s < NSPLIT; s++) { a0 += wpart(s, base + s * (DH + 2u) + d); }
#if QUANT
    let v = ((a0 + a1) + (a2 + a3)) / l;
    qa[d] = abs(v);
    workgroupBarrier();
    let l0 = d - d % 32u;
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) { amax = max(amax, qa[l0 + j]); }
    workgroupBarrier();
    qa[d] = v;
    let q = i32(round(v * select(0.0, 127.0 / amax, amax > 0.0)));
    qw[d] = u32(q & 0xff);
    workgroupBarrier();
    let c = h * DH + d;                 // channel in the attention output row
    let b = c / 32u;
    let base = t * STRIDE;
    if (d % 4u == 0u) {
      let k = (d % 32u) / 4u;           // word in the block
#if Q4
      let w0 = l0 + 8u * (k / 2u) + (k % 2u);   // evens (k even) or odds of the 8 values
      let wv = qw[w0] | (qw[w0 + 2u] << 8u) | (qw[w0 + 4u] << 16u) | (qw[w0 + 6u] << 24u);
#else
      let wv = qw[d] | (qw[d + 1u] << 8u) | (qw[d + 2u] << 16u) | (qw[d + 3u] << 24u);
#endif
      xq[base + 8u * b + k] = wv;
    }
    if (d % 32u == 0u) {
      var sum = 0.0;
      for (var j = 0u; j < 32u; j++) { sum += qa[l0 + j]; }
      xq[base + 8u * NB + b] = bitcast<u32>(amax / 127.0);
      xq[base + 8u * NB + NBP + b] = bitcast<u32>(sum);
    }
#else
    out_write1(0u, t, 0u, h * DH + d, ((a0 + a1) + (a2 + a3)) / l);
#endif
  }
}
