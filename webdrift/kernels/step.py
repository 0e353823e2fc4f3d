"""The per-step uniform every model kernel binds first (as "step", declared by
kernels/bindings.Bindings.step): the only thing the host writes per decode step
(Transformer-Lite's symbolic shapes resolved once per step, not per kernel).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import struct

STEP_STRUCT = """struct Step {
  n_tokens: u32,     // T: tokens processed by this step
  pos0: u32,         // position of the first of them
  kv_len: u32,       // pos0 + T: valid cache length after this step
  last_row: u32,     // the row whose logits are sampled (T - 1)
  seed: u32,
  step: u32,         // index of the generated token (out_tokens slot)
  top_k: u32,
  flags: u32,
  temperature: f32,
  top_p: f32,
  pad0: f32,
  pad1: f32,
}
"""
STEP_BYTES = 48


def pack_step(n_tokens: int, pos0: int, step: int = 0, seed: int = 0, temperature: float = 0.0,
              top_k: int = 0, top_p: float = 1.0) -> bytes:
    return struct.pack("<8I4f", n_tokens, pos0, pos0 + n_tokens, n_tokens - 1, seed & 0xFFFFFFFF,
                       step, top_k, 0, temperature, top_p, 0.0, 0.0)
