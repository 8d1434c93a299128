"""Tree sizing: node chances, the best node set for a cost, and what a verified tree says."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec import rounds
from verispec.tree_sizing import (
    BranchCalibration,
    TreeOutcome,
    best_nodes,
    depths,
    first_children,
    later_shares,
    node_chances,
    tree_outcome,
)

# The root's children 10 (0.6) and 20 (0.3); 10's children 11 (0.8) and 12 (0.2); 11's child 13.
PARENTS = [-1, 0, -1, 0, 1]
FREQUENCIES = [0.6, 0.8, 0.3, 0.2, 1.0]


def test_shape_helpers():
    assert depths(PARENTS) == [1, 2, 1, 2, 3]
    assert first_children(PARENTS) == [True, True, False, False, True]
    # 20 takes 0.3 of the 0.4 that did not continue with 10; 12 all of 11's 0.2 remainder.
    assert later_shares(PARENTS, FREQUENCIES) == pytest.approx([0, 0, 0.75, 1.0, 0])


def test_chances_value_the_main_chain_as_the_chain_and_alternatives_by_their_share():
    a = [0.7, 0.5, 0.4]
    chances = node_chances(PARENTS, FREQUENCIES, a, scale=1.0)
    main = [0.7, 0.7 * 0.5, 0.7 * 0.5 * 0.4]
    assert [chances[0], chances[1], chances[4]] == pytest.approx(main)
    assert chances[2] == pytest.approx((1 - 0.7) * 0.75)  # refused first child, then its share
    assert chances[3] == pytest.approx(0.7 * (1 - 0.5) * 1.0)
    # The chain's expected tokens are the positional formula's.
    assert 1 + sum(main) == pytest.approx(rounds.expected_tokens_positional(a))
    # The scale multiplies later children only; positions past the estimates take the last.
    halved = node_chances(PARENTS, FREQUENCIES, [0.7], scale=0.5)
    assert halved[2] == pytest.approx(0.3 * 0.375) and halved[4] == pytest.approx(0.7**3)


@pytest.mark.parametrize(
    ("frequencies", "acceptance", "scale", "message"),
    [
        ([0.6, 0.8], [0.5], 1.0, "frequencies"),
        (FREQUENCIES, [], 1.0, "position 1"),
        (FREQUENCIES, [0.5], -1.0, "scale"),
        ([0.6, 0.8, 1.3, 0.2, 1.0], [0.5], 1.0, "probabilities"),
    ],
)
def test_bad_inputs_are_refused(frequencies, acceptance, scale, message):
    with pytest.raises(ValueError, match=message):
        node_chances(PARENTS, frequencies, acceptance, scale)


def line(per_row: float):
    return lambda n: 1.0 + per_row * n


def test_dear_rows_keep_the_chain_cheap_rows_take_the_alternatives():
    chances = node_chances(PARENTS, FREQUENCIES, [0.7, 0.5, 0.4], 1.0)  # 0.7 .35 .225 .35 .14
    dear = best_nodes(chances, line(0.4), max_nodes=5, min_gain=1.03)
    assert dear.nodes == [0]  # 1.7 / 1.4 beats two nodes' 2.05 / 1.8
    cheap = best_nodes(chances, line(0.02), max_nodes=5, min_gain=1.03)
    assert cheap.nodes == [0, 1, 2, 3, 4]
    assert cheap.expected_tokens == pytest.approx(1 + sum(chances))
    assert cheap.predicted_speedup == pytest.approx(cheap.expected_tokens / 1.1)
    # At a middling cost the sibling 12 (0.35) beats the main chain's third node (0.14).
    middle = best_nodes(chances, line(0.2), max_nodes=5, min_gain=1.03)
    assert 3 in middle.nodes and 4 not in middle.nodes
    assert best_nodes(chances, line(0.02), max_nodes=2).nodes == [0, 1]


def test_nothing_that_pays_is_a_plain_round():
    chances = node_chances(PARENTS, FREQUENCIES, [0.05], 0.0)  # alternatives measured never to win
    choice = best_nodes(chances, line(0.4), max_nodes=5, min_gain=1.03)
    assert choice.nodes == [] and choice.predicted_speedup == 1.0
    # Where the first child is nearly always refused, its alternative (0.95 x 0.75) is drafted alone.
    assert best_nodes(node_chances(PARENTS, FREQUENCIES, [0.05], 1.0), line(0.4), 5, min_gain=1.03).nodes == [2]
    assert best_nodes([], line(0.0), max_nodes=3).nodes == []


def test_a_shared_pass_prices_a_round_by_the_batch():
    chances = [0.6, 0.5]
    alone = best_nodes(chances, line(0.3), max_nodes=2)
    shared = best_nodes(chances, line(0.3), max_nodes=2, other_tokens=8.0)
    assert alone.nodes == [0, 1] and shared.nodes == []  # 9.6 / 9 < 1.3


trees = st.integers(1, 9).flatmap(
    lambda n: st.tuples(
        st.tuples(*[st.integers(-1, i - 1) for i in range(n)]),
        st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n),
        st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
        st.floats(0.0, 3.0),
        st.floats(0.0, 0.6),
    )
)


@settings(max_examples=300, deadline=None)
@given(trees)
def test_the_choice_is_a_tree_and_the_best_of_every_parent_closed_set(case):
    parents, frequencies, acceptance, scale, per_row = case
    parents = list(parents)
    chances = node_chances(parents, frequencies, acceptance, scale)
    for node, parent in enumerate(parents):
        assert 0.0 <= chances[node] <= (chances[parent] if parent >= 0 else 1.0) + 1e-12
    choice = best_nodes(chances, line(per_row), max_nodes=len(parents))
    assert all(parents[n] < 0 or parents[n] in choice.nodes for n in choice.nodes)

    def speed(nodes):
        return (1 + sum(chances[n] for n in nodes)) / line(per_row)(len(nodes)) if nodes else 1.0

    closed = [
        nodes
        for size in range(len(parents) + 1)
        for nodes in itertools.combinations(range(len(parents)), size)
        if all(parents[n] < 0 or parents[n] in nodes for n in nodes)
    ]
    assert speed(choice.nodes) == pytest.approx(max(speed(list(n)) for n in closed))


def test_an_outcome_reads_each_examined_position_and_each_refused_first_child():
    # Path 10 -> 12: the first child at position 1, then the alternative at position 2.
    outcome = tree_outcome(PARENTS, FREQUENCIES, [0, 3])
    assert outcome.first_hits == [1.0, 0.0]
    assert outcome.later_offers == [(pytest.approx(1.0), True)]
    # Path 20 (a leaf here): refused first child at position 1, alternative taken, then nothing
    # below it was on offer, so no position 2.
    outcome = tree_outcome(PARENTS, FREQUENCIES, [2])
    assert outcome.first_hits == [0.0] and outcome.later_offers == [(pytest.approx(0.75), True)]
    # Nothing accepted: position 1 refused, the alternative refused too.
    outcome = tree_outcome(PARENTS, FREQUENCIES, [])
    assert outcome.first_hits == [0.0] and outcome.later_offers == [(pytest.approx(0.75), False)]
    # The whole main chain: three hits, no branching examined beyond.
    assert tree_outcome(PARENTS, FREQUENCIES, [0, 1, 4]) == tree_outcome(PARENTS, FREQUENCIES, [0, 1, 4])
    assert tree_outcome(PARENTS, FREQUENCIES, [0, 1, 4]).first_hits == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="does not follow"):
        tree_outcome(PARENTS, FREQUENCIES, [0, 4])
    # Only the alternative 20 verified: position 1's first child was not on offer (None).
    only = tree_outcome(PARENTS, FREQUENCIES, [2], offered=[2])
    assert only.first_hits == [None] and only.later_offers == [(pytest.approx(0.75), True)]
    # 10 and 11 verified, 11 refused: position 2 examined; no alternatives were on offer.
    assert tree_outcome(PARENTS, FREQUENCIES, [0], offered=[0, 1]) == TreeOutcome([1.0, 0.0], [])
    with pytest.raises(ValueError, match="does not follow"):
        tree_outcome(PARENTS, FREQUENCIES, [0, 3], offered=[0, 1])


def test_the_branch_scale_follows_what_alternatives_win():
    calibration = BranchCalibration()
    assert calibration.scale == 0.5  # the prior: a drafter's alternatives win half their share
    for _ in range(40):
        calibration.observe(0.5, False)
    assert calibration.scale < 0.1  # 1 / (2 + 0.5 x 27.7): the prior counts as two
    for _ in range(300):
        calibration.observe(0.5, True)
    # Taken twice as often as predicted: the sums settle at 50 and 25 (1 / (1 - 0.98) rounds),
    # and the prior adds its 1 and 2.
    assert calibration.scale == pytest.approx(51 / 27, rel=0.01)
    before = calibration.predicted
    calibration.observe(3.0, True)  # a share above one counts as one
    assert calibration.predicted == pytest.approx(0.98 * before + 1.0)
