"""Causal attention over the KV cache, split over the cache length (flash-decoding):
AttentionKernel (phase 1: wgsl/attention.wgsl per query head, wgsl/attention_gqa.wgsl per KV
head serving its query heads, or wgsl/attention_split.wgsl, the same with short chunks and
subgroup shuffles for decode, or wgsl/attention_tiled.wgsl, a few partials a row, each a
software-pipelined run of 64-key tiles; all include attention_common.wgsl) writes per-chunk partial
results, AttentionCombineKernel (wgsl/attention_combine.wgsl) merges them and writes the heads
back in token order (or as int8 rows for the O projection's integer-dot GEMV).
Must not: import numpy or wgpu.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import UnsupportedModelError
from ..gpu.base import Device
from ..tensor import TensorDesc
from .base import Kernel, ceil_div, wgsl_float
from .bindings import Bindings
from .lora import LoraPartials
from .quantize import block_defines, declare_rows, row_words
from .rope import kv_type
from .tree import declare_tree


def _attention_defines(b: Bindings, dev: Device, q_rel: TensorDesc, n_kv: int, group: int, head_dim: int, cap: int,
                       scale: float, window: int, softcap: float | None, kv_f16: bool) -> dict:
    """What every attention kernel starts with: its first bindings (the step uniform, the queries,
    the K and V caches, wgsl/attention_inputs.wgsl; f32 or, kv_f16, f16 values read as f32) and
    the shapes, score scale, window and soft-cap (attention_score.wgsl)."""
    t = kv_type(dev, kv_f16)
    return {"STEP_DECL": b.step(), "Q_DECL": b.tensor("q", q_rel),
            "KC_DECL": b.array("kc", f"array<vec4<{t}>>", f"({n_kv}, {cap}, {head_dim // 4}) = (KVH, CAP, DH / 4)",
                               writable=True),
            "VC_DECL": b.array("vc", f"array<vec4<{t}>>", f"({n_kv}, {head_dim}, {cap // 4}) = (KVH, DH, CAP / 4)",
                               writable=True),
            "DH": head_dim, "DH4": head_dim // 4, "GROUP": group, "CAP": cap, "SCALE": wgsl_float(scale),
            "WINDOW": window or 0, "SOFTCAP": softcap is not None, "CAP_ATTN": wgsl_float(softcap or 1.0)}


def _combine_outputs(b: Bindings, out: TensorDesc, n_heads: int, head_dim: int, wg: int, quant: str | None,
                     out_f: TensorDesc | None) -> dict:
    """The merged heads' bindings and defines (attention_combine.wgsl, attention_merge.wgsl): `out`
    f32 rows, or with quant ("q8" / "q4") QuantizeKernel int8 rows for that weight format
    (quantize_block.wgsl, workgroups of wg) and, with out_f, the f32 rows as well."""
    if out_f is not None and quant is None:
        raise ValueError("the combine's second, f32 output comes with its int8 rows (quant)")
    d = {"QUANT": quant is not None, "QUANT_F": out_f is not None, "OUTF_DECL": ""}
    if quant is None:
        return d | {"OUT_DECL": b.tensor("out", out)}
    if not AttentionCombineKernel.quant_supported(head_dim) or out.c != row_words(n_heads * head_dim):
        raise ValueError(f"the combine writes int8 blocks for head_dim a multiple of 32 up to 256 into "
                         f"QuantizeKernel rows; got head_dim {head_dim}, {out.name} of {out.c} words")
    d.update(block_defines(quant, n_heads * head_dim, wg), OUT_DECL=declare_rows(b, "out", out))
    if out_f is not None:
        d["OUTF_DECL"] = b.tensor("outf", out_f)
    return d


class AttnChoice(NamedTuple):
    """An attention kernel (kernels/autotune.choose_attention's answer): AttentionKernel's
    variant, the split variant's chunk (keys per workgroup; 0: the variant's own; tiled: TILE),
    whether it loads V before the scores, `adapt` (0: one chunk per workgroup; n: each
    workgroup takes enough consecutive chunks that a row has at most n partials; tiled: exactly
    n partials a row) and `fused` (tiled: the last workgroup of a row's partials merges them, no
    combine dispatch)."""
    variant: str = "head"
    chunk: int = 0
    prefetch_v: bool = False
    adapt: int = 0
    fused: bool = False

    @property
    def name(self) -> str:
        return (self.variant + (f"{self.chunk}" if self.chunk else "") + ("pf" if self.prefetch_v else "")
                + (f"a{self.adapt}" if self.adapt else "") + ("c" if self.fused else ""))


class AttentionKernel(Kernel):
    """Phase 1: per (chunk of CHUNK keys, query row, KV head) the unnormalised partial result
    (sum_k e_k V[:, k], m = max score, l = sum e_k). Bindings:
      step  the Step uniform (queries at positions pos0 .. pos0 + T - 1)
      q     (B = KVH, W = rows_cap, C = DH) activation: RopeQKVKernel's relayout
      kc    (KVH, cap, DH / 4) vec4<f32> K cache (vec4<f16> with kv_f16: read as f32)
      vc    (KVH, DH, cap / 4) vec4<f32> V cache (the same)
      part  (KVH, rows_cap, nsplit, DH + 2) f32 partials
      tree  (rows_cap / GROUP, ROW_WORDS) u32 per query row, only with tree (kernels/tree.py)
    Dispatch: per head (nsplit, T * GROUP, KVH); grouped and split (nsplit, T, KVH)."""
    template = "attention"
    MAX_CHUNK = 256

    @classmethod
    def chunk_for(cls, head_dim: int) -> int:
        """Keys per workgroup: the power of two >= head_dim, at least 64. Short chunks give decode
        many workgroups (the cache is split over them like flash-decoding; 256-key chunks left
        1B's decode attention at 34 us on an H100 with 64 workgroups)."""
        return min(cls.MAX_CHUNK, max(64, 1 << (head_dim - 1).bit_length()))

    MAX_GQA = 8   # query heads per KV head the grouped, split and tiled variants unroll
    VARIANTS = ("head", "grouped", "split", "tiled")
    TILE = 64     # the tiled variant's keys a tile (divides chunk_for: the streams' segment alignment)
    SPLIT_CHUNKS = (16, 32, 64)   # the split variant's chunk lengths (keys per workgroup)
    MAX_SPLITS = 1024         # the combine holds every chunk's (m, l) in workgroup memory

    @classmethod
    def split_chunk(cls, chunk: int, head_dim: int, cap: int) -> int:
        """The split variant's chunk: `chunk`, doubled until the cache has at most MAX_SPLITS
        chunks, at most chunk_for(head_dim) (so it divides the chunk the streams' segments are
        aligned to, runtime/streams.py)."""
        while ceil_div(cap, chunk) > cls.MAX_SPLITS and chunk < cls.chunk_for(head_dim):
            chunk *= 2
        return min(chunk, cls.chunk_for(head_dim))

    @classmethod
    def chunk_of(cls, variant: str, chunk: int, head_dim: int, cap: int) -> int:
        """Keys a chunk (a workgroup's, or a tile) of `variant`: split, `chunk` as split_chunk
        makes it; tiled, TILE; per head and grouped, chunk_for(head_dim)."""
        if variant == "split":
            return cls.split_chunk(chunk, head_dim, cap)
        return cls.TILE if variant == "tiled" else cls.chunk_for(head_dim)

    TILED_WG = 256

    @classmethod
    def tiled_lanes(cls, dev: Device) -> int:
        """The tiled variant's lanes a K row and a V channel run: 8, or 4 where the adapter may
        have subgroups of 4."""
        return 8 if dev.min_subgroup >= 8 else 4

    @classmethod
    def tiled_supported(cls, dev: Device, head_dim: int, cap: int) -> bool:
        """The tiled variant: subgroups, head_dim a power of two from 32 to 256 with at least a
        channel for each lane group of a V round, a cache of at least a tile."""
        return (dev.has_subgroups and 32 <= head_dim <= 256 and not head_dim & (head_dim - 1) and cap >= cls.TILE
                and head_dim >= cls.TILED_WG // cls.tiled_lanes(dev))

    @classmethod
    def splits(cls, choice: AttnChoice, head_dim: int, cap: int) -> int:
        """The partials a query row has with `choice` (its chunk filled in): tiled, its `adapt`;
        else one per chunk of the cache."""
        return choice.adapt if choice.variant == "tiled" else ceil_div(cap, choice.chunk or cls.chunk_for(head_dim))

    def __init__(self, dev: Device, q_rel: TensorDesc, n_heads: int, n_kv: int, head_dim: int, cap: int,
                 rows_cap: int, scale: float, window: int = 0, softcap: float | None = None,
                 variant: str = "head", chunk: int = 32, prefetch_v: bool = False, tree: bool = False,
                 lanes: int | None = None, adapt: int = 0, kv_f16: bool = False, fused: bool = False,
                 out: TensorDesc | None = None, quant: str | None = None, out_f: TensorDesc | None = None):
        """cap: cache rows per KV head (a multiple of 4); rows_cap: q_rel's rows; window: sliding
        window (0: none); softcap: scores soft-capped at it. variant: "head" (attention.wgsl, one
        workgroup per query head and chunk of chunk_for(head_dim) keys), "grouped"
        (attention_gqa.wgsl: one per KV head and chunk, serving its query heads: K and V read once
        for them) or "split" (attention_split.wgsl: grouped, with `chunk` keys per workgroup
        (split_chunk) and subgroup shuffles; needs subgroups; prefetch_v: its V loads issued with
        the K loads, before the scores; adapt > 0: a workgroup takes ceil(chunks up to the row's
        last key / adapt) consecutive chunks, merged by an online softmax, so a row has at most
        `adapt` partials whatever the depth). tree: each query row sees only what its record in
        the "tree" binding allows (kernels/tree.py: tree verification).
        lanes: the split variant's lanes per key row (default: head_dim / 4 up to 32, a power of
        two); subgroups narrower than that score keys in a loop instead (tests set it to reach the
        unrolled path on narrow software subgroups).
        fused (tiled): the last workgroup of a row's partials to finish merges them
        (attention_merge.wgsl) into `out` as AttentionCombineKernel would (quant, out_f: its int8
        rows and f32 rows); binds `cnt` too, (rows_cap / GROUP, KVH) u32 counters, zero before the
        first dispatch (each dispatch leaves them so)."""
        if head_dim % 4 or head_dim > self.MAX_CHUNK:
            raise UnsupportedModelError(f"attention needs head_dim to be a multiple of 4 and <= {self.MAX_CHUNK}, "
                                        f"got {head_dim}")
        if variant not in self.VARIANTS:
            raise ValueError(f"attention variant {variant!r}: expected one of {self.VARIANTS}")
        self.variant, self.fused = variant, fused
        self.group, self.n_kv = n_heads // n_kv, n_kv
        if variant != "head" and self.group > self.MAX_GQA:
            raise UnsupportedModelError(f"{variant} attention unrolls at most {self.MAX_GQA} query heads per KV "
                                        f"head, got {self.group}")
        if variant == "split" and not dev.has_subgroups:
            raise UnsupportedModelError("split attention needs subgroups, which this adapter lacks")
        if adapt and (variant not in ("split", "tiled") or adapt < 1):
            raise ValueError(f"adapt (several chunks a workgroup) is a split- or tiled-attention option >= 1; got "
                             f"{variant} with adapt {adapt}")
        if variant == "tiled":
            if not self.tiled_supported(dev, head_dim, cap) or adapt < 1:
                raise UnsupportedModelError(f"tiled attention needs subgroups, head_dim a power of two from 32 (64 where "
                                            f"subgroups may be 4 lanes) to 256, "
                                            f"at least {self.TILE} cache rows and adapt >= 1 (its partials a row); got "
                                            f"head_dim {head_dim}, {cap} rows, adapt {adapt}")
            self._init_tiled(dev, q_rel, n_heads, n_kv, head_dim, cap, rows_cap, scale, window, softcap, tree,
                             lanes, adapt, kv_f16, (out, quant, out_f) if fused else None)
            return
        if fused:
            raise ValueError(f"the merge in the attention kernel (fused) is a tiled-attention option; got {variant}")
        self.CHUNK = self.chunk_of(variant, chunk, head_dim, cap)
        self.nsplit = ceil_div(cap, self.CHUNK)
        wg = self.CHUNK if variant != "split" else 128 if head_dim <= 128 else 256
        nj = max(1, wg // head_dim)
        jl = -(-ceil_div(self.CHUNK, nj) // 4) * 4   # keys per V group: a multiple of 4
        nj = ceil_div(self.CHUNK, jl)
        if cap % 4:
            raise ValueError(f"attention reads V four keys at a time: cache rows {cap} must be a multiple of 4")
        b = Bindings()
        d = _attention_defines(b, dev, q_rel, n_kv, self.group, head_dim, cap, scale, window, softcap, kv_f16)
        d.update({"PART_DECL": b.array("part", "array<f32>", f"({n_kv}, {rows_cap}, {self.nsplit}, {head_dim + 2}) = "
                                       "(KVH, ROWS_CAP, NSPLIT, DH + 2)", writable=True),
                  "CHUNK4": self.CHUNK // 4, "NJ": nj, "JL": jl, "CHUNK": self.CHUNK, "NSPLIT": self.nsplit,
                  "ROWS_CAP": rows_cap, "TREE": tree, "ADAPT": adapt,
                  "TREE_DECL": declare_tree(b, rows_cap // self.group) if tree else ""})
        self.template = {"head": "attention", "grouped": "attention_gqa", "split": "attention_split"}[variant]
        if variant == "grouped":
            d.update(self._gqa_code(self.group, head_dim))
        elif variant == "split":
            d.update(self._split_code(self.group, head_dim, wg, nj, jl, lanes, prefetch_v))
        super().__init__(dev, d, b, self.template)

    def _init_tiled(self, dev, q_rel, n_heads, n_kv, head_dim, cap, rows_cap, scale, window, softcap, tree, lanes,
                    adapt, kv_f16, merge):
        """wgsl/attention_tiled.wgsl: `adapt` partials a row, TILE keys a tile, its statements
        unrolled over the group's heads, the key rows a lane group scores and the V keys an
        invocation sums; merge: (out, quant, out_f) of the fused merge, or None."""
        self.CHUNK, self.nsplit, group = self.TILE, adapt, self.group
        wg, dh4 = self.TILED_WG, head_dim // 4
        lk = lanes or min(dh4, self.tiled_lanes(dev))    # lanes per key row
        vl = min(self.tiled_lanes(dev), self.TILE // 4)   # lanes per V channel run
        kpr, cg = wg // lk, wg // vl
        nr, rv = ceil_div(self.TILE, kpr), dh4 // lk      # key rows a lane group, vec4s of a row a lane
        cpl, nvl = head_dim // cg, self.TILE // vl // 4   # channels a lane, vec4s of a run a lane
        if lk & (lk - 1) or dh4 % lk or lk > dev.min_subgroup:
            raise ValueError(f"tiled attention: {lk} lanes a key row must be a power of two dividing {dh4} and at "
                             f"most the adapter's smallest subgroup ({dev.min_subgroup})")
        hs, j = range(group), "\n".join
        b = Bindings()
        d = _attention_defines(b, dev, q_rel, n_kv, group, head_dim, cap, scale, window, softcap, kv_f16)
        d.update({"PART_DECL": b.array("part", "array<atomic<u32>>" if merge else "array<f32>",
                                       f"({n_kv}, {rows_cap}, {adapt}, {head_dim + 2}) = (KVH, ROWS_CAP, NSPLIT, DH + 2)"
                                       + (", f32 bits" if merge else ""), writable=True),
                  "FUSED": merge is not None, "PART_ATOMIC": merge is not None,
                  "CHUNK": self.TILE, "CHUNK4": self.TILE // 4, "NSPLIT": adapt, "NJ": 1, "JL": self.TILE,
                  "ROWS_CAP": rows_cap, "TREE": tree, "TREE_DECL": declare_tree(b, rows_cap // group) if tree else "",
                  "KT": kv_type(dev, kv_f16), "WG": wg, "LK": lk, "VL": vl, "NW": wg // 4, "QS": group * dh4,
                  "SC": group * self.TILE // 4, "SS": group * self.TILE, "WM": group * (wg // 4)})
        keys = [(i, f"kg + {i * kpr}u") for i in range(nr)]
        outs = [(h, i) for h in hs for i in range(cpl)]
        load = [f"      nk{i}_{r} = k_at(kvh, t, k0, {kk}, sub + {r * lk}u);" for i, kk in keys for r in range(rv)]
        load += [f"      nv{i}_{u} = v_raw(kvh, cgi + {i * cg}u, t, k0 + vsub * KPL + {4 * u}u);"
                 for i in range(cpl) for u in range(nvl)]
        km = [f"    let kk{i} = {kk};\n    let vis{i} = kp0 != NO_KEY && k0 + kk{i} < CAP && visible(p, lo, kp0 + kk{i});"
              for i, kk in keys]
        km += [f"    var a{i}_{h} = 0.0;" for i, _ in keys for h in hs]
        for h in hs:      # one query vec4 held at a time: registers for more workgroups an SM
            for r in range(rv):
                km.append(f"    {{ let q = qs[{h}u * DH4 + sub + {r * lk}u];"
                          + "".join(f" a{i}_{h} += dot(q, vec4<f32>(ck{i}_{r}));" for i, _ in keys) + " }")
        km += self._xor_sum([f"a{i}_{h}" for i, _ in keys for h in hs], lk, "    ")
        km += [f"    let s{i}_{h} = select(-3.0e38, score(a{i}_{h}), vis{i});" for i, _ in keys for h in hs]
        km.append("    if (sub == 0u) {")
        km += [f"      if (kk{i} < CHUNK) {{ ss[{h}u * CHUNK + kk{i}] = s{i}_{h}; }}"
               for i, _ in keys for h in hs]
        km.append("    }")
        km += [f"    let w{h} = subgroupMax(" + "max(" * (nr - 1) + "s0_" + str(h)
               + "".join(f", s{i}_{h})" for i in range(1, nr)) + ");" for h in hs]
        km.append("    if (lane == 0u) {")
        km += [f"      wm[{h}u * NW + wi] = w{h};" for h in hs]
        km.append("    }")
        mnew = [f"    let mo{h} = m{h};" for h in hs]
        mnew.append("    for (var w = 0u; w < WG / sg; w++) {")
        mnew += [f"      m{h} = max(m{h}, wm[{h}u * NW + w]);" for h in hs]
        mnew.append("    }")
        mnew += [f"    let al{h} = exp(mo{h} - m{h});" for h in hs]
        mnew += [f"    o{h}_{i} *= al{h};" for h, i in outs]
        decl = [f"  var m{h} = -3.0e38;" for h in hs] + [f"  var o{h}_{i} = 0.0;" for h, i in outs] + ["  var lsum = 0.0;"]
        decl += [f"  var nk{i}_{r}: vec4<KT>;" for i, _ in keys for r in range(rv)]
        decl += [f"  var nv{i}_{u}: vec4<KT>;" for i in range(cpl) for u in range(nvl)]
        vm = [f"    let e{h}_{u} = ex[{h}u * CHUNK4 + vsub * {nvl}u + {u}u];" for h in hs for u in range(nvl)]
        vm += [f"    o{h}_{i} += " + " + ".join(f"dot(e{h}_{u}, vec4<f32>(cv{i}_{u}))" for u in range(nvl)) + ";"
               for h, i in outs]
        wo = self._xor_sum([f"o{h}_{i}" for h, i in outs], vl, "  ")
        wo += ["  if (vsub == 0u) {"] + [f"    part_set(out0 + {h}u * PART_ROW + cgi + {i * cg}u, o{h}_{i});"
                                         for h, i in outs] + ["  }"]
        d.update({"DECL": j(decl).replace("KT", d["KT"]), "LOAD_NEXT": j(load), "K_MATH": j(km), "M_NEW": j(mnew),
                  "TAKE": j([f"    let ck{i}_{r} = nk{i}_{r};" for i, _ in keys for r in range(rv)]
                            + [f"    let cv{i}_{u} = nv{i}_{u};" for i in range(cpl) for u in range(nvl)]),
                  "M_PICK": "      var mh = m0;" + "".join(f" if (h == {h}u) {{ mh = m{h}; }}" for h in hs if h),
                  "V_MATH": j(vm), "W_O": j(wo),
                  "L_ALPHA": "      var alh = al0;" + "".join(f" if (lid == {h}u) {{ alh = al{h}; }}" for h in hs if h),
                  "W_M": j(f"  if (lid == {h}u) {{ part_set(out0 + {h}u * PART_ROW + DH, m{h}); }}" for h in hs)})
        if merge is not None:
            d.update(self._merge_code(b, n_heads, n_kv, head_dim, rows_cap, wg, adapt, dev.min_subgroup, *merge))
        self.template = "attention_tiled"
        Kernel.__init__(self, dev, d, b, self.template)

    # accumulator loads an invocation issues before the merge's first wait (registers)
    MERGE_AHEAD = 32

    def _merge_code(self, b: Bindings, n_heads: int, n_kv: int, head_dim: int, rows_cap: int, wg: int, nsplit: int,
                    min_subgroup: int, out: TensorDesc | None, quant: str | None, out_f: TensorDesc | None) -> dict:
        """attention_merge.wgsl's bindings and statements: invocation lid sums outputs lid, lid +
        wg, ... of the row's GROUP * DH; the first `ahead` splits' accumulator loads of each are
        issued before the (m, l) loads' barrier, the rest in rounds of that many after it."""
        if out is None:
            raise ValueError("the fused attention merge writes `out`")
        opt = ceil_div(self.group * head_dim, wg)
        ahead = max(1, min(nsplit, self.MERGE_AHEAD // opt))
        ks, j = range(opt), "\n".join
        load = [f"  let i{k} = lid + {k * wg}u;\n  let at{k} = r0 + min(i{k} / DH, GROUP - 1u) * PART_ROW + i{k} % DH;"
                for k in ks]
        load += [f"  let x{k}_{s} = part_get(at{k} + {s * (head_dim + 2)}u);" for s in range(ahead) for k in ks]
        add = [f"  let w{k} = min(i{k} / DH, GROUP - 1u) * NSPLIT;\n  var a{k} = 0.0;" for k in ks]
        for s0 in range(0, nsplit, ahead):
            ss = range(s0, min(nsplit, s0 + ahead))
            if s0:
                add.append("  {")
                add += [f"    let x{k}_{s - s0} = part_get(at{k} + {s * (head_dim + 2)}u);" for s in ss for k in ks]
            add += [f"  {'  ' if s0 else ''}a{k} += mw[w{k} + {s}u] * x{k}_{s - s0};" for s in ss for k in ks]
            if s0:
                add.append("  }")
        for k in ks:
            at = f"kvh * GROUP * DH + i{k}"
            if quant is None:
                add.append(f"  if (i{k} < GROUP * DH) {{ out_write1(0u, t, 0u, {at}, a{k}); }}")
                continue
            add.append(f"  quant_blocks(lid, a{k}, i{k} < GROUP * DH, t * QSTRIDE, ({at}) / 32u);")
            if out_f is not None:
                add.append(f"  if (i{k} < GROUP * DH) {{ outf_write1(0u, t, 0u, {at}, a{k}); }}")
        d = _combine_outputs(b, out, n_heads, head_dim, wg, quant, out_f)
        return d | {"CNT_DECL": b.array("cnt", "array<atomic<u32>>", f"({rows_cap // self.group}, {n_kv}) = (T, KVH) "
                                        "counters", writable=True),
                    "KVH": n_kv, "M_LOAD": j(load), "M_SUM": j(add),
                    # (head, partial) weights by butterflies over lanes where a subgroup holds whole heads
                    "SCAN_LANES": not nsplit & (nsplit - 1) and nsplit <= min_subgroup
                    and self.group * nsplit <= wg}

    @staticmethod
    def _xor_sum(names: list, lanes: int, indent: str) -> list:
        """Statements adding each variable over groups of `lanes` consecutive lanes (shuffles)."""
        out, m = [], lanes // 2
        while m:
            out += [f"{indent}{n} += subgroupShuffleXor({n}, {m}u);" for n in names]
            m //= 2
        return out

    @property
    def grouped(self) -> bool:
        """One workgroup serves all the query heads of a KV head (dispatch (nsplit, T, KVH))."""
        return self.variant != "head"

    def _gqa_code(self, group: int, head_dim: int) -> dict:
        """attention_gqa.wgsl's per-head statements, unrolled over the group's heads."""
        hs = range(group)
        j = "\n".join
        return {"QS": group * head_dim // 4, "SS": group * self.CHUNK,
                "RED": group * self.CHUNK, "ML": 2 * group,
                "S_DECL": j(f"  var s{h} = -3.0e38;" for h in hs),
                "A_DECL": j(f"    var a{h} = 0.0;" for h in hs),
                "A_ACC": j(f"      a{h} += dot(qs[{h}u * DH4 + d], kv);" for h in hs),
                "S_SET": j(f"    s{h} = score(a{h});" for h in hs),
                "RED_S": j(f"  red[{h}u * CHUNK + lid] = s{h};" for h in hs),
                "E_SET": j(f"  let e{h} = select(0.0, exp(s{h} - ml[{h}u]), vis);\n"
                           f"  ss[{h}u * CHUNK + lid] = e{h};\n"
                           f"  red[{h}u * CHUNK + lid] = e{h};" for h in hs),
                "O_DECL": j(f"  var o{h} = 0.0;" for h in hs),
                "O_ACC": j(f"      o{h} += dot(ss4({h}u * CHUNK4 + j), v);" for h in hs),
                "RED_O": "  workgroupBarrier();\n" + j(f"  red[{h}u * CHUNK + lid] = o{h};" for h in hs)}

    def _split_code(self, group: int, head_dim: int, wg: int, nj: int, jl: int, lanes: int | None,
                    prefetch_v: bool) -> dict:
        """attention_split.wgsl's statements, unrolled over the group's heads, the keys a lane
        group scores (K_DECL, K_LOAD, K_MATH) and the keys an invocation's V run covers (V_LOAD,
        V_MATH)."""
        hs, dh4 = range(group), head_dim // 4
        j = "\n".join
        lk = lanes or 1 << (min(dh4, 32).bit_length() - 1)          # lanes per key row
        kps = wg // lk                                               # keys in flight per workgroup
        kpl, r_n = ceil_div(self.CHUNK, kps), ceil_div(dh4, lk)     # keys per lane group, vec4s per lane
        kd, kl, km = [], [], [f"    let q{h}_{r} = qs[min({h}u * DH4 + sub + {r * lk}u, {group * dh4 - 1}u)];"
                              for h in hs for r in range(r_n)]
        for i in range(kpl):
            kd += [f"  let kk{i} = kg + {i * kps}u;",
                   f"  let vis{i} = kk{i} < CHUNK && visible(p, lo, kp0 + kk{i});"]
            kd += [f"  var x{i}_{r}: vec4<f32>;" for r in range(r_n)]
            kl.append(f"    let kb{i} = (kvh * CAP + key_slot(t, k0 + kk{i})) * DH4 + sub;")
            kl += [f"    x{i}_{r} = vec4<f32>(kc[kb{i} + {r * lk}u]);" if (r + 1) * lk <= dh4 else
                   f"    x{i}_{r} = select(vec4<f32>(0.0), vec4<f32>(kc[kb{i} + {r * lk}u]), sub + {r * lk}u < DH4);"
                   for r in range(r_n)]
        km += [f"    var a{i}_{h} = " + " + ".join(f"dot(q{h}_{r}, x{i}_{r})" for r in range(r_n)) + ";"
               for i in range(kpl) for h in hs]
        m = lk // 2
        while m:
            km += [f"    a{i}_{h} += subgroupShuffleXor(a{i}_{h}, {m}u);" for i in range(kpl) for h in hs]
            m //= 2
        km.append("    if (sub == 0u) {")
        km += [f"      if (kk{i} < CHUNK) {{ ss[{h}u * CHUNK + kk{i}] = select(-3.0e38, score(a{i}_{h}), vis{i}); }}"
               for i in range(kpl) for h in hs]
        km.append("    }")
        n4 = jl // 4
        vl = [f"  let v{i} = select(vec4<f32>(0.0), v_keys(kvh, d, t, k0 + 4u * (j0 + {i}u)), j0 + {i}u < j1);"
              for i in range(n4)]
        vm = [f"  o{h} += dot(sc[{h}u * CHUNK4 + j0 + {i}u], v{i});" for i in range(n4) for h in hs]
        pick = "".join(f" if (h == {h}u) {{ mh = m{h}; }}" for h in hs if h)
        return {"WG": wg, "LK": lk, "MULTI_J": nj > 1, "PREFETCH_V": prefetch_v,
                "K_DECL": j(kd), "K_LOAD": j(kl), "K_MATH": j(km), "V_LOAD": j(vl), "V_MATH": j(vm),
                "QS": group * dh4, "SC": group * self.CHUNK // 4, "SS": group * self.CHUNK, "RED": group * nj * head_dim if nj > 1 else 4,
                "A_DECL": j(f"      var a{h} = 0.0;" for h in hs),
                "A_ACC": j(f"          a{h} += dot(qs[{h}u * DH4 + c], kv);" for h in hs),
                "A_RED": j(f"      a{h} = subgroupAdd(a{h});" for h in hs),
                "S_SET": j(f"        ss[{h}u * CHUNK + kk] = select(-3.0e38, score(a{h}), vis);"
                           for h in hs),
                "M_DECL": j(f"  var m{h} = -3.0e38;" for h in hs),
                "M_ACC": j(f"    let x{h} = ss4({h}u * CHUNK4 + j);\n"
                           f"    m{h} = max(m{h}, max(max(x{h}.x, x{h}.y), max(x{h}.z, x{h}.w)));" for h in hs),
                "E_SET": (f"    let h = i / CHUNK4;\n    var mh = m0;{pick}\n    let s = ss4(i);\n"
                          "    sc[i] = select(vec4<f32>(0.0), exp(s - mh), s > vec4<f32>(-1.0e38));"),
                "O_DECL": j(f"  var o{h} = 0.0;" for h in hs),
                "RED_O": j(f"    red[{h}u * NJ * DH + g * DH + d] = o{h};" for h in hs),
                "W_O": j(f"    part[out0 + {h}u * PART_ROW + d] = o{h};" for h in hs),
                "W_M": j(f"  if (lid == {h}u) {{ part[out0 + {h}u * PART_ROW + DH] = m{h}; }}" for h in hs),
                # ADAPT: each chunk rescales the sums so far to the new running maximum
                "M_SAVE": j(f"  let mo{h} = m{h};" for h in hs),
                "M_ALPHA": j(f"  let al{h} = exp(mo{h} - m{h});\n  o{h} *= al{h};" for h in hs),
                "L_ALPHA": "    var alh = al0;" + "".join(f" if (lid == {h}u) {{ alh = al{h}; }}" for h in hs if h)}

    def workgroups(self, t: int):
        if self.grouped:
            return (self.nsplit, t, self.n_kv)
        return (self.nsplit, t * self.group, self.n_kv)


class AttentionPrefillKernel(Kernel):
    """A prompt chunk's causal attention in one pass (wgsl/attention_prefill.wgsl: flash
    attention with an online softmax; no partials, no combine): LANES invocations a query row,
    BQ tokens x GROUP heads of one KV head a workgroup, K and V in blocks of BK keys staged in
    workgroup memory. For the prefill graph (one sequence: cache row = position; no tree).
    Bindings:
      step  the Step uniform
      q     (B = KVH, W = rows_cap, C = DH) activation: RopeQKVKernel's relayout
      kc    (KVH, cap, DH / 4) vec4<f32> K cache (vec4<f16> with kv_f16: read as f32)
      vc    (KVH, DH, cap / 4) vec4<f32> V cache (the same)
      out   (T_cap, H * DH) activation, token-major (as AttentionCombineKernel writes it)
    Dispatch: workgroups(T) = (ceil(T / BQ), KVH)."""
    template = "attention_prefill"
    LANES = 4             # invocations a query row (H100, scripts/prefill_attention.py: 4 beat 8 and 16)
    ROWS = 256            # invocations a workgroup aims at (LANES x GROUP x BQ; 256 beat 128 on the H100)

    @classmethod
    def lanes(cls, head_dim: int, most: int = LANES) -> int:
        """Invocations per query row: the largest power of two <= `most` (<= every adapter's
        smallest subgroup, 4) that divides the row's vec4s."""
        n = 1
        while n * 2 <= most and (head_dim // 4) % (n * 2) == 0:
            n *= 2
        return n

    @classmethod
    def supported(cls, dev: Device, head_dim: int, n_heads: int, n_kv: int, cap: int) -> bool:
        return (dev.has_subgroups and head_dim % 4 == 0 and cap % 4 == 0 and n_heads % n_kv == 0
                and cls.LANES * (n_heads // n_kv) <= 256 and bool(cls._blocks(dev, head_dim, 4)))

    def __init__(self, dev: Device, q_rel: TensorDesc, out: TensorDesc, n_heads: int, n_kv: int, head_dim: int,
                 cap: int, rows_cap: int, scale: float, window: int = 0, softcap: float | None = None,
                 lanes: int | None = None, keys: int = 8, rows: int = ROWS, kv_f16: bool = False):
        """lanes a query row (a power of two, at most the adapter's smallest subgroup; default
        lanes(head_dim)), keys per iteration (4 or 8, dividing cap) and the invocations a workgroup
        aims at (rows) are tuning knobs (scripts/prefill_attention.py)."""
        if not self.supported(dev, head_dim, n_heads, n_kv, cap) or keys not in (4, 8) or cap % keys:
            raise UnsupportedModelError(f"one-pass prefill attention needs subgroups, head_dim a multiple of 4, "
                                        f"cache rows a multiple of the keys an iteration ({keys}: 4 or 8) and at "
                                        f"most 256 invocations a KV head's rows; got head_dim {head_dim}, "
                                        f"{n_heads}/{n_kv} heads, {cap} rows")
        self.group, self.n_kv = n_heads // n_kv, n_kv
        lanes = lanes or self.lanes(head_dim)
        if (head_dim // 4) % lanes or lanes & (lanes - 1) or lanes * self.group > 256:
            raise ValueError(f"{lanes} lanes a query row: a power of two dividing {head_dim // 4} vec4s")
        nv = head_dim // 4 // lanes
        self.bq = max(1, rows // (lanes * self.group))
        b = Bindings()
        j = "\n".join
        self.bk = self.block_keys(dev, head_dim, keys)
        kmath, smath, emath = [], [], []
        for kk in range(keys):
            terms = " + ".join(f"dot(q{i}, ks[(kk + {kk}u) * DH4P + lane + {i * lanes}u])" for i in range(nv))
            kmath.append(f"    let a{kk} = row_sum({terms});")
        for g in range(keys // 4):   # keys 4g .. 4g + 3: their visibility and scores
            at = [f"k + {4 * g + c}u" for c in range(4)]
            smath.append(f"    let vis{g} = vec4<bool>(" + ", ".join(f"{x} <= p && {x} >= lo" for x in at) + ");")
            smath.append(f"    let s{g} = select(vec4<f32>(-3.0e38), vec4<f32>(" + ", ".join(
                f"score(a{4 * g + c})" for c in range(4)) + f"), vis{g});")
        mx = [f"max(max(s{g}.x, s{g}.y), max(s{g}.z, s{g}.w))" for g in range(keys // 4)]
        smath.append(f"    let mn = max(m, {mx[0] if keys == 4 else f'max({mx[0]}, {mx[1]})'});")
        for g in range(keys // 4):
            emath.append(f"    let e{g} = select(vec4<f32>(0.0), exp(s{g} - vec4<f32>(mn)), vis{g});")
            emath.append(f"    l += e{g}.x + e{g}.y + e{g}.z + e{g}.w;")
        vmath = [f"    o{i} = o{i} * corr + " + " + ".join(
            f"e{j // 4}.{'xyzw'[j % 4]} * vs[(kk + {j}u) * DH4P + lane + {i * lanes}u]" for j in range(keys)) + ";"
            for i in range(nv)]
        d = _attention_defines(b, dev, q_rel, n_kv, self.group, head_dim, cap, scale, window, softcap, kv_f16)
        d.update({"OUT_DECL": b.tensor("out", out), "LANES": lanes, "BQ": self.bq,
                 "KB": keys, "BK": self.bk, "DH4P": head_dim // 4 + 1, "WG": lanes * self.group * self.bq,
                 "ROW_SUM": j(f"  s += subgroupShuffleXor(s, {m}u);" for m in (lanes >> k for k in range(1, 5)) if m),
                 "Q_LOAD": j(f"  let q{i} = q_read(kvh, tc * GROUP + h, 0u, lane + {i * lanes}u);" for i in range(nv)),
                 "O_DECL": j(f"  var o{i} = vec4<f32>(0.0);" for i in range(nv)),
                 "K_MATH": j(kmath), "S_MATH": j(smath), "E_MATH": j(emath), "V_MATH": j(vmath),
                 "O_WRITE": j(f"    out_write1(0u, t, 0u, c0 + 4u * (lane + {i * lanes}u) + {c}u, o{i}.{'xyzw'[c]} * inv);"
                              for i in range(nv) for c in range(4))})
        super().__init__(dev, d, b, self.template)

    @staticmethod
    def _blocks(dev: Device, head_dim: int, keys: int) -> list[int]:
        """The key-block sizes (32, 16, 8; multiples of `keys`) whose K and V blocks (rows padded by
        a vec4) fit the adapter's workgroup memory, largest first."""
        limit = int(dev.info.limits.get("max-compute-workgroup-storage-size", 16384))
        return [bk for bk in (32, 16, 8) if bk % keys == 0 and 2 * bk * (head_dim // 4 + 1) * 16 <= limit]

    @classmethod
    def block_keys(cls, dev: Device, head_dim: int, keys: int) -> int:
        """Keys a block in workgroup memory: the largest of _blocks (8 always fit 16 KiB for
        head_dim <= 248)."""
        fits = cls._blocks(dev, head_dim, keys)
        if not fits:
            raise UnsupportedModelError(f"one-pass prefill attention: a block of 8 keys of head_dim {head_dim} "
                                        "needs more than the adapter's workgroup memory")
        return fits[0]

    def workgroups(self, t: int):
        return (ceil_div(t, self.bq), self.n_kv, 1)


class AttentionCombineKernel(Kernel):
    """Phase 2: merge each query row's nsplit partials (log-sum-exp) into out[t, h * DH + d].
    Bindings:
      step  the Step uniform
      part  (KVH, rows_cap, nsplit, DH + 2) f32 partials of AttentionKernel
      out   (T_cap, H * DH) activation; with quant, (T_cap, row_words(H * DH)) u32 int8 rows
      outf  with quant and out_f: (T_cap, H * DH) activation, the f32 rows as well
      lpa, lpc, lpw   with lpart: the O projection's A pool, the adapter table, its shares
    Dispatch: (T * GROUP, KVH, DH / SL), SL = 32 channels per workgroup (head_dim where it is
    not a multiple of 32)."""
    template = "attention_combine"
    WG = 256

    def __init__(self, dev: Device, out: TensorDesc, n_heads: int, n_kv: int, head_dim: int, nsplit: int,
                 rows_cap: int, quant: str | None = None, out_f: TensorDesc | None = None,
                 lpart: LoraPartials | None = None):
        """quant ("q8" / "q4"): out is a QuantizeKernel row tensor for n_heads * head_dim channels
        and the heads are written as int8 blocks for that weight format; out_f (with quant): the
        f32 rows are written to it as well; lpart (with quant, one token row): the O projection's
        LoRA shares per block (kernels/lora.py)."""
        self.group, self.n_kv = n_heads // n_kv, n_kv
        self.sl = 32 if head_dim % 32 == 0 else head_dim
        self.slices = head_dim // self.sl
        b = Bindings()
        d = {"STEP_DECL": b.step(),
             "PART_DECL": b.array("part", "array<f32>", f"({n_kv}, {rows_cap}, {nsplit}, {head_dim + 2}) = "
                                  "(KVH, ROWS_CAP, NSPLIT, DH + 2)", writable=True),
             "DH": head_dim, "GROUP": self.group, "NSPLIT": nsplit, "NSPLIT4": -(-nsplit // 4) * 4, "ROWS_CAP": rows_cap,
             "WG": self.WG, "SL": self.sl, "NG": self.WG // self.sl}
        d.update(_combine_outputs(b, out, n_heads, head_dim, self.WG, quant, out_f))
        if lpart is not None:
            if quant is None or rows_cap != self.group:
                raise ValueError("the combine's LoRA shares are written with its int8 rows, for one token row")
            d.update(lpart.declare(b))
        super().__init__(dev, d, b, "attention_combine")

    @staticmethod
    def quant_supported(head_dim: int) -> bool:
        return head_dim % 32 == 0 and head_dim <= 256

    def workgroups(self, t: int):
        return (t * self.group, self.n_kv, self.slices)
