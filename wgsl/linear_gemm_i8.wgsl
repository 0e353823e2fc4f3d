// Prefill-stage linear layer on q8 / q4 weights with integer dot products (ML Drift's prefill
// path for quantized weights: int8 activations x int8 weights, dequantized per block). Its input
// is the activation rows already quantized to int8 per 32-block by quantize.wgsl (q4-packed
// order for q4 weights); XNORM: those rows were x * norm weight and 1/rms of each row comes from
// the partial sums of x^2 the quantizer left in it. Per 32-block b of a (token t, output o):
//   q8: d_w d_x sum(q_w q_x)                 q4, q4k: d_w d_x sum(q_w q_x) + m_w s_x
//   q6k: d_x (s0 sum_lo(q_w q_x) + s1 sum_hi(q_w q_x))   (s0, s1: d x the 16-input halves' scales)
// (q4 stores w = d q + m with q in 0..15; s_x = the block's f32 sum), accumulated in f32.
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
var<workgroup> wsc: array<vec2<f32>, {{WSC_N}}>;
#if DUAL
var<workgroup> ws2: array<vec4<u32>, {{WS_N}}>;
var<workgroup> wsc2: array<vec2<f32>, {{WSC_N}}>;
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
#if Q5K
// q5k: Q5_K super-blocks as stored (11 vec4: header, qh, qs): 32-block j of a super-block's 8
// words of 5-bit codes (natural order, as x is packed for it) from its qs vec4s A, B and the qh
// vec4s H, G (w_q5 is a pure function of its words, shared by w2); sc = (d sc, -dmin m)
fn q5_block(A: vec4<u32>, B: vec4<u32>, H: vec4<u32>, G: vec4<u32>, j: u32, sc: vec2<f32>) -> Block {
  return Block(vec4<u32>(w_q5(A.x, H.x, j), w_q5(A.y, H.y, j), w_q5(A.z, H.z, j), w_q5(A.w, H.w, j)),
               vec4<u32>(w_q5(B.x, G.x, j), w_q5(B.y, G.y, j), w_q5(B.z, G.z, j), w_q5(B.w, G.w, j)), sc);
}
fn w_block(o: u32, b: u32) -> Block {
  let k = o * NB + b;
  let s = k / 8u * 11u;                   // the super-block's header
  let q = s + 3u + 2u * (k % 8u / 2u);    // its qs vec4s holding block k's nibbles
  return q5_block(w_data[q], w_data[q + 1u], w_data[s + 1u], w_data[s + 2u], k % 8u, w_k4sm(k));
}
#if DUAL
fn w2_block(o: u32, b: u32) -> Block {
  let k = o * NB + b;
  let s = k / 8u * 11u;                   // the super-block's header
  let q = s + 3u + 2u * (k % 8u / 2u);    // its qs vec4s holding block k's nibbles
  return q5_block(w2_data[q], w2_data[q + 1u], w2_data[s + 1u], w2_data[s + 2u], k % 8u, w2_k4sm(k));
}
#endif
#elif Q4K
// q4k: as q4, the block's nibbles after its super-block's header, (d sc, -dmin m) from the header
fn w_block(o: u32, b: u32) -> Block {
  let k = o * NB + b;
  return q4_block(w_data[k / 8u * 9u + 1u + k % 8u], w_k4sm(k));
}
#if DUAL
fn w2_block(o: u32, b: u32) -> Block {
  let k = o * NB + b;
  return q4_block(w2_data[k / 8u * 9u + 1u + k % 8u], w2_k4sm(k));
}
#endif
#elif Q4
// q4 / q4_0: the block's pair from the weight's `pair` (q4_0: (d, -8 d))
fn w_block(o: u32, b: u32) -> Block { return q4_block(w_data[o * NB + b], w_pair(o * NB + b)); }
#if DUAL
fn w2_block(o: u32, b: u32) -> Block { return q4_block(w2_data[o * NB + b], w2_pair(o * NB + b)); }
#endif
#elif Q6K
// q6k: the block's 6 words (low nibbles A, B; high bit pairs H) -> int8 codes q - 32 in the
// quantizer's q4 order; sc = d x the two halves' scales
fn q6_block(A: vec2<u32>, B: vec2<u32>, H: vec2<u32>, sc: vec2<f32>) -> Block {
  return Block(vec4<u32>(w_q6(A.x, 0u, H.x, 0u), w_q6(A.x, 4u, H.x, 2u), w_q6(A.y, 0u, H.x, 4u), w_q6(A.y, 4u, H.x, 6u)),
               vec4<u32>(w_q6(B.x, 0u, H.y, 0u), w_q6(B.x, 4u, H.y, 2u), w_q6(B.y, 0u, H.y, 4u), w_q6(B.y, 4u, H.y, 6u)), sc);
}
fn w_block(o: u32, b: u32) -> Block {
  let i = 3u * (o * NB + b);
  return q6_block(w_data[i], w_data[i + 1u], w_data[i + 2u], w_q6s(o * NB + b));
}
#if DUAL
fn w2_block(o: u32, b: u32) -> Block {
  let i = 3u * (o * NB + b);
  return q6_block(w2_data[i], w2_data[i + 1u], w2_data[i + 2u], w2_q6s(o * NB + b));
}
#endif
#else
fn w_block(o: u32, b: u32) -> Block {
  return Block(w_data[2u * (o * NB + b)], w_data[2u * (o * NB + b) + 1u], vec2<f32>(w_scl(o * NB + b), 0.0));
}
#if DUAL
fn w2_block(o: u32, b: u32) -> Block {
  return Block(w2_data[2u * (o * NB + b)], w2_data[2u * (o * NB + b) + 1u], vec2<f32>(w2_scl(o * NB + b), 0.0));
}
#endif
#endif

struct WBlocks { g: Block, u: Block }   // the weight's block, and w2's (DUAL)

// weight block idx = (o, kb) of the step starting at block b0
fn fetch_w(idx: u32, o0: u32, b0: u32) -> WBlocks {
  let o = o0 + idx / KS;
  let b = b0 + idx % KS;
  let z = Block(vec4<u32>(0u), vec4<u32>(0u), vec2<f32>(0.0));
  var p = WBlocks(z, z);
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
