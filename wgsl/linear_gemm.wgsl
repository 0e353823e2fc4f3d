// Prefill-stage linear layer (GEMM-like "convolution" kernel), same maths and fusions as the
// decode GEMVs (linear_common.wgsl): y[t, o] = x[t, :] . W[o, :] (+bias) (DUAL: act(x.Wg) * x.Wu)
// (softcap) (+residual), any weight format (dequantized by w_read4 into workgroup memory).
// A workgroup of WG = NTY * NTX invocations computes a BM-token x BN-output tile; invocation
// (ty, tx) = (lid / NTX, lid % NTX) the TM x TN register block of tokens ty + i NTY and outputs
// tx + j NTX (kernels/linear_gemm.py writes it: COMPUTE, STORE). K advances KS 4-input slices
// per step through workgroup tiles xs (BM tokens) and ws (BN outputs), slice-major:
//   xs[buf][s][t] = x[t0 + t, 4 (k0 + s) ..+4]        ws[buf][s][o] = W[o0 + o, 4 (k0 + s) ..+4]
// (zero past T, O and the row). DB: two buffers; the next step's slices are fetched into
// registers before this step's products and stored after them: one barrier per step, the loads'
// latency behind the FMAs. WT, the tile type: f16 vectors with GemmVariant.f16_tiles (shader-f16;
// half the bytes; f16 weights only, held exactly).
// Dispatch: (ceil(O / BN), ceil(tokens / BM)).
{{STEP_DECL}}
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
const NSTEPS: u32 = (w_SI + KS - 1u) / KS;
var<workgroup> xs: array<vec4<f32>, {{XS_N}}>;
var<workgroup> ws: array<{{WT}}, {{WS_N}}>;
#if DUAL
var<workgroup> ws2: array<{{WT}}, {{WS_N}}>;
#endif

// x slice idx = (t, s) of the step starting at slice k0, s fastest (coalesced row reads)
fn fetch_x(idx: u32, t0: u32, k0: u32, T: u32) -> vec4<f32> {
  let t = t0 + idx / KS;
  let s = k0 + idx % KS;
  var v = vec4<f32>(0.0);
  if (idx < BM * KS && t < T && s < w_SI) {
    v = x_read(0u, t, 0u, s);
  }
  return v;
}

fn put_x(buf: u32, idx: u32, v: vec4<f32>) {
  if (idx < BM * KS) { xs[(buf * KS + idx % KS) * BM + idx / KS] = v; }
}

struct WSlices { g: vec4<f32>, u: vec4<f32> }   // the weight's slice, and w2's (DUAL)

fn fetch_w(idx: u32, o0: u32, k0: u32) -> WSlices {
  let o = o0 + idx / KS;
  let s = k0 + idx % KS;
  var p = WSlices(vec4<f32>(0.0), vec4<f32>(0.0));
  if (idx < BN * KS && o < w_O && s < w_SI) {
    p.g = w_read4(o, s);
#if DUAL
    p.u = w2_read4(o, s);
#endif
  }
  return p;
}

fn put_w(buf: u32, idx: u32, p: WSlices) {
  if (idx < BN * KS) {
    let i = (buf * KS + idx % KS) * BN + idx / KS;
    ws[i] = {{WT}}(p.g);
#if DUAL
    ws2[i] = {{WT}}(p.u);
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
{{ACC_DECL}}
#include linear_gemm_loop
}
