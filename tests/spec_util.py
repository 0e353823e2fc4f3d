"""Draft sources for the speculative-decoding tests: trees with a known amount of truth in them.

OracleDrafter knows the plain greedy continuation (computed by the caller without speculation)
and proposes random trees that hide a prefix of it (sometimes with a wrong token at the end) among
random distractor nodes, so acceptance depths, tree shapes, sizes up to the limit and KV
compaction of paths far from the tree's first rows are all exercised. WrongDrafter proposes
only tokens the model does not pick (nothing is ever accepted). AlternatingDrafter proposes
chains of the truth of two sizes in turn (passes alternating between verification programs).
"""

from __future__ import annotations

import random

from webdrift.runtime.speculative import Drafter, DraftTree


class OracleDrafter(Drafter):
    def __init__(self, truth: list[int], vocab: int, seed: int = 0, max_true: int = 10, eos: int | None = None):
        """truth: prompt + the plain greedy output (the drafter checks that the engine's context
        never leaves it)."""
        self.truth, self.vocab, self.rng, self.max_true = truth, vocab, random.Random(seed), max_true
        self.ctx: list[int] = []
        self.trees = 0

    def reset(self, context):
        self.ctx = list(context)

    def append(self, token):
        self.ctx.append(token)

    def propose(self, max_nodes, max_depth):
        r, n = self.rng, len(self.ctx)
        assert self.ctx == self.truth[:n], "the speculative context left the plain greedy output"
        if r.random() < 0.15:
            return None                                   # sometimes nothing: plain steps
        true = self.truth[n:n + r.randint(0, self.max_true)]
        if true and r.random() < 0.3:                     # a wrong token somewhere on the path
            k = r.randrange(len(true))
            true = true[:k] + [(true[k] + 1) % self.vocab]
        tokens, parents = [self.ctx[-1]], [-1]
        size = min(max_nodes, r.choice([2, 3, 5, 9, 17, 33, 64]))
        shape = r.choice(["random", "chain", "star"])
        while len(tokens) < size - min(len(true), max_depth):
            p = {"random": r.randrange(len(tokens)), "chain": len(tokens) - 1, "star": 0}[shape]
            tokens.append(r.randrange(self.vocab))
            parents.append(p)
        node = 0
        for t in true[:max_depth]:                        # the true path after the distractors
            if len(tokens) == max_nodes:
                break
            tokens.append(t)
            parents.append(node)
            node = len(tokens) - 1
        self.trees += 1
        return DraftTree(tokens, parents)


class WrongDrafter(OracleDrafter):
    """Chains and stars of tokens that are never the model's next token."""

    def propose(self, max_nodes, max_depth):
        r, n = self.rng, len(self.ctx)
        assert self.ctx == self.truth[:n]
        nxt = self.truth[n] if n < len(self.truth) else -1
        tokens, parents = [self.ctx[-1]], [-1]
        for _ in range(min(max_nodes - 1, r.randint(1, 12))):
            t = r.randrange(self.vocab)
            tokens.append(t if t != nxt else (t + 1) % self.vocab)
            parents.append(r.randrange(len(tokens) - 1))
        self.trees += 1
        return DraftTree(tokens, parents)


class AlternatingDrafter(Drafter):
    """Chains of the true continuation, alternately of `sizes[0]` and `sizes[1]` nodes."""

    def __init__(self, truth, sizes):
        self.truth, self.sizes, self.ctx, self.k = truth, sizes, [], 0

    def reset(self, context):
        self.ctx = list(context)

    def append(self, token):
        self.ctx.append(token)

    def propose(self, max_nodes, max_depth):
        n = min(self.sizes[self.k % 2], max_nodes, max_depth + 1)
        self.k += 1
        tokens = [self.ctx[-1], *self.truth[len(self.ctx):len(self.ctx) + n - 1]]
        return DraftTree(tokens, list(range(-1, len(tokens) - 1))) if len(tokens) > 1 else None
