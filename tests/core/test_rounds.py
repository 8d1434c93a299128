"""Round arithmetic pinned to known answers, and the theory."""

import math

import pytest

from verispec import rounds

# Ratios are pinned to 5e-4: the table states them to 3 decimals, so the exact ratio lies
# within half a unit of the last digit (5e-4) of the printed value.
RATIO_TOL = 5e-4

# k, offered, rounds, accepted, tokens, tokens/round, ideal, shortfall (measured drafter runs)
KNOWN = [
    (4, 216, 54, 108, 160, 2.963, 3.000, 2),
    (7, 322, 46, 116, 160, 3.478, 3.522, 2),
    (7, 329, 47, 117, 160, 3.404, 3.489, 4),
]


@pytest.mark.parametrize(("k", "offered", "n_rounds", "accepted", "tokens", "tpr", "ideal", "shortfall"), KNOWN)
def test_known_answers(k, offered, n_rounds, accepted, tokens, tpr, ideal, shortfall):
    assert offered == k * n_rounds
    bonus = tokens - accepted  # tokens = accepted + bonus
    assert rounds.bonus_shortfall(n_rounds, bonus) == shortfall
    assert rounds.tokens_per_round(accepted, bonus, n_rounds) == pytest.approx(tpr, abs=RATIO_TOL)
    assert rounds.ideal_tokens_per_round(accepted, n_rounds) == pytest.approx(ideal, abs=RATIO_TOL)
    # ideal - tokens/round = shortfall / rounds, exactly (as fractions of integers).
    gap = rounds.ideal_tokens_per_round(accepted, n_rounds) - rounds.tokens_per_round(accepted, bonus, n_rounds)
    assert gap == pytest.approx(shortfall / n_rounds, abs=1e-12)


def test_per_position_and_rate():
    assert rounds.acceptance_rate(108, 216) == 0.5
    assert rounds.acceptance_rate(116, 322) == pytest.approx(0.3602, abs=RATIO_TOL)
    assert rounds.per_position_acceptance([108, 116], [216, 322]) == pytest.approx([0.5, 0.3602], abs=RATIO_TOL)
    assert rounds.per_position_acceptance([3, 0], [4, 0]) == [0.75, 0.0]
    with pytest.raises(ValueError, match="accepted counts"):
        rounds.per_position_acceptance([1, 2], [3])


def test_empty_denominators_are_zero():
    assert rounds.tokens_per_round(0, 0, 0) == 0.0
    assert rounds.ideal_tokens_per_round(0, 0) == 0.0
    assert rounds.acceptance_rate(0, 0) == 0.0
    assert rounds.bonus_shortfall(0, 0) == 0
    assert rounds.per_position_acceptance([], []) == []


def test_pays_is_strict():
    tpr = rounds.tokens_per_round(108, 52, 54)
    assert rounds.pays(tpr, 1.05) and rounds.pays(tpr, 2.05)
    assert rounds.pays(1.5, 1.05) and not rounds.pays(1.5, 2.05)
    assert rounds.pays(2.06, 2.05)
    assert not rounds.pays(2.05, 2.05)
    # A drafter that accepts nothing: every round commits only its bonus.
    nothing = rounds.tokens_per_round(0, 50, 50)
    assert nothing == 1.0
    assert not rounds.pays(nothing, 1.0) and not rounds.pays(nothing, 1.01)
    # Same accepted counts; the last round ended inside its prefix (bonus 0) instead of bonus 1.
    with_bonus = rounds.tokens_per_round(accepted=10, bonus=10, rounds=10)  # 2.0
    without = rounds.tokens_per_round(accepted=10, bonus=9, rounds=10)  # 1.9
    assert rounds.pays(with_bonus, 1.95) and not rounds.pays(without, 1.95)


def test_expected_tokens_per_round():
    assert rounds.expected_tokens_per_round(0.0, 5) == 1.0
    assert rounds.expected_tokens_per_round(1.0, 5) == 6.0
    assert rounds.expected_tokens_per_round(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert rounds.expected_tokens_per_round(0.8, 0) == 1.0
    a, k = 0.73, 6
    assert rounds.expected_tokens_positional([a] * k) == pytest.approx(rounds.expected_tokens_per_round(a, k))
    assert rounds.expected_tokens_positional([0.9, 0.5, 0.0, 1.0]) == pytest.approx(1 + 0.9 + 0.45)
    a_by_position = [0.9, 0.5, 0.3, 1.0, 0.7]
    by_k = rounds.expected_tokens_by_k(a_by_position)  # every prefix, the same sums bit for bit
    assert by_k == [rounds.expected_tokens_positional(a_by_position[:k]) for k in range(6)]
    assert rounds.expected_tokens_by_k([]) == [1.0]
    with pytest.raises(ValueError):
        rounds.expected_tokens_by_k([0.5, 1.5])
    with pytest.raises(ValueError):
        rounds.expected_tokens_per_round(1.2, 3)
    with pytest.raises(ValueError):
        rounds.expected_tokens_per_round(0.5, -1)


def test_predicted_speedup_and_best_k():
    # a = 0.8, c = 0.05, r = 1.2: E(k) / (0.05 k + 1.2)
    speeds = {k: rounds.predicted_speedup(0.8, k, 0.05, 1.2) for k in range(0, 13)}
    assert speeds[0] == pytest.approx(1 / 1.2)
    best = max(range(1, 13), key=lambda k: speeds[k])
    assert rounds.best_k(0.8, 0.05, 1.2, 12) == best
    assert speeds[best] > 1.0
    # Nothing pays: acceptance 0 gives one token per round at more than a step's cost.
    assert rounds.best_k(0.0, 0.05, 1.2, 8) == 0
    assert rounds.best_k(0.99, 0.0, 1.0, 4) == 4  # free drafts, near-certain acceptance
    assert math.isclose(rounds.round_cost_steps(4, 0.1, 1.3), 1.7)
