"""A lab for the matrix-unit GEMM through Dawn on the desktop (`wgpudawn`): standalone kernels for
y[T, O] = A[T, K] . W[O, K]^T (f16 x f16 -> f32 on Dawn's subgroup matrices, 16 x 16 x 16), timed
with GPU timestamps (best of 3 passes of 10 dispatches) and checked at 24 random outputs against
the products computed here (A and W: hashed multiples of 1/256, the same on the GPU). It is how
docs/BENCHMARKS.md session 32 found what WebGPU's bounds checks cost the matrix units and how
wgsl/linear_gemm_mma.wgsl now avoids it.

Structures (LAB_VARIANTS, comma-separated):
  stage32  A (f32) and W (f16) tiles staged through registers into workgroup memory as f16
           (scalar stores), the next step's loads issued before this step's products: the
           engine's structure before session 32
  stageh   the same with A in f16
  mcopy    the tiles staged by subgroupMatrixLoad from the buffers + subgroupMatrixStore
  direct   both operands loaded straight from the buffers, no workgroup memory
Suffixes: c  every workgroup-memory matrix load at a literal offset (a switch over the subgroups,
             the step's 16-input slices unrolled)
          I  (after c) the tile stores inlined, indexed from local_invocation_index by / and %
          S  (after c) the same by >> and &
          N / L  (after c) no tile stores / no buffer loads: timing only, the outputs are wrong
Tiles: CONFIGS (bm, bn, subgroups sgm x sgn, K step); LAB_FEW=1 four of them. Shapes: SHAPES,
LAB_SHAPES. LAB_TOGGLES: Dawn device toggles to enable (e.g. disable_robustness).

    LAB_SHAPES=8b_gateup,8b_down LAB_VARIANTS=stage32,stage32c,stage32cI python scripts/dawn_gemm_lab.py

Prints one JSON line a kernel: shape, variant, us, TFLOP/s, largest difference / largest output.
"""
import asyncio
import json
import os
import pathlib
import random
import runpy
import struct

from webdrift.gpu import dawn
from webdrift.gpu.base import READ, RW, Dispatch

# the timing of scripts/dawn_mma_check.py (clocks up for WARM_S 0.3 s, then the best of 3 passes)
time_passes = runpy.run_path(str(pathlib.Path(__file__).with_name("dawn_mma_check.py")),
                             run_name="dawn_mma_check")["time_passes"]

TOG = os.environ.get("LAB_TOGGLES", "")
if TOG:
    def req(self, adapter, features, limits):
        return dawn._extras.request_device_sync(adapter, required_features=features, required_limits=limits,
                                                enable_toggles=TOG.split(","), disable_toggles=["timestamp_quantization"])
    dawn.DawnDevice._request_device = req

M32 = 0xFFFFFFFF
def hsh(x):
    x &= M32; x ^= x >> 16; x = (x * 0x7feb352d) & M32; x ^= x >> 15; x = (x * 0x846ca68b) & M32; x ^= x >> 16
    return x
def val(seed, i):
    return ((hsh(i ^ seed) & 255) - 128) / 256.0

HASH_WGSL = """
fn hsh(v: u32) -> u32 { var x = v; x ^= x >> 16u; x *= 0x7feb352du; x ^= x >> 15u; x *= 0x846ca68bu; x ^= x >> 16u; return x; }
fn val(i: u32) -> f32 { return f32(i32(hsh(i ^ SEED) & 255u) - 128) / 256.0; }
"""
# fill a buffer with val(): f16 pairs packed in u32 (F16) or f32
FILL = """{F16}
const SEED: u32 = {SEED}u;
const N: u32 = {N}u;
""" + HASH_WGSL + """
@group(0) @binding(0) var<storage, read_write> out: array<{T}>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x + g.y * 1048576u;
  if (i >= N) { return; }
  out[i] = {VALUE};
}
"""

HEAD = """enable f16;
enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
alias Left = subgroup_matrix_left<f16, 16, 16>;
alias Right = subgroup_matrix_right<f16, 16, 16>;
alias Acc = subgroup_matrix_result<f32, 16, 16>;
const T: u32 = {T}u;
const K: u32 = {K}u;
const O: u32 = {O}u;
const BM: u32 = {BM}u;
const BN: u32 = {BN}u;
const KT: u32 = {KT}u;
const ST: u32 = KT + {PAD}u;
const WG: u32 = {WG}u;
const SGN: u32 = {SGN}u;
"""


def kernel(var, T, K, O, bm, bn, sgm, sgn, kt, pad=8):
    """(wgsl, binding kinds, binding names) of one variant."""
    tm, tn = bm // 16 // sgm, bn // 16 // sgn
    wg = 32 * sgm * sgn
    nsg = sgm * sgn
    h = (HEAD.replace("{T}", str(T)).replace("{K}", str(K)).replace("{O}", str(O)).replace("{BM}", str(bm))
         .replace("{BN}", str(bn)).replace("{KT}", str(kt)).replace("{WG}", str(wg)).replace("{SGN}", str(sgn))
         .replace("{PAD}", str(pad)))
    pairs = [(i, j) for i in range(tm) for j in range(tn)]
    acc = "\n".join(f"  var c{i}_{j} = Acc();" for i, j in pairs)
    store = "\n".join(f"  subgroupMatrixStore(&y, (t0 + tm0 + {16 * i}u) * O + o0 + om0 + {16 * j}u, c{i}_{j}, false, O);"
                      for i, j in pairs)
    pre = f"""
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let t0 = wid.y * BM;
  let o0 = wid.x * BN;
  let sg = lid / 32u;
  let tm0 = (sg / SGN) * {16 * tm}u;
  let om0 = (sg % SGN) * {16 * tn}u;
{acc}
"""
    def loop_kk(body):      # the step's 16-input slices in a loop
        return "    for (var kk = 0u; kk < KT; kk += 16u) {\n" + body + "\n    }"

    def k_loop(put, fetch, products):   # the K loop of a staged structure
        nl = "\n"
        return (f"\n  for (var k0 = 0u; k0 < K; k0 += KT) {{\n{nl.join(put)}\n    workgroupBarrier();\n"
                f"    if (k0 + KT < K) {{\n{nl.join(fetch)}\n    }}\n{products}\n    workgroupBarrier();\n  }}")

    def mma(src_a, src_b, off_a, off_b, stride_a, stride_b):
        L = [f"      let a{i} = subgroupMatrixLoad<Left>(&{src_a}, {off_a(i)}, false, {stride_a});" for i in range(tm)]
        L += [f"      let b{j} = subgroupMatrixLoad<Right>(&{src_b}, {off_b(j)}, true, {stride_b});" for j in range(tn)]
        L += [f"      c{i}_{j} = subgroupMatrixMultiplyAccumulate(a{i}, b{j}, c{i}_{j});" for i, j in pairs]
        return "\n".join(L)
    if var == "direct":
        body = mma("xh", "wh", lambda i: f"(t0 + tm0 + {16 * i}u) * K + k0 + kk",
                   lambda j: f"(o0 + om0 + {16 * j}u) * K + k0 + kk", "K", "K")
        src = h + """
@group(0) @binding(0) var<storage, read> xh: array<f16>;
@group(0) @binding(1) var<storage, read> wh: array<f16>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
""" + pre + f"""
  for (var k0 = 0u; k0 < K; k0 += KT) {{
    for (var kk = 0u; kk < KT; kk += 16u) {{
{body}
    }}
  }}
{store}
}}
"""
        return src, (READ, READ, RW), ("xh", "wh", "y")
    body = mma("xs", "ws", lambda i: f"(tm0 + {16 * i}u) * ST + kk", lambda j: f"(om0 + {16 * j}u) * ST + kk", "ST", "ST")
    noput, noload = var.endswith("N"), var.endswith("L")
    inline = "shift" if var.endswith("S") else "div" if var.endswith("I") else None
    var = var.rstrip("NLSI")
    const_offsets = var.endswith("c")     # every matrix load's offset a literal: a switch over subgroups, kk unrolled
    if const_offsets:
        var = var[:-1]
        st = kt + pad
        cases = []
        for s in range(nsg):
            t_0, o_0 = (s // sgn) * 16 * tm, (s % sgn) * 16 * tn
            L = []
            for kk in range(0, kt, 16):
                L.append(mma("xs", "ws", lambda i, t_0=t_0, kk=kk: f"{(t_0 + 16 * i) * st + kk}u",
                             lambda j, o_0=o_0, kk=kk: f"{(o_0 + 16 * j) * st + kk}u",
                             "ST", "ST").replace("let a", f"let k{kk}a").replace("let b", f"let k{kk}b")
                         .replace("(a", f"(k{kk}a").replace(", b", f", k{kk}b"))
            cases.append(f"      case {s}u: {{\n" + "\n".join(L) + "\n      }")
        body = "    switch sg {\n" + "\n".join(cases) + "\n      default: {}\n    }"
    wmem = """var<workgroup> xs: array<f16, BM * ST>;
var<workgroup> ws: array<f16, BN * ST>;
"""
    if var == "mcopy":
        kb = kt // 16
        na, nw = (bm // 16) * kb, (bn // 16) * kb
        assert na % nsg == 0 and nw % nsg == 0
        fetch, put, fetch0 = [], [], []
        # (register, kind, buffer, tile, tile corner, col_major, blocks a subgroup)
        for reg, kind, buf, tile, corner, cm, count in (("fa", "Left", "xh", "xs", "t0", "false", na // nsg),
                                                        ("fw", "Right", "wh", "ws", "o0", "true", nw // nsg)):
            for n in range(count):
                b = f"(sg + {n * nsg}u)"
                src_off = f"({corner} + 16u * ({b} / {kb}u)) * K + {{K0}} + 16u * ({b} % {kb}u)"
                fetch0.append(f"  var {reg}{n} = subgroupMatrixLoad<{kind}>(&{buf}, {src_off.replace('{K0}', '0u')}, {cm}, K);")
                fetch.append(f"      {reg}{n} = subgroupMatrixLoad<{kind}>(&{buf}, "
                             f"{src_off.replace('{K0}', '(k0 + KT)')}, {cm}, K);")
                put.append(f"    subgroupMatrixStore(&{tile}, 16u * ({b} / {kb}u) * ST + 16u * ({b} % {kb}u), {reg}{n}, {cm}, ST);")
        src = h + """
@group(0) @binding(0) var<storage, read> xh: array<f16>;
@group(0) @binding(1) var<storage, read> wh: array<f16>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
""" + wmem + pre + "\n".join(fetch0) + k_loop(put, fetch, loop_kk(body)) + f"""
{store}
}}
"""
        return src, (READ, READ, RW), ("xh", "wh", "y")
    # stage32 / stageh: chunks through registers, scalar f16 stores
    a32 = var == "stage32"
    ea = 4 if a32 else 8                     # A elements a chunk
    ca, cw = bm * kt // ea, bn * kt // 8     # chunks a step
    na, nw = -(-ca // wg), -(-cw // wg)
    helpers = f"""
fn load_a(idx: u32, t0: u32, k0: u32) -> {'vec4<f32>' if a32 else 'vec4<u32>'} {{
  if (idx >= {ca}u) {{ return {'vec4<f32>' if a32 else 'vec4<u32>'}(); }}
  let r = idx / {kt // ea}u;
  let c = idx % {kt // ea}u;
  return xv[((t0 + r) * K + k0) / {ea}u + c];
}}
fn put_a(idx: u32, v: {'vec4<f32>' if a32 else 'vec4<u32>'}) {{
  if (idx >= {ca}u) {{ return; }}
  let i = (idx / {kt // ea}u) * ST + {ea}u * (idx % {kt // ea}u);
""" + ("""  let h = vec4<f16>(v);
  xs[i] = h.x; xs[i + 1u] = h.y; xs[i + 2u] = h.z; xs[i + 3u] = h.w;
}
""" if a32 else """  let p = bitcast<vec2<f16>>(v.x); let q = bitcast<vec2<f16>>(v.y);
  let r = bitcast<vec2<f16>>(v.z); let s = bitcast<vec2<f16>>(v.w);
  xs[i] = p.x; xs[i + 1u] = p.y; xs[i + 2u] = q.x; xs[i + 3u] = q.y;
  xs[i + 4u] = r.x; xs[i + 5u] = r.y; xs[i + 6u] = s.x; xs[i + 7u] = s.y;
}
""") + f"""
fn load_w(idx: u32, o0: u32, k0: u32) -> vec4<u32> {{
  if (idx >= {cw}u) {{ return vec4<u32>(); }}
  let r = idx / {kt // 8}u;
  let c = idx % {kt // 8}u;
  return wv[((o0 + r) * K + k0) / 8u + c];
}}
fn put_w(idx: u32, v: vec4<u32>) {{
  if (idx >= {cw}u) {{ return; }}
  let i = (idx / {kt // 8}u) * ST + 8u * (idx % {kt // 8}u);
  let p = bitcast<vec2<f16>>(v.x); let q = bitcast<vec2<f16>>(v.y);
  let r = bitcast<vec2<f16>>(v.z); let s = bitcast<vec2<f16>>(v.w);
  ws[i] = p.x; ws[i + 1u] = p.y; ws[i + 2u] = q.x; ws[i + 3u] = q.y;
  ws[i + 4u] = r.x; ws[i + 5u] = r.y; ws[i + 6u] = s.x; ws[i + 7u] = s.y;
}}
"""
    fetch0 = [f"  var fa{n} = load_a(lid + {n * wg}u, t0, 0u);" for n in range(na)]
    fetch0 += [f"  var fw{n} = load_w(lid + {n * wg}u, o0, 0u);" for n in range(nw)]
    fetch = [f"      fa{n} = load_a(lid + {n * wg}u, t0, k0 + KT);" for n in range(na)]
    fetch += [f"      fw{n} = load_w(lid + {n * wg}u, o0, k0 + KT);" for n in range(nw)]
    put = [f"    put_a(lid + {n * wg}u, fa{n});" for n in range(na)] + [f"    put_w(lid + {n * wg}u, fw{n});" for n in range(nw)]
    if inline:
        def unpack8(reg, arr):    # a vec4<u32> of 8 halves into arr[i ..]
            return " ".join(f"let {c} = bitcast<vec2<f16>>({reg}.{f});" for c, f in zip("pqrs", "xyzw")) + " " + " ".join(
                f"{arr}[i{f' + {2 * k + h}u' if k or h else ''}] = {c}.{'xy'[h]};" for k, c in enumerate("pqrs") for h in range(2))

        def idx_expr(per_row, width):
            sh = per_row.bit_length() - 1
            if inline == "shift":
                return f"(idx >> {sh}u) * ST + {width}u * (idx & {per_row - 1}u)"
            return f"(idx / {per_row}u) * ST + {width}u * (idx % {per_row}u)"
        put = []
        for n in range(na):
            g = "" if (n + 1) * wg <= ca else f"if (idx < {ca}u) "
            if a32:
                st = f"let h = vec4<f16>(fa{n}); xs[i] = h.x; xs[i + 1u] = h.y; xs[i + 2u] = h.z; xs[i + 3u] = h.w;"
            else:
                st = unpack8(f"fa{n}", "xs")
            put.append(f"    {{ let idx = lid + {n * wg}u; {g}{{ let i = {idx_expr(kt // ea, ea)}; {st} }} }}")
        for n in range(nw):
            g = "" if (n + 1) * wg <= cw else f"if (idx < {cw}u) "
            st = unpack8(f"fw{n}", "ws")
            put.append(f"    {{ let idx = lid + {n * wg}u; {g}{{ let i = {idx_expr(kt // 8, 8)}; {st} }} }}")
    if noput:
        put = [f"    if (fa{n}.x == 12345.0) {{ put_a(lid, fa{n}); }}" if a32 else f"    if (fa{n}.x == 12345u) {{ put_a(lid, fa{n}); }}" for n in range(na)] + [
            f"    if (fw{n}.x == 12345u) {{ put_w(lid, fw{n}); }}" for n in range(nw)]
    if noload:
        fetch = [f"      fa{n} = {'vec4<f32>(f32(k0))' if a32 else 'vec4<u32>(k0)'};" for n in range(na)] + [
            f"      fw{n} = vec4<u32>(k0);" for n in range(nw)]
    src = h + f"""
@group(0) @binding(0) var<storage, read> xv: array<{'vec4<f32>' if a32 else 'vec4<u32>'}>;
@group(0) @binding(1) var<storage, read> wv: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
""" + wmem + helpers + pre + "\n".join(fetch0) + k_loop(put, fetch, body if const_offsets else loop_kk(body)) + f"""
{store}
}}
"""
    return src, (READ, READ, RW), ("xf" if a32 else "xh", "wh", "y")


async def fill(dev, buf, n_vals, seed, f32):
    n = n_vals if f32 else n_vals // 2
    src = (FILL.replace("{F16}", "" if f32 else "enable f16;").replace("{T}", "f32" if f32 else "u32")
           .replace("{VALUE}", "val(i)" if f32 else "pack2x16float(vec2<f32>(val(2u * i), val(2u * i + 1u)))")
           .replace("{SEED}", str(seed)).replace("{N}", str(n)))
    p = dev.create_pipeline(src, (RW,), label="fill")
    wgs = -(-n // 256)
    dev.submit([Dispatch(p, dev.create_bind_group(p, [buf]), (min(wgs, 4096), -(-wgs // 4096), 1), "fill")])
    await dev.read_buffer(buf, 0, 4)


async def timed(dev, d, yb, reps=10):
    """GPU ns per dispatch (dawn_mma_check.time_passes: best of 3 passes of `reps`, clocks up first)."""
    dev.submit([d])
    await dev.read_buffer(yb, 0, 4)
    await dev.check_errors()
    return await time_passes(dev, d, yb, reps)


SHAPES = {"8b_gateup": (1024, 4096, 28672), "8b_down": (1024, 14336, 4096), "8b_qkv": (1024, 4096, 6144),
          "1b_qkv": (1024, 2048, 3072), "1b_gateup": (1024, 2048, 16384)}
CONFIGS = [(128, 128, 2, 2, 32), (256, 128, 4, 2, 32), (128, 256, 2, 4, 32), (128, 128, 2, 4, 64)] if os.environ.get("LAB_FEW") else [  # (bm, bn, sgm, sgn, kt)
    (128, 128, 2, 2, 32), (128, 128, 2, 4, 32), (128, 128, 2, 2, 64), (128, 128, 2, 4, 64), (256, 128, 4, 2, 32),
    (128, 256, 2, 4, 32), (64, 128, 2, 2, 32), (128, 64, 2, 2, 32)]


async def main():
    dev = dawn.DawnDevice()
    print("device", dev.info.adapter, "toggles", TOG, "wgmem", dev.info.limits.get("max-compute-workgroup-storage-size"),
          flush=True)
    shapes = os.environ.get("LAB_SHAPES", "8b_gateup,8b_down,1b_qkv").split(",")
    variants = os.environ.get("LAB_VARIANTS", "stage32,stageh,mcopy,direct").split(",")
    rng = random.Random(5)
    for sname in shapes:
        T, K, O = SHAPES[sname]
        xh = dev.create_buffer(2 * T * K); xf = dev.create_buffer(4 * T * K)
        wh = dev.create_buffer(2 * O * K); yb = dev.create_buffer(4 * T * O)
        await fill(dev, xh, T * K, 11, False); await fill(dev, xf, T * K, 11, True); await fill(dev, wh, O * K, 23, False)
        samples = [(rng.randrange(T), rng.randrange(O)) for _ in range(24)]
        ref = {(t, o): sum(val(11, t * K + k) * val(23, o * K + k) for k in range(K)) for t, o in samples}
        scale = max(abs(v) for v in ref.values())
        bufs = {"xh": xh, "xf": xf, "wh": wh, "y": yb}
        for var in variants:
            for cfg in CONFIGS:
                bm, bn, sgm, sgn, kt = cfg
                name = f"{var} {bm}x{bn}/sg{sgm}x{sgn}/kt{kt}"
                wgmem = 0 if var == "direct" else 2 * (kt + 8) * (bm + bn)
                if wgmem > int(dev.info.limits.get("max-compute-workgroup-storage-size", 16384)) or T % bm or O % bn:
                    continue
                if var == "mcopy" and (((bm // 16) * (kt // 16)) % (sgm * sgn) or ((bn // 16) * (kt // 16)) % (sgm * sgn)):
                    continue
                try:
                    src, kinds, names = kernel(var, T, K, O, bm, bn, sgm, sgn, kt)
                    p = dev.create_pipeline(src, kinds, label=name)
                    d = Dispatch(p, dev.create_bind_group(p, [bufs[n] for n in names]), (O // bn, T // bm, 1), name)
                    dev.write_buffer(yb, bytes(4 * 64))
                    ns = await timed(dev, d, yb)
                    err = 0.0
                    for (t, o), r in ref.items():
                        got = struct.unpack("<f", await dev.read_buffer(yb, 4 * (t * O + o), 4))[0]
                        err = max(err, abs(got - r) / scale)
                    tf = 2 * T * K * O / ns / 1e3
                    print(json.dumps({"shape": sname, "v": name, "us": round(ns / 1e3, 1), "tflops": round(tf, 1),
                                      "err": err, "tog": TOG}), flush=True)
                except Exception as e:  # noqa: BLE001 (a variant that fails to compile or run: say why, go on)
                    print(json.dumps({"shape": sname, "v": name, "error": f"{type(e).__name__}: {str(e)[:600]}"}), flush=True)
        for b in (xh, xf, wh, yb):
            dev.release_buffer(b)


if __name__ == "__main__":
    asyncio.run(main())
