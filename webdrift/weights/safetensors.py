"""safetensors reader in plain Python: JSON header, tensor table, raw tensor bytes by offset.

Runs under CPython and Pyodide: standard library only, no numpy, no `safetensors` package. A
path source is never read whole: the header is read once and each tensor's bytes on demand.
Sharded checkpoints are opened through `model.safetensors.index.json` (see open_safetensors_folder).

File layout: u64 little-endian header length N | N bytes of UTF-8 JSON | data.
    JSON: {"<tensor name>": {"dtype": "F16", "shape": [rows, cols], "data_offsets": [begin, end]},
           ..., "__metadata__": {str: str}}   offsets are relative to the start of the data.
Only F32, F16 and BF16 tensors can be read (`raw()` of another dtype -> UnsupportedModelError);
the others are still parsed and bounds-checked so that a file holding e.g. an int64 buffer
opens fine. Malformed headers raise ModelFileError naming the file; names and values from the
header are quoted through errors.shown (cut short), and the header length is bounded by the
file's size before it is read.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

from webdrift.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError, shown

__all__ = ["SUPPORTED_DTYPES", "SafeTensorInfo", "SafetensorsFile", "open_safetensors_folder"]

# dtype -> bytes per element, for every dtype the safetensors format defines
_DTYPE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
    "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}  # fmt: skip
SUPPORTED_DTYPES = ("F32", "F16", "BF16")
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit


@dataclass(frozen=True)
class SafeTensorInfo:
    name: str
    dtype: str  # "F32" | "F16" | "BF16" | ... (safetensors spelling)
    shape: tuple[int, ...]  # numpy order
    offset: int  # absolute byte offset in the file
    nbytes: int


class SafetensorsFile:
    """One .safetensors file. source: a path or a bytes-like object; name is used in messages."""

    path_or_name: str
    metadata: dict[str, str]
    tensors: dict[str, SafeTensorInfo]
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
                    head = fh.read(8)
                    n = self._header_len(head)
                    header = fh.read(n)
            except OSError as e:
                raise ModelFileError(f"cannot open safetensors file {self.path_or_name}: {e}") from e
        elif isinstance(source, (bytes, bytearray, memoryview)):
            mem = memoryview(source)
            self._mem = mem.cast("B") if mem.ndim != 1 or mem.itemsize != 1 else mem
            self.path_or_name = name or "<bytes>"
            self.file_size = len(self._mem)
            n = self._header_len(bytes(self._mem[:8]))
            header = bytes(self._mem[8 : 8 + n])
        else:
            raise InvalidArgumentError(
                f"SafetensorsFile source must be a path or bytes, got {type(source).__name__}"
            )
        if len(header) != n:
            raise self._error(f"truncated header: {n} bytes claimed, {len(header)} present")
        self._parse(header, data_start=8 + n)

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path_or_name!r}, {len(self.tensors)} tensors)"

    def _error(self, msg: str) -> ModelFileError:
        return ModelFileError(f"safetensors file {self.path_or_name}: {msg}")

    def _header_len(self, head: bytes) -> int:
        if len(head) < 8:
            raise self._error(f"not a safetensors file (only {len(head)} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > self.file_size - 8:
            raise self._error(
                f"header length {n} exceeds the file size ({self.file_size} bytes): truncated or not "
                "a safetensors file"
            )
        if n > _MAX_HEADER:
            raise self._error(f"header length {n} exceeds the {_MAX_HEADER}-byte limit")
        return n

    def _parse(self, header: bytes, data_start: int) -> None:
        try:
            doc = json.loads(header.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise self._error(f"header is not valid UTF-8 JSON ({e})") from None
        except RecursionError:
            raise self._error("header is JSON nested too deeply") from None
        if not isinstance(doc, dict):
            raise self._error("header is not a JSON object")
        meta = doc.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise self._error("__metadata__ is not a JSON object")
        self.metadata = meta
        data_size = self.file_size - data_start
        self.tensors = {}
        for name, entry in doc.items():
            if not isinstance(entry, dict):
                raise self._error(f"entry for tensor {shown(name)} is not an object")
            dtype, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
            if not isinstance(dtype, str) or dtype not in _DTYPE_SIZES:
                raise self._error(f"tensor {shown(name)} has unknown dtype {shown(dtype)}")
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
            ):
                raise self._error(f"tensor {shown(name)} has an invalid shape {shown(shape)}")
            if (
                not isinstance(offs, list)
                or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
                or not 0 <= offs[0] <= offs[1]
            ):
                raise self._error(f"tensor {shown(name)} has invalid data_offsets {shown(offs)}")
            n_el = 1
            for d in shape:
                n_el *= d
            nbytes = n_el * _DTYPE_SIZES[dtype]
            if offs[1] - offs[0] != nbytes:
                raise self._error(
                    f"tensor {shown(name)} ({dtype}, shape {shown(shape)}) needs {nbytes} bytes but its "
                    f"data_offsets {shown(offs)} span {offs[1] - offs[0]}"
                )
            if offs[1] > data_size:
                raise self._error(
                    f"tensor {shown(name)} data (bytes {offs[0]}..{offs[1]} of the data section) extends "
                    f"past the end of the file ({data_size} data bytes): truncated"
                )
            self.tensors[name] = SafeTensorInfo(name, dtype, tuple(shape), data_start + offs[0], nbytes)
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in self.tensors.values() if t.nbytes)
        for (_s0, e0, n0), (s1, _e1, n1) in itertools.pairwise(spans):
            if s1 < e0:
                raise self._error(f"tensors {shown(n0)} and {shown(n1)} overlap")

    def raw(self, name: str) -> bytes:
        """The tensor's stored bytes (little-endian, row-major)."""
        t = self.tensors.get(name)
        if t is None:
            raise InvalidArgumentError(f"safetensors file {self.path_or_name} has no tensor {shown(name)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise UnsupportedModelError(
                f"safetensors file {self.path_or_name}: tensor {shown(name)} has dtype {t.dtype}; "
                f"supported: {', '.join(SUPPORTED_DTYPES)}"
            )
        if self._mem is not None:
            return bytes(self._mem[t.offset : t.offset + t.nbytes])
        try:
            with open(self._path, "rb") as fh:
                fh.seek(t.offset)
                data = fh.read(t.nbytes)
        except OSError as e:
            raise self._error(f"read failed: {e}") from e
        if len(data) != t.nbytes:
            raise self._error(f"truncated: tensor {shown(name)} wanted {t.nbytes} bytes, got {len(data)}")
        return data


def open_safetensors_folder(folder: str | os.PathLike) -> dict[str, tuple[SafetensorsFile, SafeTensorInfo]]:
    """All tensors of a checkpoint folder: name -> (file, info).

    Uses `model.safetensors.index.json` when present (every tensor it lists must be in the shard
    it names), else `model.safetensors`, else every `*.safetensors` file in the folder.
    """
    folder = os.fspath(folder)
    index_path = os.path.join(folder, "model.safetensors.index.json")
    out: dict[str, tuple[SafetensorsFile, SafeTensorInfo]] = {}
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as f:
                index: Any = json.load(f)
        except (OSError, ValueError, RecursionError) as e:
            raise ModelFileError(f"cannot read {index_path}: {type(e).__name__}: {e}") from None
        wmap = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise ModelFileError(f"{index_path}: missing or malformed 'weight_map'")
        files: dict[str, SafetensorsFile] = {}
        for shard in sorted(set(wmap.values())):
            p = os.path.join(folder, shard)
            if os.path.dirname(os.path.normpath(shard)) or not os.path.isfile(p):
                raise ModelFileError(f"{index_path} names shard {shown(shard)}, which is not a file in {folder}")
            files[shard] = SafetensorsFile(p)
        for name, shard in wmap.items():
            sf = files[shard]
            if name not in sf.tensors:
                raise ModelFileError(f"{index_path} puts tensor {shown(name)} in {shard}, which does not hold it")
            out[name] = (sf, sf.tensors[name])
        return out
    single = os.path.join(folder, "model.safetensors")
    paths = (
        [single]
        if os.path.isfile(single)
        else sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors"))
    )
    if not paths:
        raise ModelFileError(f"{folder}: no model.safetensors, model.safetensors.index.json or *.safetensors")
    for p in paths:
        sf = SafetensorsFile(p)
        for name, info in sf.tensors.items():
            if name in out:
                raise ModelFileError(f"tensor {shown(name)} is in both {out[name][0].path_or_name} and {p}")
            out[name] = (sf, info)
    return out
