"""Desktop backend on Dawn (the WebGPU implementation inside Chrome) through the `wgpudawn`
package: wgpu-py's API with Dawn underneath (`pip install wgpudawn`, webdrift's [dawn] extra).

NativeDevice (gpu/native.py) with Dawn's API module and C entry points in place of
wgpu-native's; what differs is here:
  - Dawn's matrix units: the instance is created with Dawn's `allow_unsafe_apis` and
    `vulkan_enable_f16_on_nvidia` toggles, so that where the adapter offers them the device
    has `chromium-experimental-subgroup-matrix` (the tensor cores: the matrix-unit prefill GEMM,
    kernels/linear_gemm.py) and shader-f16 on NVIDIA's Vulkan driver, as the browser build
    gets them from Dawn (docs/BROWSER.md);
  - the adapter's subgroup sizes, matrix configurations and WGSL language features come from
    Dawn's C API (wgpudawn's adapter info leaves them out);
  - a submit is `wgpuQueueSubmit` (no submission index): reads map through wgpudawn's
    `map_sync`; decode puts 4 steps in a submit (8, the browser's, halved decode speed here).
Tint compiles the kernels (it wants `enable subgroups;`). Dawn does not run on Mesa's lavapipe;
on a machine without a GPU it runs on SwiftShader's Vulkan driver (the tests point
VK_ICD_FILENAMES at the one Chromium ships).
Must not: be imported unless asked for (gpu.native.get_device("dawn")).
"""

from __future__ import annotations

import os

from ..errors import GPUError
from .native import NativeDevice

try:
    import wgpudawn
    from wgpudawn.backends.dawn import extras as _extras
    from wgpudawn.backends.dawn._ffi import ffi as _dffi
    from wgpudawn.backends.dawn._ffi import lib as _dlib
except ImportError as e:  # pragma: no cover - checked where the device is asked for
    wgpudawn = None
    _import_error = e

_WANTED_FEATURES = ("shader-f16", "subgroups", "timestamp-query", "chromium-experimental-subgroup-matrix")
# experimental features (the matrix units); shader-f16 on NVIDIA's Vulkan driver
_INSTANCE_TOGGLES = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")
# timestamps at full precision (the tuner's timings; Dawn may round them to guard against timing attacks)
_DEVICE_TOGGLES_OFF = ("timestamp_quantization",)
_WGSL_FEATURES = {"packed_4x8_integer_dot_product": "Packed4x8IntegerDotProduct"}
_instance_ready = False


def available() -> bool:
    return wgpudawn is not None


class DawnDevice(NativeDevice):
    wgsl_subgroup_enable = True    # Tint wants `enable subgroups;` before subgroup built-ins
    # measured (H200, 1B f16, docs/BENCHMARKS.md session 31): 4 steps a submit 899 tok/s, 1 step 889,
    # 8 (the browser's) 554; the GPU's whole steps take as long as wgpu-native's
    decode_steps_per_submit = 4
    raw_maps = False
    if wgpudawn is not None:
        _wgpu, _lib, _ffi = wgpudawn, _dlib, _dffi
        encodes_ahead = True

    def __init__(self, power_preference: str = "high-performance"):
        if wgpudawn is None:
            raise GPUError(f"the Dawn backend needs the wgpudawn package (pip install wgpudawn; Python >= 3.11): "
                           f"{_import_error}")
        super().__init__(power_preference)

    def _adapter(self, power_preference: str):
        global _instance_ready
        if not _instance_ready:   # before the instance exists (the first adapter request makes it)
            try:
                known = _extras.all_toggles()
                _extras.set_instance_extras(enable_toggles=[t for t in _INSTANCE_TOGGLES if t in known])
            except Exception as e:  # the instance was made already (by the caller): keep it as it is
                if "before" not in str(e).lower() and "already" not in str(e).lower():
                    raise GPUError(f"Dawn's instance options were refused: {e}") from e
            _instance_ready = True
        return super()._adapter(power_preference)

    def _wanted_features(self) -> tuple:
        return _WANTED_FEATURES

    def _request_device(self, adapter, features: list, limits: dict):
        off = [t for t in _DEVICE_TOGGLES_OFF if t in _extras.all_toggles()]
        return _extras.request_device_sync(adapter, required_features=features, required_limits=limits,
                                           disable_toggles=off)

    def _describe(self, adapter) -> None:
        info = self.info
        info.backend = f"Dawn {info.backend}".strip()     # its own tuner-cache keys and report rows
        c = _dffi.new("WGPUAdapterInfo *")
        if _dlib.wgpuAdapterGetInfo(adapter._internal, c) == _dlib.WGPUStatus_Success:
            if c.subgroupMinSize and c.subgroupMaxSize:
                info.subgroup_sizes = (int(c.subgroupMinSize), int(c.subgroupMaxSize))
            _dlib.wgpuAdapterInfoFreeMembers(c[0])
        inst = _extras.get_wgpu_instance()
        info.wgsl_features = {name for name, c_name in _WGSL_FEATURES.items()
                              if _dlib.wgpuInstanceHasWGSLLanguageFeature(
                                  inst, getattr(_dlib, f"WGPUWGSLLanguageFeatureName_{c_name}"))}
        if "chromium-experimental-subgroup-matrix" in info.features:
            cfgs = _extras.get_adapter_properties(adapter).get("subgroup_matrix_configs", [])
            info.matrix_configs = tuple((str(c["component_type"]), str(c["result_component_type"]),
                                         int(c["m"]), int(c["n"]), int(c["k"])) for c in cfgs)

    def _submit_cb(self, cb):
        arr = _dffi.new("WGPUCommandBuffer[]", [cb])
        _dlib.wgpuQueueSubmit(self._queue._internal, 1, arr)
        # no submission index: map_read waits for everything submitted before it

    @property
    def wgpu_version(self) -> str:
        return f"wgpudawn {wgpudawn.__version__} (Dawn)"


def swiftshader_icd() -> str | None:
    """The Vulkan driver file of SwiftShader as Chromium ships it (Dawn's software adapter
    where there is no GPU), or None."""
    for p in ("/usr/lib/chromium/vk_swiftshader_icd.json", "/usr/lib/chromium-browser/vk_swiftshader_icd.json"):
        if os.path.exists(p):
            return p
    return None
