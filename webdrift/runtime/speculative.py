"""Speculative decoding without a draft model: draft sources propose a small tree of tokens after
the last accepted token, one forward pass verifies the whole tree (kernels/tree.py's masks), and
the longest path the model itself would have produced is accepted.

    Drafter         proposes a DraftTree from the text so far (LookupDrafter: n-gram / prompt
                    lookup, copying what followed earlier occurrences of the last tokens)
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
from ..kernels.kv_compact import KVCompactKernel, moves_bytes, pack_moves
from ..kernels.sample import NONFINITE_TOKEN
from ..kernels.step import pack_step
from ..kernels.tree import pack_tree

MAX_TREE = 64          # rows of one verification pass: the root + up to 63 draft nodes
MODES = ("lookup",)    # speculative= values (a Drafter instance is accepted too)


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
    """A draft source. The engine calls reset(context) once per generation (the prompt and the
    first generated token), append(token) for every token generated after it, and
    propose(max_nodes, max_depth) when it may verify a tree: a DraftTree rooted at the last
    token with at most max_nodes nodes (root included) and max_depth levels below the root, or
    None when it has nothing worth verifying."""

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
    date as tokens arrive, so a proposal costs a few dict look-ups."""

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


def make_drafter(mode) -> Drafter:
    """The Drafter for a speculative= value (checked by SamplingParams.make)."""
    if isinstance(mode, Drafter):
        return mode
    if mode == "lookup":
        return LookupDrafter()
    raise InvalidArgumentError(f"speculative={shown(mode)}: must be None, one of {', '.join(MODES)} "
                               "or a webdrift.runtime.speculative.Drafter")


def check_mode(mode) -> None:
    """InvalidArgumentError unless mode is None, a known mode name or a Drafter."""
    if mode is None or isinstance(mode, Drafter):
        return
    if isinstance(mode, str) and mode.startswith("forecast:"):
        raise InvalidArgumentError(f"speculative={shown(mode)}: forecast embeddings (DS2D) are not implemented "
                                   f"yet; use one of {', '.join(MODES)}")
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
    """Drafting pauses after verification passes that accept nothing: 1, 2, 4, ... up to `cap`
    plain decode steps after consecutive misses; an accepted draft token resets it. Keeps chat
    with few matches close to plain decode speed."""

    def __init__(self, cap: int = 32):
        self.cap, self.misses, self.wait = cap, 0, 0

    def may_draft(self) -> bool:
        return self.wait == 0

    def plain_step(self) -> None:
        self.wait = max(0, self.wait - 1)

    def verified(self, accepted: int) -> None:
        if accepted:
            self.misses = 0
        else:
            self.misses += 1
            self.wait = min(self.cap, 1 << (self.misses - 1))


class TreeVerifier:
    """The GPU side of one engine's speculative decoding: the tree-verification program (built
    by the engine: runtime/engine.py `_tree_program`), a readback buffer for every row's argmax
    spans, the move list and one KV-compaction kernel per layer."""

    def __init__(self, engine, program):
        e, m = engine, engine.model
        self.engine, self.program, self.dev = e, program, e.dev
        self.n_parts = ceil_div(e.config.vocab_size, 4096)
        amax = program.graph.tensors["amax"]
        self.amax_offset = amax.offset
        self.logits_offset = program.graph.tensors["logits"].offset    # (MAX_TREE, V) f32, linear
        self.readback = self.dev.create_buffer(MAX_TREE * self.n_parts * 8, READBACK, "tree_argmax")
        self.moves = self.dev.create_buffer(moves_bytes(MAX_TREE), STORAGE, "kv_moves")
        cfg = e.config
        k = KVCompactKernel(self.dev, cfg.n_kv_heads, cfg.head_dim, m.cap_stride, MAX_TREE)
        self.compact = [k.dispatch({"moves": self.moves, "kc": lw.k_cache, "vc": lw.v_cache}, k.workgroups(),
                                   f"L{i}.kv_compact") for i, lw in enumerate(m.layers)]

    async def argmax_rows(self, tree: DraftTree, pos0: int, step: int, sp) -> list[int]:
        """Run the verification pass of `tree` (root at cache slot pos0) and return every row's
        argmax (the model's next token after that node's path)."""
        e, dev, n = self.engine, self.dev, len(tree.tokens)
        dev.write_buffer(e.ids_buf, struct.pack(f"<{n}I", *tree.tokens))
        dev.write_buffer(e.tree_buf, pack_tree(tree.parents, pos0, MAX_TREE))
        dev.write_buffer(e.step_buf, pack_step(n, pos0, step, sp.seed, sp.temperature, sp.top_k, sp.top_p))
        size = n * self.n_parts * 8
        ticket = dev.submit(self.program.dispatches(n), [(e.arena, self.amax_offset, self.readback, 0, size)])
        raw = await dev.map_read(self.readback, size, ticket)
        words = struct.unpack(f"<{2 * n * self.n_parts}I", raw)
        out = []
        for t in range(n):
            best, best_v = None, None
            for s in range(self.n_parts):
                bits, idx = words[2 * (t * self.n_parts + s)], words[2 * (t * self.n_parts + s) + 1]
                if idx == NONFINITE_TOKEN:
                    raise NumericalError(f"tree verification at cache position {pos0}: the model's logits hold NaN "
                                         f"or infinite values")
                v = _f32(bits)
                if best is None or v > best_v:     # spans in id order: the first maximum has the lowest id
                    best, best_v = idx, v
            out.append(best)
        return out

    async def row_probs(self, row: int, sp, pos0: int) -> dict[int, float]:
        """The sampling distribution (target_probs) of row `row`'s logits in the last pass."""
        v = self.engine.config.vocab_size
        raw = await self.dev.read_buffer(self.engine.arena, self.logits_offset + 4 * v * row, 4 * v)
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


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]
