"""Per-request statistics: counts, per-position bookkeeping and cost in plain steps."""

import pytest

from verispec.stats import RequestStats


def test_observe_counts_and_derives():
    stats = RequestStats()
    stats.observe(offered=4, accepted=4, bonus=1, draft_seconds=0.01, verify_seconds=0.04)
    stats.observe(offered=4, accepted=1, bonus=1, draft_seconds=0.01, verify_seconds=0.04)
    stats.observe(offered=2, accepted=2, bonus=0, draft_seconds=0.01, verify_seconds=0.04)  # ended inside
    assert (stats.rounds, stats.offered, stats.accepted, stats.bonus, stats.tokens) == (3, 10, 7, 2, 9)
    assert stats.tokens_per_round == 3.0
    assert stats.ideal_tokens_per_round == pytest.approx(1 + 7 / 3)
    assert stats.bonus_shortfall == 1
    assert stats.acceptance_rate == 0.7
    assert stats.offered_by_position == [3, 3, 2, 2]
    assert stats.accepted_by_position == [3, 2, 1, 1]
    assert stats.per_position_acceptance == [1.0, 2 / 3, 0.5, 0.5]
    assert stats.k_histogram == {4: 2, 2: 1}
    assert stats.cost_steps is None  # no plain step time known yet
    assert stats.tokens_per_second == pytest.approx(9 / 0.15)


def test_cost_steps_from_plain_rounds_and_pays():
    stats = RequestStats()
    for _ in range(4):
        stats.observe(offered=0, accepted=0, bonus=1, draft_seconds=0.0, verify_seconds=0.02)
    for _ in range(2):
        stats.observe(offered=3, accepted=3, bonus=1, draft_seconds=0.005, verify_seconds=0.025)
    assert stats.plain_step_seconds == pytest.approx(0.02)
    assert stats.cost_steps == pytest.approx(1.5)
    assert stats.drafted_tokens_per_round == 4.0
    assert stats.pays is True
    record = stats.as_dict()
    assert record["k_histogram"] == {"0": 4, "3": 2}
    assert record["plain_rounds"] == 4 and record["pays"] is True


def test_reference_step_used_when_no_plain_round():
    stats = RequestStats(reference_step_seconds=0.01)
    stats.observe(offered=2, accepted=0, bonus=1, draft_seconds=0.002, verify_seconds=0.013)
    assert stats.cost_steps == pytest.approx(1.5)
    assert stats.pays is False  # one token per round at 1.5 steps


def test_impossible_rounds_are_refused():
    with pytest.raises(ValueError, match="impossible round"):
        RequestStats().observe(offered=2, accepted=3, bonus=1, draft_seconds=0, verify_seconds=0)
    with pytest.raises(ValueError, match="impossible round"):
        RequestStats().observe(offered=2, accepted=1, bonus=2, draft_seconds=0, verify_seconds=0)


def test_prefill_rate():
    stats = RequestStats(prefill_seconds=0.5, prompt_tokens=200)
    assert stats.prefill_tokens_per_second == pytest.approx(400.0)
    assert stats.as_dict()["prefill_tokens_per_second"] == pytest.approx(400.0)
    assert stats.as_dict()["prompt_tokens"] == 200
    assert RequestStats().prefill_tokens_per_second == 0.0  # no prefill timed: no rate
