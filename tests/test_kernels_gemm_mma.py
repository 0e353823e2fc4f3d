"""The matrix-unit prefill GEMM (wgsl/linear_gemm_mma.wgsl, GemmVariant(mma=True)): offered only
where the adapter has Dawn's subgroup matrices in f16 (f32 results) at 16 x 16 x 16 with subgroups
of 32, and its WGSL as specialised, and every variant compiled by Dawn's WGSL front end (its Null
backend, which offers the feature). No adapter here runs it (lavapipe and SwiftShader have no
matrix units); its numbers against the SIMT GEMM come from the H200 through Dawn
(scripts/dawn_mma_check.py; docs/BENCHMARKS.md, session 32: largest difference 1.2-3.4e-4 of the
largest output over 8B layers, f16 and q4, with the residual on O and down)."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from webdrift.errors import UnsupportedModelError
from webdrift.gpu.base import Device, DeviceInfo, Pipeline
from webdrift.kernels.autotune import GEMM_MMA_CANDIDATES, gemm_candidates, static_gemm
from webdrift.kernels.linear import LinearKernel
from webdrift.kernels.linear_gemm import GemmVariant
from webdrift.kernels.weights import GPUWeight
from webdrift.profile.compute import probe_source
from webdrift.tensor import TensorDesc
from webdrift.tensor.weight_layout import WeightLayout

MMA = ("f16", "f32", 16, 16, 16)


class SourceDevice(Device):
    """Builds kernels without a GPU: keeps each pipeline's WGSL."""
    wgsl_subgroup_enable = True

    def __init__(self, features=("shader-f16", "subgroups", "chromium-experimental-subgroup-matrix"),
                 configs=(MMA,), sizes=(32, 32)):
        self.info = DeviceInfo(adapter="fake", backend="WebGPU (browser)", vendor="nvidia", features=set(features),
                               limits={"max-compute-workgroup-storage-size": 49152,
                                       "max-compute-invocations-per-workgroup": 1024},
                               matrix_configs=tuple(configs), subgroup_sizes=tuple(sizes))
        self.sources = {}

    def create_pipeline(self, wgsl, bindings, entry="main", label=""):
        self.sources[label] = wgsl
        return Pipeline(None, None, tuple(bindings), label)


def weight(fmt, o, i):
    return GPUWeight("w", fmt, o, i, layout=WeightLayout.named("OI", o, i) if fmt == "f16" else None)


@pytest.mark.parametrize("dev,offered", [
    (SourceDevice(), True),
    (SourceDevice(configs=(("f16", "f16", 16, 16, 16), ("i8", "i32", 16, 16, 32))), False),   # no f32 results
    (SourceDevice(sizes=(16, 64)), False),                       # subgroups not always 32 wide
    (SourceDevice(features=("shader-f16", "subgroups")), False),   # no matrix feature
    (SourceDevice(features=("subgroups", "chromium-experimental-subgroup-matrix")), False),   # no shader-f16
])
def test_offered_only_with_f16_matrix_units(dev, offered):
    assert dev.has_mma_f16 is offered
    w = weight("q4", 2048, 2048)
    got = [c for c in gemm_candidates(dev, w) if c.mma]
    assert got == ([c for c in GEMM_MMA_CANDIDATES if not c.direct] if offered else [])
    # row-major f16 weights: also the tiles that load W straight from its buffer
    f16 = [c for c in gemm_candidates(dev, weight("f16", 2048, 2048)) if c.mma]
    assert f16 == (list(GEMM_MMA_CANDIDATES) if offered else []) and any(c.direct for c in GEMM_MMA_CANDIDATES)
    assert not static_gemm(dev, w).mma        # never the unmeasured default
    if not offered:
        with pytest.raises(UnsupportedModelError, match="subgroup-matrix"):
            LinearKernel(dev, "prefill", TensorDesc("x", 2048, 64), TensorDesc("y", 2048, 64), w,
                         variant=GEMM_MMA_CANDIDATES[0])


def test_tile_shapes_are_checked():
    for bad in ({"bm": 64, "bn": 32, "tm": 2, "tn": 2}, {"bm": 32, "bn": 32, "tm": 2, "tn": 2, "double": True},
                {"bm": 32, "bn": 32, "tm": 2, "tn": 2, "int8": True}, {"bm": 32, "bn": 32, "tm": 2, "tn": 2, "f16_tiles": True},
                {"bm": 64, "bn": 64, "tm": 2, "tn": 2, "sgm": 2, "sgn": 1},     # bn != 16 tn sgn
                {"bm": 32, "bn": 32, "tm": 2, "tn": 2, "sgm": 0}):
        with pytest.raises(ValueError):
            GemmVariant(mma=True, kstep=8, **bad).check()
    with pytest.raises(ValueError, match="subgroups per tile"):
        GemmVariant(sgm=2).check()
    v = GemmVariant(mma=True, bm=64, bn=32, tm=4, tn=2, kstep=8)
    assert v.wg == 32
    # f16 tiles of 32 inputs + 8 of padding for 64 rows and 2 x 32 outputs, two f32 16 x 16 results
    assert v.workgroup_bytes(dual=True) == 2 * 40 * (64 + 2 * 32) + 2 * 4 * 256
    v = GemmVariant(mma=True, bm=128, bn=128, tm=4, tn=2, kstep=8, sgm=2, sgn=4)
    assert v.wg == 256 and v.workgroup_bytes(dual=False) == 2 * 40 * 256 + 8 * 4 * 256
    # every candidate the tuner times fits 48 KiB (the H100's Dawn limit);
    # gate/up (two weights) gets those whose doubled tiles and results fit too
    dev = SourceDevice()
    assert all(c.fits(dev, dual=False) for c in GEMM_MMA_CANDIDATES)
    dual = [c for c in gemm_candidates(dev, weight("q4", 2048, 2048), weight("q4", 2048, 2048)) if c.mma]
    assert len(dual) >= 3 and all(c.workgroup_bytes(dual=True) <= 49152 and c.tm * c.tn <= 8 for c in dual)


def test_direct_loads_need_row_major_f16_rows_of_whole_steps():
    dev, y = SourceDevice(), TensorDesc("y", 64, 16)
    v = GemmVariant(mma=True, direct=True, bm=32, bn=64, tm=2, tn=4, kstep=8)
    for w in (weight("q8", 64, 128), weight("f16", 64, 136),      # not f16; rows not a multiple of 32
              GPUWeight("w", "f16", 64, 128, layout=WeightLayout.named("OI4O4", 64, 128))):
        with pytest.raises(UnsupportedModelError, match="direct weight loads"):
            LinearKernel(dev, "prefill", TensorDesc("x", w.i, 16), y, w, variant=v)
    with pytest.raises(ValueError):
        GemmVariant(direct=True).check()
    k = LinearKernel(dev, "prefill", TensorDesc("x", 128, 16), y, weight("f16", 64, 128), variant=v)
    assert k.binding_names[-1] == "wh" and "var<workgroup> ws" not in dev.sources[k.label]


@pytest.mark.parametrize("fmt,direct", [("f16", False), ("q4", False), ("q8", False), ("f16", True)])
@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("sgm,sgn", [(1, 1), (2, 4)])
def test_specialised_wgsl(fmt, direct, dual, sgm, sgn):
    dev = SourceDevice()
    v = GemmVariant(mma=True, direct=direct, bm=64 * sgm, bn=32 * sgn, tm=4, tn=2, kstep=8, sgm=sgm, sgn=sgn)
    w = weight(fmt, 256, 128)
    k = LinearKernel(dev, "prefill", TensorDesc("x", 128, 70), TensorDesc("y", 256, 70), w,
                     weight(fmt, 256, 128) if dual else None, variant=v)
    src = dev.sources[k.label]
    assert "{{" not in src and "#if" not in src
    assert src.startswith("enable f16;") and "enable chromium_experimental_subgroup_matrix;" in src
    # a subgroup's matrices sit at offsets of its index: Dawn's uniformity check is turned off
    assert "diagnostic(off, chromium.subgroup_matrix_uniformity);" in src
    assert f"@workgroup_size({32 * sgm * sgn})" in src and k.workgroups(70) == (-(-256 // v.bn), -(-70 // v.bm), 1)
    nacc = 4 * 2 * (2 if dual else 1)       # results a subgroup
    # the products: a switch over the subgroups, each case the step's two 16-input slices unrolled
    assert "switch sg {" in src and all(f"case {s}u: {{" in src for s in range(sgm * sgn))
    assert len(re.findall(r"subgroupMatrixMultiplyAccumulate\(", src)) == nacc * sgm * sgn * 2
    # results: to ys through a switch (literal offsets), one 16 x 16 matrix a subgroup at a time; a
    # tile inside T x O of a plain y (not gate/up) straight into y
    assert len(re.findall(r"subgroupMatrixStore<row_major>\(&ys, \d+u, ac[cd]\d_\d, 16u\)", src)) == nacc * sgm * sgn
    assert len(re.findall(r"subgroupMatrixStore<row_major>\(&y_buf, ", src)) == (0 if dual else nacc)
    assert ("let full = t0 + BM <= T && o0 + BN <= w_O;" in src) != dual and "Load<Acc" not in src
    # each subgroup's 16 x 16 result(s) staged in its own part of ys
    assert re.search(r"var<workgroup> ys: array<f32, (\d+)>", src).group(1) == str(256 * (2 if dual else 1) * sgm * sgn)
    assert f"sg * {512 if dual else 256}u" in src and "let tm0 = (sg / SGN) * 64u;" in src
    # Dawn's bounds checks: workgroup-memory matrix loads at literal offsets (left: subgroup s's
    # row blocks; right: its column blocks, W2's tile st * bn further on), direct loads from wh
    st = 4 * 8 + 8
    for s in range(sgm * sgn):
        case = src[src.index(f"case {s}u: {{"):].split("}", 1)[0]
        tm0, om0 = (s // sgn) * 64, (s % sgn) * 32
        want_left = {(tm0 + 16 * i) * st + kk for i in range(4) for kk in (0, 16)}
        assert set(map(int, re.findall(r"Load<Left, row_major>\(&xs, (\d+)u, ST\)", case))) == want_left
        right = re.findall(r"Load<Right, col_major>\(&(ws|wh2?), ([^,]+), (?:w_I|ST)\)", case)
        if direct:
            assert {r for r, _ in right} == ({"wh", "wh2"} if dual else {"wh"})
            assert all(re.fullmatch(r"\(o0 \+ \d+u\) \* w_I \+ k \* KT \+ \d+u", off) for _, off in right)
        else:
            tiles = (0, st * v.bn) if dual else (0,)
            assert {int(off[:-1]) for _, off in right} == {t + (om0 + 16 * j) * st + kk for t in tiles
                                                           for j in range(2) for kk in (0, 16)}
    # the tile stores: indices from lid and constants by / and % (Dawn's range analysis proves them)
    stores = re.findall(r"\{ let idx = lid \+ (\d+)u; (?:if \(idx < \d+u\) )?\{ let i = (\d+u \+ )?"
                        r"\(idx / KS\) \* ST \+ 4u \* \(idx % KS\); let h = (f[xwv])\d+; (\w+)\[i\]", src)
    assert {(reg, arr) for _, _, reg, arr in stores} == ({("fx", "xs")} | (set() if direct else {("fw", "ws")})
                                                         | ({("fv", "ws")} if dual and not direct else set()))
    assert all((first == f"{st * v.bn}u + ") == (reg == "fv") for _, first, reg, _ in stores)
    assert "fn put_" not in src
    # the next step's slices are fetched into registers while this step's are multiplied
    nx = -(-64 * sgm * 8 // (32 * sgm * sgn))
    assert len([1 for _, _, reg, _ in stores if reg == "fx"]) == nx
    assert (len(re.findall(r"  var fx\d+ = vec4<f16>\(fetch_x\(", src)) == len(re.findall(r"  fx\d+ = vec4<f16>\(fetch_x\(", src))
            == nx)
    assert ("fetch_w(" in src) != direct
    # no fused norm (the model's Norm op normalises x): x's tile holds x as read
    assert "xinv" not in src and "norm_w4(k0" not in src


def test_results_straight_into_y():
    """A plain y (no bias, soft-cap or LoRA; not a column view) takes a whole tile's results straight
    from the matrices, starting from y's values where the epilogue adds the residual; other
    epilogues go through ys."""
    from webdrift.kernels.linear import Epilogue
    dev = SourceDevice()
    v = GemmVariant(mma=True, bm=64, bn=64, tm=2, tn=2, kstep=8, sgm=2, sgn=2)
    w, x, y = weight("q8", 256, 128), TensorDesc("x", 128, 70), TensorDesc("y", 256, 70)
    src = {}
    for name, ep, yy in (("res", Epilogue(residual=True), y), ("bias", Epilogue(bias=True), y),
                         ("cap", Epilogue(softcap=30.0), y), ("view", Epilogue(), TensorDesc("y", 512, 70).columns(0, 256))):
        k = LinearKernel(dev, "prefill", x, yy, w, variant=v, epilogue=ep)
        src[name] = dev.sources[k.label]
    loads = re.findall(r"acc(\d)_(\d) = subgroupMatrixLoad<Acc, row_major>\(&y_buf, y_idx\(0u, t0 \+ tm0 \+ (\d+)u, 0u, "
                       r"o0 \+ om0 \+ (\d+)u\), y_C\);", src["res"])
    assert sorted(loads) == [(str(i), str(j), str(16 * i), str(16 * j)) for i in range(2) for j in range(2)]
    assert src["res"].index("Load<Acc, row_major>") < src["res"].index("for (var k = 0u; k < NSTEPS")   # before the products
    assert len(re.findall(r"subgroupMatrixStore<row_major>\(&y_buf, ", src["res"])) == 4
    for name in ("bias", "cap", "view"):
        assert "y_buf, y_idx" not in src[name] and "let full" not in src[name], name
    # inputs a whole number of K steps: no zero-fill branch; otherwise the tail is zeroed
    assert "if (s >= w_SI)" not in src["res"]
    k = LinearKernel(dev, "prefill", TensorDesc("x", 136, 70), y, weight("f16", 256, 136), variant=v)
    assert "if (s >= w_SI) { return vec4<f32>(0.0); }" in dev.sources[k.label]


# Dawn's Null backend (wgpudawn, WGPU_BACKEND_TYPE=Null) offers chromium-experimental-subgroup-matrix
# and runs Dawn's WGSL front end (parsing, types, uniformity) on every shader module: the kernels
# that no local adapter can run are compiled there in a child process (the backend choice and
# Dawn's instance toggles are per process)
NULL_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import wgpudawn
from wgpudawn.backends.dawn import extras
extras.set_instance_extras(enable_toggles=["allow_unsafe_apis"])
adapter = wgpudawn.gpu.request_adapter_sync(power_preference="high-performance")
dev = extras.request_device_sync(adapter, required_features=["shader-f16", "subgroups",
                                                             "chromium-experimental-subgroup-matrix"])
sources = json.load(open(sys.argv[2]))
errors, warnings = {}, {}
for label, src in sources.items():
    try:
        m = dev.create_shader_module(code=src)
    except Exception as e:   # the test reports every shader Dawn refuses, with Dawn's message
        errors[label] = " | ".join(x for x in str(e).splitlines() if "error" in x)[:1500]   # not the warnings
        continue
    got = sorted({x.message[:200] for x in m.get_compilation_info_sync().messages if x.type == "warning"})
    if got:
        warnings[label] = got
print(json.dumps({"backend": adapter.info["backend_type"], "errors": errors, "warnings": warnings}))
"""


def test_every_matrix_unit_kernel_compiles_in_dawn(tmp_path):
    """Each matrix-unit tile the tuner has, for f16 / q4 / q8 weights, one weight or gate/up, an
    epilogue of nothing / the residual / a bias (results straight into y, from y, or through
    workgroup memory), inputs a whole number of K steps or not: Dawn's WGSL front end accepts it
    without a warning, as the bench's matrix-unit compute probe (and refuses a broken one: the
    check can fail)."""
    from webdrift.kernels.linear import Epilogue
    dev = SourceDevice()
    sources = {}
    variants = [*GEMM_MMA_CANDIDATES, GemmVariant(mma=True, bm=16, bn=16, tm=1, tn=1, kstep=4)]
    for n, v in enumerate(variants):
        for fmt in ("f16", "q4", "q8"):
            for dual in (False, True):
                for ep in (Epilogue(), Epilogue(residual=True), Epilogue(bias=True)):
                    i = 136 if fmt == "f16" and n % 2 else 256      # f16 rows not a whole number of steps
                    w = weight(fmt, 512, i)
                    if not v.takes_weights(w) or not v.fits(dev, dual) or (dual and (ep.residual or v.tm * v.tn > 8)):
                        continue
                    k = LinearKernel(dev, "prefill", TensorDesc("x", i, 300), TensorDesc("y", 512, 300), w,
                                     weight(fmt, 512, i) if dual else None, variant=v, epilogue=ep)
                    sources[f"{n}/{fmt}/{'dual' if dual else 'one'}/{ep.residual}/{ep.bias}/{i}"] = dev.sources[k.label]
    assert len(sources) > 100 and any("if (s >= w_SI)" in s for s in sources.values())
    sources["bench's matrix-unit probe"] = probe_source("mma_f16", 256)[0]
    broken = next(iter(sources.values())).replace("subgroupMatrixMultiplyAccumulate(", "subgroupMatrixMultiplyAccumulat(", 1)
    sources["broken"] = broken
    f = tmp_path / "sources.json"
    f.write_text(json.dumps(sources))
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    r = subprocess.run([sys.executable, "-c", NULL_CHILD, root, str(f)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "WGPU_BACKEND_TYPE": "Null"}, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["backend"] == "Null"
    assert list(got["errors"]) == ["broken"], {k: v for k, v in got["errors"].items() if k != "broken"}
    # and without a warning (the matrix builtins in their current form: a deprecated one warns per call)
    assert got["warnings"] == {}, dict(list(got["warnings"].items())[:3])
    assert "unresolved call target 'subgroupMatrixMultiplyAccumulat'" in got["errors"]["broken"]
