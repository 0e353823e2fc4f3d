// Shared by attention.wgsl and attention_gqa.wgsl: bindings, shapes and the score (scaled,
// optionally soft-capped) of phase 1 of the split-K attention.
{{STEP_DECL}}
{{Q_DECL}}
{{KC_DECL}}
{{VC_DECL}}
{{PART_DECL}}
{{TREE_DECL}}
const DH: u32 = {{DH}}u;
const DH4: u32 = {{DH4}}u;
const GROUP: u32 = {{GROUP}}u;
const CAP: u32 = {{CAP}}u;
const CHUNK: u32 = {{CHUNK}}u;
const CHUNK4: u32 = {{CHUNK4}}u;
const NSPLIT: u32 = {{NSPLIT}}u;
const ROWS_CAP: u32 = {{ROWS_CAP}}u;
const SCALE: f32 = {{SCALE}};
const WINDOW: u32 = {{WINDOW}}u;   // 0: no sliding window
const NJ: u32 = {{NJ}}u;      // key groups in the V product: invocation (d, g), g < NJ, sums keys g*JL..
const JL: u32 = {{JL}}u;      // keys per group = ceil(CHUNK / NJ)

fn score(a: f32) -> f32 {
  var s = a * SCALE;
#if SOFTCAP
  s = {{CAP_ATTN}} * tanh(clamp(s / {{CAP_ATTN}}, -15.0, 15.0));
#endif
  return s;
}

// Whether query row t (cache slot p, window start lo) sees key k: causal by slot, and with
// TREE the row's record in `tree` (kernels/tree.py: a shared prefix, an own segment, ancestor
// bits over the step's block).
fn visible(t: u32, p: u32, lo: u32, k: u32) -> bool {
  if (k > p || k < lo) { return false; }
#if TREE
  let r = t * TREE_ROW;
  if (k < tree[r + 1u] || (k >= tree[r + 2u] && k < tree[r + 3u])) { return true; }
  let j = k - step.pos0;                           // block row (wraps to a huge value below pos0)
  return j < 32u * TREE_TW && (tree[r + 4u + j / 32u] & (1u << (j % 32u))) != 0u;
#else
  return true;
#endif
}

// The first key a sliding window lets row t (slot p) see; with TREE it ends at the row's RoPE
// position (the cache below the block holds position == slot).
fn window_lo(t: u32, p: u32) -> u32 {
#if TREE
  let pos = tree[t * TREE_ROW];
#else
  let pos = p;
#endif
  if (WINDOW > 0u && pos + 1u > WINDOW) { return pos + 1u - WINDOW; }
  return 0u;
}
