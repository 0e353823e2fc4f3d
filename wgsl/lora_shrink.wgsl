// LoRA "shrink" (Punica / S-LoRA's first half): for the LoRA targets of one GEMV (q|k|v, o,
// gate|up or down), u[t, seg, j] = scale * (x_in[t] . A_seg[j]) for j < the row's adapter rank,
// where x_in is the GEMV's input as the GEMV sees it (PRE_NORM: x / rms(x) * (nw + W_OFFSET)).
// The GEMV adds u . B^T in its epilogue (linear_common.wgsl, lora_delta).
//   x    (T_cap, I) activation through its accessor
//   nw   (I / 4) vec4<f32> norm weight (PRE_NORM)
//   la   (P, NSEG, I / 4) f16 A pool of this layer and GEMV, four halves per vec2<u32>; rows [off, off + rank)
//        are the adapter's (rank rows: models/lora.py packs them)
//   ctl  u32: the adapter table, MAXE entries of (offset, rank, f32 bits of scale, 0), then the
//        per-row entry index (T_cap u32; >= MAXE: no adapter on that row)
//   lu   (T_cap, UW) u32: per row [offset, rank, 0, 0, f32 bits of u[seg * R + j]] (UW = 4 + NSEG * R)
// Dispatch: (NSEG * R, tokens); workgroup (seg * R + j, t) computes u[t, seg, j] (j >= rank: idle).
{{STEP_DECL}}
{{X_DECL}}
{{NW_DECL}}
{{LA_DECL}}
{{CTL_DECL}}
{{LU_DECL}}
const WG: u32 = 256u;
const R: u32 = {{R}}u;
const NSEG: u32 = {{NSEG}}u;
const I: u32 = {{I}}u;
const MAXE: u32 = {{MAXE}}u;
const UW: u32 = 4u + NSEG * R;
var<workgroup> red: array<f32, 512>;

// input slice s as the GEMV sees it, dotted with A's slice: (x_in . a, x . x for the rms)
fn term(t: u32, s: u32, a0: u32) -> vec2<f32> {
  var xv = x_read(0u, t, 0u, s);
  var ss = 0.0;
#if PRE_NORM
  ss = dot(xv, xv);
  xv *= nw[s] + {{W_OFFSET}};
#endif
  let a = la[a0 + s];
  let w = vec4<f32>(unpack2x16float(a.x), unpack2x16float(a.y));
  return vec2<f32>(dot(xv, w), ss);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.y;
  if (t >= step.n_tokens) { return; }
  let seg = wid.x / R;
  let j = wid.x % R;
  let e = ctl[4u * MAXE + t];
  var off = 0u;
  var rank = 0u;
  var scale = 0.0;
  if (e < MAXE) {
    off = ctl[4u * e];
    rank = ctl[4u * e + 1u];
    scale = bitcast<f32>(ctl[4u * e + 2u]);
  }
  if (wid.x == 0u && lid == 0u) {
    lu[t * UW] = off;
    lu[t * UW + 1u] = rank;
  }
  let live = j < rank;
  let a0 = ((off + j) * NSEG + seg) * (I / 4u);   // first vec2 of A row (off + j, seg)
  // four slices in flight per invocation (one dependent load chain per loop iteration waited a
  // memory latency per slice: ~20 us for the 8192-input down projection)
  var r = vec2<f32>(0.0);
  var s = lid;
  for (; live && s + 3u * WG < I / 4u; s += 4u * WG) {
    r += (term(t, s, a0) + term(t, s + WG, a0)) + (term(t, s + 2u * WG, a0) + term(t, s + 3u * WG, a0));
  }
  for (; live && s < I / 4u; s += WG) { r += term(t, s, a0); }
  red[lid] = r.x;
  red[WG + lid] = r.y;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) {
      red[lid] += red[lid + k];
      red[WG + lid] += red[WG + lid + k];
    }
    workgroupBarrier();
  }
  if (lid == 0u && live) {
    var v = red[0];
#if PRE_NORM
    v *= inverseSqrt(red[WG] / f32(I) + {{EPS}});
#endif
    lu[t * UW + 4u + seg * R + j] = bitcast<u32>(v * scale);
  }
}
