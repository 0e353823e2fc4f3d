// Decode-stage linear layer on quantized weights with integer dot products ("blk" variant, like
// llama.cpp's MMVQ). Its input is the activation row already quantized to int8 per 32-block by
// quantize.wgsl; XNORM: that row was x * norm weight, and this kernel applies the RMSNorm's
// 1 / rms from the partial sums of x^2 quantize.wgsl left in the row. Every invocation takes whole 32-weight blocks
// (16 bytes of q4 or 32 bytes of q8: wide, coalesced loads) and multiplies them with
// dot4I8Packed (4 int8 products per instruction; no per-weight int -> float conversion, which is
// what bounds the f32 variants on NVIDIA):
//   q8 block: d_w * d_x * sum(q_w * q_x)
//   q4 block: d_w * d_x * sum(q_w * q_x) + m_w * s_x      (q_w in 0..15: q4 stores w = d q + m)
// A workgroup computes ROWS outputs (all of its invocations stride the blocks of every row, so
// short rows still fill it), reduced with subgroupAdd where available, else through workgroup
// memory. Fusions as in matvec.wgsl: bias, DUAL gate/up + activation, soft-cap, residual.
// Dispatch: (ceil(O / ROWS), tokens).
{{SUBGROUP_DIRECTIVES}}
{{STEP_DECL}}
// x: quantized rows (quantize.wgsl's layout), read as vec4<u32>
@group(0) @binding(1) var<storage, read_write> xq: array<vec4<u32>>;
{{Y_DECL}}
{{W_DECL}}
#if DUAL
{{W2_DECL}}
#endif
#include linear_common
const ROWS: u32 = {{ROWS}}u;
const WG: u32 = {{WG}}u;
const NB: u32 = {{NB}}u;            // 32-blocks per row
const STRIDE4: u32 = {{STRIDE4}}u;  // vec4s per quantized row
const D4: u32 = {{D4}}u;            // first vec4 of the block scales, then of the block sums
const S4: u32 = {{S4}}u;
const P0: u32 = {{P0}}u;            // first word of the partial sums of x^2 (XNORM)
const NP: u32 = {{NP}}u;
var<workgroup> red: array<f32, {{RED}}>;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32{{SG_ARGS}}) {
  let t = wid.y;
  if (t >= {{NT}}) { return; }
  let xr = t * STRIDE4;
  let o0 = wid.x * ROWS;
  var inv = 1.0;
#if XNORM
  var ss = 0.0;
  for (var k = 0u; k < NP; k++) { ss += bitcast<f32>(xq[xr + (P0 + k) / 4u][(P0 + k) % 4u]); }
  inv = inverseSqrt(ss / {{XC}}.0 + {{XEPS}});
#endif
{{ACC_DECL}}
  for (var b = lid; b < NB; b += WG) {
    let xa = xq[xr + 2u * b];
    let xb = xq[xr + 2u * b + 1u];
    let dx = bitcast<f32>(xq[xr + D4 + b / 4u][b % 4u]);
#if Q4
    let sx = bitcast<f32>(xq[xr + S4 + b / 4u][b % 4u]);
#endif
{{ROW_BODY}}
  }
{{REDUCE}}
}
