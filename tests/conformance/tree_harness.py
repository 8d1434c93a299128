"""Statistical arms for the tree rule: trees drafted per draw, emitted sequences checked.

A *tree rule* is any function with ``accept_tree``'s signature, so the same checks run on
verispec's rule and on the mutants in ``tree_mutants`` that must fail them.

The target and the drafter are Markov models over a small vocabulary (``MarkovModel``): the
row after a prefix depends on its length and last token only, so the row a verify pass gives
node j is the model's row after (depth of j, token of j). A lossless rule emits, at every
position a round reaches, a token distributed as the target's row there given what was
emitted before it; with a Markov target that is the row after the previous emitted token.
Each check (one per position, and per previous token) uses harness.py's tolerance for its
own number of draws and its chi-square threshold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tests.conformance.harness import N_DRAWS, ArmResult, chi2_pvalue, tolerance
from verispec.accept_tree import TreeResult, tree_children, tree_depths

TreeRule = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray], TreeResult]

# How the children of one position are drafted, given the drafter's row there.
IID = "iid"  # each child x ~ q independently; every child carries q
WITHOUT_REPLACEMENT = "without-replacement"  # child i ~ q with earlier siblings removed, renormalised
TOP = "top"  # child i is q's i-th most likely token: deterministic, point masses (draft_probs None)
SCHEMES = (IID, WITHOUT_REPLACEMENT, TOP)


@dataclass(frozen=True)
class MarkovModel:
    """first: (V,) the row at the root; after: (D, V, V), after[d - 1, x] the row after a node
    at depth d with token x."""

    first: np.ndarray
    after: np.ndarray

    def node_rows(self, depths: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """(N, n, V) the row after each node of N drafted trees; tokens (N, n), depths (n,)."""
        return self.after[depths - 1, tokens]

    def verify_rows(self, depths: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """(N, n + 1, V) what a verify pass returns: the root's row, then each node's."""
        root = np.broadcast_to(self.first, (tokens.shape[0], 1, self.first.shape[0]))
        return np.concatenate([root, self.node_rows(depths, tokens)], axis=1)


def draw_rows(rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One inverse-CDF draw from each of the (N, V) ``rows``."""
    cdf = np.cumsum(rows, axis=1)
    u = rng.random(rows.shape[0]) * cdf[:, -1]
    return np.minimum((cdf <= u[:, None]).sum(axis=1), rows.shape[1] - 1)


def draft_trees(
    parents: np.ndarray, drafter: MarkovModel, scheme: str, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray | None]:
    """N = n trees of shape ``parents`` drafted from ``drafter``: tokens (N, nodes) and the
    draft rows (N, nodes, V) each token was drawn from, ``None`` for the ``TOP`` scheme."""
    nodes, vocab = parents.shape[0], drafter.first.shape[0]
    depths = tree_depths(parents)
    tokens = np.zeros((n, nodes), dtype=np.int64)
    q_rows = np.zeros((n, nodes, vocab))
    for siblings in tree_children(parents):
        for rank, node in enumerate(siblings):
            parent = parents[node]
            if parent < 0:
                context = np.broadcast_to(drafter.first, (n, vocab))
            else:
                context = drafter.after[depths[parent] - 1, tokens[:, parent]]
            if scheme == TOP:  # stable order: ties go to the lower id, as argsort breaks them
                tokens[:, node] = np.argsort(-context, axis=1, kind="stable")[:, rank]
                continue
            q = context.copy()
            if scheme == WITHOUT_REPLACEMENT:
                q[np.arange(n)[:, None], tokens[:, siblings[:rank]]] = 0.0
                q /= q.sum(axis=1, keepdims=True)
            q_rows[:, node] = q
            tokens[:, node] = draw_rows(q, rng)
    return tokens, None if scheme == TOP else q_rows


@dataclass
class TreeRun:
    """Per draw: the emitted sequence (accepted tokens, then the rule's token; -1 past its end)
    and the result."""

    emitted: np.ndarray
    results: list[TreeResult]


def run_trees(
    rule: TreeRule,
    parents: np.ndarray,
    target: MarkovModel,
    drafter: MarkovModel,
    scheme: str,
    seed: int,
    n: int = N_DRAWS,
) -> TreeRun:
    """n rounds: each drafts a tree of shape ``parents`` with its own RNG, the rule decides."""
    rng = np.random.default_rng(seed)
    tokens, q_rows = draft_trees(parents, drafter, scheme, n, rng)
    rows = target.verify_rows(tree_depths(parents), tokens)
    uniforms = rng.random((n, 2 * parents.shape[0] + 1))
    emitted = np.full((n, int(tree_depths(parents).max(initial=0)) + 1), -1, dtype=np.int64)
    results = []
    for i in range(n):
        result = rule(rows[i], parents, tokens[i], None if q_rows is None else q_rows[i], uniforms[i])
        results.append(result)
        emitted[i, : result.accepted] = tokens[i, result.path]
        emitted[i, result.accepted] = result.token
    return TreeRun(emitted, results)


def position_arms(name: str, emitted: np.ndarray, target: MarkovModel, min_draws: int = 2_000) -> list[ArmResult]:
    """One result for the first emitted token, then one per (position j >= 1, previous token)
    with at least ``min_draws`` draws reaching it: the token there against the target's row."""
    vocab = target.first.shape[0]
    checks = [(f"{name} token 0", np.ones(emitted.shape[0], dtype=bool), 0, target.first)]
    for j in range(1, emitted.shape[1]):
        for previous in range(vocab):
            reached = (emitted[:, j] >= 0) & (emitted[:, j - 1] == previous)
            checks.append((f"{name} token {j} | {previous}", reached, j, target.after[j - 1, previous]))
    arms = []
    for label, reached, j, row in checks:
        n_j = int(reached.sum())
        if n_j < min_draws:
            continue
        counts = np.bincount(emitted[reached, j], minlength=vocab)
        arms.append(
            ArmResult(
                name=label,
                n=n_j,
                tol=tolerance(n_j),
                max_deviation=float(np.max(np.abs(counts / n_j - row))),
                chi2_pvalue=chi2_pvalue(counts, row),
            )
        )
    return arms


def worst(arms: list[ArmResult]) -> ArmResult:
    """The arm furthest outside (or least inside) its tolerances."""
    return max(arms, key=lambda r: (not r.passes, r.max_deviation / r.tol))
