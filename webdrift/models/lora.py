"""The LoRA pool: resident adapters as GPU buffers that the programs' LoRA slots read.

Built once per engine when LoRA is enabled (EngineOptions.enable_lora, or adapters given at
load); the decode, prefill and score programs are built with a shrink op and a LoRA epilogue on
each of the four GEMVs of a layer (forward.py), bound to these buffers. Per layer and GEMV group:

    group   targets        A pool la (P, NSEG, I)          B pool lb (P, cols)
    qkv     q | k | v      (P, 3, dim)                     (P, q_dim + 2 kv_dim)  wqkv's row order
    o       o              (P, 1, q_dim)                   (P, dim)
    gateup  gate | up      (P, 2, dim)                     (P, 2 ffn_dim)         gate's, then up's
    down    down           (P, 1, ffn_dim)                 (P, dim)

P is the pool's capacity in rank rows (`pool_rank`); an adapter of rank r holds rows [off, off + r)
of every A and B (a target it lacks, or of a smaller rank, is zeros). A and B are f16, two halves
per u32; B is stored transposed (rank rows of outputs) with the target's scale folded in, and
its q / k rows in the base model's RoPE order. The control buffer `ctl` (u32) holds the adapter
table, MAX_ENTRIES entries of (offset, rank, f32 bits of the request's lora_scale, 0), then the
per-row entry index (one row = one token of the step; >= MAX_ENTRIES: none). A single request
uses entry 0 for every row (the index is written once, zeros), so switching adapters or scales
writes 16 bytes and rebuilds nothing; streams with one adapter each give each row its own
entry (assign_rows). Adding an adapter writes its rows into the pool; removing one frees its rows.
Must not: import numpy or wgpu; decide how ops run (forward.py does).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import InvalidArgumentError, shown
from ..gpu.base import STORAGE, Buffer
from ..kernels.lora import MAX_ENTRIES
from ..weights.lora import LoraAdapter


@dataclass(frozen=True)
class LoraGroup:
    """The LoRA targets one GEMV serves: its input width and each target's output width."""
    name: str
    targets: tuple[str, ...]
    n_in: int
    outs: tuple[int, ...]

    @property
    def nseg(self) -> int:
        return len(self.targets)

    @property
    def cols(self) -> int:
        return sum(self.outs)

    @property
    def splits(self) -> tuple[int, ...]:
        """First output of each segment after the first, for q|k|v (gate|up: separate weights)."""
        if self.name != "qkv":
            return ()
        return (self.outs[0], self.outs[0] + self.outs[1])


def lora_groups(cfg) -> dict[str, LoraGroup]:
    return {"qkv": LoraGroup("qkv", ("q", "k", "v"), cfg.dim, (cfg.q_dim, cfg.kv_dim, cfg.kv_dim)),
            "o": LoraGroup("o", ("o",), cfg.q_dim, (cfg.dim,)),
            "gateup": LoraGroup("gateup", ("gate", "up"), cfg.dim, (cfg.ffn_dim, cfg.ffn_dim)),
            "down": LoraGroup("down", ("down",), cfg.ffn_dim, (cfg.dim,))}


def _rope_rows(n_heads: int, head_dim: int, to_interleaved: bool) -> list[int]:
    """Row order mapping between HF's rotate-half rows and llama.cpp's interleaved pairs (its
    GGUF export's permute): new row h*hd + 2i + b <- old row h*hd + b*hd/2 + i (to_interleaved),
    or the inverse."""
    half = head_dim // 2
    perm = [0] * (n_heads * head_dim)
    for h in range(n_heads):
        for i in range(half):
            for b in range(2):
                inter, rot = h * head_dim + 2 * i + b, h * head_dim + b * half + i
                if to_interleaved:
                    perm[inter] = rot
                else:
                    perm[rot] = inter
    return perm


def _f16(values, where: str) -> bytes:
    try:
        return struct.pack(f"<{len(values)}e", *values)
    except OverflowError:
        raise InvalidArgumentError(f"{where}: a value exceeds the f16 range (65504) the GPU pool stores") from None


class LoraPool:
    """GPU buffers of the resident adapters (see the module docstring); `entry0` is what the
    programs apply to every row now."""

    def __init__(self, dev, cfg, max_rank: int, pool_rank: int, rows_cap: int, fused_shrink: bool = False):
        """fused_shrink: programs of one token row over the int8 chain take their shrinks in the
        producers' epilogues (models/forward.py, EngineOptions.lora_fused_shrink)."""
        self.dev, self.cfg, self.max_rank, self.pool_rank = dev, cfg, max_rank, pool_rank
        self.fused_shrink = fused_shrink
        self.groups = lora_groups(cfg)
        for g in self.groups.values():
            if g.n_in % 4 or g.cols % 2:
                raise InvalidArgumentError(f"LoRA needs the {g.name} projection's input width a multiple of 4 "
                                           f"({g.n_in}) and an even output width ({g.cols})")
        # la[layer][group]: (P, nseg, n_in) f16; lb[layer][group]: (P, cols) f16
        self.la: list[dict[str, Buffer]] = []
        self.lb: list[dict[str, Buffer]] = []
        for i in range(cfg.n_layers):
            self.la.append({n: dev.create_buffer(max(16, 2 * pool_rank * g.nseg * g.n_in), STORAGE, f"L{i}.lora_a.{n}")
                            for n, g in self.groups.items()})
            self.lb.append({n: dev.create_buffer(max(16, 2 * pool_rank * g.cols), STORAGE, f"L{i}.lora_b.{n}")
                            for n, g in self.groups.items()})
        # ctl: (MAX_ENTRIES, 4) u32 table, then (rows_cap) u32 entry index; zeros: entry 0, rank 0
        self.ctl = dev.create_buffer(4 * (4 * MAX_ENTRIES + rows_cap), STORAGE, "lora_ctl")
        self.resident: dict[str, tuple[int, int]] = {}    # name -> (offset, rank) in rank rows
        self._entry0 = (0, 0, 0.0)

    @property
    def nbytes(self) -> int:
        return sum(b.size for d in self.la + self.lb for b in d.values()) + self.ctl.size

    # -- residency ---------------------------------------------------------------------------
    def _place(self, rank: int, name: str) -> int:
        """First offset of `rank` free rows (first fit)."""
        taken = sorted(self.resident.values())
        off = 0
        for o, r in taken:
            if off + rank <= o:
                return off
            off = max(off, o + r)
        if off + rank > self.pool_rank:
            used = sum(r for _, r in taken)
            raise InvalidArgumentError(
                f"LoRA adapter {shown(name)} (rank {rank}) does not fit: the pool holds {self.pool_rank} rank rows, "
                f"{used} in use by {sorted(self.resident)}; remove_lora one, or load with a larger lora_pool_rank")
        return off

    def add(self, name: str, ad: LoraAdapter) -> None:
        rank = ad.rank
        off = self._place(rank, name)
        cfg = self.cfg
        permute = ad.rows_permuted != (cfg.rope_style != "half")
        perms = {"q": _rope_rows(cfg.n_heads, cfg.head_dim, not ad.rows_permuted),
                 "k": _rope_rows(cfg.n_kv_heads, cfg.head_dim, not ad.rows_permuted)} if permute else {}
        for layer in range(cfg.n_layers):
            for gname, g in self.groups.items():
                a_rows, b_rows = [], []
                for j in range(rank):
                    b_row = []
                    for tgt, n_out in zip(g.targets, g.outs):
                        t = ad.targets.get((layer, tgt))
                        if t is None or j >= t.rank:
                            a_rows.append([0.0] * g.n_in)
                            b_row.extend([0.0] * n_out)
                            continue
                        a_rows.append(t.a[j * t.n_in:(j + 1) * t.n_in])
                        col = t.b[j::t.rank]                   # B[:, j], (n_out)
                        if tgt in perms:
                            col = [col[p] for p in perms[tgt]]
                        b_row.extend(v * t.scale for v in col)
                    b_rows.append(b_row)
                where = f"LoRA adapter {shown(name)} layer {layer} {gname}"
                if rank:
                    self.dev.write_buffer(self.la[layer][gname], _f16([v for r in a_rows for v in r], where),
                                          2 * off * g.nseg * g.n_in)
                    self.dev.write_buffer(self.lb[layer][gname], _f16([v for r in b_rows for v in r], where),
                                          2 * off * g.cols)
        self.resident[name] = (off, rank)

    def remove(self, name: str) -> None:
        off_rank = self.resident.pop(name)
        if self._entry0 is None or self._entry0[:2] == off_rank:
            self.activate(None, 0.0)

    # -- the adapter applied now ----------------------------------------------------------------
    def assign_rows(self, names: list, scale: float) -> None:
        """Row t of the next steps applies adapter names[t] (None: none) at `scale`: the distinct
        adapters take table entries 0, 1, ..., the rows their index (the streams' per-stream
        adapters). clear_rows undoes it."""
        entries = [a for a in dict.fromkeys(names) if a is not None]
        table = b"".join(struct.pack("<IIfI", *self.resident[a], float(scale), 0) for a in entries)
        if table:
            self.dev.write_buffer(self.ctl, table, 0)
        self._entry0 = None      # entry 0 is rewritten by the next activate
        index = [entries.index(a) if a is not None else MAX_ENTRIES for a in names]
        self.dev.write_buffer(self.ctl, struct.pack(f"<{len(index)}I", *index), 16 * MAX_ENTRIES)

    def clear_rows(self, n: int) -> None:
        """Rows 0 .. n - 1 back to entry 0 (a single request's adapter)."""
        self.dev.write_buffer(self.ctl, bytes(4 * n), 16 * MAX_ENTRIES)

    def activate(self, name: str | None, scale: float) -> None:
        """Entry 0 (every row of a single request) = adapter `name` at lora_scale `scale` (None: no
        adapter). Writes 16 bytes, and only when it changes."""
        off, rank = self.resident[name] if name is not None else (0, 0)
        entry = (off, rank, float(scale) if name is not None else 0.0)
        if entry != self._entry0:
            self.dev.write_buffer(self.ctl, struct.pack("<IIfI", off, rank, entry[2], 0), 0)
            self._entry0 = entry
