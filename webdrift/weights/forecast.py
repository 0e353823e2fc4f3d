"""DS2D forecast embeddings: the file format (read in plain Python, written by the trainer).

A forecast file is a safetensors file (webdrift/weights/safetensors.py) holding one tensor:

    "forecast"   F32 (or F16 / BF16), shape (m, hidden_size): m learned input vectors f_1 .. f_m

and these `__metadata__` strings:

    format        "webdrift.forecast"
    version       "1"
    branching     the draft tree's width per depth, e.g. "3,2" (m integers, each 1 .. MAX_BRANCH;
                  their product tree has at most MAX_NODES nodes with its root)
    hidden_size, vocab_size, n_layers, architecture   the base model's, checked on load
    model         (optional) what the vectors were trained on: a name, for messages

Meaning (runtime/speculative.py ForecastDrafter): after a token x_t at position t, the vectors
f_1 .. f_m are fed as the inputs (what the embedding lookup would write, after any embedding
scale) of positions t+1 .. t+m; row f_i sees x_0 .. x_t and f_1 .. f_i, and its logits forecast
the token at position t+1+i (the model's own logits at x_t give position t+1). The top
branching[i-1] tokens of f_i's logits are the draft tree's depth-i children of every node at
depth i-1, under the model's next token (the tree's root).

Must not: import numpy or wgpu.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from array import array
from dataclasses import dataclass

from ..errors import InvalidArgumentError, ModelFileError, WebdriftError, shown
from .lora import _floats
from .safetensors import SafetensorsFile

FORMAT = "webdrift.forecast"
VERSION = "1"
MAX_FORECAST = 4       # forecast vectors per file (the tree's depth)
MAX_BRANCH = 4         # children per node at one depth (the verifier's top-k per logits span)
MAX_NODES = 32         # draft tree nodes with the root: with a chain of m forecast rows under
                       # each, (1 + m) * nodes rows fit one verification pass (MAX_TREE = 64 ...)
_CHECKED = ("hidden_size", "vocab_size", "n_layers", "architecture")


@dataclass
class ForecastFile:
    vectors: array                 # m * hidden_size f32, row-major
    branching: tuple[int, ...]     # len m
    meta: dict[str, str]
    name: str

    @property
    def m(self) -> int:
        return len(self.branching)

    @property
    def hidden_size(self) -> int:
        return len(self.vectors) // self.m

    def check(self, cfg) -> None:
        """InvalidArgumentError unless the file was made for a model shaped like `cfg`."""
        want = model_meta(cfg)
        bad = [f"{k} {shown(self.meta.get(k))} (the model's: {want[k]})" for k in _CHECKED
               if self.meta.get(k) != want[k]]
        if bad:
            what = f" (trained on {shown(self.meta['model'])})" if self.meta.get("model") else ""
            raise InvalidArgumentError(f"forecast file {shown(self.name)}{what} is for another model: "
                                       + "; ".join(bad))


def model_meta(cfg) -> dict[str, str]:
    """The metadata a forecast file records about its base model (checked on load)."""
    return {"hidden_size": str(cfg.dim), "vocab_size": str(cfg.vocab_size), "n_layers": str(cfg.n_layers),
            "architecture": str(cfg.arch)}


def tree_nodes(branching) -> int:
    """Nodes of the full draft tree of `branching`, its root included."""
    n, width = 1, 1
    for b in branching:
        width *= b
        n += width
    return n


def parse_branching(text, where: str) -> tuple[int, ...]:
    """"3,2" (or a sequence of ints) -> (3, 2), checked against the limits."""
    try:
        items = [int(s) for s in text.split(",")] if isinstance(text, str) else [int(b) for b in text]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{where}: branching {shown(text)} is not a comma-separated list of "
                                   f"integers") from None
    if not 1 <= len(items) <= MAX_FORECAST or not all(1 <= b <= MAX_BRANCH for b in items):
        raise InvalidArgumentError(f"{where}: branching {shown(text)} needs 1 .. {MAX_FORECAST} widths, each "
                                   f"1 .. {MAX_BRANCH}")
    if tree_nodes(items) > MAX_NODES:
        raise InvalidArgumentError(f"{where}: branching {shown(text)} makes a tree of {tree_nodes(items)} nodes; "
                                   f"at most {MAX_NODES} fit a verification pass")
    return tuple(items)


def read_forecast(source, name: str | None = None) -> ForecastFile:
    """A forecast file from a path or its bytes; ModelFileError for a malformed one."""
    label = name or (os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<forecast bytes>")
    if isinstance(source, (str, os.PathLike)) and not os.path.isfile(source):
        raise InvalidArgumentError(f"forecast file {shown(label)}: no such file")
    try:
        st = SafetensorsFile(source, label)
        meta = st.metadata
        if meta.get("format") != FORMAT:
            raise ModelFileError(f"forecast file {shown(label)}: not a webdrift forecast file (metadata format "
                                 f"{shown(meta.get('format'))}, expected {FORMAT!r})")
        if meta.get("version") != VERSION:
            raise ModelFileError(f"forecast file {shown(label)}: version {shown(meta.get('version'))} is not "
                                 f"supported (this webdrift reads version {VERSION})")
        info = st.tensors.get("forecast")
        if info is None or len(info.shape) != 2:
            raise ModelFileError(f"forecast file {shown(label)}: needs one 2-D tensor 'forecast' (m, hidden_size)")
        try:
            branching = parse_branching(meta.get("branching", ""), f"forecast file {shown(label)}")
        except InvalidArgumentError as e:
            raise ModelFileError(str(e)) from None
        m, dim = info.shape
        if m != len(branching) or str(dim) != meta.get("hidden_size"):
            raise ModelFileError(f"forecast file {shown(label)}: tensor 'forecast' has shape {list(info.shape)}, "
                                 f"but the metadata say {len(branching)} vectors (branching) of hidden size "
                                 f"{shown(meta.get('hidden_size'))}")
        vec = _floats(st.raw("forecast"), info.dtype, m * dim, f"{label}: forecast")
    except WebdriftError:
        raise
    except (ValueError, struct.error, OverflowError, MemoryError, OSError) as e:
        raise ModelFileError(f"forecast file {shown(label)}: cannot be read ({shown(str(e))})") from e
    if not all(math.isfinite(v) for v in vec):
        raise ModelFileError(f"forecast file {shown(label)}: the vectors hold NaN or infinite values")
    return ForecastFile(vec, branching, dict(meta), label)


def write_forecast(path, vectors, branching, cfg_meta: dict[str, str], model: str = "") -> None:
    """Write a forecast file: vectors = m * hidden_size floats (row-major), cfg_meta =
    model_meta(cfg) of the base model (or the same keys from another description of it)."""
    branching = parse_branching(branching, "write_forecast")
    vec = array("f", vectors)
    m = len(branching)
    dim = int(cfg_meta["hidden_size"])
    if len(vec) != m * dim:
        raise InvalidArgumentError(f"write_forecast: {len(vec)} values, expected {m} x {dim}")
    meta = {"format": FORMAT, "version": VERSION, "branching": ",".join(map(str, branching)),
            **{k: str(cfg_meta[k]) for k in _CHECKED}}
    if model:
        meta["model"] = model
    header = {"forecast": {"dtype": "F32", "shape": [m, dim], "data_offsets": [0, 4 * len(vec)]},
              "__metadata__": meta}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    if sys.byteorder != "little":
        vec.byteswap()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw + vec.tobytes())
