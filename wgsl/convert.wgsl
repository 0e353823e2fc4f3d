// Weight conversion at load: raw tensor bytes as stored in the file (GGUF blocks or
// safetensors little-endian) -> webdrift's runtime weight format, written through the
// destination's generated accessor index, so the consuming kernel's layout is honoured.
//   raw: array<u32>, the tensor's bytes from byte 0 (ROWS x COLS elements, row-major, type {{SRC}})
//   destination rows ROW0 .. ROW0+ROWS (several tensors can be concatenated, e.g. Q|K|V)
// One invocation per (row, unit): unit = a 4-channel slice (f32/f16 targets) or a group of GROUP
// inputs sharing a scale (q8 / q4 kinds: 32; q4g128: 128, the last group of a row holding the
// remainder; per-channel formats: the whole row).
// q8 / q4 targets take the source's integers and scales as they are where the format holds them
// (Q8_0 and Q5_0 -> q8; Q4_0, Q4_1 and Q4_K -> q4, Q4_K's 6-bit sub-block scales multiplied out
// into f16); any other source is decoded to floats and re-quantized per 32-block like ggml's
// quantize_row_q8_0_ref (q8) and quantize_row_q4_1_ref (q4), per GROUP inputs; e0m4 takes the
// group's scale s = (max - min) * 16 / 15 and bias b = min - s (both rounded to f16 first), so the
// group's values fall in [b + s, b + 2s) and each is coded as the 4 fraction bits of (x - b) / s.

{{RAW_DECL}}
{{DST_DECL}}

const ROWS: u32 = {{ROWS}}u;
const COLS: u32 = {{COLS}}u;
const ROW0: u32 = {{ROW0}}u;
const UNITS: u32 = {{UNITS}}u;     // units per row
const GROUP: u32 = {{GROUP}}u;     // quantized targets: inputs per unit (one scale)
const NX: u32 = {{NX}}u;           // workgroups along x (the grid is 2-D for large tensors)

fn byte_at(b: u32) -> u32 { return (raw[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu; }
fn f16_at(b: u32) -> f32 { return unpack2x16float(byte_at(b) | (byte_at(b + 1u) << 8u)).x; }
fn i8_at(b: u32) -> i32 { return i32(byte_at(b) << 24u) >> 24u; }
fn bit_at(b: u32, k: u32) -> u32 { return (byte_at(b + k / 8u) >> (k % 8u)) & 1u; }
// Q4_0 / Q4_1 / Q5_x nibble of element j (0..31) of a block whose 16 nibble bytes start at qs
fn nib32(qs: u32, j: u32) -> u32 { return (byte_at(qs + j % 16u) >> (4u * (j / 16u))) & 15u; }

// Q4_K / Q5_K: (scale, min) of 32-element sub-block s (0..7), 6 bits each, packed in 12 bytes at sc
fn k4_scale_min(sc: u32, s: u32) -> vec2<f32> {
  if (s < 4u) {
    return vec2<f32>(f32(byte_at(sc + s) & 63u), f32(byte_at(sc + 4u + s) & 63u));
  }
  let md = byte_at(sc + s + 4u);
  return vec2<f32>(f32((md & 15u) | ((byte_at(sc + s - 4u) >> 6u) << 4u)),
                   f32((md >> 4u) | ((byte_at(sc + s) >> 6u) << 4u)));
}
// Q4_K / Q5_K: low 4 bits of element j (0..255) of a superblock whose 128 nibble bytes start at qs:
// byte 32 * (j / 64) + j % 32, low nibble for the first 32 of each 64
fn k_nib(qs: u32, j: u32) -> u32 { return (byte_at(qs + 32u * (j / 64u) + j % 32u) >> (4u * ((j / 32u) % 2u))) & 15u; }

// Q6_K: the signed 6-bit code (q - 32) of element j (0..255) of the super-block at byte blk
fn q6k_code(blk: u32, j: u32) -> i32 {
  let h = j / 128u;
  let k = (j % 128u) / 32u;
  let l = j % 32u;
  let lo = (byte_at(blk + 64u * h + 32u * (k % 2u) + l) >> (4u * (k / 2u))) & 15u;
  let hi = (byte_at(blk + 128u + 32u * h + l) >> (2u * k)) & 3u;
  return i32(lo | (hi << 4u)) - 32;
}

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
  return f16_at(blk) * f32(i8_at(blk + 2u + e % 32u));
#elif SRC_Q4_0
  let blk = (e / 32u) * 18u;
  return f16_at(blk) * (f32(nib32(blk + 2u, e % 32u)) - 8.0);
#elif SRC_Q4_1
  let blk = (e / 32u) * 20u;
  return f16_at(blk) * f32(nib32(blk + 4u, e % 32u)) + f16_at(blk + 2u);
#elif SRC_Q5_0
  let blk = (e / 32u) * 22u;       // d, qh (32 high bits), 16 nibble bytes
  let j = e % 32u;
  return f16_at(blk) * (f32(nib32(blk + 6u, j) | (bit_at(blk + 2u, j) << 4u)) - 16.0);
#elif SRC_Q5_1
  let blk = (e / 32u) * 24u;       // d, m, qh, 16 nibble bytes
  let j = e % 32u;
  return f16_at(blk) * f32(nib32(blk + 8u, j) | (bit_at(blk + 4u, j) << 4u)) + f16_at(blk + 2u);
#elif SRC_Q4_K
  let blk = (e / 256u) * 144u;     // d, dmin, 12 scale bytes, 128 nibble bytes
  let j = e % 256u;
  let sm = k4_scale_min(blk + 4u, j / 32u);
  return f16_at(blk) * sm.x * f32(k_nib(blk + 16u, j)) - f16_at(blk + 2u) * sm.y;
#elif SRC_Q5_K
  let blk = (e / 256u) * 176u;     // d, dmin, 12 scale bytes, qh[32] (bit s of qh[l]), 128 nibble bytes
  let j = e % 256u;
  let sm = k4_scale_min(blk + 4u, j / 32u);
  let q = k_nib(blk + 48u, j) | (((byte_at(blk + 16u + j % 32u) >> (j / 32u)) & 1u) << 4u);
  return f16_at(blk) * sm.x * f32(q) - f16_at(blk + 2u) * sm.y;
#elif SRC_Q6_K
  let blk = (e / 256u) * 210u;     // ql[128], qh[64], int8 scales[16], d
  let j = e % 256u;
  return f16_at(blk + 208u) * f32(i8_at(blk + 192u + j / 16u)) * f32(q6k_code(blk, j));
#elif SRC_Q2_K
  let blk = (e / 256u) * 84u;      // scales[16] (4-bit scale | 4-bit min), qs[64], d, dmin
  let j = e % 256u;
  let s = byte_at(blk + j / 16u);
  let q = (byte_at(blk + 16u + 32u * (j / 128u) + j % 32u) >> (2u * ((j % 128u) / 32u))) & 3u;
  return f16_at(blk + 80u) * f32(s & 15u) * f32(q) - f16_at(blk + 82u) * f32(s >> 4u);
#elif SRC_Q3_K
  let blk = (e / 256u) * 110u;     // hmask[32], qs[64], 12 scale bytes (16 x 6 bits, biased 32), d
  let j = e % 256u;
  let i = j / 16u;
  let lo = select(byte_at(blk + 96u + i - 8u) >> 4u, byte_at(blk + 96u + i) & 15u, i < 8u);
  let sc = i32(lo | (((byte_at(blk + 104u + i % 4u) >> (2u * (i / 4u))) & 3u) << 4u)) - 32;
  let k = (j % 128u) / 32u;
  let l = j % 32u;
  let q = i32((byte_at(blk + 32u + 32u * (j / 128u) + l) >> (2u * k)) & 3u)
        - select(4, 0, ((byte_at(blk + l) >> (4u * (j / 128u) + k)) & 1u) == 1u);
  return f16_at(blk + 108u) * f32(sc) * f32(q);
#endif
}

#if DST_HALF
// q8_0 / q4_0: scale g (f16) into half g % 2 of word g / 2; the other half is another
// invocation's (the buffer starts zeroed, each scale is written once)
fn put_half(g: u32, d: f32) {
  let h = (pack2x16float(vec2<f32>(d, 0.0)) & 0xffffu) << (16u * (g % 2u));
#if DST_Q8
  atomicOr(&dst_scale[g / 2u], h);
#else
  atomicOr(&dst_sm[g / 2u], h);
#endif
}
#endif
#if DST_Q8
fn put_q8_scale(g: u32, d: f32) {
#if DST_HALF
  put_half(g, d);
#else
  dst_scale[g] = d;
#endif
}
#endif

// C roundf: half away from zero
fn round_away(v: f32) -> f32 {
  let a = abs(v);
  let f = floor(a);
  return sign(v) * (f + select(0.0, 1.0, a - f >= 0.5));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let id = (wid.y * NX + wid.x) * 64u + lid;
  if (id >= ROWS * UNITS) { return; }
  let r = id / UNITS;
  let u = id % UNITS;
  let glen = min(GROUP, COLS - GROUP * u);   // quantized targets: a row's last group may be shorter
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
  // runtime q8: word k of the row = int8 elements 4k..4k+3 (byte order), one f32 scale per 32 (q8_0: f16)
  let wrow = (ROW0 + r) * (COLS / 4u) + (GROUP / 4u) * u;
#if Q8_DIRECT
#if SRC_Q8_0
  let blk = (r * UNITS + u) * 34u;   // copy the 32 int8 bytes, widen the scale
  for (var k = 0u; k < 8u; k++) {
    let b = blk + 2u + 4u * k;
    dst_data[wrow + k] = byte_at(b) | (byte_at(b + 1u) << 8u) | (byte_at(b + 2u) << 16u) | (byte_at(b + 3u) << 24u);
  }
  put_q8_scale((ROW0 + r) * UNITS + u, f16_at(blk));
#elif SRC_Q5_0
  let blk = (r * UNITS + u) * 22u;   // 5-bit q - 16 fits an int8 with the same scale
  for (var k = 0u; k < 8u; k++) {
    var w = 0u;
    for (var n = 0u; n < 4u; n++) {
      let j = 4u * k + n;
      w = w | ((((nib32(blk + 6u, j) | (bit_at(blk + 2u, j) << 4u)) - 16u) & 0xffu) << (8u * n));
    }
    dst_data[wrow + k] = w;
  }
  put_q8_scale((ROW0 + r) * UNITS + u, f16_at(blk));
#elif SRC_Q6_K
  let e0 = (r * UNITS + u) * 16u;    // q8g16: 16 codes q - 32 sharing a sub-block scale, d * sc exact in f32
  let blk = (e0 / 256u) * 210u;
  for (var k = 0u; k < 4u; k++) {
    var w = 0u;
    for (var n = 0u; n < 4u; n++) {
      w = w | ((u32(q6k_code(blk, e0 % 256u + 4u * k + n)) & 0xffu) << (8u * n));
    }
    dst_data[wrow + k] = w;
  }
  put_q8_scale((ROW0 + r) * UNITS + u, f16_at(blk + 208u) * f32(i8_at(blk + 192u + (e0 % 256u) / 16u)));
#endif
#else
  var amax = 0.0;
  for (var j = 0u; j < glen; j++) { amax = max(amax, abs(src_value(r, GROUP * u + j))); }
  let d = amax / 127.0;
  let inv = select(0.0, 1.0 / d, d != 0.0);
  for (var k = 0u; k < glen / 4u; k++) {
    var w = 0u;
    for (var n = 0u; n < 4u; n++) {
      let q = i32(round_away(src_value(r, GROUP * u + 4u * k + n) * inv));
      w = w | ((u32(q) & 0xffu) << (8u * n));
    }
    dst_data[wrow + k] = w;
  }
  put_q8_scale((ROW0 + r) * UNITS + u, d);
#endif
#endif
#if DST_Q4
  // runtime q4: nibble n of word k = element 8k+n; (scale, min) as f16x2 per 32-block
  let wrow = (ROW0 + r) * (COLS / 8u) + (GROUP / 8u) * u;
#if Q4_DIRECT
#if SRC_Q4_1
  let blk = (r * UNITS + u) * 20u;   // d, m, 16 nibble bytes
  let d = f16_at(blk);
  let m = f16_at(blk + 2u);
#elif SRC_Q4_0
  let blk = (r * UNITS + u) * 18u;   // d, 16 nibble bytes; x = d (q - 8) (q4_0 keeps d alone)
  let d = f16_at(blk);
  let m = -8.0 * d;
#else
  let e0 = (r * UNITS + u) * 32u;    // sub-block s of a Q4_K superblock: x = d sc q - dmin mn
  let blk = (e0 / 256u) * 144u;
  let s = (e0 % 256u) / 32u;
  let sm = k4_scale_min(blk + 4u, s);
  let d = f16_at(blk) * sm.x;
  let m = -f16_at(blk + 2u) * sm.y;
#endif
  for (var k = 0u; k < 4u; k++) {
    var w = 0u;
    for (var n = 0u; n < 8u; n++) {
      let j = 8u * k + n;
#if SRC_Q4_K
      let q = k_nib(blk + 16u, 32u * s + j);
#elif SRC_Q4_1
      let q = nib32(blk + 4u, j);
#else
      let q = nib32(blk + 2u, j);
#endif
      w = w | (q << (4u * n));
    }
    dst_data[wrow + k] = w;
  }
#if DST_HALF
  put_half((ROW0 + r) * UNITS + u, d);
#else
  dst_sm[(ROW0 + r) * UNITS + u] = pack2x16float(vec2<f32>(d, m));
#endif
#elif DST_HALF
  // ggml's quantize_row_q4_0: d = the value of largest magnitude / -8, q = trunc(x / d + 8.5) <= 15
  var amax = 0.0;
  var vmax = 0.0;
  for (var j = 0u; j < glen; j++) {
    let x = src_value(r, GROUP * u + j);
    if (abs(x) > amax) { amax = abs(x); vmax = x; }
  }
  let d = vmax / -8.0;
  let inv = select(0.0, 1.0 / d, d != 0.0);
  for (var k = 0u; k < glen / 8u; k++) {
    var w = 0u;
    for (var n = 0u; n < 8u; n++) {
      let q = min(15u, u32(trunc(src_value(r, GROUP * u + 8u * k + n) * inv + 8.5)));
      w = w | (q << (4u * n));
    }
    dst_data[wrow + k] = w;
  }
  put_half((ROW0 + r) * UNITS + u, d);
#else
  var lo = src_value(r, GROUP * u);
  var hi = lo;
  for (var j = 1u; j < glen; j++) {
    let x = src_value(r, GROUP * u + j);
    lo = min(lo, x);
    hi = max(hi, x);
  }
#if DST_E0M4
  let sb = unpack2x16float(pack2x16float(vec2<f32>((hi - lo) * (16.0 / 15.0), lo - (hi - lo) * (16.0 / 15.0))));
  let inv = select(0.0, 1.0 / sb.x, sb.x != 0.0);
  for (var k = 0u; k < glen / 8u; k++) {
    var w = 0u;
    for (var n = 0u; n < 8u; n++) {
      let f = (src_value(r, GROUP * u + 8u * k + n) - sb.y) * inv;     // in [1, 2)
      let q = u32(clamp(floor((f - 1.0) * 16.0 + 0.5), 0.0, 15.0));
      w = w | (q << (4u * n));
    }
    dst_data[wrow + k] = w;
  }
  dst_sm[(ROW0 + r) * UNITS + u] = pack2x16float(sb);
#else
  let d = (hi - lo) / 15.0;
  let inv = select(0.0, 1.0 / d, d != 0.0);
  for (var k = 0u; k < glen / 8u; k++) {
    var w = 0u;
    for (var n = 0u; n < 8u; n++) {
      let q = min(15u, u32(trunc((src_value(r, GROUP * u + 8u * k + n) - lo) * inv + 0.5)));
      w = w | (q << (4u * n));
    }
    dst_data[wrow + k] = w;
  }
  dst_sm[(ROW0 + r) * UNITS + u] = pack2x16float(vec2<f32>(d, lo));
#endif
#endif
#endif
#if DST_Q4K
  // runtime q4k (kernels/weights.py): 32-block u's nibbles in q4's order; block 0 of a super-block
  // also copies its 16-byte header (d, dmin, scales)
  let blk = (r * (COLS / 256u) + u / 8u) * 144u;
  let sb = ((ROW0 + r) * (COLS / 256u) + u / 8u) * 9u;
  let j = u % 8u;
  var q = vec4<u32>(0u);
  for (var k = 0u; k < 4u; k++) {
    for (var n = 0u; n < 8u; n++) {
      q[k] = q[k] | (((byte_at(blk + 16u + 32u * (j / 2u) + 8u * k + n) >> (4u * (j % 2u))) & 15u) << (4u * n));
    }
  }
  dst_data[sb + 1u + j] = q;
  if (j == 0u) { dst_data[sb] = vec4<u32>(raw[blk / 4u], raw[blk / 4u + 1u], raw[blk / 4u + 2u], raw[blk / 4u + 3u]); }
#endif
#if DST_Q6K
  // runtime q6k (kernels/weights.py): 32-block u of the row's Q6_K codes as 4 words of low nibbles
  // (q4 order) and 2 of high bit pairs; block 2m also writes scale word m of its super-block,
  // block 0 the super-block's d
  let blk = (r * (COLS / 256u) + u / 8u) * 210u;
  let j0 = (u % 8u) * 32u;
  let wb = ((ROW0 + r) * UNITS + u) * 6u;
  var hw = vec2<u32>(0u);
  for (var k = 0u; k < 4u; k++) {
    var w = 0u;
    for (var n = 0u; n < 8u; n++) {
      let q = u32(q6k_code(blk, j0 + 8u * k + n) + 32);
      w = w | ((q & 15u) << (4u * n));
      let sp = 2u * k + n % 2u;   // the pair s = 2k + p: word s / 4, byte lane n / 2, bits 2 (s % 4)
      hw[sp / 4u] = hw[sp / 4u] | ((q >> 4u) << (8u * (n / 2u) + 2u * (sp % 4u)));
    }
    dst_data[wb + k] = w;
  }
  dst_data[wb + 4u] = hw.x;
  dst_data[wb + 5u] = hw.y;
  let sw = ((ROW0 + r) * (COLS / 256u) + u / 8u) * 5u;
  if (u % 2u == 0u) {
    let g = (u % 8u) * 2u;   // scales g .. g + 3 (this block's two and the next block's)
    dst_sc[sw + g / 4u] = byte_at(blk + 192u + g) | (byte_at(blk + 193u + g) << 8u) | (byte_at(blk + 194u + g) << 16u)
                        | (byte_at(blk + 195u + g) << 24u);
  }
  if (u % 8u == 0u) { dst_sc[sw + 4u] = bitcast<u32>(f16_at(blk + 208u)); }
#endif
}
