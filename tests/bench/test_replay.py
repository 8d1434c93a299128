"""The replay of greedy outputs (bench/replay.py) reproduces the engine's own rounds."""

import pytest

from verispec.bench.replay import Schedule, replay
from verispec.drafters.control import WrongDrafter
from verispec.drafters.lookup import LookupDrafter

PROMPTS = ["the cat sat on the mat. the cat", "abc abc abc ab", "zq xw vu ts"]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [1, 2, 5])
def test_a_fixed_k_replays_the_engines_rounds_exactly(tiny_engine, prompt, k):
    plain = tiny_engine.generate(prompt, drafter="none", temperature=0, max_tokens=60)
    assert plain.finish_reason == "length"
    spec = tiny_engine.generate(prompt, drafter="lookup", k=k, temperature=0, max_tokens=60)
    replayed = replay(tiny_engine.encode(prompt), plain.token_ids, LookupDrafter(), Schedule.fixed(k), per_row=0.1)
    assert replayed.rounds == spec.stats.rounds
    drafted = sum(d * n for d, n in spec.stats.k_histogram.items())
    assert replayed.steps == pytest.approx(spec.stats.rounds + 0.1 * drafted)


def test_an_always_wrong_drafter_under_the_governor_costs_little():
    output = list(range(5, 105))
    fixed = replay([1, 2, 3], output, WrongDrafter(-1), Schedule.fixed(3), per_row=0.15)
    governed = replay([1, 2, 3], output, WrongDrafter(-1), Schedule.governed(8, 0.15, shadow=True), per_row=0.15)
    assert fixed.rounds == governed.rounds == 100  # one token a round: every draft rejected
    assert fixed.steps == pytest.approx(97 * 1.45 + 1.30 + 1.15 + 1.0)  # the last rounds draft what fits
    assert 0.97 < governed.speedup(100) < 1.0  # a few drafted rounds, then shadows keep it off
