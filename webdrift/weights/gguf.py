"""GGUF reader in plain Python: header, metadata, tensor table, and raw tensor bytes by offset.

Runs unchanged under CPython and Pyodide, so it must not import numpy (or anything outside the
standard library and webdrift.errors). It never reads a whole file: a path source is opened per
read and only the header region and the requested tensor ranges are read; a bytes-like source
(the browser's fetched ArrayBuffer as a memoryview) is sliced without copying until `raw()`.

Every malformed input raises ModelFileError (or UnsupportedModelError for a valid file using
something webdrift does not handle) naming the file and the problem. Every count or length the
header claims is checked against the bytes left in the file *before* anything is allocated for
it, so a corrupted length of 2**60 fails at once instead of exhausting memory; names have a
length limit of their own (keys 65535 bytes, tensor names 256), and names and values read from
the file are quoted through errors.shown (cut to a few dozen characters), so a damaged length
cannot put megabytes into a message.

File layout (GGUF v2/v3, little-endian):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value_type | value)          string = u64 length + UTF-8 bytes
    n_tensors x (string name | u32 n_dims | n_dims x u64 ne | u32 ggml_type | u64 offset)
    padding to `general.alignment` (default 32)
    tensor data; each tensor at data_start + offset (offset a multiple of the alignment)
"""

from __future__ import annotations

import itertools
import os
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

from webdrift.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError, shown

__all__ = [
    "GGML_TYPES",
    "GGUF_VALUE_TYPE_NAMES",
    "GGMLType",
    "GGUFFile",
    "TensorInfo",
    "ggml_type",
    "tensor_nbytes",
]

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_MAX_DIMS = 4
GGUF_MAX_KEY = 65535     # bytes of a metadata key (the GGUF spec's limit)
GGUF_MAX_NAME = 256      # bytes of a tensor name (ggml's own limit is 63; a longer one is a damaged length)


# --------------------------------------------------------------------------------------------
# GGML tensor types: id -> (name, elements per block, bytes per block). Values from ggml.h /
# ggml.c (type_traits). Types 4 and 5 (Q4_2, Q4_3) were removed from ggml and are unknown here.
# --------------------------------------------------------------------------------------------


class GGMLType(NamedTuple):
    id: int
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block


_QK_K = 256
GGML_TYPES: dict[int, GGMLType] = {
    t.id: t
    for t in [
        GGMLType(0, "F32", 1, 4),
        GGMLType(1, "F16", 1, 2),
        GGMLType(2, "Q4_0", 32, 2 + 16),
        GGMLType(3, "Q4_1", 32, 2 + 2 + 16),
        GGMLType(6, "Q5_0", 32, 2 + 4 + 16),
        GGMLType(7, "Q5_1", 32, 2 + 2 + 4 + 16),
        GGMLType(8, "Q8_0", 32, 2 + 32),
        GGMLType(9, "Q8_1", 32, 4 + 4 + 32),
        GGMLType(10, "Q2_K", _QK_K, 2 + 2 + _QK_K // 16 + _QK_K // 4),
        GGMLType(11, "Q3_K", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + 12),
        GGMLType(12, "Q4_K", _QK_K, 2 + 2 + _QK_K // 2 + 12),
        GGMLType(13, "Q5_K", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
        GGMLType(14, "Q6_K", _QK_K, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
        GGMLType(15, "Q8_K", _QK_K, 4 + _QK_K + _QK_K // 8),
        GGMLType(16, "IQ2_XXS", _QK_K, 2 + _QK_K // 4),
        GGMLType(17, "IQ2_XS", _QK_K, 2 + _QK_K // 4 + _QK_K // 32),
        GGMLType(18, "IQ3_XXS", _QK_K, 2 + _QK_K // 4 + _QK_K // 8),
        GGMLType(19, "IQ1_S", _QK_K, 2 + _QK_K // 8 + _QK_K // 16),
        GGMLType(20, "IQ4_NL", 32, 2 + 16),
        GGMLType(21, "IQ3_S", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
        GGMLType(22, "IQ2_S", _QK_K, 2 + _QK_K // 4 + _QK_K // 16),
        GGMLType(23, "IQ4_XS", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 64),
        GGMLType(24, "I8", 1, 1),
        GGMLType(25, "I16", 1, 2),
        GGMLType(26, "I32", 1, 4),
        GGMLType(27, "I64", 1, 8),
        GGMLType(28, "F64", 1, 8),
        GGMLType(29, "IQ1_M", _QK_K, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
        GGMLType(30, "BF16", 1, 2),
        GGMLType(34, "TQ1_0", _QK_K, 2 + 4 * 13),
        GGMLType(35, "TQ2_0", _QK_K, 2 + 64),
        GGMLType(39, "MXFP4", 32, 1 + 16),
    ]
}
_GGML_TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}


def ggml_type(type_name_or_id: str | int) -> GGMLType:
    """The GGMLType for a name ("Q4_K", case-insensitive) or numeric id; InvalidArgumentError if unknown."""
    if isinstance(type_name_or_id, bool):
        raise InvalidArgumentError(f"ggml type must be a name or an id, got {shown(type_name_or_id)}")
    if isinstance(type_name_or_id, int):
        t = GGML_TYPES.get(type_name_or_id)
    elif isinstance(type_name_or_id, str):
        t = _GGML_TYPES_BY_NAME.get(type_name_or_id.upper())
    else:
        t = None
    if t is None:
        known = ", ".join(t.name for t in GGML_TYPES.values())
        raise InvalidArgumentError(f"unknown ggml type {shown(type_name_or_id)}; known types: {known}")
    return t


def tensor_nbytes(type_name_or_id: str | int, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes of a tensor of `shape` (either order; blocks run along numpy's last axis = ne[0])."""
    t = ggml_type(type_name_or_id)
    n = 1
    for d in shape:
        n *= int(d)
    row = int(shape[-1]) if len(shape) else 1
    if row % t.block_size:
        raise InvalidArgumentError(
            f"row length {row} is not a multiple of the {t.name} block size {t.block_size}"
        )
    return n // t.block_size * t.type_size


# --------------------------------------------------------------------------------------------
# Metadata value types
# --------------------------------------------------------------------------------------------

_T_UINT8, _T_INT8, _T_UINT16, _T_INT16, _T_UINT32, _T_INT32, _T_FLOAT32 = 0, 1, 2, 3, 4, 5, 6
_T_BOOL, _T_STRING, _T_ARRAY, _T_UINT64, _T_INT64, _T_FLOAT64 = 7, 8, 9, 10, 11, 12

GGUF_VALUE_TYPE_NAMES = {
    0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32",
    7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64",
}  # fmt: skip

# fixed-size scalar types: value type -> struct format character (little-endian prefix added)
_SCALAR_FMT = {
    _T_UINT8: "B", _T_INT8: "b", _T_UINT16: "H", _T_INT16: "h", _T_UINT32: "I", _T_INT32: "i",
    _T_FLOAT32: "f", _T_BOOL: "?", _T_UINT64: "Q", _T_INT64: "q", _T_FLOAT64: "d",
}  # fmt: skip
_SCALAR_SIZE = {t: struct.calcsize("<" + f) for t, f in _SCALAR_FMT.items()}
# smallest possible encoding of one value of each type (bounds array lengths before allocating)
_MIN_VALUE_SIZE = dict(_SCALAR_SIZE)
_MIN_VALUE_SIZE[_T_STRING] = 8  # u64 length, empty string
_MIN_VALUE_SIZE[_T_ARRAY] = 12  # u32 element type + u64 count, empty array

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")

_HEADER_CHUNK = 1 << 20  # bytes read from a file per refill while parsing the header


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table. Shapes: `ne` is GGUF order (ne[0] = contiguous row
    length), `shape` is numpy order (reversed ne)."""

    name: str
    shape: tuple[int, ...]  # numpy order, e.g. (rows, cols) = (out, in)
    ne: tuple[int, ...]  # GGUF order, ne[0] = innermost
    ggml_type: int
    type_name: str  # "F32", "Q4_1", "Q4_K", ...
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


class _Cursor:
    """Sequential little-endian reader over a file (refilled in chunks) or an in-memory buffer.

    Every read first checks the bytes left in the *source* (not just the buffer), so any length
    is validated before it is allocated.
    """

    def __init__(self, gf: GGUFFile, fh: Any | None, data: memoryview | None, size: int):
        self.gf = gf
        self.fh = fh  # open binary file, or None for an in-memory source
        self.size = size  # total bytes of the source
        if data is not None:
            self.buf: bytes | memoryview = data
        else:
            self.buf = b""
        self.base = 0  # source offset of buf[0]
        self.pos = 0  # read position inside buf

    @property
    def tell(self) -> int:
        return self.base + self.pos

    @property
    def remaining(self) -> int:
        return self.size - self.base - self.pos

    def need(self, n: int, what: str) -> None:
        """Make n bytes readable at self.pos, or raise (truncated file)."""
        if self.pos + n <= len(self.buf):
            return
        if n > self.remaining:
            raise self.gf._error(
                f"truncated while reading {what}: needs {n} bytes at offset {self.tell}, "
                f"only {self.remaining} left"
            )
        # refill (file source only: an in-memory buffer already holds everything)
        start = self.tell
        want = max(n, _HEADER_CHUNK)
        want = min(want, self.size - start)
        self.fh.seek(start)
        chunk = self.fh.read(want)
        if len(chunk) < n:
            raise self.gf._error(f"truncated while reading {what}: file shrank while reading")
        self.buf = chunk
        self.base = start
        self.pos = 0

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def i64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _I64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str, limit: int | None = None, strict: bool = False) -> str:
        """A string; strict: it must be UTF-8 (names), else bytes that are not UTF-8 are kept as
        surrogate escapes (values: a few real vocabularies hold such tokens)."""
        n = self.u64(what + " (length)")
        if limit is not None and n > limit:
            raise self.gf._error(f"{what}: string length {n} exceeds the {limit}-byte limit (a damaged length field?)")
        if n > self.remaining:
            raise self.gf._error(
                f"{what}: string length {n} exceeds the {self.remaining} bytes left in the file"
            )
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        if strict:
            try:
                return str(raw, "utf-8")
            except UnicodeDecodeError as e:
                raise self.gf._error(f"{what} is not UTF-8 (byte {raw[e.start]:#04x} at {e.start} of {n})") from None
        return _decode(raw)

    def string_array(self, count: int, what: str) -> list[str]:
        # Hot path: tokenizer vocabularies hold up to ~262k strings.
        out: list[str] = []
        append = out.append
        unpack = _U64.unpack_from
        for i in range(count):
            if self.pos + 8 > len(self.buf):
                self.need(8, f"{what}[{i}] (length)")
            buf, pos = self.buf, self.pos
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > len(buf):
                self.pos = pos
                if n > self.remaining:
                    raise self.gf._error(
                        f"{what}[{i}]: string length {n} exceeds the {self.remaining} bytes left in the file"
                    )
                self.need(n, f"{what}[{i}]")
                buf, pos = self.buf, self.pos
            raw = buf[pos : pos + n]
            try:
                append(str(raw, "utf-8"))
            except UnicodeDecodeError:
                append(_decode(raw))
            self.pos = pos + n
        return out

    def scalars(self, vtype: int, count: int, what: str) -> list[Any]:
        size = _SCALAR_SIZE[vtype] * count
        self.need(size, what)
        vals = list(struct.unpack_from(f"<{count}{_SCALAR_FMT[vtype]}", self.buf, self.pos))
        self.pos += size
        return vals


def _decode(raw: bytes | memoryview) -> str:
    # GGUF strings are UTF-8; a few real vocabularies contain invalid sequences. Keep every byte
    # (surrogateescape) rather than failing or replacing: the tokenizer can recover the bytes.
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        return bytes(raw).decode("utf-8", "surrogateescape")


class GGUFFile:
    """A parsed GGUF file: metadata and tensor table; tensor bytes are read on demand.

    source: a filesystem path (str / os.PathLike) or a bytes-like object (bytes, bytearray,
    memoryview, e.g. the browser's fetched ArrayBuffer). `name` is used in messages (defaults
    to the path, or "<bytes>").
    """

    path_or_name: str
    version: int
    metadata: dict[str, Any]  # key -> int | float | bool | str | list (arrays, possibly nested)
    metadata_types: dict[str, int]  # key -> GGUF value type id (9 = ARRAY)
    tensors: dict[str, TensorInfo]  # in file order
    data_offset: int  # absolute offset of the tensor data section
    alignment: int
    file_size: int

    def __init__(self, source: str | os.PathLike | bytes | bytearray | memoryview, name: str | None = None):
        self._path: str | None = None
        self._mem: memoryview | None = None
        if isinstance(source, (str, os.PathLike)):
            self._path = os.fspath(source)
            self.path_or_name = name or self._path
            try:
                self.file_size = os.path.getsize(self._path)
                with open(self._path, "rb") as fh:
                    self._parse(_Cursor(self, fh, None, self.file_size))
            except OSError as e:
                raise ModelFileError(f"cannot read GGUF file {self.path_or_name}: {e}") from e
        elif isinstance(source, (bytes, bytearray, memoryview)):
            mem = memoryview(source)
            if mem.ndim != 1 or mem.itemsize != 1:
                mem = mem.cast("B")
            self._mem = mem
            self.path_or_name = name or "<bytes>"
            self.file_size = len(mem)
            self._parse(_Cursor(self, None, mem, self.file_size))
        else:
            raise InvalidArgumentError(
                f"GGUFFile source must be a path or a bytes-like object, got {type(source).__name__}"
            )

    def __repr__(self) -> str:
        return (
            f"GGUFFile({self.path_or_name!r}, version={self.version}, "
            f"{len(self.metadata)} keys, {len(self.tensors)} tensors)"
        )

    def _error(self, msg: str) -> ModelFileError:
        return ModelFileError(f"GGUF file {self.path_or_name}: {msg}")

    # ---------------------------------------------------------------- header parsing

    def _parse(self, c: _Cursor) -> None:
        if self.file_size < 4:
            raise self._error(f"not a GGUF file (only {self.file_size} bytes)")
        c.need(4, "magic")
        magic = bytes(c.buf[0:4])
        c.pos = 4
        if magic != GGUF_MAGIC:
            raise self._error(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        version = c.u32("version")
        if version not in (2, 3):
            if version in (1,):
                raise UnsupportedModelError(
                    f"GGUF file {self.path_or_name}: GGUF version 1 is not supported (only 2 and 3)"
                )
            if struct.unpack("<I", struct.pack(">I", version))[0] in (2, 3):
                raise UnsupportedModelError(
                    f"GGUF file {self.path_or_name}: big-endian GGUF files are not supported"
                )
            raise self._error(f"unknown GGUF version {version} (supported: 2, 3)")
        self.version = version
        n_tensors = c.u64("tensor count")
        n_kv = c.u64("metadata key count")
        # smallest KV: empty key (8) + type (4) + a 1-byte value; smallest tensor info:
        # empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8)
        if n_kv * 13 > c.remaining:
            raise self._error(
                f"header claims {n_kv} metadata keys, more than the {c.remaining} bytes left could hold"
            )
        if n_tensors * 32 > c.remaining:
            raise self._error(
                f"header claims {n_tensors} tensors, more than the {c.remaining} bytes left could hold"
            )

        self.metadata = {}
        self.metadata_types = {}
        for i in range(n_kv):
            key = c.string(f"metadata key #{i}", GGUF_MAX_KEY, strict=True)
            vtype = c.u32(f"value type of metadata key {shown(key)}")
            if key in self.metadata:
                raise self._error(f"duplicate metadata key {shown(key)}")
            self.metadata[key] = self._read_value(c, vtype, key, depth=0)
            self.metadata_types[key] = vtype

        alignment = self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if "general.alignment" in self.metadata and self.metadata_types["general.alignment"] != _T_UINT32:
            raise self._error(
                "general.alignment must be a UINT32, got "
                + GGUF_VALUE_TYPE_NAMES[self.metadata_types["general.alignment"]]
            )
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise self._error(f"general.alignment = {alignment!r} is not a positive power of two")
        self.alignment = alignment

        infos: list[tuple[str, tuple[int, ...], int, int]] = []  # name, ne, type, relative offset
        seen: set[str] = set()
        for i in range(n_tensors):
            tname = c.string(f"name of tensor #{i}", GGUF_MAX_NAME, strict=True)
            n_dims = c.u32(f"dimension count of tensor {shown(tname)}")
            if n_dims == 0 or n_dims > GGUF_MAX_DIMS:
                raise self._error(f"tensor {shown(tname)} has {n_dims} dimensions (must be 1..{GGUF_MAX_DIMS})")
            ne = tuple(c.i64(f"dimensions of tensor {shown(tname)}") for _ in range(n_dims))
            for d in ne:
                if d <= 0:
                    raise self._error(f"tensor {shown(tname)} has a non-positive dimension: ne={list(ne)}")
            ttype = c.u32(f"type of tensor {shown(tname)}")
            offset = c.u64(f"data offset of tensor {shown(tname)}")
            if tname in seen:
                raise self._error(f"duplicate tensor name {shown(tname)}")
            seen.add(tname)
            infos.append((tname, ne, ttype, offset))

        header_end = c.tell
        self.data_offset = (header_end + alignment - 1) // alignment * alignment
        if self.data_offset > self.file_size and infos:
            raise self._error(
                f"truncated: tensor data would start at {self.data_offset}, file has {self.file_size} bytes"
            )

        self.tensors = {}
        for tname, ne, ttype, rel in infos:
            t = GGML_TYPES.get(ttype)
            if t is None:
                raise self._error(f"tensor {shown(tname)} has unknown ggml type {ttype}")
            if ne[0] % t.block_size:
                raise self._error(
                    f"tensor {shown(tname)} ({t.name}) has row length {ne[0]}, not a multiple of the "
                    f"block size {t.block_size}"
                )
            if rel % alignment:
                raise self._error(
                    f"tensor {shown(tname)} data offset {rel} is not a multiple of the alignment {alignment}"
                )
            n = 1
            for d in ne:
                n *= d
            nbytes = n // t.block_size * t.type_size
            start = self.data_offset + rel
            if start + nbytes > self.file_size:
                raise self._error(
                    f"tensor {shown(tname)} ({t.name}, ne={list(ne)}, {nbytes} bytes at offset {start}) "
                    f"extends past the end of the file ({self.file_size} bytes): truncated or corrupt"
                )
            self.tensors[tname] = TensorInfo(
                name=tname,
                shape=tuple(reversed(ne)),
                ne=ne,
                ggml_type=ttype,
                type_name=t.name,
                offset=start,
                nbytes=nbytes,
            )

        # tensors must not overlap (a wrong nbytes or offset shows up as an overlap)
        spans = sorted((ti.offset, ti.offset + ti.nbytes, ti.name) for ti in self.tensors.values())
        for (s0, e0, n0), (s1, _e1, n1) in itertools.pairwise(spans):
            if s1 < e0:
                raise self._error(
                    f"tensor {shown(n0)} (bytes {s0}..{e0}) overlaps tensor {shown(n1)} (starting at {s1})"
                )

    def _read_value(self, c: _Cursor, vtype: int, key: str, depth: int) -> Any:
        if vtype in _SCALAR_FMT:
            return c.scalars(vtype, 1, f"value of {shown(key)}")[0]
        if vtype == _T_STRING:
            return c.string(f"value of {shown(key)}")
        if vtype == _T_ARRAY:
            if depth > 8:
                raise self._error(f"metadata key {shown(key)}: arrays nested more than 8 deep")
            etype = c.u32(f"element type of array {shown(key)}")
            count = c.u64(f"length of array {shown(key)}")
            if etype not in _MIN_VALUE_SIZE:
                raise self._error(f"metadata key {shown(key)}: array of unknown value type {etype}")
            if count * _MIN_VALUE_SIZE[etype] > c.remaining:
                raise self._error(
                    f"metadata key {shown(key)}: array length {count} ({GGUF_VALUE_TYPE_NAMES[etype]}) "
                    f"exceeds what the {c.remaining} bytes left in the file could hold"
                )
            if etype in _SCALAR_FMT:
                return c.scalars(etype, count, f"array {shown(key)}")
            if etype == _T_STRING:
                return c.string_array(count, f"array {shown(key)}")
            return [self._read_value(c, _T_ARRAY, key, depth + 1) for _ in range(count)]
        raise self._error(f"metadata key {shown(key)} has unknown value type {vtype}")

    # ---------------------------------------------------------------- tensor data

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise InvalidArgumentError(f"GGUF file {self.path_or_name} has no tensor {shown(name)}") from None

    def read(self, offset: int, nbytes: int) -> bytes:
        """Bytes [offset, offset + nbytes) of the file."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.file_size:
            raise self._error(f"read of {nbytes} bytes at offset {offset} is outside the file")
        if self._mem is not None:
            return bytes(self._mem[offset : offset + nbytes])
        try:
            with open(self._path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(nbytes)
        except OSError as e:
            raise self._error(f"read failed: {e}") from e
        if len(data) != nbytes:
            raise self._error(
                f"truncated: wanted {nbytes} bytes at offset {offset}, got {len(data)} "
                "(file changed since it was opened?)"
            )
        return data

    def raw(self, name: str) -> bytes:
        """The exact stored bytes of tensor `name` (GGML block layout, little-endian)."""
        ti = self.tensor(name)
        return self.read(ti.offset, ti.nbytes)

    def raw_view(self, name: str) -> memoryview:
        """Zero-copy view of a tensor's bytes for an in-memory source (browser); a copy otherwise."""
        ti = self.tensor(name)
        if self._mem is not None:
            return self._mem[ti.offset : ti.offset + ti.nbytes]
        return memoryview(self.raw(name))
