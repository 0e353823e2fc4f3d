"""Browser backend of the device interface: navigator.gpu through Pyodide's FFI (`js`, `pyodide.ffi`).

The only module of webdrift that touches `navigator.gpu`; it imports `js` and `pyodide`, so it is
imported only under Pyodide (in a page or, as webdrift.js does, in a Web Worker).
How it talks to WebGPU:
  - descriptors are Python dicts turned into JS objects with `to_js(..., dict_converter=
    Object.fromEntries)`; GPU objects stay JS objects (JsProxy) held in Buffer/Pipeline/BindGroup;
  - bytes go to the GPU without an extra copy: a small JS helper takes a view of the Python
    buffer in WASM memory (`PyProxy.getBuffer`) right before `queue.writeBuffer` and releases it
    right after (the WASM heap may move when it grows, so views are never kept);
  - a submit is one call into JS: a dispatch list is converted to a JS array once (the engine's
    lists are prebuilt and reused) and a JS loop encodes it into one compute pass plus copies;
  - the only awaits are reads (`mapAsync`), as on the desktop.
Errors: WebGPU reports validation errors asynchronously. Pipelines are created inside an error
scope whose result is checked at the next read (with the shader's compilation messages);
uncaptured errors and device loss are recorded and raised as GPUError at the next read.
Departures from the native backend: device creation is async (`await create_browser_device()`),
and there are no synchronous reads (`has_sync_reads` is False: the browser cannot block on a
map), so kernels are not timed at load and timestamps are read with `await read_timestamps(rec)`.
"""

from __future__ import annotations

import contextlib
import struct

import js
from pyodide.code import run_js
from pyodide.ffi import create_once_callable, create_proxy, to_js

from ..errors import GPUError, GPULimitError
from .base import (
    READ,
    READBACK,
    RW,
    STEP_UNIFORM,
    STORAGE,
    UNI,
    UNIFORM,
    BindGroup,
    Buffer,
    Device,
    DeviceInfo,
    Dispatch,
    Encoded,
    Pipeline,
    TimestampRecorder,
)

_BIND = {READ: "read-only-storage", RW: "storage", UNI: "uniform"}
_WANTED_FEATURES = ("shader-f16", "subgroups", "timestamp-query",
                    "chromium-experimental-subgroup-matrix")   # Dawn's matrix units (allow_unsafe_apis)
# Adapter limits requested at device creation (WebGPU's defaults, e.g. 128 MiB per storage
# binding and 256 MiB per buffer, are far below what GPUs offer); camelCase as in JS.
_LIMITS = ("maxStorageBufferBindingSize", "maxBufferSize", "maxComputeWorkgroupStorageSize",
           "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX", "maxComputeWorkgroupSizeY",
           "maxComputeWorkgroupSizeZ", "maxComputeWorkgroupsPerDimension", "maxStorageBuffersPerShaderStage",
           "maxUniformBuffersPerShaderStage", "maxBindingsPerBindGroup", "maxUniformBufferBindingSize")
_ALL_LIMITS = _LIMITS + ("minStorageBufferOffsetAlignment", "minUniformBufferOffsetAlignment", "maxBindGroups")
_CACHE_MIN_LEN = 16       # dispatch lists at least this long are converted to JS once and reused
_CACHE_MAX = 256

_JS_HELPERS = r"""
({
  // one compute pass with every dispatch, then the copies, in one command buffer
  submit(device, list, copies) {
    device.queue.submit([this.encode(device, list, copies)]);
  },
  // the same command buffer, finished now and submitted later (submitEncoded)
  encode(device, list, copies) {
    const enc = device.createCommandEncoder();
    if (list.length) {
      const cp = enc.beginComputePass();
      let last = null;
      for (const d of list) {
        if (d[0] !== last) { cp.setPipeline(d[0]); last = d[0]; }
        cp.setBindGroup(0, d[1]);
        cp.dispatchWorkgroups(d[2], d[3], d[4]);
      }
      cp.end();
    }
    for (const c of copies) enc.copyBufferToBuffer(c[0], c[1], c[2], c[3], c[4]);
    return enc.finish();
  },
  submitEncoded(device, cb) {
    device.queue.submit([cb]);
  },
  // each dispatch in its own pass with timestamps (begin, end) at query 2i, 2i+1; whole: one
  // pass with every dispatch, timestamps at 0 and 1
  submitTimed(device, list, copies, querySet, resolve, readback, whole) {
    const enc = device.createCommandEncoder();
    if (whole) {
      const cp = enc.beginComputePass({timestampWrites: {querySet, beginningOfPassWriteIndex: 0, endOfPassWriteIndex: 1}});
      for (const d of list) { cp.setPipeline(d[0]); cp.setBindGroup(0, d[1]); cp.dispatchWorkgroups(d[2], d[3], d[4]); }
      cp.end();
    } else {
      list.forEach((d, i) => {
        const cp = enc.beginComputePass({timestampWrites: {querySet,
          beginningOfPassWriteIndex: 2 * i, endOfPassWriteIndex: 2 * i + 1}});
        cp.setPipeline(d[0]); cp.setBindGroup(0, d[1]); cp.dispatchWorkgroups(d[2], d[3], d[4]);
        cp.end();
      });
    }
    const n = whole ? 1 : list.length;
    enc.resolveQuerySet(querySet, 0, 2 * n, resolve, 0);
    enc.copyBufferToBuffer(resolve, 0, readback, 0, 16 * n);
    for (const c of copies) enc.copyBufferToBuffer(c[0], c[1], c[2], c[3], c[4]);
    device.queue.submit([enc.finish()]);
  },
  // bytes from a Python buffer (a view of WASM memory taken now, released at once)
  write(queue, buffer, offset, pybuf, nbytes) {
    const view = pybuf.getBuffer("u8");
    try { queue.writeBuffer(buffer, offset, view.data, 0, nbytes); } finally { view.release(); }
  },
  // map a MAP_READ buffer, copy `size` bytes out, unmap
  async mapRead(buffer, size) {
    await buffer.mapAsync(GPUMapMode.READ, 0, buffer.size);
    try { return new Uint8Array(buffer.getMappedRange(0, size)).slice(); } finally { buffer.unmap(); }
  },
  adapterInfo(adapter) {
    const i = adapter.info || {};
    return [i.vendor || "", i.architecture || "", i.device || "", i.description || "",
            !!(i.isFallbackAdapter || adapter.isFallbackAdapter)];
  },
  features(obj) { return Array.from(obj.features); },
  // the matrix units' configurations [component, result, M, N, K] and [min, max] subgroup size
  matrixInfo(adapter) {
    const i = adapter.info || {};
    const cfgs = Array.from(i.subgroupMatrixConfigs || i.subgroupMatrixConfigurations || []);
    return [cfgs.map((c) => [String(c.componentType), String(c.resultComponentType), c.M, c.N, c.K]),
            [i.subgroupMinSize || 0, i.subgroupMaxSize || 0]];
  },
  wgslFeatures() { return navigator.gpu.wgslLanguageFeatures ? Array.from(navigator.gpu.wgslLanguageFeatures) : []; },
  limit(obj, name) { const v = obj.limits[name]; return v === undefined ? -1 : v; },
})
"""

_helpers = None


def _js():
    global _helpers
    if _helpers is None:
        _helpers = run_js(_JS_HELPERS)
    return _helpers


def _obj(d: dict):
    """A Python dict (nested dicts/lists, JS objects as values) as a plain JS object."""
    return to_js(d, dict_converter=js.Object.fromEntries)


def _kebab(name: str) -> str:
    """maxStorageBufferBindingSize -> max-storage-buffer-binding-size (the native backend's keys)."""
    return "".join("-" + c.lower() if c.isupper() else c for c in name)


def _nullish(x) -> bool:
    return x is None or type(x).__name__ in ("JsNull", "JsUndefined") or str(x) in ("null", "undefined")


def webgpu_missing_message(reason: str) -> str:
    return (f"WebGPU is not available ({reason}). Use a browser with WebGPU enabled: Chrome or Edge 113+ "
            "(on Linux, start Chrome with --enable-unsafe-webgpu --enable-features=Vulkan), or Safari 26+ / "
            "Firefox 141+ where WebGPU is on; the page must be served over https or from localhost.")


class BrowserDevice(Device):
    """A GPUDevice from navigator.gpu. Create with `await create_browser_device()`."""

    wgsl_subgroup_enable = True    # Tint wants `enable subgroups;` before subgroup built-ins
    decode_steps_per_submit = 8    # Dawn encodes in the page's thread: measured, docs/BENCHMARKS.md "Session 12"
    encodes_ahead = True           # a finished GPUCommandBuffer is submitted later

    def __init__(self, adapter, device, info: DeviceInfo):
        self._adapter, self._dev, self.info = adapter, device, info
        self._queue = device.queue
        self._pipelines: dict[str, Pipeline] = {}
        self._staging: dict[int, list] = {}            # capacity -> free MAP_READ buffers
        self._lists: dict[int, tuple] = {}   # id(dispatch list) -> (list, JS array, snapshot)
        self._pending: list[tuple[str, object, object]] = []  # (label, module, popErrorScope promise)
        self._errors: list[str] = []
        self._lost: str | None = None
        self.allocations = 0
        self._submissions = 0
        self._on_error = create_proxy(self._record_error)
        device.onuncapturederror = self._on_error
        device.lost.then(create_once_callable(self._record_lost))   # freed once called

    # -- error reporting -----------------------------------------------------------------------
    def _record_error(self, event) -> None:
        err = getattr(event, "error", None)
        self._errors.append(str(getattr(err, "message", None) or event))

    def _record_lost(self, info) -> None:
        self._lost = f"{getattr(info, 'reason', '')}: {getattr(info, 'message', info)}"

    async def check_errors(self) -> None:
        """Raise GPUError for anything WebGPU reported since the last check (pipeline
        validation errors with the shader's compiler messages, uncaptured errors, device loss)."""
        pending, self._pending = self._pending, []
        for label, module, promise in pending:
            err = await promise
            if _nullish(err):
                continue
            details = []
            with contextlib.suppress(Exception):   # compilation messages are a bonus
                ci = await module.getCompilationInfo()
                details = [f"{m.type} at line {m.lineNum}:{m.linePos}: {m.message}" for m in ci.messages]
            self._errors.clear()   # the same failure shows up as uncaptured errors of later uses
            raise GPUError(f"kernel {label!r} failed to compile in the browser's WebGPU: {err.message}"
                           + ("; " + " | ".join(details) if details else ""))
        if self._lost is not None:
            raise GPUError(f"the GPU device was lost ({self._lost}); reload the page to start again")
        if self._errors:
            errs, self._errors = self._errors, []
            raise GPUError("WebGPU reported an error: " + errs[0] + (f" (and {len(errs) - 1} more)" if len(errs) > 1
                                                                    else ""))

    # -- buffers ---------------------------------------------------------------------------------
    def create_buffer(self, size: int, usage: str = STORAGE, label: str = "") -> Buffer:
        size = max(16, (int(size) + 15) // 16 * 16)
        if usage == STORAGE and size > self.max_buffer_size:
            raise GPULimitError(f"buffer {label!r} needs {size} bytes; the adapter's maxBufferSize is "
                                f"{self.max_buffer_size}")
        U = js.GPUBufferUsage
        flags = {STORAGE: U.STORAGE | U.COPY_DST | U.COPY_SRC, UNIFORM: U.UNIFORM | U.COPY_DST,
                 STEP_UNIFORM: U.UNIFORM | U.STORAGE | U.COPY_DST,
                 READBACK: U.MAP_READ | U.COPY_DST}[usage]
        self.allocations += 1
        h = self._dev.createBuffer(_obj({"size": size, "usage": flags, "label": label}))
        self.bytes_allocated += size
        self.peak_bytes = max(self.peak_bytes, self.bytes_allocated)
        return Buffer(h, size, label, usage)

    def write_buffer(self, buf: Buffer, data, offset: int = 0) -> None:
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if n == 0:
            return
        if n % 4:  # WebGPU writes are multiples of 4 bytes
            mv = memoryview(bytes(mv) + b"\0" * (4 - n % 4))
            n = mv.nbytes
        elif not mv.c_contiguous:
            mv = memoryview(bytes(mv))
        _js().write(self._queue, buf.handle, offset, mv, n)

    def _take_staging(self, size: int):
        cap = 1 << max(8, (size - 1).bit_length())
        free = self._staging.setdefault(cap, [])
        if free:
            return cap, free.pop()
        U = js.GPUBufferUsage
        return cap, self._dev.createBuffer(_obj({"size": cap, "usage": U.MAP_READ | U.COPY_DST,
                                                 "label": f"staging{cap}"}))

    async def read_buffer(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        size = buf.size - offset if size is None else size
        aligned = (size + 3) // 4 * 4
        cap, st = self._take_staging(aligned)
        try:
            _js().submit(self._dev, to_js([]), to_js([[buf.handle, offset, st, 0, aligned]]))
            data = await self._map(st, aligned)
        finally:
            self._staging[cap].append(st)
        return data[:size]

    async def _map(self, handle, size: int) -> bytes:
        if self._pending or self._errors or self._lost:
            await self.check_errors()
        try:
            arr = await _js().mapRead(handle, size)
        except Exception as e:
            if self._lost or self._errors:
                await self.check_errors()
            raise GPUError(f"reading a GPU buffer failed: {e}") from e
        return arr.to_bytes()

    async def map_read(self, buf: Buffer, size: int, after=None) -> bytes:
        """`after` (submit's ticket) is not needed here: mapAsync already waits for every
        submitted command that uses the buffer."""
        return await self._map(buf.handle, size)

    # -- pipelines -------------------------------------------------------------------------------
    def create_pipeline(self, wgsl: str, bindings: tuple[str, ...], entry: str = "main",
                        label: str = "") -> Pipeline:
        bindings = tuple(bindings)
        key = self._pipeline_key(wgsl, entry, bindings)
        p = self._pipelines.get(key)
        if p is not None:
            return p
        dev = self._dev
        dev.pushErrorScope("validation")
        module = dev.createShaderModule(_obj({"code": wgsl, "label": label}))
        bgl = dev.createBindGroupLayout(_obj({"label": label, "entries": [
            {"binding": i, "visibility": js.GPUShaderStage.COMPUTE, "buffer": {"type": _BIND[k]}}
            for i, k in enumerate(bindings)]}))
        layout = dev.createPipelineLayout(_obj({"bindGroupLayouts": [bgl]}))
        handle = dev.createComputePipeline(_obj({"label": label, "layout": layout,
                                                 "compute": {"module": module, "entryPoint": entry}}))
        self._pending.append((label, module, dev.popErrorScope()))
        p = Pipeline(handle, bgl, bindings, label)
        self._pipelines[key] = p
        return p

    def create_bind_group(self, pipeline: Pipeline, buffers: list) -> BindGroup:
        if len(buffers) != len(pipeline.bindings):
            raise GPUError(f"kernel {pipeline.label!r} takes {len(pipeline.bindings)} bindings, got {len(buffers)}")
        entries = []
        for i, b in enumerate(buffers):
            buf, off, size = b if isinstance(b, tuple) else (b, 0, b.size)
            if size > self.max_binding_size and pipeline.bindings[i] != UNI:
                raise GPULimitError(f"binding {i} of kernel {pipeline.label!r} ({buf.label}) is {size} bytes; "
                                    f"the adapter allows {self.max_binding_size} per binding")
            entries.append({"binding": i, "resource": {"buffer": buf.handle, "offset": off, "size": size}})
        h = self._dev.createBindGroup(_obj({"label": pipeline.label, "layout": pipeline.layout,
                                            "entries": entries}))
        return BindGroup(h, tuple(buffers))

    # -- submission ----------------------------------------------------------------------------
    def _js_list(self, dispatches: list[Dispatch]):
        if len(dispatches) >= _CACHE_MIN_LEN:
            hit = self._lists.get(id(dispatches))
            if hit is not None and hit[0] is dispatches and len(hit[2]) == len(dispatches):
                return hit[1]
        arr = to_js([[d.pipeline.handle, d.bind_group.handle, *d.workgroups] for d in dispatches])
        if len(dispatches) >= _CACHE_MIN_LEN:
            if len(self._lists) >= _CACHE_MAX:
                self._lists.clear()
            # keep the list itself (so its id is not reused) and a snapshot to detect edits
            self._lists[id(dispatches)] = (dispatches, arr, list(dispatches))
        return arr

    def encode(self, dispatches: list[Dispatch], copies: list | None = None) -> Encoded:
        """The finished GPUCommandBuffer, kept until submit_encoded (dropped with the Encoded
        object otherwise: an unsubmitted command buffer is only garbage)."""
        enc = super().encode(dispatches, copies)
        enc.handle = _js().encode(self._dev, self._js_list(dispatches), self._js_copies(enc.copies))
        return enc

    def submit_encoded(self, enc: Encoded) -> int:
        if enc.handle is None:
            return super().submit_encoded(enc)
        self._claim(enc)
        cb, enc.handle = enc.handle, None
        self._submissions += 1
        _js().submitEncoded(self._dev, cb)
        return self._submissions

    def discard(self, enc: Encoded) -> None:
        enc.dispatches = enc.handle = None

    @staticmethod
    def _js_copies(copies):
        return to_js([[s.handle, so, d.handle, do, n] for s, so, d, do, n in copies or ()])

    def submit(self, dispatches: list[Dispatch], copies: list | None = None,
               timestamps: TimestampRecorder | None = None) -> int:
        """Returns a ticket (a submission counter) for map_read, as the interface asks."""
        self._submissions += 1
        cps = self._js_copies(copies)
        if timestamps is None or not self.has_timestamps or not dispatches:
            if timestamps is not None:
                timestamps.pending = None
            _js().submit(self._dev, self._js_list(dispatches), cps)
            return self._submissions
        n = 1 if timestamps.whole else len(dispatches)
        U = js.GPUBufferUsage
        qs = self._dev.createQuerySet(_obj({"type": "timestamp", "count": 2 * n}))
        resolve = self._dev.createBuffer(_obj({"size": 16 * n, "usage": U.QUERY_RESOLVE | U.COPY_SRC}))
        readback = self._dev.createBuffer(_obj({"size": 16 * n, "usage": U.MAP_READ | U.COPY_DST}))
        _js().submitTimed(self._dev, self._js_list(dispatches), cps, qs, resolve, readback, timestamps.whole)
        labels = ["submit"] if timestamps.whole else [d.label for d in dispatches]
        timestamps.pending = (readback, labels, qs, resolve)
        return self._submissions

    async def read_timestamps(self, rec: TimestampRecorder) -> None:
        if rec.pending is None:    # the adapter has no timestamp queries
            return
        readback, labels, qs, resolve = rec.pending
        raw = await self._map(readback, 16 * len(labels))
        vals = struct.unpack(f"<{2 * len(labels)}Q", raw)
        rec.labels.extend(labels)
        rec.ticks_ns.extend((vals[2 * i], vals[2 * i + 1]) for i in range(len(labels)))
        for h in (readback, resolve, qs):
            h.destroy()
        rec.pending = None

    def release_buffer(self, buf: Buffer) -> None:
        if not buf.__dict__.get("released"):       # count each buffer down once
            buf.released = True
            self.bytes_allocated -= buf.size
        buf.handle.destroy()

    def destroy(self) -> None:
        self._lists.clear()
        self._pipelines.clear()
        self._staging.clear()
        with contextlib.suppress(Exception):   # already destroyed or lost
            self._dev.onuncapturederror = None
            self._dev.destroy()
        with contextlib.suppress(Exception):
            self._on_error.destroy()


async def create_browser_device(power_preference: str = "high-performance") -> BrowserDevice:
    """Request an adapter and a device with the adapter's real limits and optional features
    (shader-f16, subgroups, timestamp-query when present; everything works without them)."""
    gpu = getattr(js.navigator, "gpu", None)
    if _nullish(gpu):
        raise GPUError(webgpu_missing_message("navigator.gpu is missing"))
    try:
        adapter = await gpu.requestAdapter(_obj({"powerPreference": power_preference}))
    except Exception as e:
        raise GPUError(webgpu_missing_message(f"requestAdapter failed: {e}")) from e
    if _nullish(adapter):
        raise GPUError(webgpu_missing_message("navigator.gpu.requestAdapter() found no GPU adapter"))
    h = _js()
    have = set(h.features(adapter).to_py())
    features = [f for f in _WANTED_FEATURES if f in have]
    limits = {}
    for name in _LIMITS:
        v = h.limit(adapter, name)
        if v >= 0:
            limits[name] = int(v)
    try:
        device = await adapter.requestDevice(_obj({"label": "webdrift", "requiredFeatures": features,
                                                   "requiredLimits": limits}))
    except Exception as e:
        raise GPUError(f"could not create a WebGPU device: {e}") from e
    vendor, arch, dev_name, desc, fallback = h.adapterInfo(adapter).to_py()
    name = desc or dev_name or " ".join(x for x in (vendor, arch) if x) or "WebGPU adapter"
    software = bool(fallback) or any("swiftshader" in x.lower() or "llvmpipe" in x.lower()
                                     for x in (arch, dev_name, desc))
    dev_limits = {}
    for k in _ALL_LIMITS:
        v = h.limit(device, k)
        if v >= 0:
            dev_limits[_kebab(k)] = int(v)
    configs, sizes = h.matrixInfo(adapter).to_py()
    info = DeviceInfo(adapter=name, backend="WebGPU (browser)", vendor=vendor,
                      features=set(h.features(device).to_py()), limits=dev_limits, is_cpu=software,
                      wgsl_features=set(h.wgslFeatures().to_py()),
                      matrix_configs=tuple((str(c[0]), str(c[1]), int(c[2]), int(c[3]), int(c[4])) for c in configs),
                      subgroup_sizes=tuple(int(x) for x in sizes) if all(sizes) else ())
    dev = BrowserDevice(adapter, device, info)
    dev.architecture = arch
    dev.adapter_info = {"vendor": vendor, "architecture": arch, "device": dev_name, "description": desc,
                        "is_fallback_adapter": bool(fallback)}
    return dev
