"""Tree verification on the native backend: the checks and bookkeeping around one tree pass.

Terms are ``accept_tree``'s: a tree of ``n`` drafted nodes hangs below the root, the pending
token; ``parents`` (n,) gives node j's parent (a node below j, or -1 for the root). The
verify pass has one row per token: row 0 the root, row j + 1 node j. A node's *path* is the
nodes from the root's child down to it; the tokens plain decoding would feed to reach it are
the root's and then its path's.

After a tree pass the cache holds the root at slot ``start`` and node j at ``start + 1 + j``
(the tree layout); keeping a path moves the path's nodes to ``start + 1, start + 2, ...``
(the plain layout). ``TreeRound`` remembers what a sequence needs to do that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from verispec.accept import RuleInputError
from verispec.accept_tree import checked_parents, tree_children
from verispec.targets.base import TargetError


@dataclass
class TreeRound:
    """A sequence's last tree pass, until its path is kept.

    start: the root's cache slot; parents, ids: the tree as passed (ids with the root first);
    plain_path: None when the cache holds the tree layout, else the path whose nodes already
    sit in the plain layout (the fallback verifies whole paths, the last one stays cached);
    hidden: the pass's captured states, one row per verify row (None without a capture).
    """

    start: int
    parents: np.ndarray
    ids: list[int]
    plain_path: list[int] | None
    hidden: torch.Tensor | None


def checked_tree(token_ids: Sequence[int], parents: Sequence[int], vocab: int) -> tuple[list[int], np.ndarray]:
    """``token_ids`` as a list and ``parents`` as (n,) int64, refused with a TargetError unless
    the tree is topological (parent < child), has n + 1 ids (the root first) and every id is
    in the vocabulary."""
    try:
        par = checked_parents(parents)
    except RuleInputError as error:
        raise TargetError(f"bad tree: {error}") from error
    ids = [int(t) for t in token_ids]
    if len(ids) != par.shape[0] + 1:
        raise TargetError(
            f"a tree of {par.shape[0]} nodes takes {par.shape[0] + 1} token ids (the root first), got {len(ids)}"
        )
    if any(not 0 <= t < vocab for t in ids):
        raise TargetError(f"tree token ids must lie in [0, {vocab})")
    return ids, par


def node_path(parents: np.ndarray, node: int) -> list[int]:
    """The nodes from the root's child down to ``node`` (empty for the root, node -1)."""
    path: list[int] = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


def leaf_paths(parents: np.ndarray) -> list[list[int]]:
    """The path to every leaf, in the leaves' index order (one empty path for a bare root).
    Together they cover every node."""
    children = tree_children(parents)
    leaves = [node for node in range(parents.shape[0]) if not children[node + 1]]
    return [node_path(parents, leaf) for leaf in leaves] or [[]]


def checked_path(parents: np.ndarray, path: Sequence[int]) -> list[int]:
    """``path`` as a list, refused with a TargetError unless it descends from the root: its
    first node a child of the root, each next one a child of the one before."""
    nodes = [int(node) for node in path]
    above = -1
    for node in nodes:
        if not 0 <= node < parents.shape[0] or int(parents[node]) != above:
            raise TargetError(f"path {nodes} does not descend from the root of the tree (parents {parents.tolist()})")
        above = node
    return nodes


def path_ids(ids: Sequence[int], path: Sequence[int]) -> list[int]:
    """The tokens plain decoding feeds to reach the end of ``path``: the root's, then its nodes'."""
    return [ids[0]] + [ids[node + 1] for node in path]
