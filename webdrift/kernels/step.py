"""The per-step uniform every model kernel binds first (as "step", declared by
kernels/bindings.Bindings.step): the only thing the host writes per decode step
(Transformer-Lite's symbolic shapes resolved once per step, not per kernel), or, for several
steps in one submit, writes once for all of them (kernels/step_advance.py).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import struct

STEP_STRUCT = """struct Step {
  n_tokens: u32,     // T: rows processed by this step
  pos0: u32,         // position of the first of them
  kv_len: u32,       // pos0 + T: valid cache length after this step (one sequence)
  last_row: u32,     // the row whose logits are sampled (T - 1)
  seed: u32,
  step: u32,         // index of the generated token (out_tokens slot: step * n_out + sampled row)
  top_k: u32,
  flags: u32,
  temperature: f32,
  top_p: f32,
  row_step: u32,     // position increment per row: 1 (the rows are consecutive tokens of one
                     // sequence) or 0 (the rows are streams, all at position pos0)
  n_out: u32,        // tokens sampled by this step (1; the streams: one per row)
  seg_base: u32,     // streams: first cache row of the per-stream segments (a multiple of the
                     // attention chunk); rows below it are the shared prompt
  seg_stride: u32,   // streams: cache rows per segment (0: one sequence, cache row = position)
  pad0: u32,
  pad1: u32,
}
// the position of row t, and the cache row its K and V are written at
fn row_pos(t: u32) -> u32 { return step.pos0 + t * step.row_step; }
fn row_cache(t: u32) -> u32 { return row_pos(t) + t * step.seg_stride; }
// the position of the key at cache row k for row t, or NO_KEY (another stream's segment)
const NO_KEY: u32 = 0xffffffffu;
fn key_pos(t: u32, k: u32) -> u32 {
  if (k < step.seg_base) { return k; }
  let shift = t * step.seg_stride;
  if (k < step.seg_base + shift) { return NO_KEY; }
  return k - shift;
}
"""
STEP_BYTES = 64


def pack_step(n_tokens: int, pos0: int, step: int = 0, seed: int = 0, temperature: float = 0.0,
              top_k: int = 0, top_p: float = 1.0, streams: tuple[int, int] | None = None, n_out: int = 1) -> bytes:
    """One sequence: rows are tokens at positions pos0 .. pos0 + n_tokens - 1, written at the same
    cache rows. streams=(seg_base, seg_stride): the n_tokens rows are streams, all at position
    pos0, row t's K and V written at cache row pos0 + t * seg_stride (runtime/streams.py)."""
    row_step, seg_base, seg_stride = (1, 0, 0) if streams is None else (0, *streams)
    return struct.pack("<8I2f6I", n_tokens, pos0, pos0 + n_tokens, n_tokens - 1, seed & 0xFFFFFFFF,
                       step, top_k, 0, temperature, top_p, row_step, n_out, seg_base, seg_stride, 0, 0)
