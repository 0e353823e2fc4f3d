// Shared by every linear_*.wgsl (decode GEMVs and the prefill GEMM): the optional bindings, the
// fused RMSNorm of the input, the gate activation and the per-output epilogue, so both stages
// compute exactly the same maths.
{{BIAS_DECL}}
#if PRE_NORM
// RMSNorm of the input fused in (norm + QKV, norm + gate/up, final norm + LM head):
// x_in = x / sqrt(mean(x^2) + EPS) * (nw + W_OFFSET), the mean taken over the whole row
{{NW_DECL}}
const EPS: f32 = {{EPS}};
const W_OFFSET: f32 = {{W_OFFSET}};
#endif

// the norm weights of input slice s (+ W_OFFSET), zero past the channel count
fn norm_w4(s: u32) -> vec4<f32> {
  var wv = vec4<f32>(0.0);
#if NW_ALIGNED
  // channels a multiple of 4 (the kernels read slices s < C / 4 only): nw holds vec4s, one
  // 16-byte load (four f32 loads cost an 8B QKV GEMV about 1.5 of its 23 us on an H200)
  wv = nw[s] + W_OFFSET;
#elif PRE_NORM
  for (var k = 0u; k < 4u; k++) { if (4u * s + k < x_C) { wv[k] = nw[4u * s + k] + W_OFFSET; } }
#endif
  return wv;
}

fn act(g: f32) -> f32 {
#if GELU
  let c = clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0);
  return 0.5 * g * (1.0 + tanh(c));
#else
  return g / (1.0 + exp(-g));
#endif
}

// output o of token t from its dot product(s): bias, gate/up activation, soft-cap, residual
fn epilogue(t: u32, o: u32, acc: f32, acc2: f32) {
  y_write1(0u, t, 0u, o, epilogue_value(t, o, acc, acc2));
}

#if LORA
// LoRA "expand" (kernels/lora.py LoraOut): the adapter's low-rank term of output o of token t,
// sum_j u[t, seg * LR + j] * B[off + j, col], from the shrink's row (lora_shrink.wgsl: its
// adapter offset, rank and u = scale * x_in A^T). part 1: the second weight (gate/up's up).
{{LU_DECL}}
{{LB_DECL}}
fn lora_delta(t: u32, o: u32, part: u32) -> f32 {
  let row = t * {{LUW}}u;
  let off = lu[row];
  let rank = lu[row + 1u];
  var seg = part;
#if LSEG3
  seg = select(select(2u, 1u, o < {{LS2}}u), 0u, o < {{LS1}}u);   // q | k | v
#endif
  let col = o + part * {{LO1}}u;
  let u0 = row + 4u + seg * {{LR}}u;
  // four terms in flight (one dependent load pair per iteration waited a memory latency per rank)
  var v = 0.0;
  var j = 0u;
  for (; j + 4u <= rank; j += 4u) {
    v += (lora_term(u0, off, col, j) + lora_term(u0, off, col, j + 1u))
       + (lora_term(u0, off, col, j + 2u) + lora_term(u0, off, col, j + 3u));
  }
  for (; j < rank; j++) { v += lora_term(u0, off, col, j); }
  return v;
}

// u[j] * B[off + j, col] (B: f16, two per u32)
fn lora_term(u0: u32, off: u32, col: u32, j: u32) -> f32 {
  let c = (off + j) * {{LBO}}u + col;
  let bw = unpack2x16float(lb[c / 2u]);
  return bitcast<f32>(lu[u0 + j]) * select(bw.x, bw.y, (c & 1u) == 1u);
}
#endif

fn epilogue_value(t: u32, o: u32, acc: f32, acc2: f32) -> f32 {
  var v = acc;
  var v2 = acc2;
#if LORA
  v += lora_delta(t, o, 0u);
#if DUAL
  v2 += lora_delta(t, o, 1u);
#endif
#endif
#if BIAS
  v += bias[o];
#endif
#if DUAL
  v = act(v) * v2;
#endif
#if SOFTCAP
  v = {{CAP}} * tanh(clamp(v / {{CAP}}, -15.0, 15.0));
#endif
#if RESIDUAL
  v += y_read1(0u, t, 0u, o);
#endif
  return v;
}
