// Embedding lookup: out[t, :] = E[ids[t], :] * SCALE for t < n_tokens.
//   ids: array<u32> (T_cap) token ids of this step (host-written for prompts; the sampler writes
//        ids[0] itself during decode, so the token never visits the host)
//   E  : weight (vocab, dim) in any runtime format (dequantized by its accessor); SHARD: rows
//        ROW0 .. ROW0+NROWS of it (a table larger than one binding runs one dispatch per shard)
//   fc : (FORECAST) forecast vectors (rows, dim / 4) vec4: an id with the FORECAST_ID bit set
//        reads fc row id & ~FORECAST_ID as it is (the layer input itself: no SCALE)
{{STEP_DECL}}
{{IDS_DECL}}
{{W_DECL}}
{{OUT_DECL}}
{{FC_DECL}}
const SCALE: f32 = {{SCALE}};

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.y;
  let s = wid.x * 64u + lid;
  if (t >= {{NT}} || s >= out_S) { return; }
  let id = ids[t];
#if FORECAST
  if (id >= {{FORECAST_ID}}u) {
    out_write(0u, t, 0u, s, fc[(id - {{FORECAST_ID}}u) * out_S + s]);
    return;
  }
#endif
#if SHARD
  // E is one row shard (rows ROW0 .. ROW0 + NROWS of the table): only its tokens are written
  if (id < {{ROW0}}u || id >= {{ROW0}}u + {{NROWS}}u) { return; }
  out_write(0u, t, 0u, s, w_read4(id - {{ROW0}}u, s) * SCALE);
#else
  out_write(0u, t, 0u, s, w_read4(id, s) * SCALE);
#endif
}
