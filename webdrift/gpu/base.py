"""The device interface the core uses. Nothing outside webdrift/gpu/ talks to WebGPU.

Two backends implement it: native.py (wgpu-native through the `wgpu` package, desktop) and
browser.py (navigator.gpu through Pyodide's FFI). The core only ever:
  - creates buffers, writes bytes into them, and reads bytes back (reads are async: in the
    browser a read is the only place the core awaits the GPU);
  - compiles WGSL compute pipelines with an explicit binding list;
  - builds bind groups once and submits lists of dispatches (one compute pass per submit).
Every optional capability and operation is declared on `Device` with a default, so the core asks
(`dev.has_timestamps`, `dev.can_time_sync`, `await dev.check_errors()`) and never probes with
hasattr / getattr:
  capabilities  has_f16, has_subgroups, has_dp4a, has_timestamps, has_sync_reads,
                can_time_sync (= timestamps read back synchronously: the tuner's timings),
                encodes_ahead (encode() does the encoding's work then)
  operations    read_timestamps (async, both backends), read_timestamps_sync and
                read_buffer_sync (only where has_sync_reads), check_errors (async, no-op by
                default), check_dispatch, encode / submit_encoded / discard (a submit encoded
                ahead of its time; by default the lists are kept and encoded at submit)
  descriptions  adapter_info (the adapter's description dict), architecture, allocations,
                bytes_allocated / peak_bytes (0 where the backend does not count them; the
                browser counts buffers it created until they are released)
The tuner (kernels/autotune.py) times kernels at once where can_time_sync, and where only
has_timestamps (the browser) queues its measurements for `await autotune.tune_pending(dev)`,
which awaits read_timestamps.
Departures from WebGPU: buffer usages are reduced to the four roles below; pipelines are cached
by (source, entry point); timestamps are optional and exposed as a per-dispatch list.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import GPUError, GPULimitError

# Buffer roles (each backend maps them to WebGPU usage flags)
STORAGE = "storage"      # read/write in shaders, copy src/dst, writable from the host
UNIFORM = "uniform"      # small per-step parameters, writable from the host
STEP_UNIFORM = "step_uniform"   # a uniform that kernels may also write as storage (the step
                                # uniform, advanced on the GPU between decode steps of one submit)
READBACK = "readback"    # host-mappable staging for reads (MAP_READ | COPY_DST)

# The desktop's WebGPU implementations (gpu.native.get_device): wgpu-native, Dawn (gpu/dawn.py)
DESKTOP_APIS = ("wgpu", "dawn")

# Binding kinds a pipeline declares, in @binding order of @group(0)
READ = "read"            # var<storage, read>
RW = "rw"                # var<storage, read_write>
UNI = "uniform"          # var<uniform>


@dataclass
class Buffer:
    """A GPU buffer. `handle` is the backend object; `size` in bytes."""
    handle: Any
    size: int
    label: str = ""
    usage: str = STORAGE


@dataclass
class Pipeline:
    handle: Any
    layout: Any
    bindings: tuple[str, ...]
    label: str = ""


@dataclass
class BindGroup:
    handle: Any
    buffers: tuple = ()


@dataclass
class Dispatch:
    """One compute dispatch: a pipeline, its bind group and the workgroup counts."""
    pipeline: Pipeline
    bind_group: BindGroup
    workgroups: tuple[int, int, int]
    label: str = ""
    raw: tuple | None = None      # backend's cached raw handles (filled on first submit)


@dataclass(eq=False)
class Encoded:
    """A submit encoded ahead of time (Device.encode): its dispatches and copies, and the backend's
    finished command buffer where it keeps one (None: encoded when submitted); `dispatches` is
    the caller's list itself (a caller can tell whether it is still current). `sources` holds
    each copy's (source, destination) GPU handles as encoded, so a buffer replaced since (an
    arena grown, a read-back buffer renewed after an interrupted read) is noticed."""
    dispatches: list
    copies: list
    sources: list
    handle: Any = None


@dataclass
class DeviceInfo:
    adapter: str = ""
    backend: str = ""
    vendor: str = ""
    features: set = field(default_factory=set)
    limits: dict = field(default_factory=dict)
    is_cpu: bool = False          # a software adapter (lavapipe, SwiftShader): prefers barrier-free kernels
    wgsl_features: set = field(default_factory=set)   # WGSL language extensions the compiler accepts
    # matrix units (Dawn's chromium-experimental-subgroup-matrix): (component, result, M, N, K) each
    matrix_configs: tuple = ()
    subgroup_sizes: tuple = ()     # (min, max) subgroup size where the adapter says


class Device:
    """Backend-independent device. Subclasses implement the interface below; the optional parts
    have defaults here (capabilities off, operations absent or no-ops)."""

    info: DeviceInfo
    wgsl_subgroup_enable = False   # whether WGSL must say `enable subgroups;` (Tint yes, naga no)
    has_sync_reads = False         # read_buffer_sync / read_timestamps_sync work (native: yes)
    decode_steps_per_submit = 1    # decode steps an engine puts in one submit by default
    encodes_ahead = False          # encode() makes the command buffer then (else at submit_encoded)
    adapter_info: Mapping[str, Any] = MappingProxyType({})   # the adapter's own description
    architecture = ""              # GPU architecture as the adapter names it ("" if unknown)
    wgpu_version = ""              # the wgpu package's version (native backend; "" elsewhere)
    allocations = 0                # buffers created (the decode loop must not add any)
    bytes_allocated = 0            # bytes of live buffers (0: the backend does not count them)
    peak_bytes = 0                 # high-water mark of bytes_allocated (reset it freely)

    # -- capabilities ------------------------------------------------------------------
    @property
    def has_f16(self) -> bool:
        return "shader-f16" in self.info.features

    @property
    def has_subgroups(self) -> bool:
        return "subgroup" in self.info.features or "subgroups" in self.info.features

    @property
    def has_dp4a(self) -> bool:
        """WGSL's packed 4x8 integer dot products (dot4I8Packed, pack4xI8)."""
        return "packed_4x8_integer_dot_product" in self.info.wgsl_features

    @property
    def has_mma_f16(self) -> bool:
        """Subgroup matrices of f16 with f32 results at 16 x 16 x 16 (the tensor cores through
        Dawn's chromium-experimental-subgroup-matrix), with subgroups of 32 (the matrix-unit GEMM's
        mapping of subgroups to tiles assumes it)."""
        return ("chromium-experimental-subgroup-matrix" in self.info.features and self.has_f16
                and ("f16", "f32", 16, 16, 16) in self.info.matrix_configs and self.info.subgroup_sizes == (32, 32))

    @property
    def min_subgroup(self) -> int:
        """The adapter's smallest subgroup: as the adapter says, else 32 on an NVIDIA GPU (its
        warps), else 4 (the least WebGPU allows)."""
        if self.info.subgroup_sizes:
            return int(self.info.subgroup_sizes[0])
        nvidia = self.adapter_info.get("vendor_id") == 0x10DE or "nvidia" in (self.info.adapter + self.info.vendor).lower()
        return 32 if nvidia else 4

    @property
    def has_timestamps(self) -> bool:
        return "timestamp-query" in self.info.features

    @property
    def can_time_sync(self) -> bool:
        """Whether kernels can be timed synchronously: GPU timestamps read back at once (the
        native backend; the browser's reads are asynchronous). The tuner measures only here."""
        return self.has_timestamps and self.has_sync_reads

    @property
    def max_binding_size(self) -> int:
        return int(self.info.limits.get("max-storage-buffer-binding-size", 128 << 20))

    @property
    def max_buffer_size(self) -> int:
        return int(self.info.limits.get("max-buffer-size", 256 << 20))

    @property
    def max_workgroups(self) -> int:
        return int(self.info.limits.get("max-compute-workgroups-per-dimension", 65535))

    # -- the interface ---------------------------------------------------------------
    def create_buffer(self, size: int, usage: str = STORAGE, label: str = "") -> Buffer:
        raise NotImplementedError

    def write_buffer(self, buf: Buffer, data, offset: int = 0) -> None:
        raise NotImplementedError

    async def read_buffer(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        raise NotImplementedError

    def read_buffer_sync(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        """read_buffer without awaiting, where has_sync_reads (the browser cannot block on a map)."""
        raise GPUError(f"{type(self).__name__} reads buffers asynchronously only: await read_buffer")

    async def map_read(self, buf: Buffer, size: int, after=None) -> bytes:
        """Map a READBACK buffer (filled by a copy in the submit whose ticket is `after`) and
        return its first `size` bytes, waiting for that submission only."""
        raise NotImplementedError

    def create_pipeline(self, wgsl: str, bindings: tuple[str, ...], entry: str = "main",
                        label: str = "") -> Pipeline:
        raise NotImplementedError

    def create_bind_group(self, pipeline: Pipeline, buffers: list) -> BindGroup:
        """buffers[i] binds to @binding(i): a Buffer, or (Buffer, offset, size). (Kernels build
        this list by name: kernels/bindings.py.)"""
        raise NotImplementedError

    def submit(self, dispatches: list[Dispatch], copies: list | None = None,
               timestamps: TimestampRecorder | None = None):
        """Encode the dispatches into one compute pass (then the buffer copies
        [(src, src_off, dst, dst_off, size)]) and submit. Returns an opaque ticket for map_read.
        timestamps: a recorder to time the dispatches with (ignored without has_timestamps)."""
        raise NotImplementedError

    def encode(self, dispatches: list[Dispatch], copies: list | None = None) -> Encoded:
        """A submit of these dispatches and copies encoded now and submitted later with
        submit_encoded (or dropped with discard): the host's encoding can overlap the GPU's work
        on an earlier submit. What buffers hold is read when it runs, so writes between the two
        are seen. This default keeps the lists and encodes them at submit_encoded."""
        copies = list(copies or ())
        return Encoded(dispatches, copies, [(s.handle, d.handle) for s, _, d, _, _ in copies])

    def submit_encoded(self, enc: Encoded):
        """Submit what encode() prepared; returns submit()'s ticket. Once only."""
        return self.submit(self._claim(enc), enc.copies)

    @staticmethod
    def _claim(enc: Encoded) -> list:
        """enc's dispatches, enc marked as submitted (a GPUError the second time, or after
        discard): every backend's submit_encoded takes them through here."""
        if enc.dispatches is None:
            raise GPUError("an encoded submit was submitted or discarded already")
        dispatches, enc.dispatches = enc.dispatches, None
        return dispatches

    def discard(self, enc: Encoded) -> None:
        """Drop an encoded submit that will not run (its command buffer released)."""
        enc.dispatches = None

    async def read_timestamps(self, rec: TimestampRecorder) -> None:
        """Fill rec.labels / rec.ticks_ns from the timed submit that took rec (awaits the GPU);
        nothing to do when that submit recorded nothing (no timestamp queries)."""
        if rec.pending is not None:
            raise NotImplementedError

    def read_timestamps_sync(self, rec: TimestampRecorder) -> None:
        """read_timestamps without awaiting, where has_sync_reads."""
        raise GPUError(f"{type(self).__name__} reads timestamps asynchronously only: await read_timestamps")

    async def check_errors(self) -> None:
        """Raise GPUError for anything the backend reported asynchronously since the last check
        (the browser's validation errors and device loss); the native backend raises at once."""

    def check_dispatch(self, wg: tuple[int, int, int], label: str) -> None:
        check_workgroups(self, wg, label)

    def release_buffer(self, buf: Buffer) -> None:
        """Free a buffer now (e.g. a temporary upload); using it afterwards is an error."""

    def destroy(self) -> None:
        pass

    # -- helpers shared by the backends --------------------------------------------------
    @staticmethod
    def _pipeline_key(wgsl: str, entry: str, bindings: tuple[str, ...]) -> str:
        return hashlib.sha1((entry + "|" + ",".join(bindings) + "|" + wgsl).encode()).hexdigest()


class TimestampRecorder:
    """Collects GPU timestamps around each dispatch (backend fills `ticks`); whole=True: one
    (start, end) pair around the whole submit instead (native backend; the others time each
    dispatch). `pending` is the backend's handle of timestamps submitted but not read yet."""

    def __init__(self, capacity: int, whole: bool = False):
        self.capacity = capacity
        self.whole = whole
        self.labels: list[str] = []
        self.ticks_ns: list[tuple[int, int]] = []
        self.pending: Any = None


def check_workgroups(dev: Device, wg: tuple[int, int, int], label: str) -> None:
    m = dev.max_workgroups
    if any(w > m for w in wg):
        raise GPULimitError(f"dispatch {label!r} needs workgroups {wg}; the adapter allows {m} per dimension")
