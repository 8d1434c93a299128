"""A draft's shape: chains, trees, and the parts of them a round verifies (drafters/base.py)."""

import numpy as np
import pytest

from verispec.drafters.base import Draft

# The root's children 10 and 20; 10's children 11 and 12; 11's child 13.
TREE = Draft([10, 11, 20, 12, 13], np.eye(5, 32), "src", [-1, 0, -1, 0, 1], [0.6, 0.8, 0.3, 0.2, 1.0])


def test_select_renumbers_parents_and_keeps_rows_source_and_frequencies():
    part = TREE.select([0, 2, 3])
    assert part.tokens == [10, 20, 12] and part.parents == [-1, -1, 0] and part.is_tree
    assert part.source == "src" and part.frequencies == [0.6, 0.3, 0.2]
    assert np.array_equal(part.probs, TREE.probs[[0, 2, 3]])
    chain = TREE.select([0, 1, 4])  # a path: a chain, parents dropped
    assert chain.parents is None and chain.tokens == [10, 11, 13] and not chain.is_tree
    assert TREE.select([2]).tokens == [20] and TREE.select([2]).parents is None
    assert TREE.select([]).tokens == []
    bare = Draft(TREE.tokens, None, "src", TREE.parents, TREE.frequencies)
    assert bare.main_chain() == bare.select([0, 1, 4])
    assert bare.first(3) == bare.select([0, 1, 2]) and bare.first(9) is bare


@pytest.mark.parametrize(
    ("nodes", "message"), [([1], "without its parent"), ([2, 0], "increase"), ([0, 0], "increase"), ([-1], "increase")]
)
def test_select_refuses_what_is_not_a_tree(nodes, message):
    with pytest.raises(ValueError, match=message):
        TREE.select(nodes)


def test_a_chain_selects_only_prefixes_and_shapes_are_checked():
    chain = Draft([1, 2, 3], frequencies=[0.5, 0.5, 0.5])
    assert chain.select([0, 1]).tokens == [1, 2]
    with pytest.raises(ValueError, match="prefix"):
        chain.select([0, 2])
    with pytest.raises(ValueError, match="frequencies"):
        Draft([1, 2], frequencies=[0.5])
    with pytest.raises(ValueError, match="parents must come before"):
        Draft([1, 2], parents=[1, -1])
