// Shared by attention.wgsl, attention_gqa.wgsl and attention_split.wgsl: bindings, shapes and
// the score (attention_score.wgsl) of phase 1 of the split-K attention.
#include attention_inputs
{{PART_DECL}}
{{TREE_DECL}}
const CHUNK: u32 = {{CHUNK}}u;
const CHUNK4: u32 = {{CHUNK4}}u;
const NSPLIT: u32 = {{NSPLIT}}u;
const ROWS_CAP: u32 = {{ROWS_CAP}}u;
const NJ: u32 = {{NJ}}u;      // key groups in the V product: invocation (d, g), g < NJ, sums keys g*JL..
const JL: u32 = {{JL}}u;      // keys per group = ceil(CHUNK / NJ)
// The partials part[(kvh, row, split)] = (acc[0..DH), m, l) (row: t * GROUP + h): the first word
// of one, and the distance from a row's partial to the next row's of the same split.
const PART_ROW: u32 = NSPLIT * (DH + 2u);
fn part_at(kvh: u32, row: u32, split: u32) -> u32 {
  return ((kvh * ROWS_CAP + row) * NSPLIT + split) * (DH + 2u);
}

#include attention_score

// Keys 4i .. 4i + 3 of the kernel's workgroup array `ss` of per-key values (scores or their
// exponentials), which its invocations write one key each: an array of scalars, as a store to one
// component of a vec4 in memory may read and write the whole vec4 (WGSL, "Component Reference from
// Vector Memory View"), a race between invocations writing neighbouring keys.
fn ss4(i: u32) -> vec4<f32> {
  return vec4<f32>(ss[4u * i], ss[4u * i + 1u], ss[4u * i + 2u], ss[4u * i + 3u]);
}

// Partial word i set to v (PART_ATOMIC: the partials are atomics, written and read device-coherent
// for the workgroup that merges them, attention_merge.wgsl)
fn part_set(i: u32, v: f32) {
#if PART_ATOMIC
  atomicStore(&part[i], bitcast<u32>(v));
#else
  part[i] = v;
#endif
}

// The position row t queries at: its cache slot, or with TREE its RoPE position (the record's
// pos: keys are then read in the logical order of the row's path, key_slot).
fn query_pos(t: u32) -> u32 {
#if TREE
  return tree[t * TREE_ROW];
#else
  return row_pos(t);
#endif
}

// The cache slot holding key position k for row t: k itself, or with TREE for k past the
// record's prefix (and up to the row's pos) the slot of the row's ancestor at that depth
// (kernels/tree.py: the path bytes), so every key sits in the chunk and lane it would in a
// decode step at the row's position.
fn key_slot(t: u32, k: u32) -> u32 {
#if TREE
  let r = t * TREE_ROW;
  let pre = tree[r + 1u];
  if (k < pre || k > tree[r]) { return k; }
  let j = k - pre;
  return step.pos0 + ((tree[r + 2u + j / 4u] >> (8u * (j % 4u))) & 0xffu);
#else
  return k;
#endif
}

// V[d][keys k .. k + 3] of KV head kvh for row t (k a multiple of 4): one vec4 load, or with TREE
// where the keys reach the block, four loads from the keys' slots
fn v_keys(kvh: u32, d: u32, t: u32, k: u32) -> vec4<f32> {
  let b = (kvh * DH + d) * CAP;
#if TREE
  if (k + 3u >= tree[t * TREE_ROW + 1u]) {
    var v: vec4<f32>;
    for (var i = 0u; i < 4u; i++) { let s = b + key_slot(t, k + i); v[i] = f32(vc[s / 4u][s % 4u]); }
    return v;
  }
#endif
  return vec4<f32>(vc[(b + k) / 4u]);
}

// Whether a query at position p (window start lo) sees key position k: causal (with TREE in the
// logical order of its path: every position up to its own).
fn visible(p: u32, lo: u32, k: u32) -> bool {
  return k <= p && k >= lo;
}


// Whether the chunk whose keys sit at positions kp0 .. kp0 + CHUNK - 1 (kp0: key_pos of its first
// cache row) holds a key the query at position p (window start lo) sees.
fn chunk_seen(kp0: u32, p: u32, lo: u32) -> bool {
  return kp0 != NO_KEY && kp0 <= p && kp0 + CHUNK > lo;
}

// A chunk no row sees: invocations lid < n write only (m, l) = (-3e38, 0) of the partials at
// out0 + lid * stride (the combine skips them).
fn write_unseen(lid: u32, n: u32, out0: u32, stride: u32) {
  if (lid < n) { part_set(out0 + lid * stride + DH, -3.0e38); part_set(out0 + lid * stride + DH + 1u, 0.0); }
}
