#include subgroup_directives
// Decode-stage linear layer (GEMV), variant "wide": linear_subgroup.wgsl with each lane reading
// a whole quant block (16-32 bytes of q4 / q8, 8 halves of row-major f16) per iteration through
// the generated `w_dot` (weights.wide_accessor_wgsl; no arrays: they can end up in local memory);
// the block's input slices are loaded once (`x_blk`) and shared by a pair's two weights.
// UNROLL4: four blocks in flight per lane. MROWS: that many consecutive rows per subgroup at a
// time (with ROPE an even count). KSPLIT: the workgroup's invocations split each row's blocks
// instead of one subgroup per row. Same maths, fusions and ROPE epilogue as linear_subgroup.wgsl.
// NCOL > 1: NCOL token rows per workgroup as in linear_subgroup.wgsl (each block's weights
// loaded once for every column, each column the one-row kernel's statements).
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
fn w2_dot(o: u32, b: u32, x: XB) -> f32 { return w_dot(o, b, x); }
#endif
#include linear_decode
{{XB_DECL}}
#include linear_subgroup_common
#if KSPLIT
const KS_SLOTS: u32 = {{KS_SLOTS}}u;   // sums per row group (rows x columns, x2 for gate/up)
const KSN: u32 = WG / 4u;              // subgroups a workgroup can have, at most
const KST: u32 = KS_SLOTS * KSN;       // the slots' totals
#endif

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
#if MROWS
#if KSPLIT
  // split K: the whole workgroup strides the blocks of MROWS rows at a time (ROWS a multiple of
  // it), so a short row is read by many invocations at once (llama.cpp's MMV shape); each
  // subgroup's sums go through red (slot k of subgroup s at k * KSN + s; subgroups have >= 4
  // invocations) and invocation k (k + WG, ..) adds slot k's in subgroup order, so a row's sum
  // does not depend on the other rows or columns
  let r0 = 0u;
  let rstep = {{MROWS}}u;
  let b0 = lid;
  let bstep = WG;
#else
  // MROWS consecutive rows per subgroup at a time: each block's input slices are loaded once
  // for all of them, and MROWS (x2 with PAIR) weight blocks are in flight per lane
  let r0 = sgi * {{MROWS}}u;
  let rstep = nsg * {{MROWS}}u;
  let b0 = lane;
  let bstep = sg;
#endif
  for (var r = r0; r < ROWS; r += rstep) {
    let o = wid.x * ROWS + r;
    if (o >= w_O) { break; }
{{MR_DECL}}
    var b = b0;
#if KUNROLL
    // KU strides at a time: KU x MROWS weight blocks in flight per invocation
{{MR_DECL_U}}
    for (; b + ({{KU}}u - 1u) * bstep < w_NB; b += {{KU}}u * bstep) {
{{MR_ACC_U}}
    }
{{MR_MERGE_U}}
#endif
    for (; b < w_NB; b += bstep) {
{{MR_ACC}}
    }
{{MR_RED}}
#if KSPLIT
    workgroupBarrier();   // red's earlier contents (the previous rows' sums) are read
    if (lane == 0u) {
{{KS_PUT}}
    }
    workgroupBarrier();
    for (var j = lid; j < KS_SLOTS; j += WG) {
      var s = 0.0;
      for (var k = 0u; k < nsg; k++) { s += red[j * KSN + k]; }
      red[KST + j] = s;
    }
    workgroupBarrier();
    if (lid == 0u) {
{{KS_GET}}
#else
    if (lane == 0u) {
#endif
{{MR_EPI}}
    }
  }
#else
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
    var b = lane;
#if UNROLL4
    // four blocks in flight per lane (16-32 bytes each), in four independent chains
#repeat NCOL
    var a1_{{#}} = 0.0; var a2_{{#}} = 0.0; var a3_{{#}} = 0.0;
#if PAIR
    var b1_{{#}} = 0.0; var b2_{{#}} = 0.0; var b3_{{#}} = 0.0;
#endif
#endrepeat
    for (; b + 3u * sg < w_NB; b += 4u * sg) {
#repeat NCOL
#if COLS
      if (nc > {{#}}u) {
#endif
      let x0_{{#}} = x_blk(x_row(t{{#}}), b, &ss{{#}});
      let x1_{{#}} = x_blk(x_row(t{{#}}), b + sg, &ss{{#}});
      let x2_{{#}} = x_blk(x_row(t{{#}}), b + 2u * sg, &ss{{#}});
      let x3_{{#}} = x_blk(x_row(t{{#}}), b + 3u * sg, &ss{{#}});
      acc{{#}} += w_dot(o, b, x0_{{#}});
      a1_{{#}} += w_dot(o, b + sg, x1_{{#}});
      a2_{{#}} += w_dot(o, b + 2u * sg, x2_{{#}});
      a3_{{#}} += w_dot(o, b + 3u * sg, x3_{{#}});
#if PAIR
      acc2_{{#}} += w2_dot(o2, b, x0_{{#}});
      b1_{{#}} += w2_dot(o2, b + sg, x1_{{#}});
      b2_{{#}} += w2_dot(o2, b + 2u * sg, x2_{{#}});
      b3_{{#}} += w2_dot(o2, b + 3u * sg, x3_{{#}});
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
    for (; b < w_NB; b += sg) {
#repeat NCOL
#if COLS
      if (nc > {{#}}u) {
#endif
      let xb{{#}} = x_blk(x_row(t{{#}}), b, &ss{{#}});
      acc{{#}} += w_dot(o, b, xb{{#}});
#if PAIR
      acc2_{{#}} += w2_dot(o2, b, xb{{#}});
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
#endif
}
