// Weight conversion at load: raw tensor bytes as stored in the file (GGUF blocks or
// safetensors little-endian) -> webdrift's runtime weight format, written through the
// destination's generated accessor index, so the consuming kernel's layout is honoured.
//   raw: array<u32>, the tensor's bytes from byte 0 (ROWS x COLS elements, row-major, type {{SRC}})
//   destination rows ROW0 .. ROW0+ROWS (several tensors can be concatenated, e.g. Q|K|V)
// One invocation per (row, unit): unit = a 4-channel slice (f32/f16 targets) or a 32-block (q8/q4).

@group(0) @binding(0) var<storage, read> raw: array<u32>;
{{DST_DECL}}

const ROWS: u32 = {{ROWS}}u;
const COLS: u32 = {{COLS}}u;
const ROW0: u32 = {{ROW0}}u;
const UNITS: u32 = {{UNITS}}u;     // units per row
const NX: u32 = {{NX}}u;           // workgroups along x (the grid is 2-D for large tensors)

fn byte_at(b: u32) -> u32 { return (raw[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu; }
fn f16_at(b: u32) -> f32 { return unpack2x16float(byte_at(b) | (byte_at(b + 1u) << 8u)).x; }

// Value of source element (r, c)
fn src_value(r: u32, c: u32) -> f32 {
  let e = r * COLS + c;
#if SRC_F32
  return bitcast<f32>(raw[e]);
#elif SRC_F16
  return unpack2x16float(raw[e / 2u])[e % 2u];
#elif SRC_BF16
  return bitcast<f32>(((raw[e / 2u] >> (16u * (e % 2u))) & 0xffffu) << 16u);
#elif SRC_Q8_0
  let blk = (e / 32u) * 34u;
  let q = i32(byte_at(blk + 2u + e % 32u) << 24u) >> 24u;
  return f16_at(blk) * f32(q);
#elif SRC_Q4_0
  let blk = (e / 32u) * 18u;
  let j = e % 32u;
  let q = (byte_at(blk + 2u + j % 16u) >> (4u * (j / 16u))) & 15u;
  return f16_at(blk) * (f32(q) - 8.0);
#elif SRC_Q4_1
  let blk = (e / 32u) * 20u;
  let j = e % 32u;
  let q = (byte_at(blk + 4u + j % 16u) >> (4u * (j / 16u))) & 15u;
  return f16_at(blk) * f32(q) + f16_at(blk + 2u);
#endif
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let id = (wid.y * NX + wid.x) * 64u + lid;
  if (id >= ROWS * UNITS) { return; }
  let r = id / UNITS;
  let u = id % UNITS;
#if DST_FLOAT
  var v = vec4<f32>(0.0);
  for (var k = 0u; k < 4u; k++) {
    if (4u * u + k < COLS) { v[k] = src_value(r, 4u * u + k); }
  }
  let at = dst_index(ROW0 + r, 4u * u) / 4u;
#if DST_F16
  dst_data[at] = vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw));
#else
  dst_data[at] = v;
#endif
#endif
#if DST_Q8
  // from Q8_0 (34-byte blocks: f16 scale, 32 x int8): copy the bytes, widen the scale
  let blk = (r * UNITS + u) * 34u;
  for (var k = 0u; k < 8u; k++) {
    let b = blk + 2u + 4u * k;
    dst_data[(ROW0 + r) * (COLS / 4u) + 8u * u + k] =
      byte_at(b) | (byte_at(b + 1u) << 8u) | (byte_at(b + 2u) << 16u) | (byte_at(b + 3u) << 24u);
  }
  dst_scale[(ROW0 + r) * UNITS + u] = f16_at(blk);
#endif
#if DST_Q4
  // from Q4_0 (18 bytes: d, 16 x nibble pairs) or Q4_1 (20 bytes: d, m, ...); element j of a
  // block sits in qs[j % 16] (low nibble for j < 16). Runtime order: nibble n of word k = element 8k+n.
#if SRC_Q4_1
  let blk = (r * UNITS + u) * 20u;
  let qs = blk + 4u;
  let d = f16_at(blk);
  let m = f16_at(blk + 2u);
#else
  let blk = (r * UNITS + u) * 18u;
  let qs = blk + 2u;
  let d = f16_at(blk);
  let m = -8.0 * d;
#endif
  for (var k = 0u; k < 4u; k++) {
    var w = 0u;
    for (var n = 0u; n < 8u; n++) {
      let j = 8u * k + n;
      let q = (byte_at(qs + j % 16u) >> (4u * (j / 16u))) & 15u;
      w = w | (q << (4u * n));
    }
    dst_data[(ROW0 + r) * (COLS / 8u) + 4u * u + k] = w;
  }
  dst_sm[(ROW0 + r) * UNITS + u] = pack2x16float(vec2<f32>(d, m));
#endif
}
