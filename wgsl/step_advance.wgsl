// Several decode steps in one compute pass (runtime/engine.py `_plain_tokens`): each step begins
// with this dispatch, which copies the next of the host's per-step records into the step uniform
// that the step's kernels read, and moves the record counter on. The host writes the counter (0)
// and the records once per submit, so a submit of n steps is one pass of n * (1 + step) dispatches
// and one buffer write, not n passes with a copy before each.
// `dst` is the step uniform itself, bound read_write here and as var<uniform> by every other
// kernel: a compute pass's usage scope is one dispatch, so WebGPU orders the write before the
// reads that follow (a barrier between the dispatches) on every backend.
{{RECORDS_DECL}}
{{DST_DECL}}

@compute @workgroup_size(1)
fn main() {
  let i = records[0];                  // steps of this submit already run
  for (var w = 0u; w < {{WORDS}}u; w++) {
    dst[w] = records[{{WORDS}}u * (i + 1u) + w];
  }
  records[0] = i + 1u;
}
