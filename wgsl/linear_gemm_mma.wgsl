// Prefill linear layer on the GPU's matrix units (Dawn's chromium_experimental_subgroup_matrix:
// the tensor cores), the same maths and fusions as linear_gemm.wgsl: y[t, o] = x[t, :] . W[o, :]
// (+bias) (DUAL: act(x.Wg) * x.Wu) (softcap) (+residual), any weight format.
// A workgroup computes a BM-token x BN-output tile with SGM x SGN subgroups of 32 invocations;
// subgroup (sy, sx) owns the SM x SN 16 x 16 result matrices of tokens sy * 16 SM .. and outputs
// sx * 16 SN .. of the tile (BM = 16 SM SGM, BN = 16 SN SGN). Its products run in a `switch` over
// the subgroup index with every workgroup-memory offset a literal (kernels/linear_gemm.py
// mma_defines: why), which Dawn's uniformity analysis rejects by default ("requires argument 1 to
// be uniform"); the index is uniform within the subgroup, which is what the matrix units need, so
// that check is turned off below. The index is lid / 32: Device.has_mma_f16 requires
// subgroups of exactly 32, laid out in invocation order (the adapters that offer the feature do).
// K advances KT = 4 KS inputs per step. x's slices (normalised here with the fused norm: 1/rms and
// its weight, so f16 holds them) and, unless DIRECT_W, W's slices dequantized by w_read4 go into
// workgroup tiles as f16, rows ST = KT + 8 apart (16 bytes of padding against bank conflicts):
//   xs[t * ST + k] = x[t0 + t, k0 + k]            ws[o * ST + k] = W[o0 + o, k0 + k]
//                                                 ws[BN * ST + o * ST + k] = W2[o0 + o, k0 + k] (DUAL)
// (rows past T or O hold the last row's values, whose results are never stored; zero past the
// row; stored in main, indexed from lid). The next step's slices are fetched into registers
// (as f16) before this step's products, so their loads overlap the matrix work.
// Per 16 inputs a subgroup multiplies its left matrices (16 tokens x 16, row-major) by its right
// ones (16 x 16 outputs: W's rows, read column-major) into f32 results.
// DIRECT_W (row-major f16 weights): the right matrices load straight from W's buffer (wh).
// The results go one 16 x 16 matrix per subgroup at a time through workgroup memory (ys, f32) to
// linear_common's epilogue(); DIRECT_Y (an epilogue of nothing or + residual, a row-major y): a
// tile inside T x O stores its matrices straight into y, the residual their starting value.
// f16 holds the activations to ~3 significant digits (an H200 check against the SIMT GEMM:
// largest difference 1.2-3.4e-4 of the largest output); the tuner takes this kernel only where
// it measures faster (kernels/autotune.py).
// Dispatch: (ceil(O / BN), ceil(tokens / BM)).
enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
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
const ST: u32 = KT + 8u;
const WG: u32 = {{WG}}u;
const SGN: u32 = {{SGN}}u;
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
var<workgroup> ws: array<f16, {{WS_ALL}}>;     // W's tile, then (DUAL) W2's
#endif
var<workgroup> ys: array<f32, {{YS_N}}>;

// x's slice idx = (t, s) of the step starting at slice k0, s fastest (coalesced row reads): rows
// past T read the last row and W's rows past O its last (their results are never stored), so no
// load waits on a bounds branch; zero past the inputs (K_TAIL: only where KS does not divide them)
fn fetch_x(idx: u32, t0: u32, k0: u32, T: u32) -> vec4<f32> {
  let t = min(t0 + idx / KS, T - 1u);
  let s = k0 + idx % KS;
#if K_TAIL
  if (s >= w_SI) { return vec4<f32>(0.0); }
#endif
  return x_read(0u, t, 0u, s);
}

#if !DIRECT_W
// W's slice idx = (o, s) of the step starting at slice k0 (tile 1: W2's), dequantized
fn fetch_w(idx: u32, o0: u32, k0: u32, tile: u32) -> vec4<f32> {
  let o = min(o0 + idx / KS, w_O - 1u);
  let s = k0 + idx % KS;
#if K_TAIL
  if (s >= w_SI) { return vec4<f32>(0.0); }
#endif
#if DUAL
  if (tile == 1u) { return w2_read4(o, s); }
#endif
  return w_read4(o, s);
}
#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let T = {{NT}};
  let t0 = wid.y * BM;
  let o0 = wid.x * BN;
  if (t0 >= T) { return; }
  // this subgroup's results: tokens tm0 .., outputs om0 .. of the tile
  let sg = lid / 32u;
  let lane = lid % 32u;
  let tm0 = (sg / SGN) * {{SUB_M}}u;
  let om0 = (sg % SGN) * {{SUB_N}}u;
{{ACC_DECL}}
{{FETCH_DECL}}
  for (var k = 0u; k < NSTEPS; k++) {
{{PUT}}
    workgroupBarrier();
    if (k + 1u < NSTEPS) {
{{FETCH_NEXT}}
    }
{{COMPUTE}}
    workgroupBarrier();
  }
{{STORE}}
}
