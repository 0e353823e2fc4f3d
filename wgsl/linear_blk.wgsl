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
// memory. Fusions as in linear_split.wgsl: bias, DUAL gate/up + activation, soft-cap, residual.
// QOUT (ROWS = 32, subgroups): each subgroup computes RPS rows at a time (lanes stride the
// blocks), and the workgroup writes its 32 outputs also as one int8 block of the next GEMV's
// input row (quantize_block.wgsl), optionally times that GEMV's RMSNorm weight with this
// workgroup's partial sum of y^2 (QNORM): the next layer needs no quantize dispatch.
// QSKIP_Y: the int8 block is the only output. QLAST (the same output from the one-row kernel,
// ROWS dividing 32): each workgroup also stores its outputs in qy and counts itself in its
// block's qcnt; the block's last workgroup to finish writes the int8 block (QWRITE: either).
// ROPE (the QKV projection): instead of y, RoPE + the Q relayout + the in-place K/V append of
// rope_qkv.wgsl happen in the epilogue. Output index i of the workgroup is weight row rperm(i):
// rotation partners are adjacent indices (2k, 2k+1) in one workgroup (ROWS is even), whichever
// pairing the model uses (ROPE_HALF: rows (k, k + DH/2); otherwise (2k, 2k+1)).
// COLS (NCOL > 1, several token rows: the streams, a prefill over decode kernels): a workgroup
// reads each weight block once and dots it with the int8 blocks of NCOL rows ("columns" t0 ..
// t0 + NCOL - 1, those < n_tokens), every epilogue applied per column (its own RoPE position and
// cache row, its own int8 output row). Each column's sums are formed in the order of the one-row
// kernel (same invocation per block, same reduction), so a row's outputs do not depend on NCOL.
// LFUSE (one token row; kernels/lora.py LoraOut.fused): the LoRA shrink of this GEMV's input
// comes from the shares its producer left per input block (quantize_block.wgsl, LPART):
// lora_sum adds them up at the start, lora_add is the expand (+ u B^T) on each output, with u
// times 1/rms where the input is normed (XNORM).
// Dispatch: (ceil(O / ROWS), ceil(tokens / NCOL)).
#include subgroup_directives
{{STEP_DECL}}
// x: quantized rows (quantize.wgsl's layout), read as vec4<u32>
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
{{W2_DECL}}
#include linear_common
#if ROPE
#include rope_epilogue
#endif
const ROWS: u32 = {{ROWS}}u;
#if COLS
const NCOL: u32 = {{NCOL}}u;      // token rows per workgroup
#endif
const WG: u32 = {{WG}}u;
const BU: u32 = {{BU}}u;            // blocks per invocation and loop iteration, a stride apart (unroll)
const NB: u32 = {{NB}}u;            // 32-blocks per row
const STRIDE4: u32 = {{STRIDE4}}u;  // vec4s per quantized row
const D4: u32 = {{D4}}u;            // first vec4 of the block scales, then of the block sums
const S4: u32 = {{S4}}u;
const P0: u32 = {{P0}}u;            // first word of the partial sums of x^2 (XNORM)
const NP: u32 = {{NP}}u;
const XP: u32 = {{XP}}u;            // lanes of the partial sums' tree (linear_blk_xnorm.wgsl)
#if COLS
const XCG: u32 = {{XCG}}u;          // columns whose trees run side by side
#endif
var<workgroup> red: array<f32, {{RED}}>;
#if COLS
#if XNORM
var<workgroup> xinv: array<f32, NCOL>;   // each column's 1/rms (linear_blk_xnorm.wgsl)
fn col_inv(c: u32) -> f32 { return xinv[c]; }
#else
fn col_inv(c: u32) -> f32 { return 1.0; }
#endif
#endif

// an invocation's share of the partial sums of x^2 of the row at xr (partials first, first + WG, ...;
// their tree: linear_blk_xnorm.wgsl)
fn x_partials(xr: u32, first: u32) -> f32 {
  var s = 0.0;
  for (var k = first; k < NP; k += WG) { s += bitcast<f32>(xq[xr + (P0 + k) / 4u][(P0 + k) % 4u]); }
  return s;
}

#if XNORM
fn rms_inv(ss: f32) -> f32 { return inverseSqrt(ss / {{XC}}.0 + {{XEPS}}); }
#endif

// block b of the input row whose first vec4 is xr: its int8 values, scale and (q4) f32 sum
struct XBlock { lo: vec4<u32>, hi: vec4<u32>, d: f32, s: f32 }
fn x_block(xr: u32, b: u32) -> XBlock {
  var s = 0.0;
#if Q4
  s = bitcast<f32>(xq[xr + S4 + b / 4u][b % 4u]);
#endif
  return XBlock(xq[xr + 2u * b], xq[xr + 2u * b + 1u], bitcast<f32>(xq[xr + D4 + b / 4u][b % 4u]), s);
}

// x_block where ok, else the block with its scale and sum zero (its products add exactly +-0 to
// the sums: an unrolled loop's sub-block past the row's last block, loaded clamped; BU > 1)
fn x_block_m(xr: u32, b: u32, ok: bool) -> XBlock {
  var k = x_block(xr, b);
  k.d = select(0.0, k.d, ok);
  k.s = select(0.0, k.s, ok);
  return k;
}
#if QWRITE
{{QOUT_DECL}}
{{QNW_DECL}}
{{QLAST_DECL}}
const QNB: u32 = {{QNB}}u;
const QNBP: u32 = {{QNBP}}u;
const QSTRIDE: u32 = {{QSTRIDE}}u;
const QP0: u32 = {{QP0}}u;
#include quantize_block

// row t's int8 block b of the next GEMV's input from the outputs v (invocations 32k .. 32k + 31
// hold a block; ok: this one holds output o): quantize_block's words, of v times the next GEMV's
// norm weight with the block's sum of v^2 (QNORM). Uniform control flow (barriers).
fn write_block(lid: u32, v: f32, ok: bool, t: u32, b: u32, o: u32) {
  var u = v;
#if QNORM
  if (ok) { u = v * (qnw[o] + {{QW_OFFSET}}); }
#endif
#if LPART
  lora_a_load(lid, b);
#endif
  quant_blocks(lid, u, ok, t * QSTRIDE, b);
#if LPART
  lora_partials(lid, t, b);
#endif
#if QNORM
  workgroupBarrier();
  let vv = select(0.0, v * v, ok);
  qa[lid] = vv;
  workgroupBarrier();
  let s2 = block_reduce(lid, vv, false);
  if (ok && lid % 32u == 0u) { qout[t * QSTRIDE + QP0 + b] = bitcast<u32>(s2); }
#endif
}
#endif
#if QOUT
const RPS: u32 = {{RPS}}u;
var<workgroup> res: array<f32, {{RES}}>;
#endif
#if LFUSE
{{LU_DECL}}
{{LCTL_DECL}}
{{LB_DECL}}
const LR: u32 = {{LR}}u;             // the LoRA slots' maximum rank (a multiple of 4)
const LJW: u32 = {{LJW}}u;           // shares per block: seg * LR + j
const LP4: u32 = {{LP4}}u;           // vec4 sums in lora_p
var<workgroup> lora_p: array<vec4<f32>, LP4>;
var<workgroup> lora_u: array<f32, LJW>;   // scale * the sum of the blocks' shares (1/rms applied at use)
// the adapter: (offset, rank, f32 bits of scale) of table entry 0, which every row of a single
// request indexes (models/lora.py activate; per-row adapters, the streams, keep the shrink
// dispatch); rank 0: none
var<private> lora_en: vec3<u32>;

// the LoRA segment of weight row o (q | k | v; else 0)
fn lora_seg(o: u32) -> u32 {
#if LSEG3
  return select(select(2u, 1u, o < {{LS2}}u), 0u, o < {{LS1}}u);
#else
  return 0u;
#endif
}

// u = scale * the sum over the NB input blocks of their shares lu[t, b, seg * LR + j], for the
// segments of outputs o_first .. o_last (gate/up: both), four j at a time: invocation (g, q) sums
// blocks g, g + ng, ... of quad q (eight loads in flight), then quad q adds the ng sums. Every
// workgroup reads all blocks' shares of its segments (their L2 traffic: NB * LR * 4 bytes each).
// Uniform control flow (a barrier); lora_u is published by the barrier before the epilogue.
fn lora_sum(lid: u32, t: u32, o_first: u32, o_last: u32) {
  lora_en = vec3<u32>(lctl[0], lctl[1], lctl[2]);
  let en = lora_en;
#if DUAL
  let s0 = 0u;
  let s1 = 1u;
#else
  let s0 = lora_seg(o_first);
  let s1 = lora_seg(o_last);
#endif
  let q0 = s0 * (LR / 4u);                  // first quad
  let nq = (s1 + 1u - s0) * (LR / 4u);      // quads
  let ng = max(1u, min(WG, LP4) / nq);      // invocations per quad
  for (var i = lid; i < ng * nq; i += WG) {
    let g = i / nq;
    let q = q0 + i % nq;
    var a0 = vec4<f32>(0.0); var a1 = a0; var a2 = a0; var a3 = a0;
    var a4 = a0; var a5 = a0; var a6 = a0; var a7 = a0;
    if ((4u * q) % LR < en.y) {
      let p = t * NB * (LJW / 4u) + q;
      let st = ng * (LJW / 4u);   // vec4s from one of the invocation's blocks to its next
      var b = g;
      for (; b + 7u * ng < NB; b += 8u * ng) {
        let pb = p + b * (LJW / 4u);
        a0 += lu[pb]; a1 += lu[pb + st]; a2 += lu[pb + 2u * st]; a3 += lu[pb + 3u * st];
        a4 += lu[pb + 4u * st]; a5 += lu[pb + 5u * st]; a6 += lu[pb + 6u * st]; a7 += lu[pb + 7u * st];
      }
      for (; b < NB; b += ng) { a0 += lu[p + b * (LJW / 4u)]; }
    }
    lora_p[i] = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
  }
  workgroupBarrier();
  for (var i = lid; i < nq; i += WG) {
    var tot = vec4<f32>(0.0);
    for (var g = 0u; g < ng; g++) { tot += lora_p[g * nq + i]; }
    tot *= bitcast<f32>(en.z);
    let j = 4u * (q0 + i);
    lora_u[j] = tot.x;
    lora_u[j + 1u] = tot.y;
    lora_u[j + 2u] = tot.z;
    lora_u[j + 3u] = tot.w;
  }
}

// u[seg * LR + j] * B[off + j, col] for j < rank, masked (its loads clamped into the adapter's rows)
fn lora_fterm(u0: u32, off: u32, rank: u32, col: u32, j: u32) -> f32 {
  let jc = min(j, rank - 1u);
  let c = (off + jc) * {{LBO}}u + col;
  let bw = unpack2x16float(lb[c / 2u]);
  return select(0.0, lora_u[u0 + jc] * select(bw.x, bw.y, (c & 1u) == 1u), j < rank);
}

// the expand of output o (weight row o; part 1: the second weight's): sum_j u[seg * LR + j] *
// B[off + j, col], eight terms' loads in flight (B loaded ahead of the block loop, 16 or 32
// values per invocation, ran the 1B q4 step at 1920 us against 1340 on an H100, 2026-11-25)
fn lora_part(en: vec3<u32>, o: u32, part: u32) -> f32 {
  let col = o + part * {{LO1}}u;
  let u0 = (part + lora_seg(o)) * LR;
  var v = 0.0;
  for (var j = 0u; j < en.y; j += 8u) {
    v += ((lora_fterm(u0, en.x, en.y, col, j) + lora_fterm(u0, en.x, en.y, col, j + 1u))
        + (lora_fterm(u0, en.x, en.y, col, j + 2u) + lora_fterm(u0, en.x, en.y, col, j + 3u)))
       + ((lora_fterm(u0, en.x, en.y, col, j + 4u) + lora_fterm(u0, en.x, en.y, col, j + 5u))
        + (lora_fterm(u0, en.x, en.y, col, j + 6u) + lora_fterm(u0, en.x, en.y, col, j + 7u)));
  }
  return v;
}

// the LoRA terms of output o of row t: (first weight's, second's with DUAL)
fn lora_add(t: u32, o: u32) -> vec2<f32> {
  var r = vec2<f32>(lora_part(lora_en, o, 0u), 0.0);
#if DUAL
  r.y = lora_part(lora_en, o, 1u);
#endif
  return r;
}
#endif
#if QLAST
var<workgroup> qlast: u32;
#if QSKIP_Y
const QWRITE_Y = false;
#else
const QWRITE_Y = true;
#endif
#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32{{SG_ARGS}}) {
#if QWRITE
#if SUBGROUPS
  q_lane = lane;   // for quantize_block (a quantizing epilogue comes with subgroups)
  q_sg = sg;
#endif
#endif
#if COLS
  let t0 = wid.y * NCOL;
  if (t0 >= {{NT}}) { return; }
  let nc = min(NCOL, {{NT}} - t0);   // this workgroup's columns
  let o0 = wid.x * ROWS;
{{XR_DECL}}
#if XNORM
  // each column's share of its row's partial sums of x^2 (named values: a register array indexed
  // in loops can live in local memory), loaded before the block loop (their tree comes after it:
  // linear_blk_xnorm.wgsl)
{{SSQ_DECL}}
#endif
#else
  let t = wid.y;
  if (t >= {{NT}}) { return; }
  let xr = t * STRIDE4;
  let o0 = wid.x * ROWS;
  var inv = 1.0;
#if LPART
  lora_entry0();
#endif
#if LFUSE
  lora_sum(lid, t, o0, min(o0 + ROWS, w_O) - 1u);
#endif
#if XNORM
  let ssp = x_partials(xr, lid);   // (the tree after the block loop)
#endif
#endif
#if QOUT
  for (var r0 = (lid / sg) * RPS; r0 < ROWS; r0 += (WG / sg) * RPS) {
{{ACC_DECL}}
    for (var b0 = lane; b0 < NB; b0 += sg * BU) {
{{ROW_BODY}}
    }
{{SG_STORE}}
  }
#if XNORM
#include linear_blk_xnorm
#endif
  workgroupBarrier();
#if COLS
  // WG / 32 columns at a time: invocations 32j .. 32j + 31 hold column c0 + j's 32 outputs
  for (var c0 = 0u; c0 < nc; c0 += WG / 32u) {
    let c = c0 + lid / 32u;
    let r = lid % 32u;
    let ok = c < nc && o0 + r < w_O;
    let cc = min(c, NCOL - 1u);
    let t = t0 + cc;
    var v = 0.0;
    if (ok) {
      v = epilogue_value(t, o0 + r, col_inv(cc) * res[cc * 2u * ROWS + r], col_inv(cc) * res[cc * 2u * ROWS + ROWS + r]);
#if !QSKIP_Y
      y_write1(0u, t, 0u, o0 + r, v);
#endif
    }
    write_block(lid, v, ok, t, wid.x, o0 + r);
    workgroupBarrier();
  }
#else
  let ok = lid < ROWS && o0 + lid < w_O;
  var v = 0.0;
  if (ok) {
#if LFUSE
    let la = lora_add(t, o0 + lid);
    v = epilogue_value(t, o0 + lid, inv * (res[lid] + la.x), inv * (res[ROWS + lid] + la.y));
#else
    v = epilogue_value(t, o0 + lid, inv * res[lid], inv * res[ROWS + lid]);
#endif
#if !QSKIP_Y
    y_write1(0u, t, 0u, o0 + lid, v);
#endif
  }
  write_block(lid, v, ok, t, wid.x, o0 + lid);
#endif
#else
{{ACC_DECL}}
  for (var b0 = lid; b0 < NB; b0 += WG * BU) {
{{ROW_BODY}}
  }
#if XNORM
#include linear_blk_xnorm
#endif
{{REDUCE}}
#if QLAST
  // the 32-block's last workgroup to finish quantizes it (qcnt counts the block's workgroups;
  // storageBarrier, a device-scope fence, releases qy before the count and acquires it after;
  // qy is read with atomics, at the device-coherent level)
  storageBarrier();
  if (lid == 0u) { qlast = u32(atomicAdd(&qcnt[t * QNB + o0 / 32u], 1u) == 32u / ROWS - 1u); }
  if (workgroupUniformLoad(&qlast) == 1u) {
    storageBarrier();
    let ob = o0 - o0 % 32u;
    let ok = lid < 32u;
    var v = 0.0;
    if (ok) { v = bitcast<f32>(atomicLoad(&qy[t * w_O + ob + lid])); }
    write_block(lid, v, ok, t, o0 / 32u, ob + lid);
    if (lid == 0u) { atomicStore(&qcnt[t * QNB + o0 / 32u], 0u); }
  }
#endif
#endif
}
