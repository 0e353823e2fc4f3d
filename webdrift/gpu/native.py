"""Native backend of the device interface: wgpu-native through the `wgpu` package (desktop); its
class NativeDevice also carries Dawn (gpu/dawn.py: the same class on wgpudawn's module).

The only module of webdrift that imports wgpu. Reads go through staging buffers kept in a
pool (wgpu's queue.read_buffer allocates one per call); `queue.on_submitted_work_done_sync`
is avoided (broken in wgpu 0.32) - a read is the synchronisation point.
Reads can also be synchronous here (`has_sync_reads`: read_buffer_sync, read_timestamps_sync),
which the kernel tuner and the roofline probe use to time kernels at load.
Departure from WebGPU: timestamps inside passes are not exposed by wgpu-py 0.32, so
profiling puts each dispatch in its own pass with `timestamp_writes`.
"""

from __future__ import annotations

import itertools
import os
import struct
import sys
import time
import weakref

import wgpu

try:  # wgpu-native's C entry points: the hot encode loop calls them directly (see submit)
    from wgpu.backends.wgpu_native._ffi import ffi as _ffi
    from wgpu.backends.wgpu_native._ffi import lib as _lib
except ImportError:  # pragma: no cover - another wgpu build: fall back to the Python API
    _ffi = _lib = None

from ..errors import GPUError, GPULimitError, InvalidArgumentError
from .base import (
    DESKTOP_APIS,
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

_U = wgpu.BufferUsage
_USAGE = {
    STORAGE: _U.STORAGE | _U.COPY_DST | _U.COPY_SRC,
    UNIFORM: _U.UNIFORM | _U.COPY_DST,
    STEP_UNIFORM: _U.UNIFORM | _U.STORAGE | _U.COPY_DST,
    READBACK: _U.MAP_READ | _U.COPY_DST,
}
_BIND = {
    READ: wgpu.BufferBindingType.read_only_storage,
    RW: wgpu.BufferBindingType.storage,
    UNI: wgpu.BufferBindingType.uniform,
}
_WANTED_FEATURES = ("shader-f16", "subgroup", "timestamp-query", "timestamp-query-inside-passes")
_LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size",
           "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x",
           "max-storage-buffers-per-shader-stage", "max-compute-workgroups-per-dimension")


class NativeDevice(Device):
    has_sync_reads = True
    decode_steps_per_submit = 4    # measured: docs/BENCHMARKS.md, "Session 12"
    # the WebGPU implementation: wgpu-py's API module and its C entry points (cffi), which the hot
    # encode loop calls directly (see submit); DawnDevice (gpu/dawn.py) puts Dawn's here
    _wgpu = wgpu
    _lib = _lib
    _ffi = _ffi
    encodes_ahead = _lib is not None
    raw_maps = _lib is not None    # maps through the C API, waiting for one submission (map_read)

    def __init__(self, power_preference: str = "high-performance"):
        os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
        adapter = self._adapter(power_preference)
        feats = [f for f in self._wanted_features() if f in adapter.features]
        # Ask for the adapter's real limits: WebGPU's defaults (128 MiB bindings) are too small.
        limits = {k: v for k, v in adapter.limits.items() if k in _LIMITS}
        try:
            self._dev = self._request_device(adapter, feats, limits)
        except Exception as e:
            raise GPUError(f"could not create a WebGPU device on {adapter.info.get('device')}: {e}") from e
        info = adapter.info
        self.info = DeviceInfo(adapter=info.get("device", ""), backend=info.get("backend_type", ""),
                               vendor=info.get("vendor", ""), features=set(self._dev.features),
                               limits=dict(self._dev.limits),
                               is_cpu=info.get("adapter_type") == "CPU" or "llvmpipe" in info.get("device", ""),
                               wgsl_features={"packed_4x8_integer_dot_product"})   # naga in wgpu-native 0.32
        self._describe(adapter)
        self._queue = self._dev.queue
        self._pipelines: dict[str, Pipeline] = {}
        self._staging: dict[int, object] = {}
        self.allocations = 0   # buffers created (the decode loop must not add any)
        # Buffer maps (see map_read): the callback files each map's status under its token; a
        # read that is interrupted leaves its buffer in _unsettled, recycled before its next use
        self._map_results: dict[int, int] = {}      # map token -> WGPUMapAsyncStatus
        self._map_tokens = itertools.count(1)
        self._caught: list[BaseException] = []     # raised by a signal handler inside a callback
        self._unsettled: dict[int, Buffer] = {}     # id(buf) -> buf whose map may be pending or mapped
        if self.raw_maps:
            self._on_mapped = _map_callback(self._map_results, self._caught)   # kept alive with the device
        self.adapter_info = dict(info)   # incl. "description" (the driver, e.g. "Mesa 22.3.6")
        self.architecture = info.get("architecture", "")
        self.bytes_allocated = 0         # bytes of live buffers made by create_buffer
        self.peak_bytes = 0              # high-water mark of bytes_allocated (reset it freely)

    # -- what differs between WebGPU implementations (DawnDevice overrides these) ----------
    def _adapter(self, power_preference: str):
        try:
            adapter = self._wgpu.gpu.request_adapter_sync(power_preference=power_preference)
        except Exception as e:  # no Vulkan/Metal/D3D12 driver at all
            raise GPUError(f"no WebGPU adapter found ({e}); on Linux without a GPU install "
                           "mesa-vulkan-drivers (lavapipe)") from e
        if adapter is None:
            raise GPUError("no WebGPU adapter found; on Linux without a GPU install mesa-vulkan-drivers")
        return adapter

    def _wanted_features(self) -> tuple:
        return _WANTED_FEATURES

    def _request_device(self, adapter, features: list, limits: dict):
        return adapter.request_device_sync(required_features=features, required_limits=limits)

    def _describe(self, adapter) -> None:
        """Complete self.info from what the implementation tells of the adapter."""

    def _submit_cb(self, cb):
        """Submit the raw command buffer cb; the ticket for map_read."""
        arr = self._ffi.new("WGPUCommandBuffer[]", [cb])
        return self._lib.wgpuQueueSubmitForIndex(self._queue._internal, 1, arr)

    @property
    def wgpu_version(self) -> str:
        """The `wgpu` package's version (for reports such as `webdrift bench`'s machine facts)."""
        return self._wgpu.__version__

    # -- buffers -----------------------------------------------------------------------
    def create_buffer(self, size: int, usage: str = STORAGE, label: str = "") -> Buffer:
        size = max(16, (int(size) + 15) // 16 * 16)
        if usage == STORAGE and size > self.max_buffer_size:
            raise GPULimitError(f"buffer {label!r} needs {size} bytes; the adapter's max-buffer-size is "
                                f"{self.max_buffer_size}")
        self.allocations += 1
        h = self._dev.create_buffer(size=size, usage=_USAGE[usage], label=label)
        buf = Buffer(h, size, label, usage)
        self.bytes_allocated += size
        self.peak_bytes = max(self.peak_bytes, self.bytes_allocated)
        buf._freed = weakref.finalize(buf, self._forget, size)   # released or garbage-collected
        return buf

    def _forget(self, size: int) -> None:
        self.bytes_allocated -= size

    def write_buffer(self, buf: Buffer, data, offset: int = 0) -> None:
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if n % 4:  # WebGPU writes must be multiples of 4 bytes
            mv = memoryview(bytes(mv) + b"\0" * (4 - n % 4))
        self._queue.write_buffer(buf.handle, offset, mv)

    def _staging_for(self, size: int) -> Buffer:
        cap = 1 << max(8, (size - 1).bit_length())
        st = self._staging.get(cap)
        if st is None:
            h = self._dev.create_buffer(size=cap, usage=_USAGE[READBACK], label=f"staging{cap}")
            st = self._staging[cap] = Buffer(h, cap, f"staging{cap}", READBACK)
        return st

    def read_buffer_sync(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        size = buf.size - offset if size is None else size
        aligned = (size + 3) // 4 * 4
        st = self._staging_for(aligned)
        self._settle(st)           # before the copy: an interrupted read's buffer is replaced first
        enc = self._dev.create_command_encoder()
        enc.copy_buffer_to_buffer(buf.handle, offset, st.handle, 0, aligned)
        self._queue.submit([enc.finish()])
        if not self.raw_maps:
            return self._map_sync_read(st, size, aligned)
        return self._map_and_read(st, aligned)[:size]

    async def read_buffer(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        return self.read_buffer_sync(buf, offset, size)

    async def map_read(self, buf: Buffer, size: int, after=None) -> bytes:
        """Map a READBACK buffer once submission `after` (a ticket from submit) has finished.

        wgpu-py's map_sync waits for *all* submitted work, which would make the host wait for the
        decode step it just queued; here the wait is for the callback of this one map, so later
        steps keep running. The wait is Python code (see _wait_map): Ctrl-C ends it at once.
        """
        self._settle(buf)          # a read of it was interrupted: what it held is gone (drained)
        if not self.raw_maps or after is None:
            return self._map_sync_read(buf, size, buf.size)
        return self._map_and_read(buf, size)

    def _map_sync_read(self, buf: Buffer, size: int, length: int) -> bytes:
        """The first `size` bytes of buf through the Python API's blocking map of `length` bytes
        (Dawn; wgpu without its C entry points), which waits for all work submitted before it.
        buf is unsettled while its map may be pending or mapped (see below), so a read that an
        interrupt ends leaves a buffer that is replaced before its next copy or map."""
        self._unsettled[id(buf)] = buf
        h = buf.handle
        # an interrupt that lands in the map's callback (wgpudawn's, run inside the wait) is
        # swallowed there as "unraisable" and leaves the map half done: caught here and raised
        caught: list[BaseException] = []
        hook = sys.unraisablehook
        sys.unraisablehook = lambda u: (caught.append(u.exc_value) if isinstance(u.exc_value, KeyboardInterrupt)
                                        else hook(u))
        try:
            try:
                h.map_sync(self._wgpu.MapMode.READ, 0, length)
                data = bytes(h.read_mapped(0, size, copy=False))
                h.unmap()
            finally:
                sys.unraisablehook = hook
        except RuntimeError as e:   # a map left half done
            if caught:
                raise caught[0] from None
            raise GPUError(f"reading {buf.label!r} back failed ({e}); it is replaced at its next use") from e
        del self._unsettled[id(buf)]
        if caught:
            raise caught[0]
        return data

    # An interrupt (KeyboardInterrupt, or any exception a signal handler raises) may arrive at any
    # Python instruction of a read, including inside the map callback, which wgpu-native runs
    # within a poll. So: the callback never lets an exception out (cffi's onerror files the status
    # and keeps the exception, which the wait re-raises from Python); the wait polls without
    # blocking in C, so the interrupt ends it; and a buffer whose read was interrupted, its map
    # pending or done, is marked unsettled *before* its map is requested and replaced by a fresh
    # buffer before its next use (its map state cannot be asked: wgpu-native 0.32 does not
    # implement wgpuBufferGetMapState), so no later map meets a mapped or pending buffer.
    # A GPU: poll without sleeping for up to SPIN_S (a synchronous read such as a speculative
    # verification pass, several ms, must not wake late: a 2 ms spin then sleeps doubling to 1 ms
    # added up to ~1 ms to a 2-3 ms pass on an H100), then sleeps doubling up to MAX_PAUSE_S (how
    # late a long wait may notice). A software adapter: sleeps from the start (its work runs on
    # the CPU cores a spin would take), up to SOFT_PAUSE_S.
    SPIN_S = 0.02
    MAX_PAUSE_S = 0.0005
    SOFT_PAUSE_S = 0.001

    def _map_and_read(self, buf: Buffer, size: int) -> bytes:
        token = next(self._map_tokens)
        self._unsettled[id(buf)] = buf              # from here until unmapped: replaced if we unwind
        info = self._ffi.new("WGPUBufferMapCallbackInfo *")
        info.mode = self._lib.WGPUCallbackMode_AllowProcessEvents
        info.callback = self._on_mapped
        info.userdata1 = self._ffi.cast("void *", token)
        raw = buf.handle._internal
        self._lib.wgpuBufferMapAsync(raw, self._lib.WGPUMapMode_Read, 0, buf.size, info[0])
        status = self._wait_map(token)
        if status != self._lib.WGPUMapAsyncStatus_Success:
            del self._unsettled[id(buf)]
            raise GPUError(f"mapping {buf.label!r} for reading failed (status {status})")
        ptr = self._lib.wgpuBufferGetConstMappedRange(raw, 0, buf.size)
        data = bytes(self._ffi.buffer(ptr, size))
        self._lib.wgpuBufferUnmap(raw)
        del self._unsettled[id(buf)]
        return data

    def _wait_map(self, token: int) -> int:
        """The status of map `token`, polling until its callback has run: non-blocking polls for
        SPIN_S (none on a software adapter), then with sleeps doubling up to MAX_PAUSE_S
        (SOFT_PAUSE_S). Interruptible (Python code)."""
        results, caught = self._map_results, self._caught
        poll, dev, null = self._lib.wgpuDevicePoll, self._dev._internal, self._ffi.NULL
        soft = self.info.is_cpu
        spin, most = (0.0, self.SOFT_PAUSE_S) if soft else (self.SPIN_S, self.MAX_PAUSE_S)
        t0 = time.perf_counter()
        pause = 0.0
        while True:
            poll(dev, False, null)
            if caught:
                raise caught.pop()
            st = results.pop(token, None)
            if st is not None:
                return st
            if pause or time.perf_counter() - t0 > spin:
                pause = min(2 * pause or 5e-5, most)
                time.sleep(pause)

    def _settle(self, buf: Buffer) -> None:
        """Replace buf's GPU buffer if a read of it was interrupted (its map pending or mapped):
        a fresh one of the same size and usage; the old one is destroyed (any state may be)."""
        if id(buf) not in self._unsettled:
            return
        old = buf.handle
        buf.handle = self._dev.create_buffer(size=buf.size, usage=_USAGE[buf.usage], label=buf.label)
        del self._unsettled[id(buf)]
        old.destroy()

    # -- pipelines -----------------------------------------------------------------------
    def create_pipeline(self, wgsl: str, bindings: tuple[str, ...], entry: str = "main",
                        label: str = "") -> Pipeline:
        bindings = tuple(bindings)
        key = self._pipeline_key(wgsl, entry, bindings)
        p = self._pipelines.get(key)
        if p is not None:
            return p
        try:
            module = self._dev.create_shader_module(code=wgsl, label=label)
            bgl = self._dev.create_bind_group_layout(entries=[
                {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": _BIND[k]}}
                for i, k in enumerate(bindings)])
            layout = self._dev.create_pipeline_layout(bind_group_layouts=[bgl])
            handle = self._dev.create_compute_pipeline(layout=layout,
                                                       compute={"module": module, "entry_point": entry})
        except Exception as e:
            raise GPUError(f"kernel {label!r} failed to compile: {e}") from e
        p = Pipeline(handle, bgl, bindings, label)
        self._pipelines[key] = p
        return p

    def create_bind_group(self, pipeline: Pipeline, buffers: list) -> BindGroup:
        if len(buffers) != len(pipeline.bindings):
            raise GPUError(f"kernel {pipeline.label!r} takes {len(pipeline.bindings)} bindings, got {len(buffers)}")
        entries = []
        for i, b in enumerate(buffers):
            if isinstance(b, tuple):
                buf, off, size = b
            else:
                buf, off, size = b, 0, b.size
            if size > self.max_binding_size and pipeline.bindings[i] != UNI:
                raise GPULimitError(f"binding {i} of kernel {pipeline.label!r} ({buf.label}) is {size} bytes; "
                                    f"the adapter allows {self.max_binding_size} per binding")
            entries.append({"binding": i, "resource": {"buffer": buf.handle, "offset": off, "size": size}})
        h = self._dev.create_bind_group(layout=pipeline.layout, entries=entries)
        return BindGroup(h, tuple(buffers))

    # -- submission ----------------------------------------------------------------------
    def submit(self, dispatches: list[Dispatch], copies: list | None = None,
               timestamps: TimestampRecorder | None = None):
        if self._lib is not None and timestamps is None:
            return self._submit_raw(dispatches, copies)
        enc = self._dev.create_command_encoder()
        if timestamps is None:
            cp = enc.begin_compute_pass()
            self._encode_pass(cp, dispatches)
            cp.end()
        elif timestamps.whole:   # one pass, timestamps at its start and end (a decode step's GPU span)
            qs = self._dev.create_query_set(type=wgpu.QueryType.timestamp, count=2)
            cp = enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 0,
                                                          "end_of_pass_write_index": 1})
            self._encode_pass(cp, dispatches)
            cp.end()
            resolve = self._dev.create_buffer(size=16, usage=_U.QUERY_RESOLVE | _U.COPY_SRC)
            enc.resolve_query_set(qs, 0, 2, resolve, 0)
            timestamps.pending = (resolve, [f"step of {len(dispatches)} kernels"])
        else:
            self._encode_timed(enc, dispatches, timestamps)
        for src, so, dst, do, n in copies or ():
            if self._unsettled:        # a read-back buffer whose last read was interrupted
                self._settle(dst)
            enc.copy_buffer_to_buffer(src.handle, so, dst.handle, do, n)
        cb = enc.finish()
        if self._lib is None:
            self._queue.submit([cb])
            return None
        return self._submit_cb(cb._internal)   # the ticket for map_read

    def _submit_raw(self, dispatches: list[Dispatch], copies: list | None):
        """submit() without timestamps, through the C API alone: no wgpu-py object is made per
        step (faster, and an interrupt cannot leave one half-built: wgpu-py's __del__ then
        fails noisily); every handle is released in `finally`, so an interrupted submit leaves
        nothing behind (an unfinished encoder is dropped, never submitted)."""
        cb = self._encode_cb(dispatches, copies)
        try:
            return self._submit_cb(cb)
        finally:
            self._lib.wgpuCommandBufferRelease(cb)

    def _encode_cb(self, dispatches: list[Dispatch], copies: list | None):
        """The finished raw command buffer of one compute pass of the dispatches, then the copies
        (the caller releases it); the encoder and pass are released here whatever happens."""
        lib, null = self._lib, self._ffi.NULL
        enc = cp = None
        try:
            enc = lib.wgpuDeviceCreateCommandEncoder(self._dev._internal, null)
            cp = lib.wgpuCommandEncoderBeginComputePass(enc, null)
            self._encode_raw(cp, dispatches)
            lib.wgpuComputePassEncoderEnd(cp)
            for src, so, dst, do, n in copies or ():
                if self._unsettled:        # a read-back buffer whose last read was interrupted
                    self._settle(dst)
                lib.wgpuCommandEncoderCopyBufferToBuffer(enc, src.handle._internal, so, dst.handle._internal, do, n)
            return lib.wgpuCommandEncoderFinish(enc, null)
        finally:
            if cp is not None:
                lib.wgpuComputePassEncoderRelease(cp)
            if enc is not None:
                lib.wgpuCommandEncoderRelease(enc)

    def encode(self, dispatches: list[Dispatch], copies: list | None = None) -> Encoded:
        """A finished command buffer kept until submit_encoded / discard (released with the
        Encoded object if neither comes)."""
        if self._lib is None:
            return super().encode(dispatches, copies)
        cb = self._encode_cb(dispatches, copies)         # (first: it may renew a read-back buffer)
        enc = super().encode(dispatches, copies)         # the copies' handles as encoded
        enc.handle = weakref.finalize(enc, self._lib.wgpuCommandBufferRelease, cb), cb
        return enc

    def submit_encoded(self, enc: Encoded):
        if enc.handle is None:
            return super().submit_encoded(enc)
        dispatches = self._claim(enc)
        release, cb = enc.handle
        stale = any(id(d) in self._unsettled or (s.handle, d.handle) != h
                    for (s, _, d, _, _), h in zip(enc.copies, enc.sources))
        try:
            # a buffer it copies was replaced since (or must be): encoded again, as submit() does
            return self._submit_raw(dispatches, enc.copies) if stale else self._submit_cb(cb)
        finally:
            release()

    def discard(self, enc: Encoded) -> None:
        enc.dispatches = None
        if enc.handle is not None:
            enc.handle[0]()

    def _encode_raw(self, h, dispatches: list[Dispatch]) -> None:
        """Encode dispatches into the raw compute pass h: wgpu-py's set_bind_group allocates a
        cffi array per call (~10 us) and a decode step is hundreds of dispatches, so this goes
        through the C API with cached raw handles."""
        null = self._ffi.NULL
        set_p, set_bg = self._lib.wgpuComputePassEncoderSetPipeline, self._lib.wgpuComputePassEncoderSetBindGroup
        disp = self._lib.wgpuComputePassEncoderDispatchWorkgroups
        last_p = None
        for d in dispatches:
            raw = d.raw
            if raw is None:
                raw = d.raw = (d.pipeline.handle._internal, d.bind_group.handle._internal) + tuple(d.workgroups)
            if raw[0] is not last_p:
                set_p(h, raw[0])
                last_p = raw[0]
            set_bg(h, 0, raw[1], 0, null)
            disp(h, raw[2], raw[3], raw[4])

    def _encode_pass(self, cp, dispatches: list[Dispatch]) -> None:
        if self._lib is not None:
            self._encode_raw(cp._internal, dispatches)
        else:
            last_p = None
            for d in dispatches:
                if d.pipeline is not last_p:
                    cp.set_pipeline(d.pipeline.handle)
                    last_p = d.pipeline
                cp.set_bind_group(0, d.bind_group.handle)
                cp.dispatch_workgroups(*d.workgroups)

    def _encode_timed(self, enc, dispatches: list[Dispatch], rec: TimestampRecorder) -> None:
        n = len(dispatches)
        qs = self._dev.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
        for i, d in enumerate(dispatches):
            cp = enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 2 * i,
                                                          "end_of_pass_write_index": 2 * i + 1})
            cp.set_pipeline(d.pipeline.handle)
            cp.set_bind_group(0, d.bind_group.handle)
            cp.dispatch_workgroups(*d.workgroups)
            cp.end()
        resolve = self._dev.create_buffer(size=16 * n, usage=_U.QUERY_RESOLVE | _U.COPY_SRC)
        enc.resolve_query_set(qs, 0, 2 * n, resolve, 0)
        rec.pending = (resolve, [d.label for d in dispatches])

    def read_timestamps_sync(self, rec: TimestampRecorder) -> None:
        if rec.pending is None:
            return
        resolve, labels = rec.pending
        raw = self.read_buffer_sync(Buffer(resolve, resolve.size), 0, resolve.size)
        vals = struct.unpack(f"<{len(labels) * 2}Q", raw)
        rec.labels.extend(labels)
        rec.ticks_ns.extend((vals[2 * i], vals[2 * i + 1]) for i in range(len(labels)))
        rec.pending = None

    async def read_timestamps(self, rec: TimestampRecorder) -> None:
        self.read_timestamps_sync(rec)

    def release_buffer(self, buf: Buffer) -> None:
        self._unsettled.pop(id(buf), None)     # destroyed in whatever map state it is
        buf.handle.destroy()
        freed = getattr(buf, "_freed", None)
        if freed is not None:
            freed()   # runs _forget once

    def destroy(self) -> None:
        self._dev.destroy()


def _map_callback(results: dict, caught: list):
    """The C callback of every buffer map: files the status under the map's token (userdata1).
    It must never raise (cffi would print the exception and drop it, and the wait would spin for
    a status that never comes): a signal handler that raises inside it (Ctrl-C during a poll) is
    caught by onerror, which files the status from the callback's arguments and keeps the
    exception for the wait to raise from Python code."""
    def on_mapped(st, msg, u1, u2):
        results[int(_ffi.cast("uintptr_t", u1))] = st

    def on_error(exc_type, exc, tb):
        args = tb.tb_frame.f_locals if tb is not None else {}
        if "st" in args and "u1" in args:
            results[int(_ffi.cast("uintptr_t", args["u1"]))] = args["st"]
        caught.append(exc)

    return _ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)", on_mapped, onerror=on_error)


_default: dict[str, NativeDevice] = {}


def get_device(api: str | None = None) -> NativeDevice:
    """The process-wide desktop device (created on first use) of the WebGPU implementation
    `api`: "wgpu" (wgpu-native through the `wgpu` package) or "dawn" (Dawn through `wgpudawn`,
    gpu/dawn.py); None: the environment's WEBDRIFT_GPU_API, else "wgpu"."""
    api = api or os.environ.get("WEBDRIFT_GPU_API") or "wgpu"
    if api not in DESKTOP_APIS:
        raise InvalidArgumentError(f"gpu api {api!r} is not one of {', '.join(DESKTOP_APIS)} "
                                   "(WEBDRIFT_GPU_API / --gpu-api)")
    dev = _default.get(api)
    if dev is None:
        if api == "dawn":
            from .dawn import DawnDevice
            dev = DawnDevice()
        else:
            dev = NativeDevice()
        _default[api] = dev
    return dev
