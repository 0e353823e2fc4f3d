// Shared by kernels that write their outputs as int8 32-blocks of a QuantizeKernel row (the
// layout described in quantize.wgsl): invocations 32k .. 32k+31 of the workgroup hold the 32
// values of block b (valid = false: not part of a block; such lanes count as 0 and write
// nothing). Call from uniform control flow (it has barriers). Needs `qout: array<u32>` and the
// consumer row's QNB / QNBP; QPACK_Q4 packs for q4 weights (evens then odds per 8 values).
// QuantizeKernel (quantize.wgsl) uses it too, so every producer gives the same words for the
// same values.
// SUBGROUPS: the including kernel's entry point sets q_lane / q_sg (its subgroup builtins) first;
// where a block's 32 invocations are 32 aligned lanes of one subgroup (subgroups of 32 or 64
// laid out along the invocation index, as on NVIDIA and AMD GPUs) its maximum and sum are
// butterflies of shuffles instead of 32 workgroup-memory loads in a row (each workgroup's tail,
// in every kernel that writes such rows).
// LPART (kernels/lora.py LoraPartials; one token row per workgroup, its block held by
// invocations 0 .. 31): lora_partials also leaves the block's share of the next GEMV's LoRA
// shrink, the block's values (as quantized: times the norm weight where there is one) dotted with
// that GEMV's A rows, so the next GEMV sums the blocks' shares instead of a shrink dispatch
// running in between (linear_blk.wgsl, LFUSE).
var<workgroup> qa: array<f32, {{QWG}}>;
var<workgroup> qw: array<u32, {{QWG}}>;
#if SUBGROUPS
var<private> q_lane: u32;
var<private> q_sg: u32;
#endif

// the maximum (is_max) or sum of the 32 values of lid's block (invocations l0 .. l0 + 31), qa[l0 ..]
// holding them (v: lid's)
fn block_reduce(lid: u32, v: f32, is_max: bool) -> f32 {
  let l0 = lid - lid % 32u;
#if SUBGROUPS
  let off = lid - q_lane;   // the same for every lane (lanes along lid), a multiple of 32: aligned blocks
  if (subgroupAll(q_sg % 32u == 0u && off % 32u == 0u && off == subgroupBroadcastFirst(off))) {
    var r = v;
    for (var m = 16u; m > 0u; m >>= 1u) {
      let o = subgroupShuffleXor(r, m);
      r = select(r + o, max(r, o), is_max);
    }
    return r;
  }
#endif
  var r = qa[l0];
  for (var j = 1u; j < 32u; j++) { r = select(r + qa[l0 + j], max(r, qa[l0 + j]), is_max); }
  return r;
}

fn quant_blocks(lid: u32, u: f32, valid: bool, base: u32, b: u32) {
  let a = select(0.0, abs(u), valid);
  let uv = select(0.0, u, valid);
  qa[lid] = a;
  workgroupBarrier();
  let l0 = lid - lid % 32u;
  let amax = block_reduce(lid, a, true);
  workgroupBarrier();
  qa[lid] = uv;
  let q = i32(round(u * select(0.0, 127.0 / amax, amax > 0.0)));
  qw[lid] = u32(q & 0xff);
  workgroupBarrier();
  if (valid && lid % 4u == 0u) {
    let k = (lid % 32u) / 4u;          // word in the block
#if QPACK_Q4
    let w0 = l0 + 8u * (k / 2u) + (k % 2u);
    let wv = qw[w0] | (qw[w0 + 2u] << 8u) | (qw[w0 + 4u] << 16u) | (qw[w0 + 6u] << 24u);
#else
    let wv = qw[lid] | (qw[lid + 1u] << 8u) | (qw[lid + 2u] << 16u) | (qw[lid + 3u] << 24u);
#endif
    qout[base + 8u * b + k] = wv;
  }
  let sum = block_reduce(lid, uv, false);
  if (valid && lid % 32u == 0u) {
    qout[base + 8u * QNB + b] = bitcast<u32>(amax / 127.0);
    qout[base + 8u * QNB + QNBP + b] = bitcast<u32>(sum);
  }
}

#if LPART
{{LPA_DECL}}
{{LPC_DECL}}
{{LPW_DECL}}
const LPR: u32 = {{LPR}}u;           // the LoRA slots' maximum rank
const LPNSEG: u32 = {{LPNSEG}}u;     // targets of the next GEMV (q|k|v: 3)
const LPJW: u32 = LPNSEG * LPR;      // shares per block: seg * LPR + j
const LPI: u32 = {{LPI}}u;           // the row's channels (the next GEMV's inputs)
const LP_PRE: bool = LPJW <= {{QWG}}u;   // one share per invocation: its A rows loaded ahead
var<private> lp_en: vec2<u32>;       // the adapter: (offset, rank) of table entry 0
var<private> lp_a: array<vec4<u32>, 4>;

// the adapter of a single request's row (every row of one request indexes table entry 0:
// models/lora.py activate; per-row adapters, the streams, keep the shrink dispatch). Call at the
// start: nothing waits for it until the epilogue.
fn lora_entry0() {
  lp_en = vec2<u32>(lpc[0], lpc[1]);
}

// first vec4 of A row (off + j % LPR, segment j / LPR), block b (lpa: the (P, LPNSEG, LPI) f16
// pool, eight halves per vec4)
fn lora_a0(j: u32, b: u32) -> u32 {
  return (((lp_en.x + j % LPR) * LPNSEG + j / LPR) * LPI + 32u * b) / 8u;
}

// LP_PRE: invocation lid's A words of block b, loaded before the block's quantization (its
// barriers hide their latency)
fn lora_a_load(lid: u32, b: u32) {
  if (LP_PRE && lid < LPJW && lid % LPR < lp_en.y) {
    let a0 = lora_a0(lid, b);
    lp_a[0] = lpa[a0];
    lp_a[1] = lpa[a0 + 1u];
    lp_a[2] = lpa[a0 + 2u];
    lp_a[3] = lpa[a0 + 3u];
  }
}

// row t's block b, in qa[0 .. 31] (quant_blocks leaves the values there, published by its
// barriers): lpw[(t * LPI / 32 + b) * LPJW + seg * LPR + j] = sum_i qa[i] * A[off + j, seg, 32 b + i]
// for j < the adapter's rank. No barrier inside.
fn lora_partials(lid: u32, t: u32, b: u32) {
  for (var j = lid; j < LPJW; j += {{QWG}}u) {
    if (j % LPR < lp_en.y) {
      var w = lp_a;
      if (!LP_PRE) {
        let a0 = lora_a0(j, b);
        w = array<vec4<u32>, 4>(lpa[a0], lpa[a0 + 1u], lpa[a0 + 2u], lpa[a0 + 3u]);
      }
      var s = vec4<f32>(0.0);
      for (var k = 0u; k < 4u; k++) {
        let i = 8u * k;
        s += vec4<f32>(unpack2x16float(w[k].x), unpack2x16float(w[k].y)) * vec4<f32>(qa[i], qa[i + 1u], qa[i + 2u], qa[i + 3u])
           + vec4<f32>(unpack2x16float(w[k].z), unpack2x16float(w[k].w)) * vec4<f32>(qa[i + 4u], qa[i + 5u], qa[i + 6u], qa[i + 7u]);
      }
      lpw[(t * (LPI / 32u) + b) * LPJW + j] = (s.x + s.y) + (s.z + s.w);
    }
  }
}
#endif
