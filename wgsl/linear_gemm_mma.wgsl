// Prefill linear layer on the GPU's matrix units (Dawn's chromium_experimental_subgroup_matrix:
// the tensor cores), the same maths and fusions as linear_gemm.wgsl: y[t, o] = x[t, :] . W[o, :]
// (+bias) (DUAL: act(x.Wg) * x.Wu) (softcap) (+residual), any weight format.
// A workgroup is one subgroup (32 invocations) and computes a BM-token x BN-output tile as
// SM x SN 16 x 16 result matrices (BM = 16 SM, BN = 16 SN). One subgroup, because Dawn wants a
// uniform offset for subgroupMatrixStore and a subgroup's index within a workgroup is not (an
// H100 run with four subgroups a workgroup failed to compile: "'subgroupMatrixStore' requires
// argument 1 to be uniform", 2026-11-24). K advances KT = 4 KS inputs per step: x's slices
// (normalised here with the fused norm: 1/rms and its weight, so f16 holds them) and, unless
// DIRECT_W, W's slices dequantized by w_read4 are stored as f16 into workgroup tiles,
//   xs[t * KT + k] = x[t0 + t, k0 + k]            ws[o * KT + k] = W[o0 + o, k0 + k]
// (zero past T, O and the row), then per 16 inputs each subgroup multiplies left (16 tokens x 16,
// row-major) by right (16 x 16 outputs: W's rows, read column-major) into f32 results.
// DIRECT_W (row-major f16 weights): the right matrices load straight from W's buffer (wh).
// The results go one 16 x 16 matrix at a time through workgroup memory (ys, f32) to
// linear_common's epilogue(). f16 holds the activations to ~3 significant digits (an H100
// check against the SIMT GEMM: largest difference 1.6-3.5e-4 of the largest output); the tuner
// takes this kernel only where it measures faster (kernels/autotune.py).
// Dispatch: (ceil(O / BN), ceil(tokens / BM)).
enable chromium_experimental_subgroup_matrix;
{{STEP_DECL}}
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
{{W2_DECL}}
#include linear_common
const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const KS: u32 = {{KS}}u;
const KT: u32 = 4u * KS;
const WG: u32 = {{WG}}u;
const NSTEPS: u32 = (w_SI + KS - 1u) / KS;
alias Left = subgroup_matrix_left<f16, 16, 16>;
alias Right = subgroup_matrix_right<f16, 16, 16>;
alias Acc = subgroup_matrix_result<f32, 16, 16>;
var<workgroup> xs: array<f16, {{XS_N}}>;
#if DIRECT_W
// W (and W2) as f16 rows of w_I inputs: the right matrices load from here, no W tile
{{WH_DECL}}
{{WH2_DECL}}
#else
var<workgroup> ws: array<f16, {{WS_N}}>;
#if DUAL
var<workgroup> ws2: array<f16, {{WS_N}}>;
#endif
#endif
var<workgroup> ys: array<f32, {{YS_N}}>;
#if PRE_NORM
#include linear_gemm_rms
#endif

// slice idx = (t, s) of the step starting at slice k0, s fastest (coalesced row reads)
fn load_x(idx: u32, t0: u32, k0: u32, T: u32) {
  if (idx >= BM * KS) { return; }
  let t = idx / KS;
  let s = idx % KS;
  var v = vec4<f32>(0.0);
  if (t0 + t < T && k0 + s < w_SI) {
    v = x_read(0u, t0 + t, 0u, k0 + s);
#if PRE_NORM
    v = v * norm_w4(k0 + s) * xinv[t];
#endif
  }
  let h = vec4<f16>(v);
  let i = t * KT + 4u * s;
  xs[i] = h.x; xs[i + 1u] = h.y; xs[i + 2u] = h.z; xs[i + 3u] = h.w;
}

#if !DIRECT_W
fn load_w(idx: u32, o0: u32, k0: u32) {
  if (idx >= BN * KS) { return; }
  let o = idx / KS;
  let s = idx % KS;
  var g = vec4<f32>(0.0);
#if DUAL
  var u = vec4<f32>(0.0);
#endif
  if (o0 + o < w_O && k0 + s < w_SI) {
    g = w_read4(o0 + o, k0 + s);
#if DUAL
    u = w2_read4(o0 + o, k0 + s);
#endif
  }
  let i = o * KT + 4u * s;
  let hg = vec4<f16>(g);
  ws[i] = hg.x; ws[i + 1u] = hg.y; ws[i + 2u] = hg.z; ws[i + 3u] = hg.w;
#if DUAL
  let hu = vec4<f16>(u);
  ws2[i] = hu.x; ws2[i + 1u] = hu.y; ws2[i + 2u] = hu.z; ws2[i + 3u] = hu.w;
#endif
}
#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let T = {{NT}};
  let t0 = wid.y * BM;
  let o0 = wid.x * BN;
  if (t0 >= T) { return; }
#if PRE_NORM
  tile_inv_rms(lid, t0, T);
#endif
{{ACC_DECL}}
  for (var k = 0u; k < NSTEPS; k++) {
    for (var i = lid; i < BM * KS; i += WG) { load_x(i, t0, k * KS, T); }
#if !DIRECT_W
    for (var i = lid; i < BN * KS; i += WG) { load_w(i, o0, k * KS); }
#endif
    workgroupBarrier();
    for (var kk = 0u; kk < KT; kk += 16u) {
{{COMPUTE}}
    }
    workgroupBarrier();
  }
{{STORE}}
}
