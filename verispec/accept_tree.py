"""The acceptance rule for a tree of drafts, as pure functions on NumPy rows.

A draft tree generalises the chain of ``accept.py``: a position may carry several candidate
next tokens (siblings), each with its own continuation. One verify pass scores every node;
the rule walks down from the root, keeping at most one child per position, and emits one
token where the walk stops. Recursive rejection over siblings (SpecInfer, Miao et al. 2024;
multi-draft speculative sampling) keeps the output distributed exactly as the target's.

Terms (the chain's terms, see ``accept.py`` and design.md):

- node: a drafted token. Nodes are numbered ``0 .. n-1`` in topological order.
- ``parents`` (n,): node j's parent, a node index below j, or ``ROOT_PARENT`` (-1) for the
  root: the pending token, whose verify-pass row is row 0. Siblings are tried in index order.
- position / verify-pass row: row 0 is the root, row ``j + 1`` is node j. The row of a
  position scores its children and, when the walk ends there, gives the bonus.
- ``target_probs`` (n + 1, V): the target's final distribution at each row.
- ``draft_probs`` (n, V) or ``None``: row j is exactly the distribution node j's token was
  drawn from GIVEN its parent and its earlier siblings (siblings drawn i.i.d. from q all
  carry q; siblings drawn without replacement carry q with the earlier ones removed and
  renormalised). ``None``: every node is a point mass (a deterministic drafter's branches).
- uniforms (2n + 1,) in [0, 1): node i owns ``u[2i]`` (its accept test) and ``u[2i + 1]``
  (the draw from the residual when node i is the last child tried at its position and is
  rejected); ``u[2n]`` draws the bonus at a position without children. A chain-shaped tree
  (node i the only child of node i - 1) thus reads the uniforms ``accept_chain`` reads and
  returns its result.

The rule at a position with distribution ``p_cur`` (initially its target row)::

    for each child c (token x, draft row q_c), in order:
        accept c   iff  u[2c] * q_c[x] < p_cur[x]       # min(1, p_cur[x] / q_c[x]); never if q_c[x] = 0
                   -> move to c: p_cur = c's target row, continue with c's children
        else       p_cur = normalise(max(0, p_cur - q_c))   # the residual, as in the chain
    all children rejected: emit y ~ p_cur with u[2c + 1] of the last child c, stop
    no children:           emit y ~ the position's row with u[2n] (the bonus), stop

Each rejection removes the rejected child's draft mass from what later siblings must match,
so the token the position emits is distributed as its target row whatever the drafts were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verispec.accept import (
    Row,
    RuleInputError,
    checked_drafts,
    checked_ids,
    checked_round,
    checked_rows,
    residual,
    sample_index,
)

ROOT_PARENT = -1  # the parent of the root's children: the pending token, verify-pass row 0

Ids = NDArray[np.int64]


@dataclass(frozen=True)
class TreeResult:
    """One round over a tree: the accepted nodes, root to leaf, then the emitted ``token``.

    ``uniforms_used`` is one past the last uniform read (the chain's count on a chain).
    """

    path: list[int]
    token: int
    uniforms_used: int

    @property
    def accepted(self) -> int:
        return len(self.path)


def accept_tree(
    target_probs: ArrayLike,
    parents: ArrayLike,
    tokens: ArrayLike,
    draft_probs: ArrayLike | None,
    uniforms: ArrayLike,
) -> TreeResult:
    """Decide one round over a tree of ``n`` drafts behind one verify pass.

    target_probs: (n + 1, V) final target rows, row 0 the root's, row j + 1 node j's.
    parents:      (n,) parent node of each node, ``ROOT_PARENT`` for the root's children.
    tokens:       (n,) drafted ids.
    draft_probs:  (n, V) rows the drafts were sampled from, or ``None`` for point masses.
    uniforms:     (2n + 1,) in [0, 1), laid out as in the module docstring.
    """
    p, par, drafts, q, u = _checked(target_probs, parents, tokens, draft_probs, uniforms)
    return _tree(lambda r: p[r], par, drafts, q, u)


def accept_tree_rows(
    target_row: Callable[[int], ArrayLike],
    parents: ArrayLike,
    tokens: ArrayLike,
    draft_probs: ArrayLike | None,
    uniforms: ArrayLike,
    vocab: int,
) -> TreeResult:
    """``accept_tree`` with the target rows asked for one at a time: ``target_row(r)`` is
    verify-pass row r (V,) of its ``target_probs`` (V = ``vocab``), the other arguments as there.

    Only the rows the walk reaches are asked for (the root's, then each accepted node's), in
    that order, and rows never read are never checked: a sampled round is spared the softmax
    over the vocabulary of every node the walk passes by (~0.2 ms each at 49k). The verdict
    and the uniforms used are ``accept_tree``'s (tested against it)."""
    par = checked_parents(parents)
    drafts, q, u = checked_drafts(tokens, draft_probs, uniforms, vocab)
    if drafts.shape != par.shape:
        raise RuleInputError(f"{par.shape[0]} nodes take {par.shape[0]} tokens, got shape {drafts.shape}")

    def row(r: int) -> Row:
        p = checked_rows(target_row(r), "target_probs", ndim=1)
        if p.shape[0] != vocab:
            raise RuleInputError(f"target row {r} has {p.shape[0]} entries, the vocabulary {vocab}")
        return p

    return _tree(row, par, drafts, q, u)


def _tree(p: Callable[[int], Row], par: Ids, drafts: Ids, q: Row | None, u: Row) -> TreeResult:
    """The tree's verdict on checked inputs, verify-pass row r of the target read as ``p(r)``."""
    children = tree_children(par)
    n = par.shape[0]
    path: list[int] = []
    row = 0
    while children[row]:
        p_cur = p(row)
        for c in children[row]:
            x, q_c = int(drafts[c]), None if q is None else q[c]
            q_x = 1.0 if q_c is None else float(q_c[x])
            if q_x > 0.0 and u[2 * c] * q_x < p_cur[x]:
                break
            rest = residual(p_cur, x, q_c)
            p_cur = rest / rest.sum()  # what the next sibling must match
        else:  # every child rejected: draw from the unnormalised residual, the chain's floats exactly
            return TreeResult(path, sample_index(rest, u[2 * c + 1]), 2 * c + 2)
        path.append(c)
        row = c + 1
    return TreeResult(path, sample_index(p(row), u[2 * n]), 2 * n + 1)


def accept_tree_greedy(target_argmax: ArrayLike, parents: ArrayLike, tokens: ArrayLike) -> TreeResult:
    """Temperature 0: follow the first child whose token is its position's argmax, emit the argmax.

    target_argmax: (n + 1,) the argmax of each verify-pass row. Equal to ``accept_tree`` on
    one-hot target rows, any uniforms: a non-argmax child has p(x) = 0, the argmax child p(x) = 1.
    """
    par = checked_parents(parents)
    n = par.shape[0]
    drafts = checked_ids(tokens, "tokens")
    best = checked_ids(target_argmax, "target_argmax")
    if drafts.shape != (n,) or best.shape != (n + 1,):
        raise RuleInputError(f"{n} nodes take {n} tokens and {n + 1} argmaxes, got {drafts.shape}, {best.shape}")
    if np.any(drafts < 0) or np.any(best < 0):
        raise RuleInputError("tokens and target_argmax must be non-negative ids")
    children = tree_children(par)
    path: list[int] = []
    row = 0
    while children[row]:
        match = [c for c in children[row] if drafts[c] == best[row]]
        if not match:
            return TreeResult(path, int(best[row]), 2 * children[row][-1] + 2)
        path.append(match[0])
        row = match[0] + 1
    return TreeResult(path, int(best[row]), 2 * n + 1)


def checked_parents(parents: ArrayLike) -> Ids:
    """``parents`` as (n,) int64, refused unless each node's parent is -1 or an earlier node.

    Parent < child makes the order topological and rules out cycles and self-loops.
    """
    par = checked_ids(parents, "parents")
    for node, parent in enumerate(par.tolist()):
        if not ROOT_PARENT <= parent < par.shape[0]:
            raise RuleInputError(f"node {node} has parent {parent}, outside [-1, {par.shape[0]})")
        if parent >= node:
            raise RuleInputError(
                f"node {node} has parent {parent}: a parent must come before its child "
                "(parent < child), which also rules out cycles"
            )
    return par


def chain_parents(k: int) -> Ids:
    """The parents of a chain of ``k`` drafts: node i is the only child of node i - 1."""
    return np.arange(k, dtype=np.int64) - 1


def tree_children(parents: Ids) -> list[list[int]]:
    """Children of each verify-pass row, in index order: entry 0 the root's, entry j + 1 node j's."""
    children: list[list[int]] = [[] for _ in range(parents.shape[0] + 1)]
    for node, parent in enumerate(parents.tolist()):
        children[parent + 1].append(node)
    return children


def tree_depths(parents: ArrayLike) -> Ids:
    """(n,) depth of each node: 1 for the root's children, so a node's position is the root's + depth."""
    par = checked_parents(parents)
    depths = np.zeros(par.shape[0], dtype=np.int64)
    for node, parent in enumerate(par.tolist()):
        depths[node] = 1 if parent == ROOT_PARENT else depths[parent] + 1
    return depths


def ancestor_mask(parents: ArrayLike) -> NDArray[np.bool_]:
    """(n + 1, n + 1) attention mask of a tree verify pass over rows [root, node 0, ..., node n-1].

    ``mask[i, j]`` is True iff row i may attend to row j: j is i itself or one of its ancestors
    (the root is everyone's). Each row then sees exactly the prefix plain decoding would have.
    """
    par = checked_parents(parents)
    mask = np.eye(par.shape[0] + 1, dtype=np.bool_)
    for node, parent in enumerate(par.tolist()):
        mask[node + 1] |= mask[parent + 1]
    return mask


def path_rows(path: Sequence[int]) -> list[int]:
    """The verify-pass rows a KV cache keeps after the round: the root's, then the accepted nodes'."""
    return [0] + [node + 1 for node in path]


def _checked(
    target_probs: ArrayLike,
    parents: ArrayLike,
    tokens: ArrayLike,
    draft_probs: ArrayLike | None,
    uniforms: ArrayLike,
) -> tuple[Row, Ids, Ids, Row | None, Row]:
    par = checked_parents(parents)
    n = par.shape[0]
    if np.shape(tokens) != (n,):
        raise RuleInputError(f"{n} nodes take {n} tokens, got shape {np.shape(tokens)}")
    p, drafts, q, u = checked_round(target_probs, tokens, draft_probs, uniforms)
    return p, par, drafts, q, u
