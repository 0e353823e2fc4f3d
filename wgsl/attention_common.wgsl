// Shared by attention.wgsl and attention_gqa.wgsl: bindings, shapes and the score (scaled,
// optionally soft-capped) of phase 1 of the split-K attention.
{{STEP_DECL}}
{{Q_DECL}}
{{KC_DECL}}
{{VC_DECL}}
{{PART_DECL}}
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
