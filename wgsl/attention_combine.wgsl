// Attention phase 2: merge the per-chunk partials of each query row (log-sum-exp rescaling)
// and write the heads back to token-major order: out[t, h * DH + d], h = kvh * GROUP + g.
// Dispatch: (T * GROUP, KVH), DH threads (up to 256) per workgroup.
{{STEP_DECL}}
@group(0) @binding(1) var<storage, read_write> part: array<f32>;  // (KVH, ROWS_CAP, NSPLIT, DH + 2)
{{OUT_DECL}}
const DH: u32 = {{DH}}u;
const GROUP: u32 = {{GROUP}}u;
const NSPLIT: u32 = {{NSPLIT}}u;
const ROWS_CAP: u32 = {{ROWS_CAP}}u;
const WG: u32 = {{WG}}u;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.x;
  let kvh = wid.y;
  if (row >= step.n_tokens * GROUP) { return; }
  let base = (kvh * ROWS_CAP + row) * NSPLIT * (DH + 2u);
  var m = -3.0e38;
  for (var s = 0u; s < NSPLIT; s++) { m = max(m, part[base + s * (DH + 2u) + DH]); }
  var l = 0.0;
  for (var s = 0u; s < NSPLIT; s++) {
    let ms = part[base + s * (DH + 2u) + DH];
    if (ms > -1.0e38) { l += exp(ms - m) * part[base + s * (DH + 2u) + DH + 1u]; }
  }
  let t = row / GROUP;
  let h = kvh * GROUP + row % GROUP;
  for (var d = lid; d < DH; d += WG) {
    var acc = 0.0;
    for (var s = 0u; s < NSPLIT; s++) {
      let ms = part[base + s * (DH + 2u) + DH];
      if (ms > -1.0e38) { acc += exp(ms - m) * part[base + s * (DH + 2u) + d]; }
    }
    out_write1(0u, t, 0u, h * DH + d, acc / l);
  }
}
