"""The compute roofline of the adapter, measured in the same run as the benchmark (issue 11):
peak multiply-add throughput through WebGPU for f32, f16 (where shader-f16 exists) and int8
dot products (`dot4I8Packed`, 4 multiply-adds per instruction).

Each probe runs WG-thread workgroups in which every thread keeps CHAINS independent chains of
vector multiply-adds (`fma` on vec4 for f32 / f16, `dot4I8Packed` with its accumulate for int8)
over ITERS iterations, with no memory traffic but one final store per thread (the sum of its
chains, so nothing is optimised away and the result can be checked: tests compare it with the
closed form of the recurrence). Throughput = multiply-adds x 2 / kernel time, best of `reps`
(GPU timestamps where the device has them, else host time of submit + read).

    f32 / f16   a <- a * m + c           per chain: 4 lanes x ITERS multiply-adds
    int8        a <- dot4(a, y) + a      per chain: 4 multiply-adds x ITERS (a's bytes are the
                                         running sum's: each step depends on the last)

    mma_f16     c <- a b + c             per chain: 16 x 16 x 16 multiply-adds a step, 16 x 16 f32
                                         results per subgroup of 32 (Dawn's matrix units)

A prefill's arithmetic is 2 x (weights' multiply-adds per token) x tokens; its share of the
relevant peak (f32 for the float GEMM, which accumulates in f32; int8 dot for the int8 GEMM; the
matrix units' where a GEMM runs on them) is what the bench reports.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from ..errors import GPUError
from ..gpu.base import Dispatch
from ..kernels.bindings import Bindings
from .roofline import atime_dispatch

WG = 256
# independent chains per thread: on an H200 (2026-11-29, docs/BENCHMARKS.md session 29) 8 chains
# read f32 44.3 / f16 56.0 / int8 69.7 TFLOP/s, 32 chains 54.3 / 62.4 / 83.5 (64: f16 spills);
# a register-blocked 4 x 8 multiply-add kernel (the GEMMs' shape) reached 64.4 f32 / 79.0 f16,
# so even these peaks read low by up to a sixth
CHAINS = 32
ITERS = 256

FLOAT_PROBE = """
{ENABLE}
// Compute probe ({T}): CHAINS independent vec4 fma chains per thread, ITERS steps each.
{OUT_DECL}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let x = {T}(f32(gid.x % 64u) * 0.0078125);
  let m = vec4<{T}>({T}(0.5));
  let c = vec4<{T}>({T}(0.25));
{INIT}
  for (var i = 0u; i < {ITERS}u; i++) {
{STEP}
  }
  let s = {SUM};
  out[gid.x] = f32(s.x + s.y + s.z + s.w);
}
"""

INT8_PROBE = """
// Compute probe (int8): CHAINS independent dot4I8Packed chains per thread, ITERS steps each.
{OUT_DECL}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let y = 0x01010101u;          // four int8 ones: dot4(a, y) = the sum of a's four signed bytes
{INIT}
  for (var i = 0u; i < {ITERS}u; i++) {
{STEP}
  }
  out[gid.x] = f32({SUM});
}
"""


# the matrix units (Device.has_mma_f16: Dawn's subgroup matrices, f16 x f16 -> f32 at 16 x 16 x 16):
# MMA_CHAINS independent result matrices per subgroup of 32, each ITERS multiply-accumulates of
# the same left and right matrices (1/64 everywhere: each step adds 16 / 4096 to every element,
# so after ITERS steps every element is ITERS / 256 exactly); every chain's matrix is stored
MMA_CHAINS = 8
MMA_PROBE = """
enable f16;
enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
// Compute probe (matrix units): MMA_CHAINS independent 16 x 16 f32 results per subgroup of 32,
// ITERS multiply-accumulates of 16 x 16 x 16 each.
{OUT_DECL}
var<workgroup> ones: array<f16, 256>;
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  ones[lid % 256u] = f16(0.015625);
  workgroupBarrier();
  let a = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&ones, 0u, 16u);
  let b = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, row_major>(&ones, 0u, 16u);
{INIT}
  for (var i = 0u; i < {ITERS}u; i++) {
{STEP}
  }
  let base = (gid.x / 32u) * {CH}u * 256u;
{STORE}
}
"""


def out_floats(kind: str, n_threads: int) -> int:
    """The f32 values one probe dispatch of n_threads writes."""
    return n_threads // 32 * MMA_CHAINS * 256 if kind == "mma_f16" else n_threads


def probe_source(kind: str, n_threads: int, iters: int = ITERS) -> tuple[str, Bindings]:
    """The WGSL of one probe ("f32", "f16", "int8" or "mma_f16") writing out_floats() f32."""
    b = Bindings()
    if kind == "mma_f16":
        ch = range(MMA_CHAINS)
        decl = b.array("out", "array<f32>", f"({out_floats(kind, n_threads)}) each subgroup's result matrices",
                       writable=True)
        src = (MMA_PROBE.replace("{INIT}", "\n".join(f"  var c{j} = subgroup_matrix_result<f32, 16, 16>();"
                                                     for j in ch))
               .replace("{STEP}", "\n".join(f"    c{j} = subgroupMatrixMultiplyAccumulate(a, b, c{j});" for j in ch))
               .replace("{STORE}", "\n".join(f"  subgroupMatrixStore<row_major>(&out, base + {256 * j}u, c{j}, 16u);"
                                              for j in ch))
               .replace("{CH}", str(MMA_CHAINS)))
        return src.replace("{OUT_DECL}", decl).replace("{WG}", str(WG)).replace("{ITERS}", str(iters)), b
    decl = b.array("out", "array<f32>", f"({n_threads}) each thread's sum of chains", writable=True)
    chains = range(CHAINS)
    if kind == "int8":
        src = (INT8_PROBE.replace("{INIT}", "\n".join(f"  var a{j} = i32(gid.x % 7u) + {j};" for j in chains))
               .replace("{STEP}", "\n".join(f"    a{j} = dot4I8Packed(bitcast<u32>(a{j}), y) + a{j};" for j in chains))
               .replace("{SUM}", " + ".join(f"a{j}" for j in chains)))
    else:
        t = "f16" if kind == "f16" else "f32"
        src = (FLOAT_PROBE.replace("{ENABLE}", "enable f16;" if kind == "f16" else "")
               .replace("{INIT}", "\n".join(f"  var a{j} = vec4<{{T}}>(x + {{T}}({j}.0));" for j in chains))
               .replace("{STEP}", "\n".join(f"    a{j} = fma(a{j}, m, c);" for j in chains))
               .replace("{SUM}", " + ".join(f"vec4<f32>(a{j})" for j in chains)).replace("{T}", t))
    src = src.replace("{OUT_DECL}", decl).replace("{WG}", str(WG)).replace("{ITERS}", str(iters))
    return src, b


def multiply_adds(n_threads: int, iters: int = ITERS, kind: str = "f32") -> int:
    """Multiply-adds one probe dispatch performs (4 per chain step; the matrix units 16 x 16 x 16
    per chain step of a subgroup of 32)."""
    if kind == "mma_f16":
        return n_threads // 32 * MMA_CHAINS * iters * 16 * 16 * 16
    return n_threads * CHAINS * iters * 4


def kinds(dev) -> list[str]:
    """The probes this adapter can run."""
    return ["f32"] + (["f16"] if dev.has_f16 else []) + ["int8"] + (["mma_f16"] if dev.has_mma_f16 else [])


async def ameasure_compute(dev, kind: str, reps: int = 5, workgroups: int = 2048, iters: int = ITERS) -> dict:
    """Peak multiply-add throughput of one probe kind: {"kind", "tflops" (2 ops per multiply-add,
    best of reps), "median_tflops", "method", "threads"}; `out` is returned too (per-thread sums,
    for checking against the recurrence's closed form)."""
    workgroups = max(1, min(workgroups, dev.max_workgroups))
    n = workgroups * WG
    src, b = probe_source(kind, n, iters)
    out = dev.create_buffer(4 * out_floats(kind, n), label=f"compute.{kind}")
    try:
        pipe = dev.create_pipeline(src, b.kinds, label=f"compute_{kind}")
        d = Dispatch(pipe, dev.create_bind_group(pipe, b.buffers({"out": out})), (workgroups, 1, 1), f"compute_{kind}")
        dev.submit([d])                                  # compile and warm up
        sums = await dev.read_buffer(out, 0, 4 * min(n, 1024))
        await dev.check_errors()
        times_ns, timed = await atime_dispatch(dev, d, reps, out)
    finally:
        dev.release_buffer(out)
    times_ns.sort()
    ops = 2 * multiply_adds(n, iters, kind)
    return {"kind": kind, "tflops": round(ops / times_ns[0] / 1e3, 3),
            "median_tflops": round(ops / times_ns[len(times_ns) // 2] / 1e3, 3),
            "method": "gpu-timestamps" if timed else "host-clock", "threads": n, "sums": sums}


async def ameasure_peaks(dev, reps: int = 5, workgroups: int = 2048, iters: int = ITERS) -> dict:
    """{kind: {"tflops", "median_tflops", "method"}} for every probe the adapter runs (the matrix
    units' where it has them; a failure of that experimental probe leaves it out, with its error)."""
    out = {}
    for k in kinds(dev):
        try:
            r = await ameasure_compute(dev, k, reps, workgroups, iters)
        except GPUError as e:
            if k != "mma_f16":
                raise
            out[k] = {"tflops": None, "median_tflops": None, "method": None, "error": str(e)[:300]}
            continue
        out[k] = {f: r[f] for f in ("tflops", "median_tflops", "method")}
    return out


def prefill_flops_per_token(src) -> float:
    """2 x the multiply-adds of one token through the model's weight matrices (every 2-D tensor
    except the token embedding, which is a lookup; a tied LM head counts once as the head)."""
    names = set(src.tensors)
    tied = "output.weight" not in names and "lm_head.weight" not in names
    total = 0
    for name, t in src.tensors.items():
        if len(t.shape) != 2:
            continue
        if name in ("token_embd.weight", "model.embed_tokens.weight") and not tied:
            continue                       # an untied embedding: a lookup, no arithmetic
        total += t.shape[0] * t.shape[1]
    return 2.0 * total
