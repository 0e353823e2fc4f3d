"""Several streams decoded in one pass (the multi-LoRA paper's multi-response generation):
`Engine.generate(prompt, n=K)` reads the prompt once and decodes K continuations together, one
row per stream in every decode step, so each step's weights are read for all K.

The KV cache (kernels/step.py, the attention's key_pos):

    rows [0, F)                 the prompt, shared by every stream (F: the prompt's length rounded
                                down to the attention chunk)
    rows [F + s N, F + (s+1) N)  stream s's segment: the prompt's last partial chunk (rows F .. P-1;
                                stream 0 keeps the prompt's own rows, the others get a copy,
                                < one chunk per layer), then the stream's own tokens

Segments start on chunk boundaries, so every attention chunk of a stream holds exactly the keys a
single sequence's chunk holds at the same positions: a stream's logits are bit-identical to a
single generation of its tokens. The segments live inside the engine's cache (max_context rows):
K streams of a P-token prompt get about (max_context - P) / K new tokens each (at least one).

One adapter per stream (`lora=[...]`, Punica / S-LoRA's batched LoRA: each row of a step applies
its own adapter): the prompt's keys depend on the adapter, so nothing is shared: F = 0, every
segment holds its own copy of the prompt, prefilled once per distinct adapter.

First tokens: "distinct" (the paper's scheme: the K most likely distinct tokens after the prompt,
ties to the lowest id; then each stream samples as usual) or "sampled" (K independent draws
from the sampler, each stream with its own random sequence).
Must not: import numpy or wgpu (Pyodide).
"""

from __future__ import annotations

import heapq
import math
import struct
import time
from dataclasses import dataclass, replace

from ..errors import ContextLengthError, InvalidArgumentError, NumericalError
from ..kernels.attention import AttentionKernel
from ..kernels.base import ceil_div
from ..kernels.rope import KVSegmentCopyKernel
from ..kernels.step import pack_step

MAX_STREAMS = 16
FIRST_TOKENS = ("distinct", "sampled")


@dataclass(frozen=True)
class StreamLayout:
    prompt: int        # P: prompt tokens (shared cache rows [0, seg_base) and the copied tail)
    seg_base: int      # F: first cache row of the segments (a multiple of the attention chunk)
    seg_stride: int    # N: cache rows per segment (a multiple of the attention chunk)
    budget: int        # new tokens per stream that fit


def plan(prompt: int, n: int, max_new_tokens: int, cache_rows: int, max_context: int, chunk: int,
         shared: bool = True) -> StreamLayout:
    """Where n streams after a `prompt`-token prompt live in a cache of `cache_rows` rows; the
    budget is max_new_tokens or what fits. A stream's segment holds the prompt's last partial
    chunk and the tokens decode steps process (all but the last sampled one), so a budget of one
    token needs no segment at all. shared=False (one adapter per stream: the prompt's keys differ
    per adapter): no shared rows, each segment holds the whole prompt."""
    seg_base = prompt // chunk * chunk if shared else 0
    tail = prompt - seg_base
    per_stream = (cache_rows - seg_base) // n // chunk * chunk     # segment rows each stream can have
    fits = min(per_stream - tail + 1 if per_stream > tail else 1, max_context - prompt)
    if fits < 1:
        raise ContextLengthError(f"a {prompt}-token prompt leaves no room in this engine's context of "
                                 f"{max_context} tokens")
    budget = min(max_new_tokens, fits)
    stride = ceil_div(tail + budget - 1, chunk) * chunk if budget > 1 else 0
    return StreamLayout(prompt, seg_base, stride, budget)


def top_distinct(row: bytes, n: int) -> list[int]:
    """The n largest logits' ids of a float32 row, largest first (ties: lowest id first);
    NumericalError if the row holds a NaN or an infinity."""
    vals = struct.unpack(f"<{len(row) // 4}f", row)
    if not all(math.isfinite(v) for v in vals):
        raise NumericalError("the logits after the prompt hold NaN or infinite values: the model's weights are "
                             "damaged or a tensor's type is mislabelled")
    return heapq.nlargest(n, range(len(vals)), key=vals.__getitem__)   # stable: equal values keep id order


class StreamRunner:
    """The streams' decode programs and the KV tail copies of one engine (built on first use).
    A program per stream count rounded up to a power of two (2, 4, 8, 16), each built on first
    use: its GEMVs' token rows per workgroup are chosen for that many rows (autotune.choose_cols),
    as a 16-row program's choice ran 4 streams slower."""

    def __init__(self, eng):
        self.eng = eng
        m = eng.model
        self.chunk = AttentionKernel.chunk_for(m.cfg.head_dim)
        self.programs: dict = {}     # rows -> Program
        k = KVSegmentCopyKernel(eng.dev, m.cfg.n_kv_heads, m.cfg.head_dim, m.cap_stride, m.kv_f16)
        self.copy = [(k, k.bind(eng.dev, {"step": eng.step_buf, "kc": lw.k_cache, "vc": lw.v_cache}))
                     for lw in m.layers]

    def program(self, n: int):
        """The decode program of n streams (its capacity: n rounded up to a power of two, >= 2)."""
        rows = max(2, 1 << (n - 1).bit_length())
        p = self.programs.get(rows)
        if p is None:
            p = self.eng._program("decode", rows, False, streams=True)
            self.eng._fit_arena(p)
            self.programs[rows] = p
        return p

    def copy_dispatches(self, n: int, rows: int) -> list:
        return [k.dispatch(bg, k.workgroups(n, rows), f"L{i}.kv_segment_copy") for i, (k, bg) in enumerate(self.copy)]


async def _prefill(eng, ids: list[int], sp, n: int, draws: int) -> list[int]:
    """The prompt through the prefill program and n first tokens: `draws` sampled ones (read
    back), or the n most likely distinct ones (written into the step's ids)."""
    dev, prof, P = eng.dev, eng.profiler, len(ids)
    ticket = None
    with prof.phase("prefill.submit", tokens=P):
        for pos, part, disp in eng._submit_prompt(ids, sp, draws=draws):
            last = pos + len(part) == P
            copies = [(eng.out_tokens, 0, eng.ring[0], 0, 4 * draws)] if last and draws > 1 else None
            ticket = dev.submit(disp, copies, timestamps=prof.gpu_timer("prefill", len(disp), pos=pos))
    if draws > 1:
        return list(struct.unpack(f"<{draws}I", await dev.map_read(eng.ring[0], 4 * draws, ticket)))
    lt = eng.prefill.graph.tensors["logits"]
    first = top_distinct(await dev.read_buffer(eng.arena, lt.offset, 4 * eng.config.vocab_size), n)
    dev.write_buffer(eng.ids_buf, struct.pack(f"<{n}I", *first))
    return first


async def _prefill_per_adapter(eng, runner: StreamRunner, ids: list[int], sp, lay: StreamLayout,
                               adapters: tuple) -> list[int]:
    """One adapter per stream: the prompt once per distinct adapter (its keys and values depend
    on the adapter), each time copied whole into the segments of that adapter's streams; stream
    0's adapter last, so its own segment (rows [0, P)) keeps the prompt's rows. First tokens per
    adapter group as sp.first_tokens says (distinct within the group; sampled: each group's draws
    with its own seed)."""
    dev, P, n = eng.dev, len(ids), len(adapters)
    groups: dict = {}
    for s, a in enumerate(adapters):
        groups.setdefault(a, []).append(s)
    first = [0] * n
    order = [a for a in groups if a != adapters[0]] + [adapters[0]]
    for gi, a in enumerate(order):
        members = groups[a]
        eng.lora_pool.activate(a, sp.lora_scale)
        sampled = sp.first_tokens == "sampled"
        gsp = replace(sp, seed=(sp.seed + 0x9E3779B9 * gi) & 0xFFFFFFFF) if sampled else sp
        toks = await _prefill(eng, ids, gsp, len(members), len(members) if sampled else 1)
        for s, tok in zip(members, toks):
            first[s] = tok
            if s:   # stream s's own copy of the whole prompt
                dev.write_buffer(eng.step_buf, pack_step(2, P, streams=(0, s * lay.seg_stride)))
                dev.submit(runner.copy_dispatches(2, P))
    dev.write_buffer(eng.ids_buf, struct.pack(f"<{n}I", *first))
    return first


async def events(eng, ids: list[int], sp, st):
    """Async generator of ("text", (stream, piece)) events, then ("done", [GenerationResult per
    stream]). The caller holds the engine's busy guard, has checked the prompt and filled st
    (GenerationStats) with the prompt's length and tokenize time."""
    from .engine import IN_FLIGHT, RING, GenerationResult
    n, dev, prof = sp.n, eng.dev, eng.profiler
    if n > eng.config.vocab_size:
        raise InvalidArgumentError(f"n={n} streams: more than the vocabulary's {eng.config.vocab_size} tokens")
    t0 = time.perf_counter() - st.tokenize_s
    if eng._streams is None:
        eng._streams = StreamRunner(eng)
    runner = eng._streams
    P = len(ids)
    adapters = sp.lora if isinstance(sp.lora, tuple) else None     # one adapter per stream
    lay = plan(P, n, sp.max_new_tokens, eng.model.cap_stride, eng.max_context, runner.chunk, shared=adapters is None)
    eos = set(eng.tokenizer.eos_token_ids) | set(eng.config.eos_token_ids) if sp.stop_at_eos else set()
    outs: list[list[int]] = [[] for _ in range(n)]
    texts: list[list[str]] = [[] for _ in range(n)]
    decs = [eng.tokenizer.stream_decoder() for _ in range(n)]
    finish = [""] * n
    if lay.budget == 0:
        for i in range(n):
            finish[i] = "length"
    # -- the prompt, and the first token of every stream
    t_pf = time.perf_counter()
    draws = n if sp.first_tokens == "sampled" else 1
    tickets = [None] * RING
    if lay.budget and adapters is not None:
        first = await _prefill_per_adapter(eng, runner, ids, sp, lay, adapters)
        st.prefill_s = time.perf_counter() - t_pf
    elif lay.budget:
        first = await _prefill(eng, ids, sp, n, draws)
        if P > lay.seg_base and lay.seg_stride:   # each stream's copy of the prompt's last partial chunk
            dev.write_buffer(eng.step_buf, pack_step(n, P, streams=(lay.seg_base, lay.seg_stride)))
            dev.submit(runner.copy_dispatches(n, P - lay.seg_base))
        st.prefill_s = time.perf_counter() - t_pf
    t_dec = time.perf_counter()

    def take(step: int, toks: list[int]):
        """Stream i's token of generation step `step`; the events it makes."""
        evs = []
        for i, tok in enumerate(toks):
            if finish[i]:
                continue
            if tok >= eng.config.vocab_size:
                raise eng._bad_token(tok, step, P)
            if tok in eos:
                finish[i] = "eos"
                continue
            outs[i].append(tok)
            piece = decs[i].push(tok)
            if piece:
                texts[i].append(piece)
                evs.append(("text", (i, piece)))
            if step + 1 == lay.budget:
                finish[i] = "length" if lay.budget == sp.max_new_tokens else "context"
        return evs

    if lay.budget:
        for ev in take(0, first):
            yield ev
    # -- decode steps: every stream's row in one pass; step j processes the tokens of step j - 1
    decode_list = runner.program(n).dispatches(n)
    submitted = read = 1
    if adapters is not None:
        eng.lora_pool.assign_rows(list(adapters), sp.lora_scale)
    try:
        while True:
            while (submitted < lay.budget and submitted < read + IN_FLIGHT and not all(finish)
                   and not eng._stop_requested):
                with prof.phase("decode.submit", step=submitted):
                    dev.write_buffer(eng.step_buf, pack_step(n, P + submitted - 1, submitted, sp.seed, sp.temperature,
                                                             sp.top_k, sp.top_p, streams=(lay.seg_base, lay.seg_stride),
                                                             n_out=n))
                    tickets[submitted % RING] = dev.submit(
                        decode_list, [(eng.out_tokens, 4 * n * submitted, eng.ring[submitted % RING], 0, 4 * n)],
                        timestamps=prof.gpu_timer("decode", len(decode_list), step=submitted))
                submitted += 1
            if read == submitted:
                break
            with prof.phase("readback", token=read):
                raw = await dev.map_read(eng.ring[read % RING], 4 * n, tickets[read % RING])
            evs = take(read, list(struct.unpack(f"<{n}I", raw)))   # finished streams' tokens are dropped
            read += 1
            for ev in evs:
                yield ev
    finally:
        if adapters is not None:
            eng.lora_pool.clear_rows(n)
    if eng._stop_requested:
        for i in range(n):
            finish[i] = finish[i] or "stopped"
    for i in range(n):
        tail = decs[i].flush()
        if tail:
            texts[i].append(tail)
            yield "text", (i, tail)
    st.decode_s = time.perf_counter() - t_dec if lay.budget > 1 else 0.0
    st.total_s = time.perf_counter() - t0
    results = []
    for i in range(n):
        s = replace(st, new_tokens=len(outs[i]) + (1 if finish[i] == "eos" else 0), finish_reason=finish[i] or "stopped")
        results.append(GenerationResult("".join(texts[i]), outs[i], s))
    yield "done", results

