// Prefill-stage linear layer on q8 / q4 weights with integer dot products (ML Drift's prefill
// path for quantized weights: int8 activations x int8 weights, dequantized per block). Its input
// is the activation rows already quantized to int8 per 32-block by quantize.wgsl (q4-packed
// order for q4 weights); XNORM: those rows were x * norm weight and 1/rms of each row comes from
// the partial sums of x^2 the quantizer left in it. Per 32-block b of a (token t, output o):
//   q8: d_w d_x sum(q_w q_x)                 q4, q4k: d_w d_x sum(q_w q_x) + m_w s_x
//   q6k: d_x (s0 sum_lo(q_w q_x) + s1 sum_hi(q_w q_x))   (s0, s1: d x the 16-input halves' scales)
// (q4 stores w = d q + m with q in 0..15; s_x = the block's f32 sum), accumulated in f32;
//   a row-split weight (each row range its own format): d_x (s0 sum_lo + s1 sum_hi) + m_w s_x, its
//   blocks carrying three scales (WBlock; kernels/linear_gemm.py i8_block_wgsl).
// A workgroup of WG = NTY * NTX invocations computes a BM-token x BN-output tile; invocation
// (ty, tx) the TM x TN register block of tokens ty + i NTY and outputs tx + j NTX
// (kernels/linear_gemm.py writes COMPUTE and STORE). K advances KS blocks per step through
// workgroup tiles, block-half-major (half h = words 4h .. 4h+3 of a block's 8):
//   xs[buf][2 kb + h][t]  int8 x 16 of token t0 + t       xsc[buf][kb][t] = (d_x, s_x)
//   ws[buf][2 kb + h][o]  int8 x 16 of output o0 + o      wsc[buf][kb][o] = (d_w, m_w)
// q4 weight words are unpacked once per tile load into the quantizer's q4 order: block word
// k (nibbles of weights 8k .. 8k+7) -> words 2k = w & 0x0F0F0F0F (the even ones), 2k+1 =
// (w >> 4) & 0x0F0F0F0F (the odd ones), so the product loop is the same for q8 and q4.
// Blocks past the row, tokens past T and outputs past O load as zeros. DB: two buffers, the next
// step's blocks fetched into registers before this step's products (one barrier per step).
// Fusions as the GEMVs (linear_common.wgsl): bias, DUAL gate/up + activation, soft-cap,
// residual, LoRA.
// Dispatch: (ceil(O / BN), ceil(tokens / BM)).
{{STEP_DECL}}
// x: quantized rows (quantize.wgsl's layout), read as vec4<u32>
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
{{W2_DECL}}
#include linear_common
const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const KS: u32 = {{KS}}u;
const NTX: u32 = {{NTX}}u;
const NTY: u32 = {{NTY}}u;
const WG: u32 = {{WG}}u;
const NB: u32 = {{NB}}u;            // 32-blocks per row
const STRIDE4: u32 = {{STRIDE4}}u;  // vec4s per quantized row
const D4: u32 = {{D4}}u;            // first vec4 of the block scales, then of the block sums
const S4: u32 = {{S4}}u;
const P0: u32 = {{P0}}u;            // first word of the partial sums of x^2 (XNORM)
const NP: u32 = {{NP}}u;
const NSTEPS: u32 = (NB + KS - 1u) / KS;
var<workgroup> xs: array<vec4<u32>, {{XS_N}}>;
var<workgroup> xsc: array<vec2<f32>, {{XSC_N}}>;
var<workgroup> ws: array<vec4<u32>, {{WS_N}}>;
var<workgroup> wsc: array<{{WSC_T}}, {{WSC_N}}>;
#if DUAL
var<workgroup> ws2: array<vec4<u32>, {{WS_N}}>;
var<workgroup> wsc2: array<{{WSC_T}}, {{WSC_N}}>;
#endif
#if XNORM
var<workgroup> xinv: array<f32, {{BM}}>;
#endif

// one 32-block: its 8 words as two halves and its pair of scales
struct Block { h0: vec4<u32>, h1: vec4<u32>, sc: vec2<f32> }

// x block idx = (t, kb) of the step starting at block b0
fn fetch_x(idx: u32, t0: u32, b0: u32, T: u32) -> Block {
  let t = t0 + idx / KS;
  let b = b0 + idx % KS;
  var k = Block(vec4<u32>(0u), vec4<u32>(0u), vec2<f32>(0.0));
  if (idx < BM * KS && t < T && b < NB) {
    let xr = t * STRIDE4;
    k.h0 = xq[xr + 2u * b];
    k.h1 = xq[xr + 2u * b + 1u];
    k.sc.x = bitcast<f32>(xq[xr + D4 + b / 4u][b % 4u]);
#if Q4
    k.sc.y = bitcast<f32>(xq[xr + S4 + b / 4u][b % 4u]);
#endif
  }
  return k;
}

fn put_x(buf: u32, idx: u32, k: Block) {
  if (idx < BM * KS) {
    let t = idx / KS;
    let kb = idx % KS;
    xs[((buf * KS + kb) * 2u) * BM + t] = k.h0;
    xs[((buf * KS + kb) * 2u + 1u) * BM + t] = k.h1;
    xsc[(buf * KS + kb) * BM + t] = k.sc;
  }
}

// q4 kind: a vec4 of 32 nibbles (word k: inputs 8k .. 8k+7) -> the quantizer's q4 order, and its pair
fn q4_block(q: vec4<u32>, sc: vec2<f32>) -> Block {
  let M = 0x0F0F0F0Fu;
  return Block(vec4<u32>(q.x & M, (q.x >> 4u) & M, q.y & M, (q.y >> 4u) & M),
               vec4<u32>(q.z & M, (q.z >> 4u) & M, q.w & M, (q.w >> 4u) & M), sc);
}
// the weights' blocks: `w_block(o, b)` (and `w2_block`) as Blocks of the format, or for a
// row-split weight as WBlocks (sc = (scale of inputs 0..15, of 16..31, min)) from the row
// range's own block function (kernels/linear_gemm.py i8_block_wgsl)
{{W_BLOCKS}}

struct WBlocks { g: WBlock, u: WBlock }   // the weight's block, and w2's (DUAL)

// weight block idx = (o, kb) of the step starting at block b0
fn fetch_w(idx: u32, o0: u32, b0: u32) -> WBlocks {
  let o = o0 + idx / KS;
  let b = b0 + idx % KS;
  var p = WBlocks(WBlock(), WBlock());
  if (idx < BN * KS && o < w_O && b < NB) {
    p.g = w_block(o, b);
#if DUAL
    p.u = w2_block(o, b);
#endif
  }
  return p;
}

fn put_w(buf: u32, idx: u32, p: WBlocks) {
  if (idx < BN * KS) {
    let o = idx / KS;
    let kb = idx % KS;
    ws[((buf * KS + kb) * 2u) * BN + o] = p.g.h0;
    ws[((buf * KS + kb) * 2u + 1u) * BN + o] = p.g.h1;
    wsc[(buf * KS + kb) * BN + o] = p.g.sc;
#if DUAL
    ws2[((buf * KS + kb) * 2u) * BN + o] = p.u.h0;
    ws2[((buf * KS + kb) * 2u + 1u) * BN + o] = p.u.h1;
    wsc2[(buf * KS + kb) * BN + o] = p.u.sc;
#endif
  }
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let T = {{NT}};
  let t0 = wid.y * BM;
  let o0 = wid.x * BN;
  if (t0 >= T) { return; }
  let ty = lid / NTX;
  let tx = lid % NTX;
#if XNORM
  // 1/rms of the tile's rows from the NP partial sums of x^2 in each (read after the barriers below)
  for (var r = lid; r < BM; r += WG) {
    var ss = 0.0;
    if (t0 + r < T) {
      let xr = (t0 + r) * STRIDE4;
      for (var k = 0u; k < NP; k++) { ss += bitcast<f32>(xq[xr + (P0 + k) / 4u][(P0 + k) % 4u]); }
    }
    xinv[r] = inverseSqrt(ss / {{XC}}.0 + {{XEPS}});
  }
#endif
{{ACC_DECL}}
#include linear_gemm_loop
}
