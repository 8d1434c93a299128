"""Exact hand cases, properties and refusals of the tree rule (accept_tree.py)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.accept import RuleInputError, accept_chain
from verispec.accept_tree import (
    accept_tree,
    accept_tree_greedy,
    accept_tree_rows,
    ancestor_mask,
    chain_parents,
    path_rows,
    tree_children,
    tree_depths,
)

P = np.array([0.5, 0.3, 0.2])
FLAT = np.full(3, 1 / 3)


def rows(*r):
    return np.array(r, dtype=np.float64)


def test_first_child_accepted_moves_to_its_row_and_takes_the_bonus_there():
    # Root children 0 (token 0) and 1 (token 1), point masses; node 0 is a leaf.
    p = rows(P, [0.0, 0.0, 1.0], [1.0, 0.0, 0.0])
    u = np.array([0.4, 0.9, 0.9, 0.9, 0.0])  # 0.4 < p(0) = 0.5: accept node 0
    result = accept_tree(p, [-1, -1], [0, 1], None, u)
    assert (result.path, result.token, result.uniforms_used, result.accepted) == ([0], 2, 5, 1)


def test_rejected_sibling_is_removed_before_the_next_is_tried():
    # Point masses: reject token 0 (u = 0.6 >= 0.5); p_cur becomes [0, 0.6, 0.4].
    # Token 1 is then accepted iff u < 0.6, not iff u < 0.3 as against the untouched row.
    p = rows(P, FLAT, FLAT)
    assert accept_tree(p, [-1, -1], [0, 1], None, [0.6, 0.0, 0.5, 0.0, 0.0]).path == [1]
    assert accept_tree(p, [-1, -1], [0, 1], None, [0.6, 0.0, 0.61, 0.0, 0.0]).path == []


def test_all_siblings_rejected_draws_from_the_final_residual_with_the_last_childs_uniform():
    # Reject tokens 0 and 1: only token 2 is left, whatever the residual uniform.
    p = rows(P, FLAT, FLAT)
    for u_last in (0.0, 0.5, 0.999):
        result = accept_tree(p, [-1, -1], [0, 1], None, [0.9, 0.0, 0.9, u_last, 0.0])
        assert (result.path, result.token, result.uniforms_used) == ([], 2, 4)
    # Node 0's own residual uniform u[1] is never read: its sibling comes after it.
    a = accept_tree(rows(P, FLAT, FLAT, FLAT), [-1, -1, -1], [0, 0, 1], None, [0.9, 0.0, 0.1, 0.0, 0.9, 0.3, 0.0])
    b = accept_tree(rows(P, FLAT, FLAT, FLAT), [-1, -1, -1], [0, 0, 1], None, [0.9, 0.99, 0.1, 0.0, 0.9, 0.3, 0.0])
    assert a == b
    # Duplicate token 0: once rejected, p_cur(0) = 0, so its twin is never accepted (u = 0.1).
    assert a.path == [] and a.token == 2  # p_cur = [0, 0, 1] after token 1 is rejected too


def test_sampled_siblings_use_their_own_draft_rows():
    # q = [0.1, 0.8, 0.1], token 1 drawn twice i.i.d.: the first is accepted w.p. 0.3/0.8.
    q = np.array([0.1, 0.8, 0.1])
    p = rows(P, FLAT, FLAT)
    assert accept_tree(p, [-1, -1], [1, 1], rows(q, q), [0.37, 0.0, 0.99, 0.0, 0.0]).path == [0]
    # Rejected: p_cur = normalise(max(0, p - q)) = [0.8, 0, 0.2], so p_cur(1) = 0: the twin never
    # passes, and the token comes from normalise(max(0, p_cur - q)) = [0.7, 0, 0.1] / 0.8.
    rejected = accept_tree(p, [-1, -1], [1, 1], rows(q, q), [0.38, 0.0, 0.0, 0.0, 0.0])
    assert rejected.path == [] and rejected.token == 0
    assert accept_tree(p, [-1, -1], [1, 1], rows(q, q), [0.38, 0.0, 0.0, 0.87, 0.0]).token == 0
    assert accept_tree(p, [-1, -1], [1, 1], rows(q, q), [0.38, 0.0, 0.0, 0.88, 0.0]).token == 2


def test_a_draft_its_row_gives_no_mass_is_never_accepted():
    q = rows([0.5, 0.5, 0.0], [1.0, 0.0, 0.0])
    result = accept_tree(rows(P, FLAT, FLAT), [-1, -1], [2, 0], q, [0.0, 0.0, 0.99, 0.5, 0.0])
    # Node 0 (q(2) = 0) rejected: p_cur = [0, 0, 1]; node 1 (token 0) then has p_cur(0) = 0.
    assert (result.path, result.token) == ([], 2)


def test_two_levels_walk_down_and_stop_at_the_first_fully_rejected_position():
    # Node 0 (token 0) under the root; nodes 1, 2 (tokens 1, 2) under node 0.
    p = rows(P, [0.0, 0.0, 1.0], FLAT, FLAT)
    accepted_leaf = accept_tree(p, [-1, 0, 0], [0, 1, 2], None, [0.1, 0.0, 0.5, 0.0, 0.5, 0.0, 0.5])
    assert (accepted_leaf.path, accepted_leaf.token, accepted_leaf.uniforms_used) == ([0, 2], 1, 7)  # bonus u[6]
    # Node 0's row gives tokens 0 and 1 no mass: both children rejected, token 2 emitted.
    rejected = accept_tree(p, [-1, 0, 0], [0, 0, 1], None, [0.1, 0.0, 0.5, 0.0, 0.5, 0.3, 0.0])
    assert (rejected.path, rejected.token, rejected.uniforms_used) == ([0], 2, 6)


def test_no_drafts_is_a_plain_step():
    result = accept_tree(np.array([[0.2, 0.8]]), np.array([], dtype=np.int64), [], None, [0.5])
    assert (result.path, result.token, result.uniforms_used) == ([], 1, 1)


@st.composite
def trees(draw, max_nodes=7):
    n = draw(st.integers(0, max_nodes))
    return np.array([draw(st.integers(-1, j - 1)) for j in range(n)], dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(k=st.integers(0, 6), vocab=st.integers(2, 6), seed=st.integers(0, 2**32 - 1), sampled=st.booleans())
def test_a_chain_shaped_tree_is_exactly_the_chain(k, vocab, seed, sampled):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(vocab), size=k + 1)
    q = rng.dirichlet(np.ones(vocab), size=k) if sampled else None
    drafts = np.array([rng.choice(vocab, p=row) for row in q]) if sampled else rng.integers(0, vocab, size=k)
    u = rng.random(2 * k + 1)
    chain = accept_chain(p, drafts, q, u)
    tree = accept_tree(p, chain_parents(k), drafts, q, u)
    assert (tree.accepted, tree.token, tree.uniforms_used) == (chain.accepted, chain.token, chain.uniforms_used)
    assert tree.path == list(range(chain.accepted))


@settings(max_examples=300, deadline=None)
@given(parents=trees(), vocab=st.integers(2, 5), seed=st.integers(0, 2**32 - 1), sampled=st.booleans())
def test_greedy_is_the_rule_on_one_hot_rows(parents, vocab, seed, sampled):
    rng = np.random.default_rng(seed)
    n = parents.shape[0]
    argmax = rng.integers(0, vocab, size=n + 1)
    # Small vocabularies make drafts hit the argmax often, so walks go deep.
    tokens = rng.integers(0, vocab, size=n)
    q = None
    if sampled:  # rows that the drafted tokens could have come from
        q = rng.dirichlet(np.ones(vocab), size=n)
        q[np.arange(n), tokens] += 0.5
        q /= q.sum(axis=1, keepdims=True)
    greedy = accept_tree_greedy(argmax, parents, tokens)
    assert greedy == accept_tree(np.eye(vocab)[argmax], parents, tokens, q, rng.random(2 * n + 1))
    # The walk follows argmaxes only.
    rows_walked = path_rows(greedy.path)
    assert all(tokens[node] == argmax[row] for node, row in zip(greedy.path, rows_walked, strict=False))
    assert greedy.token == argmax[rows_walked[-1]]


@settings(max_examples=300, deadline=None)
@given(parents=trees(), vocab=st.integers(2, 5), seed=st.integers(0, 2**32 - 1), sampled=st.booleans())
def test_rows_on_demand_give_the_rules_verdict_reading_only_the_rows_walked(parents, vocab, seed, sampled):
    # accept_tree_rows must return accept_tree's verdict, uniforms used included, asking for
    # the root's row, then each accepted node's, in that order, and for no other row.
    rng = np.random.default_rng(seed)
    n = parents.shape[0]
    p = rng.dirichlet(np.full(vocab, 0.5), size=n + 1)
    p[rng.random(n + 1) < 0.3] = np.eye(vocab)[0]  # some one-hot rows: certain verdicts
    q = rng.dirichlet(np.ones(vocab), size=n) if sampled else None
    tokens = np.array([rng.choice(vocab, p=row) for row in q]) if sampled else rng.integers(0, vocab, size=n)
    u = rng.random(2 * n + 1)
    asked: list[int] = []

    def row(r):
        asked.append(r)
        return p[r]

    result = accept_tree_rows(row, parents, tokens, q, u, vocab)
    assert result == accept_tree(p, parents, tokens, q, u)
    assert asked == path_rows(result.path)


def test_tree_rows_on_demand_are_checked_as_they_are_read():
    good, bad = np.array([0.0, 1.0]), np.array([0.5, 0.6])
    # Both children rejected at the root (p(0) = 0, then the residual has no mass on 0 either):
    # the bad rows 1 and 2 are never read ...
    result = accept_tree_rows([good, bad, bad].__getitem__, [-1, -1], [0, 0], None, [0.5] * 5, vocab=2)
    assert result.path == [] and result.token == 1
    # ... and refused once the walk reaches one.
    with pytest.raises(RuleInputError, match="sum to 1"):
        accept_tree_rows([good, bad, bad].__getitem__, [-1, -1], [1, 0], None, [0.5] * 5, vocab=2)
    with pytest.raises(RuleInputError, match="3 entries, the vocabulary 2"):
        accept_tree_rows(lambda r: np.array([0.0, 1.0, 0.0]), [-1], [1], None, [0.5] * 3, vocab=2)
    with pytest.raises(RuleInputError, match="2 nodes take 2 tokens"):
        accept_tree_rows([good, good, good].__getitem__, [-1, -1], [1], None, [0.5] * 3, vocab=2)


def test_greedy_takes_the_first_matching_sibling():
    result = accept_tree_greedy([1, 0, 2, 0], [-1, -1, -1], [0, 1, 1])
    assert (result.path, result.token, result.uniforms_used) == ([1], 2, 7)
    assert accept_tree_greedy([2, 0, 0], [-1, -1], [0, 1]).path == []


SHAPE = np.array([-1, -1, 0, 0, 1, 3])  # root: 0, 1; node 0: 2, 3; node 1: 4; node 3: 5


def test_children_depths_and_rows():
    assert tree_children(SHAPE) == [[0, 1], [2, 3], [4], [], [5], [], []]
    np.testing.assert_array_equal(tree_depths(SHAPE), [1, 1, 2, 2, 2, 3])
    assert path_rows([0, 3, 5]) == [0, 1, 4, 6]
    assert path_rows([]) == [0]


def test_ancestor_mask_lets_each_row_see_itself_and_its_ancestors_only():
    mask = ancestor_mask(SHAPE)
    expected = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 4], 5: [0, 2, 5], 6: [0, 1, 4, 6]}
    for row, seen in expected.items():
        assert np.flatnonzero(mask[row]).tolist() == seen
    # A chain's mask is the causal mask: each row sees every earlier row.
    np.testing.assert_array_equal(ancestor_mask(chain_parents(4)), np.tril(np.ones((5, 5), dtype=bool)))


@settings(max_examples=200, deadline=None)
@given(parents=trees(max_nodes=10))
def test_mask_depths_and_rows_agree(parents):
    mask = ancestor_mask(parents)
    depths = tree_depths(parents)
    # A node sees the root, its ancestors and itself: depth + 1 rows.
    np.testing.assert_array_equal(mask[1:].sum(axis=1), depths + 1)
    for node in range(parents.shape[0]):  # the path to a node is exactly the rows its row sees
        chain, walk = [], node
        while walk >= 0:
            chain.append(walk)
            walk = parents[walk]
        assert np.flatnonzero(mask[node + 1]).tolist() == path_rows(chain[::-1])


GOOD = {"p": rows(P, FLAT, FLAT), "parents": [-1, -1], "tokens": [0, 1], "q": None, "u": [0.5] * 5}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parents": [-1, 1]}, "node 1 has parent 1: a parent must come before its child"),
        ({"parents": [1, 0]}, "node 0 has parent 1: a parent must come before"),  # a cycle 0 -> 1 -> 0
        ({"parents": [-1, 2]}, "node 1 has parent 2, outside \\[-1, 2\\)"),
        ({"parents": [-2, -1]}, "node 0 has parent -2, outside"),
        ({"parents": [-1.0, 0.0]}, "parents must be a 1-D array of ids"),
        ({"parents": [[-1, 0]]}, "parents must be a 1-D array of ids"),
        ({"tokens": [0]}, "2 nodes take 2 tokens"),
        ({"tokens": [0, 3]}, "draft token 3 is outside the vocabulary \\[0, 3\\)"),
        ({"tokens": [-1, 0]}, "outside the vocabulary"),
        ({"p": rows(P, FLAT)}, "target_probs needs k \\+ 1 = 3 rows for 2 drafts, has 2"),
        ({"p": rows([0.5, 0.6, 0.0], FLAT, FLAT)}, "sum to 1"),
        ({"q": rows(FLAT)}, "draft_probs has shape \\(1, 3\\), expected \\(2, 3\\)"),
        ({"q": rows(FLAT, [np.nan, 0.5, 0.5])}, "NaN or inf"),
        ({"u": [0.5] * 4}, "2 drafts take 5 uniforms, got shape \\(4,\\)"),
        ({"u": [0.5, 0.5, 1.0, 0.5, 0.5]}, "uniforms must lie in \\[0, 1\\)"),
        ({"u": [0.5, -0.1, 0.5, 0.5, 0.5]}, "uniforms must lie in \\[0, 1\\)"),
    ],
)
def test_refusals_name_the_problem(change, message):
    args = {**GOOD, **change}
    with pytest.raises(RuleInputError, match=message):
        accept_tree(np.array(args["p"]), np.array(args["parents"]), np.array(args["tokens"]), args["q"], args["u"])


def test_helper_and_greedy_refusals():
    for helper in (tree_depths, ancestor_mask):
        with pytest.raises(RuleInputError, match="parent must come before"):
            helper([0])
    with pytest.raises(RuleInputError, match="2 nodes take 2 tokens and 3 argmaxes"):
        accept_tree_greedy([0, 0], [-1, -1], [0, 1])
    with pytest.raises(RuleInputError, match="non-negative"):
        accept_tree_greedy([0, 0, 0], [-1, -1], [0, -1])
