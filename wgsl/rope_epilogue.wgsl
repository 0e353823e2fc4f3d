// The QKV projection's epilogue (linear_subgroup / linear_wide / linear_blk.wgsl ROPE): instead of
// writing y, RoPE + the Q relayout + the in-place K/V append of rope_qkv.wgsl. The GEMV computes
// output index i as weight row rperm(i), so rotation partners are adjacent indices (2k, 2k+1)
// whichever pairing the model uses (ROPE_HALF: rows (k, k + DH/2); otherwise (2k, 2k+1)), and
// calls rope_out for each with its partner's value. Bindings (rope.declare_rope_outputs): q_rel,
// the K and V caches and inv_freq; ROPE_TREE (tree verification) also the tree records.
{{Q_DECL}}
{{KC_DECL}}
{{VC_DECL}}
alias kv_t = {{KV_T}};   // the caches' value type (f32, or f16: kernels/rope.py kv_type)
{{INV_FREQ_DECL}}
{{TREE_DECL}}
const RH: u32 = {{RH}}u;
const RKVH: u32 = {{RKVH}}u;
const RDH: u32 = {{RDH}}u;
const RGROUP: u32 = {{RGROUP}}u;
const RCAP: u32 = {{RCAP}}u;

// the weight row computed as output index idx (pairs adjacent)
fn rperm(idx: u32) -> u32 {
#if ROPE_HALF
  let slot = idx / RDH;
  if (slot >= RH + RKVH) { return idx; }
  let m = idx % RDH;
  return slot * RDH + m / 2u + (m % 2u) * (RDH / 2u);
#else
  return idx;
#endif
}

// output index idx of token t with its value vs and its rotation partner's vp
fn rope_out(t: u32, idx: u32, vs: f32, vp: f32) {
#if ROPE_TREE
  let p = tree[t * TREE_ROW];  // a tree row: its node's position (kernels/tree.py), at slot pos0 + t
#else
  let p = row_pos(t);
#endif
  let cr = row_cache(t);       // its cache row
  let slot = idx / RDH;        // [0, H) q heads, [H, H + KVH) k heads, then v heads
  let m = idx % RDH;
  if (slot >= RH + RKVH) {
    vc[((slot - RH - RKVH) * RDH + m) * RCAP + cr] = kv_t(vs);
    return;
  }
  let k = m / 2u;
  let odd = (m % 2u) == 1u;
  let a = select(vs, vp, odd);  // the pair's first and second element
  let b = select(vp, vs, odd);
  let ang = f32(p) * inv_freq[k];
  let cs = cos(ang);
  let sn = sin(ang);
  let r = select(a * cs - b * sn, b * cs + a * sn, odd);
#if ROPE_HALF
  let c = k + select(0u, RDH / 2u, odd);
#else
  let c = m;
#endif
  if (slot < RH) {
    q_write1(slot / RGROUP, t * RGROUP + slot % RGROUP, 0u, c, r);
  } else {
    kc[((slot - RH) * RCAP + cr) * RDH + c] = kv_t(r);
  }
}
