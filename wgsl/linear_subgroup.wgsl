#include subgroup_directives
// Decode-stage linear layer (GEMV), variant "subgroup": each subgroup computes one output at a
// time, its lanes striding the input's 4-channel slices (UNROLL4: four in flight per lane),
// reduced with subgroupAdd; a workgroup covers ROWS rows whatever the subgroup size. No
// barrier: a fused norm's 1/rms comes from the row's own input loads (load_xs). Same maths and
// fusions as linear_split.wgsl.
//   ROPE (the QKV projection): each subgroup computes a pair of rotation partners
//     (rope_epilogue.wgsl's rperm) and applies RoPE + the Q relayout + the KV append instead of
//     writing y (the unfused path's rope_qkv dispatch); PAIR: a second row per subgroup (DUAL's
//     up projection or ROPE's partner).
//   NCOL > 1 (several token rows: tree verification, the streams): the workgroup computes its
//     rows for NCOL token rows ("columns" tbase .. tbase + NCOL - 1, those < n_tokens) at once, each
//     weight slice loaded once for all of them; every column runs the one-row kernel's
//     statements (#repeat copies of the same text), so its outputs are that kernel's bit for bit.
// Dispatch: (ceil(O / ROWS), ceil(tokens / NCOL)).
{{STEP_DECL}}
{{X_DECL}}
{{Y_DECL}}
{{W_DECL}}
{{W2_DECL}}
#include linear_common
#if ROPE
#include rope_epilogue
// the pair's second row comes from the same weight
fn w2_read4(o: u32, s: u32) -> vec4<f32> { return w_read4(o, s); }
#endif
#include linear_decode
#include linear_subgroup_common

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg: u32) {
  let tbase = wid.y * NCOL;
  if (tbase >= {{NT}}) { return; }
  let nc = min(NCOL, {{NT}} - tbase);   // columns with a token row (workgroup-uniform)
  let nsg = WG / sg;
  let sgi = lid / sg;
#repeat NCOL
  let t{{#}} = min(tbase + {{#}}u, {{NT}} - 1u);   // column {{#}}'s token row (past the last: not written)
#endrepeat
#if ROPE
  // pairs of outputs (i0, i0 + 1) = weight rows (o, o2), rotation partners, in one subgroup
  for (var r = 2u * sgi; r < ROWS; r += 2u * nsg) {
    let i0 = wid.x * ROWS + r;
    if (i0 >= w_O) { break; }
    let o = rperm(i0);
    let o2 = rperm(i0 + 1u);
#else
  for (var r = sgi; r < ROWS; r += nsg) {
    let o = wid.x * ROWS + r;
    if (o >= w_O) { break; }
    let o2 = o;
#endif
#repeat NCOL
    var acc{{#}} = 0.0;
    var acc2_{{#}} = 0.0;
    var ss{{#}} = 0.0;   // x's squares (PRE_NORM)
#endrepeat
    var s = lane;
#if UNROLL4
    // four independent chains: four loads in flight per lane (memory-level parallelism)
#repeat NCOL
    var a1_{{#}} = 0.0; var a2_{{#}} = 0.0; var a3_{{#}} = 0.0;
#if PAIR
    var b1_{{#}} = 0.0; var b2_{{#}} = 0.0; var b3_{{#}} = 0.0;
#endif
#endrepeat
    for (; s + 3u * sg < w_SI; s += 4u * sg) {
#repeat NCOL
#if COLS
      if (nc > {{#}}u) {
#endif
      let x0_{{#}} = load_xs(x_row(t{{#}}), s, &ss{{#}});
      let x1_{{#}} = load_xs(x_row(t{{#}}), s + sg, &ss{{#}});
      let x2_{{#}} = load_xs(x_row(t{{#}}), s + 2u * sg, &ss{{#}});
      let x3_{{#}} = load_xs(x_row(t{{#}}), s + 3u * sg, &ss{{#}});
      acc{{#}} += dot(x0_{{#}}, w_read4(o, s));
      a1_{{#}} += dot(x1_{{#}}, w_read4(o, s + sg));
      a2_{{#}} += dot(x2_{{#}}, w_read4(o, s + 2u * sg));
      a3_{{#}} += dot(x3_{{#}}, w_read4(o, s + 3u * sg));
#if PAIR
      acc2_{{#}} += dot(x0_{{#}}, w2_read4(o2, s));
      b1_{{#}} += dot(x1_{{#}}, w2_read4(o2, s + sg));
      b2_{{#}} += dot(x2_{{#}}, w2_read4(o2, s + 2u * sg));
      b3_{{#}} += dot(x3_{{#}}, w2_read4(o2, s + 3u * sg));
#endif
#if COLS
      }
#endif
#endrepeat
    }
#repeat NCOL
    acc{{#}} += a1_{{#}} + a2_{{#}} + a3_{{#}};
#if PAIR
    acc2_{{#}} += b1_{{#}} + b2_{{#}} + b3_{{#}};
#endif
#endrepeat
#endif
    for (; s < w_SI; s += sg) {
#repeat NCOL
#if COLS
      if (nc > {{#}}u) {
#endif
      let xv{{#}} = load_xs(x_row(t{{#}}), s, &ss{{#}});
      acc{{#}} += dot(xv{{#}}, w_read4(o, s));
#if PAIR
      acc2_{{#}} += dot(xv{{#}}, w2_read4(o2, s));
#endif
#if COLS
      }
#endif
#endrepeat
    }
#repeat NCOL
    acc{{#}} = subgroupAdd(acc{{#}});
#if PAIR
    acc2_{{#}} = subgroupAdd(acc2_{{#}});
#endif
#if PRE_NORM
    let inv{{#}} = rms_inv(subgroupAdd(ss{{#}}));
    acc{{#}} *= inv{{#}};
    acc2_{{#}} *= inv{{#}};
#endif
#endrepeat
#if ROPE
    if (lane == 0u) {
      let va = epilogue_value(t0, o, acc0, 0.0);
      let vb = epilogue_value(t0, o2, acc2_0, 0.0);
      rope_out(t0, i0, va, vb);
      rope_out(t0, i0 + 1u, vb, va);
    }
#else
#repeat NCOL
    if (lane == 0u && tbase + {{#}}u < {{NT}}) { epilogue(t{{#}}, o, acc{{#}}, acc2_{{#}}); }
#endrepeat
#endif
  }
}
