"""Per-request statistics: counts, per-position bookkeeping and cost in plain steps."""

import dataclasses

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
    # Given reached: position 3 was reached by the first round only (the second broke at 2,
    # the third drafted 2), which kept it: 1.0, not the 0.75 of consecutive per-position values.
    assert stats.reached_by_position == [3, 3, 1, 1]
    assert stats.acceptance_given_reached == [1.0, 2 / 3, 1.0, 1.0]
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
    # Tokens read from the cache an earlier request left were not computed: not in the rate.
    reused = RequestStats(prefill_seconds=0.5, prompt_tokens=200, cached_prompt_tokens=150)
    assert reused.prefill_tokens_per_second == pytest.approx(100.0)
    assert reused.as_dict()["cached_prompt_tokens"] == 150


def _two_requests():
    first = RequestStats(prompt_tokens=10, prefill_seconds=0.1, cached_prompt_tokens=4)
    second = RequestStats(prompt_tokens=30)
    first.observe(offered=3, accepted=3, bonus=1, draft_seconds=0.001, verify_seconds=0.03)
    first.observe(offered=0, accepted=0, bonus=1, draft_seconds=0.0, verify_seconds=0.02)
    first.observe_choice(3, probe=False)
    second.observe(offered=5, accepted=1, bonus=1, draft_seconds=0.002, verify_seconds=0.04)
    second.observe_choice(5, probe=True)
    return first, second


def test_a_total_is_the_counts_of_all_rounds_observed_in_one():
    first, second = _two_requests()
    together = RequestStats(prompt_tokens=40, prefill_seconds=0.1, cached_prompt_tokens=4)
    together.observe(offered=3, accepted=3, bonus=1, draft_seconds=0.001, verify_seconds=0.03)
    together.observe(offered=0, accepted=0, bonus=1, draft_seconds=0.0, verify_seconds=0.02)
    together.observe(offered=5, accepted=1, bonus=1, draft_seconds=0.002, verify_seconds=0.04)
    together.observe_choice(3, probe=False)
    together.observe_choice(5, probe=True)
    total = RequestStats.total([first, second])
    for name, value in dataclasses.asdict(together).items():
        assert getattr(total, name) == (pytest.approx(value) if isinstance(value, float) else value), name
    assert total.offered_by_position == [2, 2, 2, 1, 1] and total.accepted_by_position == [2, 1, 1, 0, 0]
    assert total.k_histogram == {3: 1, 0: 1, 5: 1} and total.k_chosen_histogram == {3: 1, 5: 1}
    assert first.rounds == 2  # the parts are left as they were


def test_statistics_round_trip_through_their_dict():
    first, _ = _two_requests()
    first.reference_step_seconds, first.governor_start_acceptance = 0.02, 0.4
    assert RequestStats.from_dict(first.as_dict()) == first
    older = {key: value for key, value in first.as_dict().items() if key not in ("prefill_seconds", "prompt_tokens")}
    assert RequestStats.from_dict(older).prompt_tokens == 0  # a record from before prefill was counted


def test_cost_and_pays_against_a_step_measured_elsewhere():
    first, second = _two_requests()
    total = RequestStats.total([first, second])
    # Drafted rounds: 0.031 + 0.042 s over 2 rounds, in steps of 0.0146 s: 2.5 steps; 3 tokens a round.
    assert total.cost_steps_at(0.0146) == pytest.approx(0.0365 / 0.0146)
    assert total.pays_at(0.0146) is True and total.pays_at(0.01) is False
    assert total.cost_steps == pytest.approx(0.0365 / 0.02)  # its own plain round as the step
    assert total.predicted_speedup_at(None) is None and RequestStats().cost_steps_at(0.01) is None


def test_passes_shared_with_other_requests_are_counted_and_add_up():
    stats = RequestStats()
    for requests, rows in ((1, 1), (4, 9), (16, 40)):
        stats.observe(offered=0, accepted=0, bonus=1, draft_seconds=0.0, verify_seconds=0.01)
        stats.observe_pass(requests, rows)
    assert stats.mean_batch_size == pytest.approx(7.0) and stats.mean_rows_per_pass == pytest.approx(50 / 3)
    record = stats.as_dict()
    assert record["mean_batch_size"] == pytest.approx(7.0) and record["pass_rows"] == 50
    assert RequestStats.from_dict(record) == stats
    assert RequestStats.total([stats, stats]).pass_requests == 42
    for requests, rows in ((0, 1), (3, 2)):
        with pytest.raises(ValueError, match="impossible pass"):
            stats.observe_pass(requests, rows)


def test_tree_rounds_are_counted_round_trip_and_add_up():
    stats = RequestStats(tree_rounds=2, tree_nodes=11)
    assert RequestStats.from_dict(stats.as_dict()) == stats
    total = RequestStats.total([stats, stats])
    assert (total.tree_rounds, total.tree_nodes) == (4, 22)


def test_records_written_before_reached_was_counted_give_no_acceptance_given_reached():
    first, _ = _two_requests()
    older = {key: value for key, value in first.as_dict().items() if key != "reached_by_position"}
    stats = RequestStats.from_dict(older)
    assert stats.per_position_acceptance == first.per_position_acceptance
    assert first.acceptance_given_reached and stats.acceptance_given_reached == []
