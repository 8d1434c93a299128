"""The replay of greedy outputs (bench/replay.py) reproduces the engine's own rounds."""

import pytest

from verispec.bench.replay import Clock, NoisyTimer, replay
from verispec.drafters.control import WrongDrafter
from verispec.drafters.lookup import LookupDrafter
from verispec.governor import CostModel
from verispec.planner import Planner

PROMPTS = ["the cat sat on the mat. the cat", "abc abc abc ab", "zq xw vu ts"]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [1, 2, 5])
def test_a_fixed_k_replays_the_engines_rounds_exactly(tiny_engine, prompt, k):
    plain = tiny_engine.generate(prompt, drafter="none", temperature=0, max_tokens=60)
    assert plain.finish_reason == "length"
    spec = tiny_engine.generate(prompt, drafter="lookup", k=k, temperature=0, max_tokens=60)
    replayed = replay(tiny_engine.encode(prompt), plain.token_ids, LookupDrafter(), Planner(), Clock(0.1), k=k)
    assert replayed.rounds == spec.stats.rounds
    assert replayed.stats.k_histogram == spec.stats.k_histogram
    assert replayed.stats.accepted_by_position == spec.stats.accepted_by_position
    drafted = sum(d * n for d, n in spec.stats.k_histogram.items())
    assert replayed.steps == pytest.approx(spec.stats.rounds + 0.1 * drafted)


def test_an_always_wrong_drafter_under_the_governor_costs_little():
    output = list(range(5, 105))
    clock = Clock(0.15)
    fixed = replay([1, 2, 3], output, WrongDrafter(-1), Planner(), clock, k=3)
    governed = replay([1, 2, 3], output, WrongDrafter(-1), Planner(), clock)
    assert fixed.rounds == governed.rounds == 100  # one token a round: every draft rejected
    assert fixed.steps == pytest.approx(97 * 1.45 + 1.30 + 1.15 + 1.0)  # the last rounds draft what fits
    assert 0.97 < governed.speedup(100) < 1.0  # a few drafted rounds, then shadows keep it off


def test_a_clock_charges_rows_more_at_longer_contexts():
    clock = Clock(0.1, 0.0001)
    assert clock.steps(0, 5000) == 1.0
    assert clock.steps(4, 0) == pytest.approx(1.4) and clock.steps(4, 1000) == pytest.approx(1.8)


def test_a_clock_from_a_measured_curve_charges_its_passes_and_governs_on_its_line():
    """The native decoder's q4 passes on 2 AVX-512 VNNI cores (verify_cost.py): the clock
    charges each size its measured steps, past them the line through the last, and hands a
    governor the least-squares line through them, as a calibration fits it."""
    curve = (1.0, 1.04, 1.15, 1.25, 1.41, 1.58, 2.06, 2.27, 2.27)
    clock = Clock.from_curve(curve, per_token=0.001)
    assert [clock.steps(d, 0) for d in range(len(curve))] == pytest.approx(curve)
    assert clock.steps(16, 0) - 1 == pytest.approx(2 * (curve[-1] - 1))
    assert clock.steps(2, 100) == pytest.approx(1 + (curve[2] - 1) * (1 + 0.1 / clock.per_row))
    fitted = CostModel.from_timings(dict(enumerate(curve, start=1)))
    assert clock.costs(0).round_steps(6) == pytest.approx(fitted.round_steps(6)) == pytest.approx(1 + 6 * clock.per_row)
    bumpy = Clock.from_curve((1.0, 1.3, 1.1, 1.4))  # a noisy size never costs less than a smaller one
    assert bumpy.steps(2, 0) == pytest.approx(bumpy.steps(1, 0))
    with pytest.raises(ValueError, match="1 row on"):
        Clock.from_curve((1.2, 1.4))


def test_a_governor_measuring_noisy_timings_keeps_close_to_exact_costs():
    """Lookup over a repetitive output at a long context, where rows are dear: the governor
    that measures its costs through noise (sigma 0.15, drift, stalls) loses little to one that
    knows them."""
    prompt = [7, 8, 9, 10, 11, 12] * 150  # 900 tokens: a row costs 0.1 + 0.12 = 0.22 steps
    output = ([7, 8, 9, 10, 11, 12] * 10 + [40 + i for i in range(20)]) * 3
    clock = Clock(0.1, 0.00012)
    exact = replay(prompt, output, LookupDrafter(), Planner(), clock)
    timer = NoisyTimer(clock, sigma=0.15, seed=1)
    measured = replay(prompt, output, LookupDrafter(), Planner(), clock, timer=timer)
    speeds = [r.speedup(len(output)) for r in (exact, measured)]
    print(f"\n  exact costs {speeds[0]:.3f}x, measured {speeds[1]:.3f}x")
    assert speeds[1] >= 0.95 * speeds[0]
    assert speeds[1] > 1.0


def test_a_fixed_k_replays_the_engines_tree_rounds_exactly(native_engine):
    # The prompt's own repeats branch after "the cat": trees from the request's own tokens.
    prompt = "the cat sat. the cat ran. the cat sat. the cat ate. the cat sat. the cat"
    # Drafts no longer than the match (spec_factor 1): short chains, whose branches the
    # governor verifies as trees here (with the default of 4, this prompt's rounds were chains).
    options = {"suffix_branches": 3, "suffix_min_score": 0.0, "suffix_cache_tokens": 0, "suffix_spec_factor": 1.0}
    plain = native_engine.generate(prompt, drafter="none", temperature=0, max_tokens=40)
    spec = native_engine.generate(
        prompt, drafter=native_engine.drafter("suffix", scope="replay-a", **options), k=4, temperature=0, max_tokens=40
    )
    assert spec.token_ids == plain.token_ids and spec.stats.tree_rounds > 0
    drafter = native_engine.drafter("suffix", scope="replay-b", **options)
    replayed = replay(native_engine.encode(prompt), plain.token_ids, drafter, Planner(), Clock(0.1), k=4)
    counts = ("rounds", "tree_rounds", "tree_nodes", "accepted_by_position", "offered_by_position")
    assert [getattr(replayed.stats, c) for c in counts] == [getattr(spec.stats, c) for c in counts]
