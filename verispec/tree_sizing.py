"""How big a tree of drafts to verify: the nodes that maximise expected tokens per second.

Terms (``verispec.accept_tree``): a tree's nodes are listed parents first; ``parents[j]`` is
node j's parent (-1: the pending token, the root); a node's *first child* is the drafter's
best guess after it, its *later children* the alternatives. ``frequencies[j]`` is the
drafter's estimate of P(node j | its parent reached), e.g. the suffix drafter's share of the
occurrences that continued with j.

The rule walks down from the root and, at a reached node, accepts at most one child. Its
chance of accepting node j's whole path (the node's *chance*) is estimated as the product,
over the path, of each step's conditional chance:

- a first child at depth d: ``a_d``, the governor's measured acceptance at draft position d
  (so a tree's main chain is valued exactly as the chain would be);
- a later child: ``(1 - a_d) * min(1, s * share)``, where ``share = f_j / (1 - f_first)`` is
  its part of the occurrences that did not continue with the first child, and ``s`` a
  measured calibration (``BranchCalibration``: realised later-child acceptances over the
  shares predicted, from a prior of 0.5, carried from request to request).

A round verifying a node set S is expected to commit ``1 + sum of the chances of S`` tokens
(each accepted node one, plus the bonus). A child's chance never exceeds its parent's, so
for every size n the n nodes of highest chance form a tree (parent-closed) and are the best
n-node tree under these estimates; the round size is the n with the most expected tokens per
unit of round cost (Sequoia's objective, with the drafter's own tree shape). Where the
alternatives' chances stay below what an extra row costs, the result is the main chain: a
tree is verified only where it is predicted to pay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Forgetting of the later-child calibration per observed branching (~50 of them remembered,
# across requests: an engine's planner carries the calibration from request to request).
BRANCH_FORGET = 0.98
# The prior scale, counting as this many predicted acceptances. Below 1: a drafter's share for
# an alternative rests on few occurrences, and where its first guess is wrong the truth is
# often none of what it saw (the suffix drafter on the dev replay: alternatives offered alone
# with a summed share of 0.98 were right 17% of the time).
BRANCH_PRIOR = 0.5
BRANCH_PRIOR_WEIGHT = 2.0


def first_children(parents: Sequence[int]) -> list[bool]:
    """Whether each node is the first child of its parent (the first listed)."""
    seen: set[int] = set()
    out = []
    for parent in parents:
        out.append(parent not in seen)
        seen.add(parent)
    return out


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 1 for the root's children."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def later_shares(parents: Sequence[int], frequencies: Sequence[float]) -> list[float]:
    """Each later child's share of its parent's occurrences that did not take the first child
    (0 for first children)."""
    first_frequency: dict[int, float] = {}
    out = []
    for parent, frequency in zip(parents, frequencies, strict=True):
        if parent not in first_frequency:
            first_frequency[parent] = frequency
            out.append(0.0)
        else:
            rest = 1.0 - first_frequency[parent]
            out.append(min(1.0, frequency / rest) if rest > 0 else 0.0)
    return out


def node_chances(
    parents: Sequence[int], frequencies: Sequence[float], acceptance: Sequence[float], scale: float = 1.0
) -> list[float]:
    """Each node's estimated chance that the rule accepts its whole path. ``acceptance[d - 1]``
    is a_d (positions beyond it take the last one); ``scale`` the later-child calibration."""
    if len(frequencies) != len(parents):
        raise ValueError(f"{len(parents)} nodes but {len(frequencies)} frequencies")
    if not acceptance:
        raise ValueError("acceptance needs at least position 1")
    if scale < 0:
        raise ValueError(f"the later-child scale must be >= 0, got {scale}")
    firsts, shares, node_depths = first_children(parents), later_shares(parents, frequencies), depths(parents)
    chances: list[float] = []
    for node, parent in enumerate(parents):
        if not 0.0 <= frequencies[node] <= 1.0:
            raise ValueError(f"frequencies are probabilities, got {frequencies[node]}")
        a = acceptance[min(node_depths[node], len(acceptance)) - 1]
        step = a if firsts[node] else (1.0 - a) * min(1.0, scale * shares[node])
        chances.append(step * (chances[parent] if parent >= 0 else 1.0))
    return chances


@dataclass(frozen=True)
class TreeChoice:
    """The nodes to verify (increasing, parent-closed; empty: a plain round), the tokens a
    round of them is expected to commit, and the predicted speed-up over plain decoding."""

    nodes: list[int]
    expected_tokens: float
    predicted_speedup: float


def best_nodes(
    chances: Sequence[float],
    round_steps: Callable[[int], float],
    max_nodes: int,
    other_tokens: float = 0.0,
    min_gain: float = 1.0,
) -> TreeChoice:
    """The node set with the most expected tokens per plain step: for each size n up to
    ``max_nodes`` the n nodes of highest chance, priced at ``round_steps(n)`` plain steps (the
    cost of a round of n drafted rows, relative to a plain round of the same pass), then the
    best n, kept only if its speed-up reaches ``min_gain``. ``other_tokens``: the tokens the
    other requests of a shared pass are expected to commit in it (0 alone): a round's gain is
    then ``(other + E) / (other + 1)``, as the governor prices chains."""
    order = sorted(range(len(chances)), key=lambda node: (-chances[node], node))
    best = TreeChoice([], 1.0, 1.0)
    expected = 1.0
    for n, node in enumerate(order[:max_nodes], start=1):
        expected += chances[node]
        speedup = (other_tokens + expected) / (other_tokens + 1.0) / round_steps(n)
        if speedup > best.predicted_speedup:
            best = TreeChoice(sorted(order[:n]), expected, speedup)
    return best if best.predicted_speedup >= min_gain else TreeChoice([], 1.0, 1.0)


@dataclass(frozen=True)
class TreeOutcome:
    """What a verified tree said: per draft position the rule examined (its reached node had
    children on offer), whether it took the first child (1.0) or not (0.0), or None where the
    first child was not on offer; and per position where the first child was refused or not
    offered and later children were, their summed share and whether one of them was taken."""

    first_hits: list[float | None]
    later_offers: list[tuple[float, bool]]


def tree_outcome(
    parents: Sequence[int], frequencies: Sequence[float], path: Sequence[int], offered: Sequence[int] | None = None
) -> TreeOutcome:
    """The outcome of a round that verified the nodes ``offered`` (default: all) of the tree
    ``parents`` and accepted ``path`` (nodes of the tree, root to leaf, as ``accept_tree``
    returns them once mapped back to the tree's numbering)."""
    firsts, shares = first_children(parents), later_shares(parents, frequencies)
    on_offer = set(range(len(parents)) if offered is None else offered)
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    hits: list[float | None] = []
    offers: list[tuple[float, bool]] = []
    reached = -1
    for depth in range(len(path) + 1):
        below = [node for node in children.get(reached, []) if node in on_offer]
        if not below:
            break
        taken = path[depth] if depth < len(path) else None
        if taken is not None and (parents[taken] != reached or taken not in on_offer):
            raise ValueError(f"path {list(path)} does not follow the tree's offered nodes")
        took_first = taken is not None and firsts[taken]
        hits.append((1.0 if took_first else 0.0) if firsts[below[0]] else None)
        later = [node for node in below if not firsts[node]]
        if later and not took_first:
            offers.append((sum(shares[node] for node in later), taken is not None))
        if taken is None:
            break
        reached = taken
    return TreeOutcome(hits, offers)


@dataclass
class BranchCalibration:
    """The later-child scale s: later children taken over the shares predicted for them,
    both sums forgetting by BRANCH_FORGET per observation, from the prior BRANCH_PRIOR."""

    taken: float = 0.0
    predicted: float = 0.0

    @property
    def scale(self) -> float:
        return (self.taken + BRANCH_PRIOR * BRANCH_PRIOR_WEIGHT) / (self.predicted + BRANCH_PRIOR_WEIGHT)

    def observe(self, share: float, taken: bool) -> None:
        """One branching where the first child was refused: the later children's summed share
        (what the scale multiplies, capped at one) and whether one of them was taken."""
        self.taken = BRANCH_FORGET * self.taken + float(taken)
        self.predicted = BRANCH_FORGET * self.predicted + min(1.0, share)
