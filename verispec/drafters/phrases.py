"""The target's own phrases: what most often followed each short context in its answers.

A retrieval datastore in the manner of REST (He et al. 2024), shrunk to a table: built from
the target's self-distilled answers (``verispec train-data`` directories, the data the trained
drafters learn from; never benchmark prompts), it holds for every context of n tokens
(n in ``orders``, longest first) that occurred at least ``min_count`` times:

- the continuation: the token that followed the context most often (ties: the lower id);
- its count and the context's total, so ``count / total`` is the frequency with which the
  target continued that context that way.

``chain`` drafts from it: the longest order whose context the table holds gives the next
token; the walk goes on from the context grown by that token while the product of
frequencies stays at least ``min_score`` (the suffix drafter's limit). It is a read of sorted
arrays: a few microseconds a token, so the suffix drafter asks it wherever the request and
its cache of earlier requests have nothing to propose (see ``verispec.drafters.suffix``).

Contexts are keyed by a 64-bit hash of (n, the n tokens); two contexts that collide share an
entry. Drafts are only proposals, verified by the exact rule, so a collision costs at most a
rejected row, never a wrong token.

A table is saved as ``.npz`` (arrays only, loaded without pickle) with a JSON header: the
target it was built for (name, vocabulary size, weights fingerprint), the orders, min_count
and what it was built from.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from verispec.drafters.base import DrafterError

FORMAT = "verispec-phrases"
VERSION = 1
DEFAULT_ORDERS = (4, 3, 2)
# A context seen once says little of what comes next in another text.
DEFAULT_MIN_COUNT = 2
SHIPPED = Path(__file__).parent / "weights" / "phrases" / "table.npz"
_MULTIPLIER = 0x9E3779B97F4A7C15  # odd: the hash's step is a bijection of 64-bit words
_MASK = (1 << 64) - 1


def context_key(tokens: Sequence[int]) -> int:
    """The table's key of a context (as ``_context_keys`` computes it for arrays)."""
    key = len(tokens)
    for token in tokens:
        key = (key * _MULTIPLIER + int(token) + 1) & _MASK
    return key


def _context_keys(tokens: NDArray[np.int64], n: int) -> tuple[NDArray[np.uint64], NDArray[np.bool_]]:
    """The key of every context of n tokens in ``tokens`` (the i-th ends at index n - 1 + i),
    and which of them hold a document separator (negative id)."""
    count = max(0, tokens.shape[0] - n + 1)
    keys = np.full(count, n, dtype=np.uint64)
    broken = np.zeros(count, dtype=bool)
    for i in range(n):
        part = tokens[i : i + count]
        keys = keys * np.uint64(_MULTIPLIER) + (part + 1).astype(np.uint64)  # wraps mod 2^64
        broken |= part < 0
    return keys, broken


@dataclass
class Order:
    """The entries of one context length, sorted by key."""

    keys: NDArray[np.uint64]
    tokens: NDArray[np.int32]
    counts: NDArray[np.uint32]
    totals: NDArray[np.uint32]

    def find(self, key: int) -> int:
        """The entry of ``key``, or -1."""
        at = int(np.searchsorted(self.keys, np.uint64(key)))
        return at if at < self.keys.shape[0] and int(self.keys[at]) == key else -1


@dataclass
class PhraseTable:
    """Continuations per context length (``orders``, longest first); ``header``: what it is for
    and from (``target``: name, vocab_size, weights_sha256; ``built_from``)."""

    orders: dict[int, Order]
    header: dict[str, Any] = field(default_factory=dict)
    _native: Any = field(default=None, init=False, repr=False, compare=False)
    _native_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    @property
    def longest(self) -> int:
        return max(self.orders)

    def __len__(self) -> int:
        return sum(order.keys.shape[0] for order in self.orders.values())

    @classmethod
    def build(
        cls,
        documents: Iterable[Sequence[int]],
        orders: Sequence[int] = DEFAULT_ORDERS,
        min_count: int = DEFAULT_MIN_COUNT,
        header: dict[str, Any] | None = None,
    ) -> PhraseTable:
        """The table of ``documents`` (token id sequences; no context crosses from one to the
        next) for contexts of each length in ``orders``, kept where seen ``min_count`` times."""
        if not orders or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in orders):
            raise DrafterError(f"phrase orders are context lengths >= 1, got {list(orders)}")
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise DrafterError(f"min_count must be an integer >= 1, got {min_count!r}")
        parts: list[NDArray[np.int64]] = []
        for document in documents:
            ids = np.asarray(document, dtype=np.int64)
            if ids.ndim != 1 or (ids.shape[0] and int(ids.min()) < 0):
                raise DrafterError("a document is a flat sequence of token ids >= 0")
            parts += [ids, np.full(1, -1, dtype=np.int64)]
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        built = {n: _order(tokens, n, min_count) for n in sorted(set(orders), reverse=True)}
        info = dict(header or {})
        info.update(
            format=FORMAT,
            version=VERSION,
            orders=sorted(built, reverse=True),
            min_count=min_count,
            documents=len(parts) // 2,
            tokens=int(tokens.shape[0]) - len(parts) // 2,
            max_token=int(tokens.max()) if tokens.shape[0] else -1,
        )
        return cls(built, info)

    def next(self, context: Sequence[int]) -> tuple[int, float, int] | None:
        """(token, frequency, n) of the longest context of ``context``'s last tokens that the
        table holds; None where it holds none."""
        for n, order in self.orders.items():  # longest first
            if len(context) < n:
                continue
            at = order.find(context_key(context[len(context) - n :]))
            if at >= 0:
                return int(order.tokens[at]), int(order.counts[at]) / int(order.totals[at]), n
        return None

    def chain(self, context: Sequence[int], k: int, min_score: float) -> tuple[list[int], list[float], int]:
        """Up to ``k`` tokens to follow ``context``, each the table's continuation of what came
        before it, while the product of their frequencies is at least ``min_score``; with each
        token's frequency, and the context length the first one rested on (0: none)."""
        tail = list(context[max(0, len(context) - self.longest) :])
        tokens: list[int] = []
        frequencies: list[float] = []
        first, score = 0, 1.0
        while len(tokens) < k:
            found = self.next(tail)
            if found is None or score * found[1] < min_score:
                break
            token, frequency, n = found
            score *= frequency
            tokens.append(token)
            frequencies.append(frequency)
            first = first or n
            tail = [*tail, token][-self.longest :]
        return tokens, frequencies, first

    def native_index(self) -> Any:
        """The table as hash tables in C++ (``csrc/drafting.cpp``: ``chain(doc, size, k,
        min_score)`` gives ``chain``'s result after the first ``size`` ids of the int64 array
        ``doc``), built on first use and kept; None where the drafting helpers did not build."""
        with self._native_lock:
            if self._native is None:
                from verispec.native import kernels

                module = kernels.load_drafting()
                if module is None:
                    return None
                parts = [(n, o.keys, o.tokens, o.counts, o.totals) for n, o in self.orders.items()]
                self._native = module.Phrases(parts)
            return self._native

    def check_vocabulary(self, vocab_size: int) -> None:
        """``DrafterError`` where the table proposes ids the target does not have."""
        largest = int(self.header.get("max_token", -1))
        if largest >= vocab_size:
            raise DrafterError(
                f"the phrase table holds token id {largest}, beyond the target's vocabulary of {vocab_size}: "
                "it was built for another tokenizer"
            )

    def save(self, path: Path) -> None:
        arrays: dict[str, NDArray[Any]] = {"header": np.frombuffer(json.dumps(self.header).encode(), dtype=np.uint8)}
        for n, order in self.orders.items():
            for name in ("keys", "tokens", "counts", "totals"):
                arrays[f"{name}_{n}"] = getattr(order, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            np.savez_compressed(handle, **arrays)  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: Path) -> PhraseTable:
        try:
            with np.load(path, allow_pickle=False) as stored:
                arrays = {name: stored[name] for name in stored.files}
            header = json.loads(arrays.pop("header").tobytes().decode())
        except (OSError, ValueError, KeyError) as error:
            raise DrafterError(f"cannot read a phrase table from {path}: {error}") from error
        if header.get("format") != FORMAT or header.get("version") != VERSION:
            raise DrafterError(f"{path} is not a {FORMAT} table of version {VERSION}")
        try:
            orders = {
                int(n): Order(
                    arrays[f"keys_{n}"].astype(np.uint64),
                    arrays[f"tokens_{n}"].astype(np.int32),
                    arrays[f"counts_{n}"].astype(np.uint32),
                    arrays[f"totals_{n}"].astype(np.uint32),
                )
                for n in header["orders"]
            }
        except KeyError as error:
            raise DrafterError(f"{path} lacks the arrays of its orders: {error}") from error
        return cls(dict(sorted(orders.items(), reverse=True)), header)


def _order(tokens: NDArray[np.int64], n: int, min_count: int) -> Order:
    """The entries for contexts of ``n`` tokens: every context followed by a token (neither
    crossing a separator), grouped by (context, next token), the most frequent kept."""
    empty = Order(np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.uint32), np.zeros(0, np.uint32))
    if tokens.shape[0] <= n:
        return empty
    keys, broken = _context_keys(tokens[:-1], n)
    following = tokens[n:]
    valid = ~broken & (following >= 0)
    keys, following = keys[valid], following[valid]
    if not keys.shape[0]:
        return empty
    ranked = np.lexsort((following, keys))
    keys, following = keys[ranked], following[ranked]
    # Runs of one (context, next token) pair, then groups of one context.
    pair_starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (following[1:] != following[:-1])])
    pair_counts = np.diff(np.r_[pair_starts, keys.shape[0]])
    pair_keys, pair_tokens = keys[pair_starts], following[pair_starts]
    group_starts = np.flatnonzero(np.r_[True, pair_keys[1:] != pair_keys[:-1]])
    totals = np.add.reduceat(pair_counts, group_starts)
    best = np.maximum.reduceat(pair_counts, group_starts)
    group_of = np.repeat(np.arange(group_starts.shape[0]), np.diff(np.r_[group_starts, pair_keys.shape[0]]))
    # The first pair of each group with the best count: the lowest token id among the best.
    candidates = np.flatnonzero(pair_counts == best[group_of])
    firsts = candidates[np.r_[True, group_of[candidates][1:] != group_of[candidates][:-1]]]
    keep = totals >= min_count
    return Order(
        pair_keys[group_starts][keep],
        pair_tokens[firsts][keep].astype(np.int32),
        best[keep].astype(np.uint32),
        totals[keep].astype(np.uint32),
    )
