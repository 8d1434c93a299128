"""Wrong tree rules that the tree arms must tell apart from the real one.

Each has ``accept_tree``'s signature and is one plausible slip away from the real rule (see
issue 22: a residual that does not remove rejected children, accepting the first child without
the ratio, a wrong ancestor). They exist only to be caught.
"""

from __future__ import annotations

import numpy as np

from verispec.accept import accept_step, sample_index
from verispec.accept_tree import TreeResult, accept_tree, tree_children


def _walk(p, parents, tokens, q, u, try_children):
    """The tree walk with a pluggable position step: ``try_children`` returns (accepted child,
    None) or (None, emitted token)."""
    children = tree_children(np.asarray(parents))
    path, row = [], 0
    while children[row]:
        child, token = try_children(p[row], children[row], tokens, q, u)
        if child is None:
            return TreeResult(path, token, 2 * children[row][-1] + 2)
        path.append(child)
        row = child + 1
    return TreeResult(path, sample_index(p[row], u[2 * len(tokens)]), 2 * len(tokens) + 1)


def _row_of(q, node):
    return None if q is None else q[node]


def _independent_siblings(p_row, siblings, tokens, q, u):
    # Each sibling is tested against the untouched row, as if it were a one-draft chain; the
    # emitted token removes only the last sibling.
    for c in siblings:
        step = accept_step(p_row, int(tokens[c]), _row_of(q, c), u[2 * c], u[2 * c + 1])
        if step.accepted:
            return c, None
    return None, step.token


def _first_without_ratio(p_row, siblings, tokens, q, u):
    return siblings[0], None  # the drafter's favourite child, kept unchecked


def residual_keeps_rejected(p, parents, tokens, q, u) -> TreeResult:
    """(i) After a rejection the next sibling still faces the target row: rejected children
    are not removed from what later ones must match."""
    return _walk(p, parents, tokens, q, u, _independent_siblings)


def first_child_without_ratio(p, parents, tokens, q, u) -> TreeResult:
    """(ii) Accept the first child of every position without the ratio test."""
    return _walk(p, parents, tokens, q, u, _first_without_ratio)


def _with_row_of(wrong_row):
    """The real rule, but the verify pass scores node j's children with row ``wrong_row(j)``
    instead of row j + 1: the row of a node the ancestor mask should have kept out."""

    def rule(p, parents, tokens, q, u) -> TreeResult:
        parents = np.asarray(parents)
        shifted = p.copy()
        shifted[1:] = p[[wrong_row(parents, j) for j in range(len(parents))]]
        return accept_tree(shifted, parents, tokens, q, u)

    return rule


# (iii) a wrong ancestor: each node's row is its parent's (row 0 for the root's children) ...
parent_row = _with_row_of(lambda parents, j: parents[j] + 1)
# ... or the row of the node just before it (its previous sibling, when it has one): a causal
# mask where an ancestor mask belongs lets node j see node j - 1.
previous_node_row = _with_row_of(lambda parents, j: j)


TREE_MUTANTS = {
    "residual-keeps-rejected": residual_keeps_rejected,
    "first-child-without-ratio": first_child_without_ratio,
    "parent-row": parent_row,
    "previous-node-row": previous_node_row,
}
