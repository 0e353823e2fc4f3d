"""BPE models: word -> token ids, with exactly HF `tokenizers`' BPE merge order.

Two ways to rank a pair of adjacent symbols, one merge engine:

* `BPE` with explicit merges (byte-level GPT-2 / SmolLM / Llama 3 / Qwen2, or tokenizer.json merges):
  the rank of (a, b) is its index in the merges list.
* `BPE.from_scores` for SentencePiece-style vocabularies that ship no merges (Gemma GGUF): every split of
  a token into two vocabulary tokens is a merge, ranked by the merged token's priority (its score, or its
  position in the file), then by the longer left part -- the order `transformers` derives for them.

The engine always merges the lowest-ranked adjacent pair, leftmost first, until none is left (HF's
priority-queue algorithm). Short words use a simple scan, long words (SentencePiece texts are one word)
a heap over a linked list. Results are cached per word. Byte fallback (`<0xXX>` tokens), unknown-token
fusing and `ignore_merges` follow HF. Pure standard library; must not import numpy or tokenizers.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from webdrift.errors import TokenizerError

_SHORT_WORD = 48  # symbols; below this the O(n^2) scan beats the heap in CPython
_CACHE_LIMIT = 1 << 16
_CACHE_WORD_CHARS = 128
_LEN_SLOTS = 1 << 16


class BPE:
    """A BPE model over `vocab` (token text -> id)."""

    def __init__(
        self,
        vocab: dict[str, int],
        merges: Iterable[tuple[str, str]] | None = None,
        *,
        byte_fallback: bool = False,
        unk_token: str | None = None,
        fuse_unk: bool = False,
        ignore_merges: bool = False,
        merge_priority: Sequence[int] | None = None,
    ) -> None:
        self.vocab = vocab
        self.byte_fallback = byte_fallback
        self.fuse_unk = fuse_unk
        self.ignore_merges = ignore_merges
        self.unk_id: int | None = None
        if unk_token is not None:
            if unk_token not in vocab:
                raise TokenizerError(f"BPE unk_token {unk_token!r} is not in the vocabulary")
            self.unk_id = vocab[unk_token]
        self._n = max(vocab.values(), default=0) + 1  # ids < N; pair values pack (order, merged id)
        # byte value -> id of its "<0xXX>" token (byte fallback)
        self._byte_tokens = {b: vocab[f"<0x{b:02X}>"] for b in range(256) if f"<0x{b:02X}>" in vocab}
        self._pairs: dict[tuple[int, int], int] | None = None
        self._priority = merge_priority
        self._tokens: list[str | None] = []
        if merges is not None:
            self._pairs = self._rank_merges(merges)
        elif merge_priority is None:
            raise TokenizerError("BPE needs either merges or per-token merge priorities")
        else:
            if len(merge_priority) < self._n:
                raise TokenizerError(f"BPE merge priorities cover {len(merge_priority)} of {self._n} ids")
            self._tokens = [None] * self._n
            for token, i in vocab.items():
                self._tokens[i] = token
        self._cache: dict[str, tuple[int, ...]] = {}

    # -- construction -------------------------------------------------------------------------------

    def _rank_merges(self, merges: Iterable[tuple[str, str]]) -> dict[tuple[int, int], int]:
        """(id_a, id_b) -> rank * N + merged_id. A repeated pair keeps its last rank, as in HF."""
        vocab, n = self.vocab, self._n
        pairs: dict[tuple[int, int], int] = {}
        for rank, (a, b) in enumerate(merges):
            ia, ib, im = vocab.get(a), vocab.get(b), vocab.get(a + b)
            if ia is None or ib is None:
                missing = a if ia is None else b
                raise TokenizerError(
                    f"merge #{rank} ({a!r} {b!r}) uses {missing!r}, which is not in the vocabulary"
                )
            if im is None:
                raise TokenizerError(
                    f"merge #{rank} ({a!r} {b!r}) makes {a + b!r}, which is not in the vocabulary"
                )
            pairs[(ia, ib)] = rank * n + im
        return pairs

    @classmethod
    def from_scores(
        cls,
        vocab: dict[str, int],
        priority: Sequence[int],
        *,
        byte_fallback: bool = True,
        unk_token: str | None = None,
        fuse_unk: bool = True,
    ) -> BPE:
        """SentencePiece-style BPE without a merges list: priority[id] ranks merges producing token id."""
        return cls(
            vocab,
            None,
            byte_fallback=byte_fallback,
            unk_token=unk_token,
            fuse_unk=fuse_unk,
            merge_priority=priority,
        )

    # -- pair ranking ---------------------------------------------------------------------------------

    def _pair_value(self, a: int, b: int) -> int | None:
        """Smaller is merged first; value % N is the merged id. None: the pair does not merge."""
        if self._pairs is not None:
            return self._pairs.get((a, b))
        left, right = self._tokens[a], self._tokens[b]
        merged = self.vocab.get(left + right)  # type: ignore[operator]
        if merged is None:
            return None
        order = self._priority[merged] * _LEN_SLOTS + (_LEN_SLOTS - 1 - len(left))  # type: ignore[index,arg-type]
        return order * self._n + merged

    # -- word -> ids ----------------------------------------------------------------------------------

    def _initial_symbols(self, word: str) -> list[int]:
        vocab = self.vocab
        out: list[int] = []
        unk: int | None = None  # pending unknown-token span (HF fuses consecutive ones)
        for ch in word:
            i = vocab.get(ch)
            if i is not None:
                if unk is not None:
                    out.append(unk)
                    unk = None
                out.append(i)
                continue
            if self.byte_fallback:
                data = ch.encode("utf-8")
                ids = [self._byte_tokens.get(b) for b in data]
                if all(x is not None for x in ids):
                    out.extend(ids)  # type: ignore[arg-type]
                    continue  # HF does not flush a pending unk here
            if self.unk_id is not None:
                if unk is not None and not self.fuse_unk:
                    out.append(unk)
                unk = self.unk_id
            # else: HF drops a character it cannot represent
        if unk is not None:
            out.append(unk)
        return out

    def tokenize(self, word: str) -> tuple[int, ...]:
        """Token ids of one pre-tokenized word."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        if self.ignore_merges and word in self.vocab:
            result: tuple[int, ...] = (self.vocab[word],)
        else:
            symbols = self._initial_symbols(word)
            if len(symbols) > 1:
                symbols = (
                    self._merge_short(symbols) if len(symbols) < _SHORT_WORD else self._merge_long(symbols)
                )
            result = tuple(symbols)
        if len(word) <= _CACHE_WORD_CHARS:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[word] = result
        return result

    def _merge_short(self, symbols: list[int]) -> list[int]:
        n = self._n
        if self._pairs is not None:
            get = self._pairs.get
            values = [get((symbols[i], symbols[i + 1])) for i in range(len(symbols) - 1)]
            while True:
                best, best_i = None, -1
                for i, v in enumerate(values):
                    if v is not None and (best is None or v < best):
                        best, best_i = v, i
                if best is None:
                    return symbols
                symbols[best_i] = merged = best % n
                del symbols[best_i + 1]
                del values[best_i]
                if best_i > 0:
                    values[best_i - 1] = get((symbols[best_i - 1], merged))
                if best_i < len(values):
                    values[best_i] = get((merged, symbols[best_i + 1]))
        value = self._pair_value
        values = [value(symbols[i], symbols[i + 1]) for i in range(len(symbols) - 1)]
        while True:
            best, best_i = None, -1
            for i, v in enumerate(values):
                if v is not None and (best is None or v < best):
                    best, best_i = v, i
            if best is None:
                return symbols
            symbols[best_i] = merged = best % n
            del symbols[best_i + 1]
            del values[best_i]
            if best_i > 0:
                values[best_i - 1] = value(symbols[best_i - 1], merged)
            if best_i < len(values):
                values[best_i] = value(merged, symbols[best_i + 1])

    def _merge_long(self, symbols: list[int]) -> list[int]:
        """HF's algorithm: a heap of (value, position) over a doubly linked list of symbols."""
        n = self._n
        value = self._pair_value
        count = len(symbols)
        ids = list(symbols)
        nxt = list(range(1, count + 1))
        nxt[-1] = -1
        prv = list(range(-1, count - 1))
        alive = [True] * count
        heap = []
        for i in range(count - 1):
            v = value(ids[i], ids[i + 1])
            if v is not None:
                heap.append((v, i))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            v, i = pop(heap)
            j = nxt[i]
            if not alive[i] or j < 0 or value(ids[i], ids[j]) != v:
                continue  # stale entry: one of the two symbols changed since it was queued
            ids[i] = merged = v % n
            alive[j] = False
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
                w = value(merged, ids[k])
                if w is not None:
                    push(heap, (w, i))
            p = prv[i]
            if p >= 0:
                w = value(ids[p], merged)
                if w is not None:
                    push(heap, (w, p))
        out = []
        i = 0
        while i >= 0:
            out.append(ids[i])
            i = nxt[i]
        return out
