"""Speculative decoding without a draft model: draft sources propose a small tree of tokens after
the last accepted token, one forward pass verifies the whole tree (kernels/tree.py's masks), and
the longest path the model itself would have produced is accepted.

    Drafter         proposes a DraftTree from the text so far (LookupDrafter: n-gram / prompt
                    lookup, copying what followed earlier occurrences of the last tokens;
                    ForecastDrafter: DS2D, the top tokens of the forecast rows of the last pass)
    DraftTree       tokens + parent indices, node 0 the root (the last accepted token)
    TreeVerifier    the GPU side: the verification pass over the tree's rows (every row's argmax),
                    and the in-place KV compaction of the accepted path
    greedy_walk     which nodes a greedy model accepts, and the tokens it emits
    sampled_walk    the same for sampling (temperature > 0): the speculative-sampling rule for
                    deterministic drafts, so every emitted token has exactly the model's
                    distribution (target_probs: the GPU sampler's temperature / top-k / top-p)
    BackOff         when to stop drafting for a while (low acceptance: plain decode steps)

The engine's loop (runtime/engine.py, `_speculative_tokens`) ties them together.
Must not: import numpy or wgpu.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ..errors import InvalidArgumentError, NumericalError, shown
from ..gpu.base import READBACK, STORAGE
from ..kernels.base import ceil_div
from ..kernels.embedding import FORECAST_ID
from ..kernels.kv_compact import KVCompactKernel, moves_bytes, pack_moves
from ..kernels.sample import NONFINITE_TOKEN
from ..kernels.step import pack_step
from ..kernels.tree import pack_tree
from ..models.forward import TREE_TOPK
from ..weights.forecast import ForecastFile, read_forecast

MAX_TREE = 64          # rows of one verification pass: the root + up to 63 draft nodes
# the verification programs' capacities: a pass runs the smallest that holds its rows, whose
# K-column GEMVs are chosen for that many rows (autotune.choose_cols). With MAX_TREE's alone a
# pass of 2-4 rows cost as much as 2.2 decode steps on the 1B q4 (H200, 2026-11-28,
# docs/BENCHMARKS.md session 27): its int8 gate/up of 8 columns took 2.9x the one-row kernel's time
TREE_BUCKETS = (4, MAX_TREE)
PASS_PART = 48         # dispatches per submit of a verification pass not encoded ahead
ENCODE_GRAIN = 8       # a pass of MAX_TREE's program is encoded for its rows rounded up to this
MODES = ("lookup", "forecast:PATH")    # speculative= values (a Drafter instance is accepted too)


@dataclass
class DraftTree:
    """A token tree: tokens[0] is the root (the last accepted token, not yet in the KV cache);
    parents[i] < i for every other node (parents[0] = -1)."""
    tokens: list[int]
    parents: list[int]

    def __post_init__(self):
        if len(self.tokens) != len(self.parents) or not self.tokens or self.parents[0] != -1 \
                or any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise ValueError(f"not a token tree: tokens {shown(self.tokens)}, parents {shown(self.parents)}")


class Drafter:
    """A draft source. The engine calls reset(context) once per generation (the prompt),
    append(token) for every token generated (the first one included), and
    propose(max_nodes, max_depth) when it may verify a tree: a DraftTree rooted at the last
    token with at most max_nodes nodes (root included) and max_depth levels below the root, or
    None when it has nothing worth verifying. sized: max_nodes follows the acceptance so far
    (BackOff.node_budget; the DS2D drafter); False: the whole room of a pass."""

    sized = False

    def reset(self, context: list[int]) -> None:
        raise NotImplementedError

    def append(self, token: int) -> None:
        raise NotImplementedError

    def propose(self, max_nodes: int, max_depth: int) -> DraftTree | None:
        raise NotImplementedError


class LookupDrafter(Drafter):
    """n-gram / prompt lookup: find earlier occurrences of the last n tokens (n = max_ngram down
    to min_ngram) in the prompt and the output, and draft what followed them: the continuations
    of up to `branches` distinct matches (most recent first), up to `depth` tokens each, merged
    into a tree (a chain when they agree); a continuation that reaches the end of the text goes
    on repeating its period. An index of every n-gram's end positions is kept up to
    date as tokens arrive, so a proposal costs a few dict look-ups. Not sized: its acceptance
    is all or nothing (a copied run accepts a whole branch), and trees cut to the average lost
    more than the cheaper passes won (SmolLM2 on an H100: chat 1.00x -> 0.93x, docs/BENCHMARKS.md)."""

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4, depth: int = 12, branches: int = 3):
        self.min_ngram, self.max_ngram, self.depth, self.branches = min_ngram, max_ngram, depth, branches
        self.ctx: list[int] = []
        self.index: dict[tuple, list[int]] = {}    # n-gram -> positions just after its occurrences

    def reset(self, context: list[int]) -> None:
        self.ctx, self.index = [], {}
        for t in context:
            self.append(t)

    def append(self, token: int) -> None:
        ctx = self.ctx
        ctx.append(token)
        end = len(ctx)
        # the n-grams ending just before the new token now have a known continuation (the token)
        for n in range(self.min_ngram, self.max_ngram + 1):
            if end - 1 - n >= 0:
                self.index.setdefault(tuple(ctx[end - 1 - n:end - 1]), []).append(end - 1)

    def propose(self, max_nodes: int, max_depth: int) -> DraftTree | None:
        ctx = self.ctx
        depth = min(self.depth, max_depth)
        if depth <= 0 or max_nodes < 2:
            return None
        conts: list[list[int]] = []
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ctx) < n:
                continue
            for start in reversed(self.index.get(tuple(ctx[-n:]), ())):
                # what followed; a match running into the end of the text repeats with its period
                # (a loop "a b a b" drafts "a b a b ..." however recent)
                period, c = len(ctx) - start, []
                for j in range(depth):
                    c.append(ctx[start + j] if start + j < len(ctx) else c[j - period])
                if c and all(c[:len(o)] != o[:len(c)] for o in conts):   # a new continuation
                    conts.append(c)
                if len(conts) == self.branches:
                    break
            if conts:   # the longest n-gram that matched decides
                break
        if not conts:
            return None
        tokens, parents = [ctx[-1]], [-1]
        children: dict[tuple[int, int], int] = {}
        for c in conts:
            node = 0
            for t in c:
                nxt = children.get((node, t))
                if nxt is None:
                    if len(tokens) == max_nodes:
                        break
                    nxt = children[(node, t)] = len(tokens)
                    tokens.append(t)
                    parents.append(node)
                node = nxt
        return DraftTree(tokens, parents) if len(tokens) > 1 else None


class ForecastDrafter(Drafter):
    """DS2D (dynamic self-speculative decoding): m learned forecast vectors (weights/forecast.py)
    ride along every verification pass as a chain of m extra rows under each tree node (the
    embedding writes the vectors for their ids, FORECAST_ID | i); after the pass the chain under
    the last accepted node forecasts the m tokens after the model's own next token, and their
    top branching[i] tokens make the next pass's tree (depth i + 1 under the new root). A pass
    with no forecast yet (the first, or after plain steps) verifies the root alone, which still
    yields a token and the forecast. The engine (runtime/engine.py) adds the rows
    (with_forecast_rows) and hands the forecasts back through observe()."""

    sized = True

    def __init__(self, forecast: ForecastFile):
        self.forecast = forecast
        self.last: int | None = None
        self.next: list[list[int]] | None = None

    def reset(self, context: list[int]) -> None:
        self.last, self.next = context[-1], None

    def append(self, token: int) -> None:
        self.last, self.next = token, None    # the forecast was for the text before this token

    def observe(self, forecasts: list[list[int]]) -> None:
        """The last pass's forecast for the text so far: forecasts[i] = the tokens drafted at depth
        i + 1 below the last token, best first."""
        self.next = forecasts

    def propose(self, max_nodes: int, max_depth: int) -> DraftTree | None:
        if max_nodes < 1:
            return None
        tokens, parents, level = [self.last], [-1], [0]
        for cands in (self.next or ())[:max(0, max_depth)]:
            new = []
            for p in level:
                for t in cands[:max_nodes - len(tokens)]:
                    new.append(len(tokens))
                    tokens.append(t)
                    parents.append(p)
            level = new
        return DraftTree(tokens, parents)


def with_forecast_rows(tree: DraftTree, m: int) -> DraftTree:
    """The rows of a DS2D pass: the tree's nodes, then under each node i a chain of m forecast
    rows (ids FORECAST_ID | j, j = 0 .. m-1) at rows len(tree) + i * m + j: row j of the chain
    sees the node's path and the chain's rows up to itself (the tree mask of a chain)."""
    tokens, parents = list(tree.tokens), list(tree.parents)
    for node in range(len(tree.tokens)):
        for j in range(m):
            parents.append(node if j == 0 else len(tokens) - 1)
            tokens.append(FORECAST_ID | j)
    return DraftTree(tokens, parents)


def make_drafter(mode, cfg) -> Drafter:
    """The Drafter for a speculative= value (checked by SamplingParams.make) and the model's
    config (a forecast file must match it)."""
    if isinstance(mode, Drafter):
        return mode
    if mode == "lookup":
        return LookupDrafter()
    if isinstance(mode, str) and mode.startswith("forecast:"):
        ff = read_forecast(mode[len("forecast:"):])
        ff.check(cfg)
        return ForecastDrafter(ff)
    raise InvalidArgumentError(f"speculative={shown(mode)}: must be None, one of {', '.join(MODES)} "
                               "or a webdrift.runtime.speculative.Drafter")


def check_mode(mode) -> None:
    """InvalidArgumentError unless mode is None, a known mode name or a Drafter."""
    if mode is None or isinstance(mode, Drafter):
        return
    if isinstance(mode, str) and mode.startswith("forecast:"):
        if not mode[len("forecast:"):]:
            raise InvalidArgumentError(f"speculative={shown(mode)}: forecast:PATH needs the path of a forecast file")
        return
    if mode not in MODES:
        raise InvalidArgumentError(f"speculative={shown(mode)}: must be None, one of {', '.join(MODES)} "
                                   "or a webdrift.runtime.speculative.Drafter")


def greedy_walk(tree: DraftTree, argmax: list[int]) -> tuple[list[int], list[int]]:
    """(tokens emitted, tree rows of the accepted path) for a greedy model whose next token after
    node i's path is argmax[i]: from the root, follow the child holding the model's token while
    there is one; every step emits the model's token (the last one is the bonus token, the next
    root). The path starts at the root (row 0)."""
    kids: dict[tuple[int, int], int] = {}
    for i in range(1, len(tree.tokens)):
        kids.setdefault((tree.parents[i], tree.tokens[i]), i)
    node, path, out = 0, [0], []
    while True:
        tok = argmax[node]
        out.append(tok)
        nxt = kids.get((node, tok))
        if nxt is None:
            return out, path
        node = nxt
        path.append(node)


def target_probs(logits: list[float], temperature: float, top_k: int, top_p: float) -> dict[int, float]:
    """{token: probability > 0} of the GPU sampler's distribution (wgsl/sample.wgsl): softmax of
    logits / temperature over the top_k highest logits (ties at the k-th all kept; 0: all), then
    the smallest top set whose mass >= top_p of that (ties at the threshold all kept)."""
    ids = range(len(logits))
    if 0 < top_k < len(logits):
        kth = sorted(logits, reverse=True)[top_k - 1]
        ids = [i for i in ids if logits[i] >= kth]
    m = max(logits[i] for i in ids)
    e = {i: math.exp((logits[i] - m) / temperature) for i in ids}
    z = sum(e.values())
    if top_p < 1.0:
        acc, thr = 0.0, 0.0
        for v in sorted(e.values(), reverse=True):
            acc, thr = acc + v, v
            if acc >= top_p * z:
                break
        e = {i: v for i, v in e.items() if v >= thr}
        z = sum(e.values())
    return {i: v / z for i, v in e.items() if v > 0.0}


def draw(p: dict[int, float], u: float) -> int:
    """The token at cumulative mass u (in [0, 1)) of p, in id order."""
    total = sum(p.values())
    acc, last = 0.0, None
    for i in sorted(p):
        acc += p[i] / total
        last = i
        if u < acc:
            return i
    return last


async def sampled_walk(tree: DraftTree, probs_of, rng) -> tuple[list[int], list[int]]:
    """(tokens emitted, tree rows of the accepted path) under sampling. At each node with the
    model's distribution p (await probs_of(row)), its children's distinct tokens c_1, c_2, ... are
    tried in turn: c_i is accepted with probability p(c_i), else removed from p and p renormalised
    (the speculative-sampling rule for a deterministic draft, min(1, p/q) with q = 1 and the
    residual max(0, p - q) = p without c_i, applied per candidate as in SpecInfer's multi-candidate
    verification). Every token emitted thus has exactly the model's distribution. An accepted
    child's token is emitted and the walk goes on from it; when all are rejected, a token drawn
    from what is left of p is emitted and the walk ends. rng: random.Random (u in [0, 1))."""
    kids: dict[int, list[int]] = {}
    for i in range(1, len(tree.tokens)):
        kids.setdefault(tree.parents[i], []).append(i)
    node, path, out = 0, [0], []
    while True:
        p = dict(await probs_of(node))
        nxt = None
        tried = set()
        for c in kids.get(node, ()):
            t = tree.tokens[c]
            if t in tried:
                continue
            tried.add(t)
            total = sum(p.values())
            if rng.random() * total < p.get(t, 0.0):
                nxt = c
                break
            p.pop(t, None)
        if nxt is None:
            out.append(draw(p, rng.random()))
            return out, path
        out.append(tree.tokens[nxt])
        node = nxt
        path.append(node)


class BackOff:
    """Drafting pauses after verification passes that do not pay: 1, 2, 4, ... up to `cap` plain
    decode steps after consecutive misses; a paying pass resets it. A pass misses when it accepts
    nothing, or, once plain steps have been timed, when its tokens per second are below the plain
    steps' (a pass of many rows costs more than a step: accepting a little can still lose). Keeps
    text with few matches, and drafts of low quality, close to plain decode speed.
    node_budget: the nodes a sized drafter may propose, from the drafts accepted per pass so far
    (a pass's cost grows with its rows: on an H100 a SmolLM2 pass of 4 rows cost 1.25 synchronous
    decode steps, 16 rows 2.5, 64 rows 5.7; docs/BENCHMARKS.md, session 8)."""

    EMA = 0.3          # weight of the newest burst / pass in the averages
    MIN_NODES = 4      # node_budget's floor

    def __init__(self, cap: int = 64):
        self.cap, self.misses, self.wait = cap, 0, 0
        self.plain_rate: float | None = None     # tokens / s of plain bursts (an average)
        self.accepted: float | None = None       # drafts accepted per drafting pass (an average)

    def node_budget(self, room: int) -> int:
        """Nodes for the next tree (root included), at most `room`: the whole room until a pass
        has been verified, then twice the average accepted drafts + 4 (room to grow when every
        draft is accepted), at least MIN_NODES."""
        if self.accepted is None:
            return room
        return min(room, max(self.MIN_NODES, int(2 * self.accepted) + 4))

    def may_draft(self) -> bool:
        return self.wait == 0

    def plain_step(self) -> None:
        self.wait = max(0, self.wait - 1)

    def plain_burst(self, tokens: int, seconds: float) -> None:
        if tokens and seconds > 0:
            new = tokens / seconds
            self.plain_rate = new if self.plain_rate is None else (1 - self.EMA) * self.plain_rate + self.EMA * new

    def verified(self, accepted: int, tokens: int = 0, seconds: float = 0.0) -> None:
        """After a pass that drafted, accepted `accepted` of its drafts and emitted `tokens`
        (with the model's own) in `seconds`."""
        a = self.EMA
        self.accepted = accepted if self.accepted is None else (1 - a) * self.accepted + a * accepted
        losing = self.plain_rate is not None and seconds > 0 and tokens / seconds < self.plain_rate
        if accepted and not losing:
            self.misses = 0
        else:
            self.misses += 1
            self.wait = min(self.cap, 1 << (self.misses - 1))


def tree_bucket(rows: int) -> int:
    """The capacity of the verification program a pass of `rows` rows runs (TREE_BUCKETS)."""
    return next(c for c in TREE_BUCKETS if rows <= c)


def encoded_rows(rows: int) -> int:
    """The rows a pass of `rows` rows is encoded for (its dispatches' workgroup counts): the
    capacity of a program up to ENCODE_GRAIN rows, else `rows` rounded up to ENCODE_GRAIN. Every
    kernel reads the pass's true row count from the step uniform and leaves the rows past it
    alone, so passes of different sizes share one encoding, and the next pass can be encoded
    while the GPU runs this one (TreeVerifier.argmax_rows)."""
    cap = tree_bucket(rows)
    return cap if cap <= ENCODE_GRAIN else min(cap, ceil_div(rows, ENCODE_GRAIN) * ENCODE_GRAIN)


class TreeVerifier:
    """The GPU side of one engine's speculative decoding: the tree-verification programs, one per
    TREE_BUCKETS capacity (built by the engine: runtime/engine.py `_tree_verifier`), a readback
    buffer for every row's top TREE_TOPK logits per span, the forecast vectors' buffer (DS2D
    rows), the move list and one KV-compaction kernel per layer."""

    def __init__(self, engine, programs: dict, forecast_buf):
        """programs: {capacity: Program} for every TREE_BUCKETS capacity."""
        e, m = engine, engine.model
        self.engine, self.programs, self.dev, self.forecast_buf = e, programs, e.dev, forecast_buf
        self.last = self.program          # the program of the last pass (row_probs reads its logits)
        self.n_parts = ceil_div(e.config.vocab_size, 4096)
        self.span_words = 2 * TREE_TOPK                                  # (value bits, id) x k per span
        self.readback = self.dev.create_buffer(MAX_TREE * self.n_parts * self.span_words * 4, READBACK,
                                               "tree_argmax")
        self.moves = self.dev.create_buffer(moves_bytes(MAX_TREE), STORAGE, "kv_moves")
        self.words: tuple = ()       # the last pass's spans, row-major
        self.ahead = None            # the next pass, encoded while the GPU ran the last (Encoded)
        self.after: dict[int, int] = {}   # encoded rows of a pass -> those of the pass after it
        self.prev_rows: int | None = None
        cfg = e.config
        k = KVCompactKernel(self.dev, cfg.n_kv_heads, cfg.head_dim, m.cap_stride, MAX_TREE, m.kv_f16)
        self.compact = [k.dispatch({"moves": self.moves, "kc": lw.k_cache, "vc": lw.v_cache}, k.workgroups(),
                                   f"L{i}.kv_compact") for i, lw in enumerate(m.layers)]

    @property
    def program(self):
        """The program of MAX_TREE rows (the largest)."""
        return self.programs[MAX_TREE]

    def load_forecast(self, ff: ForecastFile) -> None:
        """Put a forecast file's vectors where the embedding reads the forecast rows (each row
        padded to whole vec4 slices)."""
        dim = ff.hidden_size
        pad = -dim % 4
        vals = [v for i in range(ff.m) for v in (*ff.vectors[i * dim:(i + 1) * dim], *[0.0] * pad)]
        self.dev.write_buffer(self.forecast_buf, struct.pack(f"<{len(vals)}f", *vals))

    async def argmax_rows(self, tree: DraftTree, pos0: int, step: int, sp, nodes: int | None = None) -> list[int]:
        """Run the verification pass of `tree` (root at cache slot pos0) and return the argmax of
        its first `nodes` rows (all: None), the model's next token after each node's path; the
        pass's spans stay for topk()."""
        e, dev, n = self.engine, self.dev, len(tree.tokens)
        cap = tree_bucket(n)
        self.last = self.programs[cap]
        dev.write_buffer(e.ids_buf, struct.pack(f"<{n}I", *tree.tokens))
        dev.write_buffer(e.tree_buf, pack_tree(tree.parents, pos0, cap))   # the records as its kernels read them
        dev.write_buffer(e.step_buf, pack_step(n, pos0, step, sp.seed, sp.temperature, sp.top_k, sp.top_p))
        size = n * self.n_parts * self.span_words * 4
        rows = encoded_rows(n)
        disp, copy = self._encoding(rows)
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.dispatches is disp and ahead.copies == [copy]:
            ticket = dev.submit_encoded(ahead)
        else:
            if ahead is not None:
                dev.discard(ahead)
            # in parts, so the GPU starts on the first layers while the host encodes the rest
            # (one submit would leave the GPU idle through its whole encode, ~1.5 ms of a SmolLM2
            # pass on an H100 host)
            for i in range(0, len(disp), PASS_PART):
                last = i + PASS_PART >= len(disp)
                ticket = dev.submit(disp[i:i + PASS_PART], [copy] if last else None)
        # while the GPU runs this pass, the host encodes the next one (its tree is not known yet,
        # but its encoding depends on its row count only), for the rows that followed this
        # pass's rows last time: drafters repeat their sizes (lookup: whole trees; DS2D: a root
        # pass after plain steps, then trees of its node budget). The first time, nothing: a
        # wrong guess makes the host encode while the GPU ends a pass submitted in parts, and the
        # read waits for that. A backend that would only keep the lists (Device's default)
        # submits every pass in parts instead.
        if self.prev_rows is not None:
            self.after[self.prev_rows] = rows
        self.prev_rows = rows
        guess = self.after.get(rows)
        if guess is not None and dev.encodes_ahead:
            d, c = self._encoding(guess)
            self.ahead = dev.encode(d, [c])
        raw = await dev.map_read(self.readback, size, ticket)
        self.words = struct.unpack(f"<{size // 4}I", raw)
        out = []
        for t in range(n if nodes is None else nodes):
            best = self.topk(t, 1)
            if not best:
                raise NumericalError(f"tree verification at cache position {pos0}: the model's logits hold NaN "
                                     f"or infinite values")
            out.append(best[0])
        return out

    def _encoding(self, rows: int) -> tuple[list, tuple]:
        """A pass encoded for `rows` rows: its program's dispatches and the copy of every row's
        spans to the read-back buffer."""
        program = self.programs[tree_bucket(rows)]
        return program.dispatches(rows), (self.engine.arena, program.graph.tensors["amax"].offset, self.readback, 0,
                                          rows * self.n_parts * self.span_words * 4)

    def topk(self, row: int, k: int) -> list[int]:
        """The k tokens of row `row` with the largest logits in the last pass, best first (ties:
        lowest id); [] if the row's logits hold a non-finite value."""
        w, kk, v = self.words, TREE_TOPK, self.engine.config.vocab_size
        cands = []
        for s in range(self.n_parts):
            base = (row * self.n_parts + s) * self.span_words
            if w[base + 1] == NONFINITE_TOKEN:
                return []
            for j in range(min(k, kk)):
                idx = w[base + 2 * j + 1]
                if idx < v:
                    cands.append((-_order(w[base + 2 * j]), idx))
        return [idx for _, idx in sorted(cands)[:k]]

    def forecasts(self, nodes: int, node: int, branching) -> list[list[int]]:
        """The drafts of the forecast rows under tree node `node` in the last DS2D pass (rows after
        the `nodes` tree rows, with_forecast_rows' order): the top branching[j] tokens of row j."""
        m = len(branching)
        out = []
        for j, b in enumerate(branching):
            top = self.topk(nodes + node * m + j, b)
            if not top:
                break
            out.append(top)
        return out

    async def row_probs(self, row: int, sp, pos0: int) -> dict[int, float]:
        """The sampling distribution (target_probs) of row `row`'s logits in the last pass."""
        v = self.engine.config.vocab_size
        offset = self.last.graph.tensors["logits"].offset    # (capacity, V) f32, linear
        raw = await self.dev.read_buffer(self.engine.arena, offset + 4 * v * row, 4 * v)
        logits = struct.unpack(f"<{v}f", raw)
        if not all(math.isfinite(x) for x in logits):
            raise NumericalError(f"tree verification at cache position {pos0}: the model's logits hold NaN or "
                                 "infinite values")
        return target_probs(list(logits), sp.temperature, sp.top_k, sp.top_p)

    def compact_path(self, path: list[int], pos0: int) -> None:
        """Move the accepted path's K/V rows (tree rows `path`, at slots pos0 + row) to the
        consecutive slots pos0 + depth, in place, in every layer."""
        moves = [(pos0 + row, pos0 + d) for d, row in enumerate(path) if row != d]
        if moves:
            self.dev.write_buffer(self.moves, pack_moves(moves, MAX_TREE))
            self.dev.submit(self.compact)


def _order(bits: int) -> int:
    """An integer that orders finite f32 values (given as their bits) as the floats compare,
    -0.0 equal to 0.0 (no float is made: a pass's rows x spans candidates cost ~1 us each that way)."""
    if bits & 0x80000000:
        return 0x80000000 if bits == 0x80000000 else ~bits & 0xFFFFFFFF
    return bits | 0x80000000
