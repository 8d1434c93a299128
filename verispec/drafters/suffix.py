"""``suffix``: drafts from everything seen, the current request and a cache of earlier ones.

Where prompt lookup proposes what followed the latest occurrence of the last few tokens in
this request alone, ``suffix`` (after SuffixDecoding, Oliaro et al. 2024) looks the current
context up in two token stores at once:

- the request's own prompt and output so far (``_Local``, extended as tokens commit);
- a bounded cache of earlier requests' prompts and outputs (``SuffixCache``, one per engine
  and scope; a request's document joins it when the request ends; oldest evicted), asked
  only where the context's last KEY tokens occur in it.

Terms:

- occurrence: a position in a store right after a match of the context's last tokens;
- match length ``L`` of an occurrence: how many of the context's last tokens equal the
  tokens before it (found from an index of the last 1..``KEY`` tokens, then extended
  backwards up to ``max_match``); the occurrences of the longest match are the node of a
  suffix tree that the context reaches, and their number is the node's count;
- continuation: walking that node's occurrences forward, the token most of them continue
  with, its frequency ``count(child) / count(node)`` the estimate that it comes next; the
  proposal follows the most frequent child while the product of frequencies stays at least
  ``min_score`` (ties: the most recent occurrence wins, the request's own before the cache).

With ``branches`` > 1 (option ``suffix_branches``) the proposal is a tree: each node's
``branches`` most frequent continuations are candidates, and nodes are taken best first by
score (the product of frequencies from the root: the estimated chance that the whole path is
right) while the score is at least ``min_score``, up to k deep and ``branches`` x k nodes.
Nodes come out parents first, so the first n nodes are the best n-node tree under these
estimates. Each node carries its frequency (``Draft.frequencies``), and the governor picks
the nodes a round verifies (``verispec.tree_sizing``: the main chain as it would, and an
alternative where its chance pays for its row). The engine verifies a tree in one pass
(``verispec.accept_tree``) where the target can (``verify_tree``), else the tree's main chain.

Where neither store has anything to propose, the target's own phrases do (option
``suffix_phrases``; ``verispec.drafters.phrases``): a table, built from the target's
self-distilled answers, of what most often followed each context of 4, 3 or 2 tokens. It
drafts the generic stretches that no earlier text of the request holds ("Here are some",
list markup, the model's set phrases); the table shipped for the embedded model is used with
it by default ("auto").

Drafts are deterministic, so q is a point mass. A proposal's source is (match length bucket,
first frequency bucket, which store it rests on: the request, the cache alone, or the phrase
table): the governor keeps acceptance estimates per source, as it does for lookup's n. A match
in earlier requests alone is weaker evidence than one in the request itself (on the dev
prompts, where requests share little, such drafts were accepted less often and drafting them
cost more than the cache gave); as a source of its own, the governor drafts it where it has
been right and shadows it where not.
Proposing is a read (``pure_proposals``): a chain of k tokens is the first k of a longer one,
because the walk does not depend on k.

Chains walk in C++ where the drafting helpers built (``verispec/native/csrc/drafting.cpp``,
option ``suffix_native``): the request's document lives there and one call a round brings it up
to the context and walks, since a proposal runs with caches that the forward pass just flushed
and every Python object it touches costs a miss. The Python walks below are the reference the
C++ equals (tests/drafters/test_native_drafting.py) and run for trees and where no compiler is.

The cache never mixes scopes: the server gives each API key's requests a drafter of their own
(``scope`` option), so one key's prompts never become another key's drafts.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from verispec.drafters.base import NO_DRAFT, Draft, DrafterContext, DrafterError
from verispec.drafters.phrases import SHIPPED, PhraseTable
from verispec.sampling import SamplingParams

KEY = 3  # index keys: the last 1..KEY tokens of an occurrence
MAX_CANDIDATES = 256  # most recent occurrences of one key considered (bounds a proposal's work)
DEFAULT_MAX_MATCH = 64  # match lengths are measured up to this many tokens
# Stop the walk where the product of frequencies falls below this, and draft at most
# SPEC_FACTOR tokens per token of match (SuffixDecoding's two limits): a short match says
# little about what follows far ahead. The score floor was chosen on a greedy replay of the
# multi-turn and dev runs with a verify cost of 0.3 plain steps per drafted row (draft length
# <= match and 0.3 gave 1.20x / 1.13x the replayed steps' tokens against lookup's best 1.13x /
# 1.05x). With the kernels of the twenty-fifth increment a row costs ~0.13 steps, and the
# governor, which picks k up to the proposal's length by acceptance per source, gained from
# longer proposals: 4 tokens per matched token against 1, interleaved in the engine (tok/s):
# dev 474.0 / 465.2 and 484.5 / 481.6, multi-turn 503.3 / 495.3, edit 793.0 / 791.1; `suffix`
# at least lookup in 8 and 5 of 13 dev categories against 4 and 4 (qa and math_reasoning,
# where lookup's longer drafts paid, 0.98-0.99 of lookup against 0.87-0.97).
DEFAULT_MIN_SCORE = 0.3
DEFAULT_SPEC_FACTOR = 4.0
DEFAULT_CACHE_TOKENS = 1 << 18  # tokens of earlier requests kept (0: no cross-request cache)
SEPARATOR = -1  # between documents in a store: no match or walk crosses it
NO_DRAWS = np.random.default_rng(0)  # a generator for ``propose``, which never reads it: suffix draws nothing
# A key packs KEY tokens of 20 bits (ids of larger vocabularies may share keys: then the match
# lengths, measured on the tokens themselves, tell the occurrences apart) and n in 63 bits.
TOKEN_BITS = 20
MASK = (1 << TOKEN_BITS) - 1
MATCH_BLOCK = 8  # match lengths are measured this many tokens at a time
FEW_OCCURRENCES = 24  # up to this many, a node's continuations are counted without NumPy
# A proposal's source: the largest bucket <= its match length, and whether its first token
# followed at least SURE of the occurrences. Few sources, so the governor's estimates for
# each fill quickly (more, finer ones measured slower on the multi-turn workload).
MATCH_BUCKETS = (1, 2, 3, 4)
SURE = 0.9

Positions = NDArray[np.int64]


def _keys(tokens: NDArray[np.int64], n: int) -> NDArray[np.int64]:
    """The key of every n-gram of ``tokens`` (ending at index n-1, n, ...), as one int64 each;
    n-grams holding a separator get key -1."""
    if tokens.shape[0] < n:
        return np.zeros(0, dtype=np.int64)
    keys = np.zeros(tokens.shape[0] - n + 1, dtype=np.int64)
    bad = np.zeros(keys.shape[0], dtype=bool)
    for i in range(n):
        part = tokens[i : tokens.shape[0] - n + 1 + i]
        keys = (keys << TOKEN_BITS) | (np.where(part < 0, 0, part) & MASK)
        bad |= part < 0
    keys += n << (TOKEN_BITS * KEY)  # keys of different n never collide
    keys[bad] = -1
    return keys


def _key(tail: Sequence[int]) -> int:
    key = 0
    for token in tail:
        key = (key << TOKEN_BITS) | (int(token) & MASK)
    return key + (len(tail) << (TOKEN_BITS * KEY))


class SuffixCache:
    """Earlier requests' documents (prompt + output) in one token array, and a sorted index.

    ``tokens``: the documents, each followed by ``SEPARATOR``. The index holds, for every
    position but a document's last and n in 1..KEY, the key of the n tokens ending there,
    sorted (``_keys`` sorted, ``_next`` the position after each): an occurrence search is a
    binary search, and every occurrence it finds has a next token. A document
    is merged in when its request ends; past ``capacity`` tokens the oldest documents go (the
    array and index are cut in one pass). Thread-safe: a server's requests end on one
    thread, but an API user may run engines' requests on several.
    """

    def __init__(self, capacity: int = DEFAULT_CACHE_TOKENS) -> None:
        if capacity < 0:
            raise DrafterError(f"the suffix cache's capacity must be >= 0 tokens, got {capacity}")
        self.capacity = capacity
        self.tokens: NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._sorted_keys: NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._next: Positions = np.zeros(0, dtype=np.int64)
        self._starts: list[int] = []  # where each document starts, oldest first
        self._lock = threading.Lock()
        # (tokens, sorted keys, the position after each key's n-gram): what the C++ chain
        # searches, replaced whole under the lock at every change, so a proposal reads it in one
        # attribute read without the lock (an eviction never shifts positions under it).
        self.snapshot = (self.tokens, self._sorted_keys, self._next)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def documents(self) -> int:
        return len(self._starts)

    def add(self, document: Sequence[int]) -> None:
        """Keep ``document`` (a request's prompt and output) for later requests' drafts."""
        room = self.capacity - 1  # a document's tail that fits with its separator
        if room < 2 or len(document) < 2:
            return
        doc = np.asarray(document[len(document) - min(room, len(document)) :], dtype=np.int64)
        with self._lock:
            base = len(self)
            tokens = np.concatenate([self.tokens, doc, [SEPARATOR]])
            new_keys, new_next = [], []
            for n in range(1, KEY + 1):
                # Keys of n-grams ending in the new document (they may not reach back into the
                # previous one: its separator makes their key -1).
                window = tokens[max(0, base - n + 1) :]
                keys = _keys(window, n)
                ends = np.arange(keys.shape[0], dtype=np.int64) + max(0, base - n + 1) + n  # position after
                # An n-gram that ends a document has nothing after it to propose: not indexed.
                keep = (keys >= 0) & (ends < tokens.shape[0] - 1)
                new_keys.append(keys[keep])
                new_next.append(ends[keep])
            keys = np.concatenate(new_keys)
            follows = np.concatenate(new_next)
            order = np.argsort(keys, kind="stable")
            keys, follows = keys[order], follows[order]
            # Merge: existing entries before new ones of the same key, so each key's entries
            # stay in order of position (the most recent last).
            at = np.searchsorted(self._sorted_keys, keys, side="right")
            self._sorted_keys = np.insert(self._sorted_keys, at, keys)
            self._next = np.insert(self._next, at, follows)
            self.tokens = tokens
            self._starts.append(base)
            self._evict()
            self.snapshot = (self.tokens, self._sorted_keys, self._next)

    def clear(self) -> None:
        with self._lock:
            self.tokens = np.zeros(0, dtype=np.int64)
            self._sorted_keys = np.zeros(0, dtype=np.int64)
            self._next = np.zeros(0, dtype=np.int64)
            self._starts = []
            self.snapshot = (self.tokens, self._sorted_keys, self._next)

    def _evict(self) -> None:
        if len(self) <= self.capacity:
            return
        cut = next(s for s in self._starts if len(self) - s <= self.capacity)
        self._starts = [s - cut for s in self._starts if s >= cut]
        keep = self._next > cut  # an occurrence whose n-gram ends at or after the cut
        keep &= self._next - self._n_of_keys() >= cut
        self._sorted_keys, self._next = self._sorted_keys[keep], self._next[keep] - cut
        self.tokens = self.tokens[cut:]

    def _n_of_keys(self) -> Positions:
        return (self._sorted_keys >> (TOKEN_BITS * KEY)).astype(np.int64)

    def occurrences(self, tail: Sequence[int]) -> Positions:
        """Positions right after the most recent MAX_CANDIDATES occurrences of ``tail`` (1..KEY
        tokens) that a token follows (not a document's end), oldest first."""
        return self.find(tail)[1]

    def find(self, tail: Sequence[int]) -> tuple[NDArray[np.int64], Positions]:
        """The token array as it is now and ``occurrences(tail)`` in it, read under one lock: an
        eviction between two reads would shift the positions off the array they index. (Arrays
        are replaced, never changed in place, so the pair stays valid after the lock.)"""
        key = _key(tail)
        with self._lock:
            # Keys are integers: the entries of ``key`` end where those of ``key + 1`` would start.
            lo, hi = self._sorted_keys.searchsorted((key, key + 1)).tolist()
            return self.tokens, self._next[max(lo, hi - MAX_CANDIDATES) : hi]


class _Local:
    """The current request's prompt and output: a token array that grows, and a dict index
    from the last 1..KEY tokens to the positions after them (oldest first)."""

    def __init__(self) -> None:
        self.buffer: NDArray[np.int64] = np.zeros(256, dtype=np.int64)
        self.size = 0
        self.ids: list[int] = []  # the same tokens, for the index's keys
        self.index: dict[tuple[int, ...], list[int]] = {}

    @property
    def tokens(self) -> NDArray[np.int64]:
        return self.buffer[: self.size]

    def extend(self, new_tokens: Sequence[int]) -> None:
        ids = self.ids
        for token in new_tokens:
            end = self.size
            for n in range(1, min(KEY, end) + 1):
                positions = self.index.setdefault(tuple(ids[end - n : end]), [])
                positions.append(end)
                if len(positions) > 2 * MAX_CANDIDATES:
                    del positions[:-MAX_CANDIDATES]
            if end == self.buffer.shape[0]:
                self.buffer = np.concatenate([self.buffer, np.zeros_like(self.buffer)])
            self.buffer[end] = int(token)
            ids.append(int(token))
            self.size = end + 1

    def occurrences(self, tail: tuple[int, ...]) -> Positions:
        return np.asarray(self.index.get(tail, ())[-MAX_CANDIDATES:], dtype=np.int64)


class _NativeLocal:
    """The request's document held in C++ (``core.Suffix``, what the C++ walks read), with
    ``_Local``'s attributes as copies (for reports and tests) and no index."""

    def __init__(self, state: Any) -> None:
        self.state = state
        state.clear()

    @property
    def size(self) -> int:
        return int(self.state.size)

    @property
    def tokens(self) -> NDArray[np.int64]:
        return np.asarray(self.state.tokens())

    @property
    def ids(self) -> list[int]:
        return list(self.tokens.tolist())

    def extend(self, new_tokens: Sequence[int]) -> None:
        self.state.extend(new_tokens)


@dataclass(frozen=True)
class Walk:
    """A proposal and what it rests on: its tokens (a tree's nodes, parents first), the match
    length, the node's count, each token's frequency among the occurrences that reached its
    parent, and ``parents`` (-1: the pending token; a chain's are -1, 0, 1, ...)."""

    tokens: list[int]
    match: int
    count: int
    frequencies: list[float]
    parents: list[int] = field(default_factory=list)
    cached_only: bool = False  # the node's occurrences are all in the cache, none in the request
    phrases: bool = False  # drafted from the phrase table (``match``: its context length)

    @property
    def scores(self) -> list[float]:
        """Each node's estimated chance that its whole path is right: the product of the
        frequencies from the root to it."""
        out: list[float] = []
        for frequency, parent in zip(self.frequencies, self.parents, strict=True):
            out.append(frequency * (out[parent] if parent >= 0 else 1.0))
        return out


def match_lengths(store: NDArray[np.int64], positions: Positions, context: NDArray[np.int64], limit: int) -> Positions:
    """For each position, how many of ``context``'s last tokens equal the tokens right
    before it in ``store`` (at most ``limit``); separators never match. A few positions (the
    usual case) are compared in Python, many with NumPy: the same lengths (tested)."""
    if positions.shape[0] <= FEW_OCCURRENCES:
        return _few_match_lengths(store, positions, context, limit)
    return _many_match_lengths(store, positions, context, limit)


def _few_match_lengths(
    store: NDArray[np.int64], positions: Positions, context: NDArray[np.int64], limit: int
) -> Positions:
    limit = min(limit, context.shape[0])
    backwards = context[context.shape[0] - limit :].tolist()[::-1]
    return np.asarray(
        [_match_before(store[max(0, p - limit) : p].tolist(), backwards) for p in positions.tolist()], dtype=np.int64
    )


def _match_before(before: list[int], backwards: list[int]) -> int:
    """How many of ``backwards`` (the context's last tokens, the last first) equal the last
    tokens of ``before`` (the store's tokens up to an occurrence, in order)."""
    before = before[::-1]
    n, size = 0, min(len(before), len(backwards))  # the shorter one bounds the match
    # Whole blocks compared as lists first (matches run long where text is copied).
    while n < size and before[n : n + MATCH_BLOCK] == backwards[n : n + MATCH_BLOCK]:
        n += MATCH_BLOCK
    n = min(n, size)
    while n < size and before[n] == backwards[n]:
        n += 1
    return n


def _many_match_lengths(
    store: NDArray[np.int64], positions: Positions, context: NDArray[np.int64], limit: int
) -> Positions:
    """Compared in blocks of ``MATCH_BLOCK`` tokens, the candidates still matching carried to
    the next block."""
    lengths = np.zeros(positions.shape[0], dtype=np.int64)
    alive = np.arange(positions.shape[0])
    limit = min(limit, context.shape[0])
    for first in range(1, limit + 1, MATCH_BLOCK):
        back = np.arange(first, min(first + MATCH_BLOCK, limit + 1))  # tokens back from the end
        at = positions[alive, None] - back[None, :]
        same = (at >= 0) & (store[np.maximum(at, 0)] == context[-back][None, :])
        run = np.cumprod(same, axis=1).sum(axis=1)  # leading matches in this block
        lengths[alive] += run
        alive = alive[run == back.shape[0]]
        if not alive.shape[0]:
            break
    return lengths


Stores = list[tuple[NDArray[np.int64], Positions]]


def _continuations(stores: Stores, branches: int) -> tuple[int, list[tuple[int, int, Stores]]]:
    """The tokens that follow the occurrences (positions point at the next token), the most
    frequent ``branches`` of them with their counts and their occurrences one token further,
    most frequent first (ties: the most recent occurrence, the request's own store last in
    ``stores`` and so first); and how many occurrences have a next token at all.

    A few occurrences (a deep match's usual case) are counted in Python, many with NumPy: the
    same result (tested), at a tenth of the cost where array calls would dominate."""
    if sum(int(positions.shape[0]) for _, positions in stores) <= FEW_OCCURRENCES:
        return _few_continuations(stores, branches)
    return _many_continuations(stores, branches)


def _few_continuations(stores: Stores, branches: int) -> tuple[int, list[tuple[int, int, Stores]]]:
    counts: dict[int, int] = {}
    latest: dict[int, int] = {}
    following: list[list[int]] = []
    for rank, (store, positions) in enumerate(stores):
        size = store.shape[0]
        nexts = [int(store[p]) if p < size else SEPARATOR for p in positions.tolist()]
        following.append(nexts)
        for p, token in zip(positions.tolist(), nexts, strict=True):
            if token >= 0:
                counts[token] = counts.get(token, 0) + 1
                latest[token] = max(latest.get(token, -1), rank * (1 << 40) + p)
    order = sorted(counts, key=lambda t: (-counts[t], -latest[t]))[:branches]
    children = []
    for token in order:
        advanced = []
        for (store, positions), nexts in zip(stores, following, strict=True):
            kept = [p + 1 for p, t in zip(positions.tolist(), nexts, strict=True) if t == token]
            if kept:
                advanced.append((store, np.asarray(kept, dtype=np.int64)))
        children.append((token, counts[token], advanced))
    return sum(counts.values()), children


def _many_continuations(stores: Stores, branches: int) -> tuple[int, list[tuple[int, int, Stores]]]:
    nexts, recency = [], []
    for rank, (store, positions) in enumerate(stores):
        inside = positions < store.shape[0]
        following = np.full(positions.shape[0], SEPARATOR, dtype=np.int64)
        following[inside] = store[positions[inside]]
        nexts.append(following)
        recency.append(rank * (1 << 40) + positions)
    following = np.concatenate(nexts) if nexts else np.zeros(0, dtype=np.int64)
    alive = following >= 0
    if not alive.any():
        return 0, []
    values, counts = np.unique(following[alive], return_counts=True)
    ranked = np.concatenate(recency)[alive]
    latest = np.full(values.shape[0], -1, dtype=np.int64)
    np.maximum.at(latest, np.searchsorted(values, following[alive]), ranked)
    order = np.lexsort((-latest, -counts))[:branches]  # count first, then recency, both descending
    children = []
    for i in order.tolist():
        token = int(values[i])
        advanced = [(store, positions[nxt == token] + 1) for (store, positions), nxt in zip(stores, nexts, strict=True)]
        children.append((token, int(counts[i]), [(st, p) for st, p in advanced if p.shape[0]]))
    return int(alive.sum()), children


def walk(stores: Stores, k: int, min_score: float, match: int, branches: int = 1, nodes: int = 0) -> Walk:
    """Grow a draft from the occurrences ``positions`` (each pointing at the token after a
    match) in each store (the request's own last: it wins ties): up to ``k`` tokens deep and
    ``nodes`` nodes (default k), best first by score (the product of frequencies from the
    root), each node's ``branches`` most frequent continuations its candidates, none scoring
    below ``min_score``. With one branch this is the chain of most frequent continuations; with
    more, the nodes come out parents first, so any first n of them are a tree (the best n-node
    tree under these estimates)."""
    budget = max(nodes, k)
    count = sum(int(p.shape[0]) for _, p in stores)
    found = Walk([], match, count, [], [])
    depth: list[int] = []  # of each node taken, 1 for the root's children
    live = [(store, positions) for store, positions in stores if positions.shape[0]]
    heap: list[tuple[float, int, int, int, float, Stores]] = []  # (-score, order, parent, token, frequency, stores)
    pushed = 0

    def expand(parent: int, score: float, node_stores: Stores) -> None:
        nonlocal pushed
        if parent >= 0 and depth[parent] >= k:
            return
        total, children = _continuations(node_stores, branches)
        for token, child_count, advanced in children:
            frequency = child_count / total
            if score * frequency >= min_score:
                heapq.heappush(heap, (-score * frequency, pushed, parent, token, frequency, advanced))
                pushed += 1

    expand(-1, 1.0, live)
    while heap and len(found.tokens) < budget:
        negative, _, parent, token, frequency, advanced = heapq.heappop(heap)
        found.tokens.append(token)
        found.frequencies.append(frequency)
        found.parents.append(parent)
        depth.append(1 if parent < 0 else depth[parent] + 1)
        if not heap and len(advanced) == 1 and advanced[0][1].shape[0] == 1:
            # One occurrence and no other candidate: the rest is what followed it, each token
            # with frequency 1, as expanding node by node would give (a slice, not k calls).
            store, (start,) = advanced[0][0], advanced[0][1].tolist()
            rest = store[start : start + min(k - depth[-1], budget - len(found.tokens))].tolist()
            rest = rest[: rest.index(SEPARATOR)] if SEPARATOR in rest else rest
            for token in rest:
                _grow(found, int(token), 1.0)
                depth.append(depth[-1] + 1)
            break
        expand(len(found.tokens) - 1, -negative, advanced)
    return found


def chain(stores: Stores, k: int, min_score: float, match: int) -> Walk:
    """``walk`` with one branch (the chain of most frequent continuations), the same walk at a
    fraction of the cost: once FEW_OCCURRENCES or fewer occurrences are left, each one's next
    tokens are read as a list at once and the counting is done on them, instead of a call
    (and a re-slicing of the occurrences) per token."""
    count = sum(int(p.shape[0]) for _, p in stores)
    found = Walk([], match, count, [], [])
    live = [(rank, store, positions) for rank, (store, positions) in enumerate(stores) if positions.shape[0]]
    ranks = {id(store): rank for rank, store, _ in live}  # a store keeps its rank as others drop out
    score = 1.0
    while len(found.tokens) < k and sum(int(p.shape[0]) for _, _, p in live) > FEW_OCCURRENCES:
        total, children = _many_continuations([(store, positions) for _, store, positions in live], 1)
        if not children or score * (children[0][1] / total) < min_score:  # as _follow_runs rounds it
            return found
        token, child_count, advanced = children[0]
        score *= child_count / total
        _grow(found, token, child_count / total)
        live = [(ranks[id(store)], store, positions) for store, positions in advanced]
    left = k - len(found.tokens)
    runs = [
        ((rank << 40) + p, store[p : p + left].tolist()) for rank, store, positions in live for p in positions.tolist()
    ]
    _follow_runs(found, runs, left, score, min_score)
    return found


def _follow_runs(found: Walk, runs: list[tuple[int, list[int]]], left: int, score: float, min_score: float) -> None:
    """Grow a chain's walk (its score so far ``score``) by up to ``left`` tokens from
    ``runs``: (recency, what followed an occurrence of the node, up to ``left`` tokens; a
    separator ends it). Ties go to the most recent occurrence, the request's own store before
    the cache's (its recency ranks above any of the cache's)."""
    if len(runs) == 1:  # one occurrence: what followed it, each token with frequency 1
        run = runs[0][1]
        for token in run[: run.index(SEPARATOR)] if SEPARATOR in run else run:
            _grow(found, token, 1.0)
        return
    for depth in range(left):
        counts: dict[int, int] = {}
        latest: dict[int, int] = {}
        for recency, run in runs:
            if depth < len(run) and (token := run[depth]) >= 0:
                counts[token] = counts.get(token, 0) + 1
                if recency > latest.get(token, -1):
                    latest[token] = recency
        if not counts:
            break
        token = max(counts, key=lambda t: (counts[t], latest[t]))
        frequency = counts[token] / sum(counts.values())
        if score * frequency < min_score:
            break
        score *= frequency
        _grow(found, token, frequency)
        runs = [(recency, run) for recency, run in runs if depth < len(run) and run[depth] == token]


def _grow(found: Walk, token: int, frequency: float) -> None:
    """Append a token to a chain's walk (its parent the token before)."""
    found.parents.append(len(found.tokens) - 1)
    found.tokens.append(token)
    found.frequencies.append(frequency)


REQUEST, CACHE, PHRASES = 0, 1, 2  # which store a proposal rests on (``source_of``)


def source_of(found: Walk) -> tuple[int, int, int]:
    """The governor's key for a proposal: (match bucket, 1 if its first token is near sure,
    the store it rests on: REQUEST (the request's own, the cache's beside it or not), CACHE
    (the cache alone) or PHRASES)."""
    first = found.frequencies[0] if found.frequencies else 0.0
    return _source(found.match, first, PHRASES if found.phrases else CACHE if found.cached_only else REQUEST)


# The bucket of each match length up to the last bucket's: the largest bucket <= it (0 as 1).
_BUCKET_OF = [max(b for b in MATCH_BUCKETS if b <= max(1, m)) for m in range(MATCH_BUCKETS[-1] + 1)]


def _source(match: int, first: float, store: int) -> tuple[int, int, int]:
    return _BUCKET_OF[min(match, MATCH_BUCKETS[-1])], int(first >= SURE), store


class SuffixDrafter:
    name = "suffix"
    hidden_capture = None
    pure_proposals = True  # a read of the stores; see drafters.base

    def __init__(
        self,
        cache: SuffixCache | None = None,
        *,
        max_match: int = DEFAULT_MAX_MATCH,
        min_score: float = DEFAULT_MIN_SCORE,
        branches: int = 1,
        spec_factor: float = DEFAULT_SPEC_FACTOR,
        phrases: PhraseTable | None = None,
        native: bool | None = None,
    ) -> None:
        """``native``: walk chains with the C++ helpers (True: required, an error where they
        did not build; None: where they built; False: the Python walks, the reference)."""
        if isinstance(max_match, bool) or not isinstance(max_match, int) or max_match < 1:
            raise DrafterError(f"suffix needs max_match >= 1, got {max_match!r}")
        if not 0.0 <= min_score <= 1.0:
            raise DrafterError(f"suffix needs min_score in [0, 1], got {min_score!r}")
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise DrafterError(f"suffix needs branches >= 1 (1: chains), got {branches!r}")
        if not spec_factor > 0:
            raise DrafterError(f"suffix needs spec_factor > 0 (draft tokens per matched token), got {spec_factor!r}")
        self.spec_factor = spec_factor
        self.cache = cache if cache is not None else SuffixCache()
        self.phrases = phrases  # read-only, shared by forks
        self.max_match, self.min_score, self.branches = max_match, min_score, branches
        self.core = _core(native)
        # The C++ helpers walk chains (a tree walks in Python), with the table's hash tables.
        self.native_chains = self.core is not None and branches == 1
        self.phrase_index = phrases.native_index() if phrases is not None and self.core is not None else None
        self.state = None  # the request in C++ (native chains)
        self._cache_seen: object = None  # the cache snapshot ``state`` reads
        if self.native_chains:
            self.state = self.core.Suffix(
                min_score, max_match, spec_factor, KEY, MAX_CANDIDATES, TOKEN_BITS, self.phrase_index
            )
        self.local: _Local | _NativeLocal = self._new_local()
        self._last: Walk | tuple[list[int], list[float], int, int, int] | None = None

    @property
    def last(self) -> Walk | None:
        """The latest proposal's walk (for tests and reports)."""
        if isinstance(self._last, tuple):  # the C++ chain's (tokens, frequencies, match, count, store)
            tokens, frequencies, match, count, store = self._last
            parents = list(range(-1, len(tokens) - 1))
            self._last = Walk(tokens, match, count, frequencies, parents, store == CACHE, store == PHRASES)
        return self._last

    def fork(self, target: object) -> SuffixDrafter:
        """A drafter for another request at the same time: its own document, the same cache."""
        return SuffixDrafter(
            self.cache,
            max_match=self.max_match,
            min_score=self.min_score,
            branches=self.branches,
            spec_factor=self.spec_factor,
            phrases=self.phrases,
            native=self.core is not None,
        )

    def _new_local(self) -> _Local | _NativeLocal:
        return _NativeLocal(self.state) if self.state is not None else _Local()

    def reset(self) -> None:
        """The request ended (or a new one begins): its document joins the cache."""
        if self.local.size:
            self.cache.add(self.local.tokens.tolist())
        self.local = self._new_local()

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.reset()
        self.local.extend(prompt_ids)

    def propose(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft:
        if self.state is not None:
            return self._native_propose(context, k)
        self._sync(context)
        if k <= 0 or self.local.size == 0:
            return NO_DRAFT
        found = self.search(k)
        if not found.tokens and self.phrases is not None:
            found = self.phrase_walk(k)
        self._last = found
        if not found.tokens:
            return NO_DRAFT
        parents = found.parents if self.branches > 1 else None
        return Draft(found.tokens, source=source_of(found), parents=parents, frequencies=found.frequencies)

    def propose_after(self, context: Sequence[int], extra: Sequence[int], k: int) -> Draft:
        """``propose`` on the context followed by ``extra``, tokens another drafter drafted and
        nothing has committed yet: the chain that would follow them (a pure read; the document
        stays the context's, ``last`` is this walk)."""
        if self.state is not None:
            return self._native_draft(self._native_state().propose_after(context, extra, k))
        # The Python walks index their document as it grows: walk a document extended by the
        # draft, then start the context's over (a fallback, O(context) a call).
        draft = self.propose([*context, *extra], k, NO_DRAWS)
        walk = self._last
        self._sync(context)
        self._last = walk
        return draft

    def _native_propose(self, context: Sequence[int], k: int) -> Draft:
        """``propose`` in one C++ call (``csrc/drafting.cpp``: the document brought up to the
        context, the chain, the phrase table's fallback). A proposal runs between passes that
        flush the caches, and each Python object it touches is a miss: this path builds only the
        Draft."""
        return self._native_draft(self._native_state().propose(context, k))

    def _native_draft(self, found: tuple[list[int], list[float], int, int, int] | None) -> Draft:
        """The Draft of a C++ chain (None: k <= 0 or nothing read yet); ``last`` is its walk."""
        if found is None:
            return NO_DRAFT
        self._last = found
        drafted, frequencies, match, _, store = found
        if not drafted:
            return NO_DRAFT
        return Draft(drafted, source=_source(match, frequencies[0], store), frequencies=frequencies)

    def search(self, k: int) -> Walk:
        """The walk from the deepest node the context reaches in either store.

        The usual case, FEW_OCCURRENCES or fewer occurrences of the context's last tokens,
        runs on lists: a proposal is asked for every round, next to a step of a few
        milliseconds, and array calls on a handful of positions would cost most of it. Chains
        walk in C++ where the helpers built (``native_search``): the same walk."""
        if self.native_chains:
            return self.native_search(k)
        local = self.local
        assert isinstance(local, _Local)
        ids, size = local.ids, local.size
        store, cached, own = self.cache.tokens, np.zeros(0, dtype=np.int64), []
        for n in range(min(KEY, size), 0, -1):
            tail = tuple(ids[size - n :])
            own = local.index.get(tail, [])[-MAX_CANDIDATES:]  # each followed by a token
            # The cache is asked for the longest key only: a match of one or two tokens in
            # other requests is weak evidence, and a short key's many occurrences there are
            # what made proposals dear (dev prompts: 0.14 ms a round with them, 0.08 without).
            # (Below KEY, ``cached`` is the longest key's: empty, or the loop would have ended.)
            if n == KEY and len(self.cache):
                store, cached = self.cache.find(tail)
            if own or cached.shape[0]:
                break
        else:
            return Walk([], 0, 0, [])
        if len(own) + cached.shape[0] > FEW_OCCURRENCES or self.branches > 1:
            return self._search_arrays(k, n, [(store, cached), (local.tokens, np.asarray(own, dtype=np.int64))])
        cached_list = cached.tolist()
        # An occurrence matching n + 1 tokens would be one of the n + 1 tokens' key, which has
        # none: below KEY, every occurrence matches exactly n tokens (at most max_match).
        if n < KEY:
            deepest = min(n, self.max_match)
            cached_lengths, own_lengths = [deepest] * len(cached_list), [deepest] * len(own)
        else:
            limit = min(self.max_match, size)
            backwards = ids[size - limit :][::-1]
            cached_lengths = [_match_before(store[max(0, p - limit) : p].tolist(), backwards) for p in cached_list]
            own_lengths = [_match_before(ids[max(0, p - limit) : p], backwards) for p in own]
            deepest = max(cached_lengths + own_lengths)
        depth = min(k, max(1, int(self.spec_factor * deepest)))
        # The request's own occurrences rank above the cache's on ties (``_follow_runs``).
        runs = [
            (p, store[p : p + depth].tolist())
            for p, length in zip(cached_list, cached_lengths, strict=True)
            if length >= deepest
        ]
        runs += [
            ((1 << 40) + p, ids[p : p + depth]) for p, length in zip(own, own_lengths, strict=True) if length >= deepest
        ]
        cached_only = not any(length >= deepest for length in own_lengths)
        found = Walk([], deepest, len(runs), [], [], cached_only)
        _follow_runs(found, runs, depth, 1.0, self.min_score)
        return found

    def _native_state(self) -> Any:
        """``state``, reading the cache's current arrays."""
        assert self.state is not None
        snapshot = self.cache.snapshot
        if snapshot is not self._cache_seen:  # a request ended: the cache's arrays were replaced
            self.state.set_cache(*snapshot)
            self._cache_seen = snapshot
        return self.state

    def native_search(self, k: int) -> Walk:
        """``search`` for a chain, in C++ (``csrc/drafting.cpp``)."""
        drafted, frequencies, match, count, store = self._native_state().search(k)
        return Walk(drafted, match, count, frequencies, list(range(-1, len(drafted) - 1)), store == CACHE)

    def phrase_walk(self, k: int) -> Walk:
        """The phrase table's chain after the context (``match``: the context length its first
        token rested on; ``count`` 0: the table keeps no occurrences). The Python walks' (the
        C++ ``propose`` falls back to the table itself)."""
        assert self.phrases is not None and isinstance(self.local, _Local)
        if self.phrase_index is not None:
            tokens, frequencies, order = self.phrase_index.chain(self.local.buffer, self.local.size, k, self.min_score)
        else:
            tokens, frequencies, order = self.phrases.chain(self.local.ids, k, self.min_score)
        return Walk(tokens, order, 0, frequencies, list(range(-1, len(tokens) - 1)), phrases=True)

    def _search_arrays(self, k: int, n: int, found: Stores) -> Walk:
        """``search`` for many occurrences (or a tree), on arrays: ``found`` holds each store
        with the occurrences of the longest key (``n`` tokens) that has any, the request's own
        store last."""
        context = self.local.tokens
        if n < KEY:
            lengths = [np.full(positions.shape[0], min(n, self.max_match)) for _, positions in found]
        else:
            lengths = [match_lengths(store, positions, context, self.max_match) for store, positions in found]
        deepest = max(int(each.max()) for each in lengths if each.shape[0])
        node = [(store, at[each >= deepest]) for (store, at), each in zip(found, lengths, strict=True)]
        cached_only = not node[-1][1].shape[0]  # the request's own store is the last
        node = [(store, at) for store, at in node if at.shape[0]]
        limit = min(k, max(1, int(self.spec_factor * deepest)))
        if self.branches == 1:
            found_walk = chain(node, limit, self.min_score, deepest)
        else:
            # A tree may hold up to ``branches`` nodes per position of depth: which of them a
            # round verifies is the governor's choice (``verispec.tree_sizing``).
            found_walk = walk(node, limit, self.min_score, deepest, self.branches, limit * self.branches)
        return dataclasses.replace(found_walk, cached_only=cached_only)

    def observe(self, context: Sequence[int], accepted: int) -> None:
        self._sync(context)

    def _sync(self, context: Sequence[int]) -> None:
        if self.state is not None:
            self.state.sync(context)
            return
        local = self.local
        known = local.size
        if len(context) >= known and (known == 0 or context[known - 1] == local.ids[-1]):
            local.extend(context[known:])
        else:  # not an extension of what we hold: start the document over (nothing cached)
            self.local = self._new_local()
            self.local.extend(context)


def native_choice(option: object) -> bool | None:
    """The ``suffix_native`` option: "auto" (the C++ walks where they built: None), "on" (always;
    an error where they did not build: True) or "off" (the Python walks: False)."""
    for text, choice in (("auto", None), ("on", True), ("off", False)):
        if option == text or (choice is not None and option is choice):
            return choice
    raise DrafterError(f"suffix_native is auto, on or off, got {option!r}")


def _core(native: bool | None) -> Any:
    """The C++ drafting helpers as ``native`` asks (see ``SuffixDrafter``), or None."""
    if native not in (None, True, False):
        raise DrafterError(f"suffix_native is auto, on or off, got {native!r}")
    if native is False:
        return None
    from verispec.native import kernels

    module = kernels.load_drafting()
    if module is None and native:
        reason = kernels.drafting_error() or "VERISPEC_NATIVE_DRAFTING=0"
        raise DrafterError(f"suffix: the C++ drafting helpers are not available ({reason})")
    return module


def _build(context: DrafterContext) -> SuffixDrafter:
    tokens = context.option("suffix_cache_tokens", DEFAULT_CACHE_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise DrafterError(f"suffix_cache_tokens must be an integer >= 0, got {tokens!r}")
    return SuffixDrafter(
        SuffixCache(tokens),
        max_match=context.option("suffix_max_match", DEFAULT_MAX_MATCH),
        min_score=context.option("suffix_min_score", DEFAULT_MIN_SCORE),
        branches=context.option("suffix_branches", 1),
        spec_factor=context.option("suffix_spec_factor", DEFAULT_SPEC_FACTOR),
        phrases=phrase_table(context.option("suffix_phrases", "auto"), context.target),
        native=native_choice(context.option("suffix_native", "auto")),
    )


def phrase_table(option: object, target: object) -> PhraseTable | None:
    """The ``suffix_phrases`` option: "auto" (the table shipped for the embedded model, where
    ``target`` is it: the same name and vocabulary size), "off", or a table file's path (its
    ids checked against the target's vocabulary)."""
    if not isinstance(option, str | Path) or not str(option):
        raise DrafterError(f'suffix_phrases is "auto", "off" or a phrase table file, got {option!r}')
    vocab_size = getattr(target, "vocab_size", None)
    if option == "off":
        return None
    if option == "auto":
        if not SHIPPED.is_file():
            return None
        table = _load(SHIPPED)
        made_for = table.header.get("target", {})
        same = made_for.get("name") == getattr(target, "name", None) and made_for.get("vocab_size") == vocab_size
        return table if same else None
    path = Path(option).expanduser()
    if not path.is_file():
        raise DrafterError(f'suffix_phrases: no phrase table at {path} (build one with "verispec train-data phrases")')
    table = _load(path.resolve())
    if isinstance(vocab_size, int):
        table.check_vocabulary(vocab_size)
    return table


@functools.cache
def _load(path: Path) -> PhraseTable:
    """One copy per file and process: a table is read-only, and every scope's drafter shares it."""
    return PhraseTable.load(path)
