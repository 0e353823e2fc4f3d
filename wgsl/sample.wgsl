// Sampling on the GPU: one workgroup of 256 threads over the vocabulary of one logits row.
//   temperature <= 0 : greedy argmax (ties -> lowest id, like torch.argmax); with NPART, from the
//                      per-span maxima sample_argmax.wgsl wrote (many workgroups) instead of a full scan
//   otherwise        : softmax(l / temperature), keep the top_k highest (top_k = 0: all), then
//                      the smallest top set whose mass >= top_p, and draw with a counter-based
//                      RNG of (seed, step). Thresholds are found exactly by bisection over
//                      order-preserving u32 images of the floats (32 passes, no sort).
// Writes the token to out_tokens[step.step] (read back by the host, asynchronously) and to
// ids[0] (the next decode step's embedding input: the token never visits the host). If a logit
// of the row is NaN or infinite (bits tested: compilers may assume floats are finite; greedy
// with NPART: a span's NONFINITE id) the token is NONFINITE, which the host reports as an error
// instead of feeding a garbage id on (issue 15: NaN logits from a mislabelled tensor).
{{STEP_DECL}}
{{L_DECL}}
{{OUT_TOKENS_DECL}}
{{IDS_DECL}}
{{PART_DECL}}
#if NPART
const NPART: u32 = {{NPART}}u;
#endif
const V: u32 = {{V}}u;
const WG: u32 = 256u;
const CH: u32 = {{CH}}u;      // contiguous chunk per thread = ceil(V / WG)
var<workgroup> rf: array<f32, 256>;
var<workgroup> ru: array<u32, 256>;
var<workgroup> sel: atomic<u32>;
var<workgroup> bad: atomic<u32>;      // 1: a logit is NaN or inf (cleared first: not every driver
                                      // zeroes workgroup memory per dispatch; lavapipe keeps it)
const NONFINITE: u32 = 0xffffffffu;   // the token written for a row with a non-finite logit
const LOWEST: f32 = -3.4028235e38;    // the lowest finite f32

fn finite(v: f32) -> bool { return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u; }

fn logit(i: u32) -> f32 { return l_read1(0u, {{LROW}}, 0u, i); }
fn key(f: f32) -> u32 {       // order-preserving map f32 -> u32
  let u = bitcast<u32>(f);
  return select(u | 0x80000000u, ~u, (u & 0x80000000u) != 0u);
}
fn pcg(v: u32) -> u32 {
  let s = v * 747796405u + 2891336453u;
  let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
  return (w >> 22u) ^ w;
}
fn sum_f(lid: u32, v: f32) -> f32 {
  workgroupBarrier();
  rf[lid] = v;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) { rf[lid] += rf[lid + k]; }
    workgroupBarrier();
  }
  return rf[0];
}
fn sum_u(lid: u32, v: u32) -> u32 {
  workgroupBarrier();
  ru[lid] = v;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) { ru[lid] += ru[lid + k]; }
    workgroupBarrier();
  }
  return ru[0];
}
fn max_f(lid: u32, v: f32) -> f32 {
  workgroupBarrier();
  rf[lid] = v;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) { rf[lid] = max(rf[lid], rf[lid + k]); }
    workgroupBarrier();
  }
  return rf[0];
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
  if (lid == 0u) { atomicStore(&bad, 0u); }
  workgroupBarrier();
  let i0 = lid * CH;
  let i1 = min(i0 + CH, V);
  var tok = 0u;
  if (step.temperature <= 0.0) {
    var best = LOWEST;
    var bi = NONFINITE - 1u;           // no id yet: loses every tie (ids are lower)
#if NPART
    // the spans' maxima (sample_argmax.wgsl); spans are in id order, ties keep the lowest id
    for (var k = lid; k < NPART; k += WG) {
      let v = bitcast<f32>(part[2u * k]);
      let id = part[2u * k + 1u];
      if (id == NONFINITE) { atomicOr(&bad, 1u); }
      if (v > best || (v == best && id < bi)) { best = v; bi = id; }
    }
#else
    // strided (coalesced) scan: a thread sees its ids in increasing order, ties keep the lowest
    for (var i = lid; i < V; i += WG) {
      let v = logit(i);
      if (!finite(v)) { atomicOr(&bad, 1u); }
      if (v > best || (v == best && i < bi)) { best = v; bi = i; }
    }
#endif
    rf[lid] = best;
    ru[lid] = bi;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
      if (lid < k) {
        let ov = rf[lid + k];
        let oi = ru[lid + k];
        if (ov > rf[lid] || (ov == rf[lid] && oi < ru[lid])) { rf[lid] = ov; ru[lid] = oi; }
      }
      workgroupBarrier();
    }
    tok = ru[0];
  } else {
    let inv_t = 1.0 / step.temperature;
    var mx = LOWEST;
    for (var i = i0; i < i1; i++) {
      let v = logit(i);
      if (!finite(v)) { atomicOr(&bad, 1u); }
      mx = max(mx, v);
    }
    let m = max_f(lid, mx);
    // top-k: the largest key threshold kt with count(key(l) >= kt) >= k
    var kt = 0u;
    if (step.top_k > 0u && step.top_k < V) {
      var lo = 0u;
      var hi = 0xffffffffu;
      for (var it = 0u; it < 32u; it++) {
        let mid = lo + (hi - lo) / 2u + ((hi - lo) & 1u);   // ceil midpoint; hi - lo + 1 overflows
        var c = 0u;
        for (var i = i0; i < i1; i++) { if (key(logit(i)) >= mid) { c++; } }
        if (sum_u(lid, c) >= step.top_k) { lo = mid; } else { hi = mid - 1u; }
      }
      kt = lo;
    }
    var z = 0.0;
    for (var i = i0; i < i1; i++) { let v = logit(i); if (key(v) >= kt) { z += exp((v - m) * inv_t); } }
    let zt = sum_f(lid, z);
    // top-p: the largest probability-key threshold pt with mass(p >= pt) >= top_p * zt
    var pt = 0u;
    if (step.top_p < 1.0) {
      var lo = 0u;
      var hi = 0x7f800000u;       // keys of non-negative floats stay below +inf's
      let goal = step.top_p * zt;
      for (var it = 0u; it < 31u; it++) {
        let mid = lo + (hi - lo + 1u) / 2u;
        var c = 0.0;
        for (var i = i0; i < i1; i++) {
          let v = logit(i);
          let e = exp((v - m) * inv_t);
          if (key(v) >= kt && bitcast<u32>(e) >= mid) { c += e; }
        }
        if (sum_f(lid, c) >= goal) { lo = mid; } else { hi = mid - 1u; }
      }
      pt = lo;
    }
    // mass kept per thread, then an exclusive scan over the threads' contiguous chunks
    var part = 0.0;
    for (var i = i0; i < i1; i++) {
      let v = logit(i);
      let e = exp((v - m) * inv_t);
      if (key(v) >= kt && bitcast<u32>(e) >= pt) { part += e; }
    }
    workgroupBarrier();
    rf[lid] = part;
    workgroupBarrier();
    if (lid == 0u) {   // exclusive prefix of the chunk masses; the draw
      var acc = 0.0;
      for (var k = 0u; k < WG; k++) { let v = rf[k]; rf[k] = acc; acc += v; }
      let u = f32(pcg(step.seed ^ pcg(step.step + 0x9e3779b9u)) >> 8u) * (1.0 / 16777216.0);
      ru[0] = bitcast<u32>(u * acc);
      atomicStore(&sel, 0u);
    }
    workgroupBarrier();
    let goal = bitcast<f32>(ru[0]);
    let mine = rf[lid];
    // the chunk holding the goal is the last one with mass that starts at or before it
    if (part > 0.0 && mine <= goal) { atomicMax(&sel, lid); }
    workgroupBarrier();
    if (lid == atomicLoad(&sel)) {
      var acc = mine;
      var pick = 0xffffffffu;
      var last = i0;
      for (var i = i0; i < i1; i++) {
        let v = logit(i);
        let e = exp((v - m) * inv_t);
        if (key(v) >= kt && bitcast<u32>(e) >= pt) {
          last = i;
          acc += e;
          if (acc > goal && pick == 0xffffffffu) { pick = i; }
        }
      }
      if (pick == 0xffffffffu) { pick = last; }   // rounding put the goal past the end
      ru[1] = pick;
    }
    workgroupBarrier();
    tok = ru[1];
  }
  workgroupBarrier();
  if (lid == 0u) {
    let t = select(tok, NONFINITE, atomicLoad(&bad) != 0u);
    out_tokens[step.step] = t;
    ids[0] = t;
  }
}
