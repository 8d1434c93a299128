"""The Drafter protocol, the Draft it proposes, and what a drafter's factory is given.

Lifecycle, one line each:

- ``begin(prompt_ids, params)``: a new request starts with this prompt.
- ``propose(context, k, rng)``: up to k tokens to follow ``context`` (the committed
  tokens), with the rows they were sampled from, or ``None`` for point masses.
- ``propose_tree(context, k, rng)``, only where a drafter has ``branches`` > 1 (the trained
  drafters' ``draft_branches``): k drafted positions, each offering up to ``branches``
  candidates, as a tree (``Draft.parents``) whose main chain is what ``propose`` drafts.
- ``cheap_next(context, k)``, only where a drafter routes each proposal to a cheap or a dear
  drafter of its own (``hybrid``: suffix's walk or the head's layers): whether
  ``propose(context, k)`` will be the cheap one; pure. A shadowing governor asks for the cheap
  ones in every plain round and for the dear ones as its shadow budget allows. Such a drafter
  also has ``propose_fallback(context, k, rng)``, its dear proposal whatever the routing says
  (pure; its ``Draft.source`` is ``fallback_source``), drafted where the governor would not
  draft the cheap one and would draft the dear one, and may name ``steady_sources``, sources
  whose acceptance is its own rather than the prompt's (the governor pools their estimates
  with the engine's memory).
- ``observe(context, accepted)``: the round committed ``context`` (now ending with the
  bonus) after keeping ``accepted`` drafts; a drafter with a cache trims it here.
- ``reset()``: forget the request.
- ``fork(target)``: a drafter like this one for another request running at the same time
  on ``target`` (another sequence of the same model's cache): it shares what is read-only
  (weights, options) and owns its request's state; None where the drafter cannot run two
  requests at once (a draft model with one cache). The scheduler asks for it.

Two attributes say what a drafter needs of the engine (every drafter sets both):

- ``hidden_capture``: None, or for a drafter conditioned on the target's hidden states
  (``head``, ``block``) a ``verispec.targets.base.HiddenCapture``: the engine turns the
  target's capture on for the request, so ``begin`` finds the prompt's states in
  ``target.last_hidden`` and ``observe`` the last verify pass's (rows 0..accepted are the
  committed positions).
- ``pure_proposals``: True for a drafter whose ``propose`` is pure (it changes nothing a
  later call sees) and cheap: the engine then asks it for its proposal of up to k_max
  tokens before the governor decides how many of them to verify (a proposal of k tokens
  must be the first k of a longer one), and in plain rounds its first token is a shadow
  draft that shows whether drafting would pay again (``verispec.governor``); its cost is
  priced per proposal, whatever the k it is cut to. False otherwise.

A drafter proposes and observes; it never decides acceptance. The engine creates drafters
through ``verispec.drafters.registry.create_drafter(name, ...)``, the only place names are
looked up.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from verispec.errors import UserError
from verispec.sampling import SamplingParams
from verispec.targets.base import HiddenCapture


@dataclass(frozen=True)
class Draft:
    """Proposed tokens (n,) and the rows (n, V) they were drawn from; ``probs`` None = point masses.

    ``source``: what the proposal is based on, where a drafter's acceptance differs by it
    (prompt lookup: the length of the matched n-gram); the governor keeps its acceptance
    estimates per source. None: one kind of proposal.

    ``parents``: None for a chain (token i follows token i - 1); for a tree, token i's parent
    node, -1 for the pending token (``verispec.accept_tree``). A tree lists its nodes so that
    every prefix of the list is a tree (parents first): a round may verify its first k nodes.

    ``frequencies``: where the drafter can say it, each node's estimated chance that the
    target continues its parent with it (``verispec.tree_sizing`` sizes trees from them).
    """

    tokens: list[int]
    probs: NDArray[np.float64] | None = None
    source: Hashable = None
    parents: list[int] | None = None
    frequencies: list[float] | None = None

    def __post_init__(self) -> None:
        if self.probs is not None and self.probs.shape[0] != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} draft tokens but {self.probs.shape[0]} draft rows")
        if self.parents is not None:
            if len(self.parents) != len(self.tokens):
                raise ValueError(f"{len(self.tokens)} draft tokens but {len(self.parents)} parents")
            if any(not -1 <= parent < node for node, parent in enumerate(self.parents)):
                raise ValueError(f"a tree's parents must come before their children: {self.parents}")
        if self.frequencies is not None and len(self.frequencies) != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} draft tokens but {len(self.frequencies)} frequencies")

    @property
    def is_tree(self) -> bool:
        """More than one candidate at some position (a chain given as a tree is not one)."""
        return self.parents is not None and any(parent != node - 1 for node, parent in enumerate(self.parents))

    def first(self, k: int) -> Draft:
        """The first k tokens (nodes), with their rows, source, parents and frequencies."""
        if len(self.tokens) <= k:
            return self
        if self.parents is None:  # a chain's prefix: slices (every round of a governed request cuts one)
            k = max(0, k)
            probs = None if self.probs is None else self.probs[:k]
            frequencies = None if self.frequencies is None else self.frequencies[:k]
            return Draft(self.tokens[:k], probs, self.source, None, frequencies)
        return self.select(list(range(max(0, k))))

    def select(self, nodes: Sequence[int]) -> Draft:
        """The nodes ``nodes`` (increasing; with each node its parent) as a draft of their own:
        a chain where they form one, else a tree with its parents renumbered."""
        if any(b <= a for a, b in itertools.pairwise(nodes)) or (nodes and nodes[0] < 0):
            raise ValueError(f"nodes to keep must increase from 0 up, got {list(nodes)}")
        probs = None if self.probs is None else self.probs[list(nodes)]
        frequencies = None if self.frequencies is None else [self.frequencies[n] for n in nodes]
        parents = None
        if self.parents is not None:
            renumbered = {node: i for i, node in enumerate(nodes)}
            try:
                parents = [-1 if self.parents[n] < 0 else renumbered[self.parents[n]] for n in nodes]
            except KeyError as missing:
                raise ValueError(f"node {missing} is kept without its parent") from None
            if all(parent == i - 1 for i, parent in enumerate(parents)):
                parents = None  # a chain
        elif list(nodes) != list(range(len(nodes))):
            raise ValueError(f"a chain keeps a prefix, not the nodes {list(nodes)}")
        return Draft([self.tokens[n] for n in nodes], probs, self.source, parents, frequencies)

    def main_chain(self) -> Draft:
        """A tree's first path: each position's first child (the drafter's best guess)."""
        if self.parents is None:
            return self
        if not self.is_tree:
            return Draft(self.tokens, self.probs, self.source, None, self.frequencies)
        assert self.parents is not None
        nodes: list[int] = []
        current = -1
        while True:
            child = next((node for node, parent in enumerate(self.parents) if parent == current), None)
            if child is None:
                break
            nodes.append(child)
            current = child
        return self.select(nodes)


NO_DRAFT = Draft(tokens=[])


@runtime_checkable
class Drafter(Protocol):
    name: str

    # Read-only here, so a drafter may hold a narrower type (a HiddenCapture, never None).
    @property
    def hidden_capture(self) -> HiddenCapture | None: ...

    @property
    def pure_proposals(self) -> bool: ...

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams) -> None: ...

    def propose(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft: ...

    def observe(self, context: Sequence[int], accepted: int) -> None: ...

    def reset(self) -> None: ...

    def fork(self, target: Any) -> Drafter | None: ...


class DrafterError(UserError, ValueError):
    """A drafter cannot be built for this target (unknown name, vocabulary mismatch, ...)."""


@dataclass(frozen=True)
class DrafterContext:
    """What a drafter factory may need: the loaded target and its tokenizer, plus options."""

    target: Any
    tokenizer: Any = None
    options: dict[str, Any] | None = None

    def option(self, key: str, default: Any = None) -> Any:
        return (self.options or {}).get(key, default)


# A trained drafter stops drafting where its confidence (``SharedTarget.distribution``) falls
# below this (drafter option ``min_confidence``; 0 drafts whatever k asks).
DEFAULT_MIN_CONFIDENCE = 0.0


def check_confidence(value: object) -> float:
    """A ``min_confidence`` option: a number in [0, 1]."""
    return check_fraction(value, "min_confidence")


def check_fraction(value: object, name: str) -> float:
    """Option ``name``'s ``value`` as a number in [0, 1]; ``DrafterError`` for anything else."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise DrafterError(f"{name} must be a number in [0, 1], got {value!r}")
    return number
