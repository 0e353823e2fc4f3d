// RoPE fused with the Q/K/V relayout and the in-place KV-cache append (ML Drift's hand-fused
// kernel). Input qkv (T, QD + 2 KVD), rows [q heads | k heads | v heads], each head DH wide.
//   q_rel : (B = KVH, W = T * GROUP, C = DH) activation: the query heads that share a KV head
//           become consecutive rows, so attention reads K/V once per group.
//   kc    : (KVH, CAP, DH)  K cache as conv weights OHWI, O = cache position, I = DH
//   vc    : (KVH, DH, CAP)  V cache as conv weights OHWI, O = DH, I = cache position
// Row t sits at position p = row_pos(t) and is written at cache row row_cache(t) (= p for one
// sequence; streams: in the row's own segment, kernels/step.py); no copies ever. With TREE it
// is rotated by its tree record's position instead (a tree node: its depth).
// ROPE_HALF rotates pairs (i, i + DH/2) (HF); otherwise pairs (2i, 2i+1) (llama.cpp GGUF order).
// QK_NORM applies RMSNorm over DH to q and k heads before rotation (Gemma 3).
// One workgroup per (head slot, token), DH/2 threads, one rotation pair each.
{{STEP_DECL}}
{{QKV_DECL}}
{{Q_DECL}}
{{KC_DECL}}
{{VC_DECL}}
alias kv_t = {{KV_T}};   // the caches' value type (f32, or f16: kernels/rope.py kv_type)
{{INV_FREQ_DECL}}
{{QN_DECL}}
{{KN_DECL}}
{{TREE_DECL}}
const H: u32 = {{H}}u;
const KVH: u32 = {{KVH}}u;
const DH: u32 = {{DH}}u;
const HALF: u32 = {{HALF}}u;
const GROUP: u32 = {{GROUP}}u;
const CAP: u32 = {{CAP}}u;
const EPS: f32 = {{EPS}};
const W_OFFSET: f32 = {{W_OFFSET}};
var<workgroup> red: array<f32, {{HALF}}>;

@compute @workgroup_size({{HALF}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) i: u32) {
  let j = wid.x;     // head slot: [0, H) q, [H, H+KVH) k, [H+KVH, H+2KVH) v
  let t = wid.y;
  if (t >= step.n_tokens) { return; }
  let p = row_pos(t);
  let cr = row_cache(t);   // its cache row
#if ROPE_HALF
  let c0 = i;
  let c1 = i + HALF;
#else
  let c0 = 2u * i;
  let c1 = 2u * i + 1u;
#endif
  let base = j * DH;
  var a = qkv_read1(0u, t, 0u, base + c0);
  var b = qkv_read1(0u, t, 0u, base + c1);
  if (j >= H + KVH) {   // value head: straight into the V cache, transposed
    let kvh = j - H - KVH;
    vc[(kvh * DH + c0) * CAP + cr] = kv_t(a);
    vc[(kvh * DH + c1) * CAP + cr] = kv_t(b);
    return;
  }
#if QK_NORM
  red[i] = a * a + b * b;
  workgroupBarrier();
  for (var k = HALF / 2u; k > 0u; k >>= 1u) {
    if (i < k) { red[i] += red[i + k]; }
    workgroupBarrier();
  }
  let inv = inverseSqrt(red[0] / f32(DH) + EPS);
  if (j < H) {
    a = a * inv * (qn[c0] + W_OFFSET); b = b * inv * (qn[c1] + W_OFFSET);
  } else {
    a = a * inv * (kn[c0] + W_OFFSET); b = b * inv * (kn[c1] + W_OFFSET);
  }
#endif
#if TREE
  let ang = f32(tree[t * TREE_ROW]) * inv_freq[i];
#else
  let ang = f32(p) * inv_freq[i];
#endif
  let cs = cos(ang);
  let sn = sin(ang);
  let ra = a * cs - b * sn;
  let rb = b * cs + a * sn;
  if (j < H) {
    let kvh = j / GROUP;
    let row = t * GROUP + j % GROUP;
    q_write1(kvh, row, 0u, c0, ra);
    q_write1(kvh, row, 0u, c1, rb);
  } else {
    let kvh = j - H;
    kc[(kvh * CAP + cr) * DH + c0] = kv_t(ra);
    kc[(kvh * CAP + cr) * DH + c1] = kv_t(rb);
  }
}
