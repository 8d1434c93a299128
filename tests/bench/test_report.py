"""The bench's statistics come from rounds.py applied to summed counts: known answers."""

import pytest

from verispec.bench.configs import BenchConfigError, own_plain, parse_config, parse_configs
from verispec.bench.report import OVERALL, summarise

RATIO_TOL = 5e-4  # known answers are stated to 3 decimals


def stats(
    rounds, offered, accepted, bonus, k_hist, acc_pos, off_pos, seconds, plain_rounds=0, plain_seconds=0.0, reached=None
):
    extra = {} if reached is None else {"reached_by_position": reached}
    return extra | {
        "rounds": rounds,
        "offered": offered,
        "accepted": accepted,
        "bonus": bonus,
        "k_histogram": {str(k): n for k, n in k_hist.items()},
        "accepted_by_position": acc_pos,
        "offered_by_position": off_pos,
        "draft_seconds": 0.0,
        "verify_seconds": seconds,
        "plain_rounds": plain_rounds,
        "plain_seconds": plain_seconds,
    }


def record(config, index, category, tokens, seconds, token_ids, round_stats):
    return {
        "config": config,
        "prompt_index": index,
        "category": category,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "token_ids": token_ids,
        "peak_rss_mb": 100.0,
        "stats": round_stats,
    }


@pytest.fixture
def records():
    # Two prompts. The plain baseline decodes 80 tokens per prompt at 10 ms a step.
    # lookup:k=4 reproduces the known-answer row k=4: over both prompts 54 rounds, 216
    # offered, 108 accepted, 160 tokens (so 52 bonus, shortfall 2).
    base = [
        record("none", i, "summarization", 80, 0.8, [1] * 80, stats(80, 0, 0, 80, {0: 80}, [], [], 0.8, 80, 0.8))
        for i in range(2)
    ]
    look = [
        record(
            "lookup:k=4",
            0,
            "summarization",
            80,
            0.4,
            [1] * 80,
            stats(27, 108, 54, 26, {4: 27}, [20, 14, 11, 9], [27, 27, 27, 27], 0.4, reached=[27, 20, 14, 11]),
        ),
        record(
            "lookup:k=4",
            1,
            "summarization",
            80,
            0.5,
            [1] * 79 + [2],
            stats(27, 108, 54, 26, {4: 27}, [21, 14, 10, 9], [27, 27, 27, 27], 0.5, reached=[27, 21, 14, 10]),
        ),
    ]
    return base + look


def test_known_answers(records):
    rows = {(r.category, r.config): r for r in summarise(records, "none", greedy=True)}
    row = rows[("summarization", "lookup:k=4")]
    assert row.tokens_per_round == pytest.approx(2.963, abs=RATIO_TOL)
    assert row.acceptance_rate == 0.5
    assert row.bonus_shortfall == 2
    assert row.per_position == pytest.approx([41 / 54, 28 / 54, 21 / 54, 18 / 54])
    # Given reached: a position is reached by the rounds that kept the one before it.
    assert row.given_reached == pytest.approx([41 / 54, 28 / 41, 21 / 28, 18 / 21])
    assert rows[("summarization", "none")].given_reached == []  # nothing drafted
    assert row.tokens_per_second == pytest.approx(160 / 0.9)
    # Per-prompt ratios 200/100 and 160/100: geometric mean sqrt(3.2).
    assert row.speedup == pytest.approx(3.2**0.5)
    assert row.identical == 0.5
    # Cost: 0.9 s over 54 drafted rounds = 16.67 ms, over the 10 ms plain step = 1.667 steps.
    assert row.cost_steps == pytest.approx(0.9 / 54 / 0.01)
    assert row.pays is True  # 2.963 tokens per round > 1.667 steps
    # Every round offered 4: it keeps on average the sum of the per-position shares (108/54 = 2
    # drafts), plus its bonus: 3 tokens expected per round, at 1.667 steps a round.
    assert row.predicted_speedup == pytest.approx(3.0 / row.cost_steps)
    assert row.efficiency == pytest.approx(row.speedup / row.predicted_speedup)
    overall = rows[(OVERALL, "lookup:k=4")]
    assert overall.tokens_per_round == row.tokens_per_round
    assert rows[("summarization", "none")].speedup == 1.0


def test_identity_is_only_reported_for_greedy(records):
    rows = summarise(records, "none", greedy=False)
    assert all(r.identical is None for r in rows)


def test_config_parsing():
    drafters = ["lookup", "model", "none"]
    config = parse_config("lookup:k=8,dtype=float32", drafters)
    assert (config.name, config.options, config.int_option("k", 4)) == ("lookup", {"k": "8", "dtype": "float32"}, 8)
    assert parse_config("hf-prompt-lookup:n=5", drafters).is_peer
    assert parse_configs(["lookup"], drafters)[0].label == "none"  # the baseline is added
    with pytest.raises(BenchConfigError, match="unknown configuration 'turbo'"):
        parse_config("turbo", drafters)
    with pytest.raises(BenchConfigError, match="unknown option"):
        parse_config("lookup:n=3", drafters)
    with pytest.raises(BenchConfigError, match="must be an integer"):
        parse_config("lookup:k=many", drafters)
    with pytest.raises(BenchConfigError, match="k_max must be >= 0"):
        parse_config("lookup:k_max=-1", drafters)
    with pytest.raises(BenchConfigError, match="key=value"):
        parse_config("lookup:k", drafters)
    with pytest.raises(BenchConfigError, match="repeat"):
        parse_configs(["lookup", "lookup"], drafters)


def test_own_plain_of_each_runtime(records):
    """A configuration on another runtime is held to that runtime's plain run: identity and
    cost steps come from it, speed-up from the chosen baseline."""
    drafters = ["lookup", "none"]
    configs = parse_configs(
        [
            "none",
            "lookup:k=4",
            "none:backend=llama.cpp",
            "lookup:backend=llama.cpp,k=4",
            "llama.cpp",
            "llama.cpp-lookup",
        ],
        drafters,
    )
    plain = own_plain(configs, "none")
    assert plain == {
        "none": "none",
        "lookup:k=4": "none",
        "none:backend=llama.cpp": "none",
        "lookup:backend=llama.cpp,k=4": "none:backend=llama.cpp",
        "llama.cpp": "none",
        "llama.cpp-lookup": "llama.cpp",
    }
    # Without its own plain run in the bench, a configuration falls back to the baseline.
    assert own_plain(parse_configs(["lookup:dtype=float32"], drafters), "none")["lookup:dtype=float32"] == "none"

    # The llama.cpp runs: plain decodes 80 tokens at 5 ms a step, output [7] * 80, which the
    # torch baseline never produces; lookup keeps that output at twice the plain speed.
    other = [
        record(
            "none:backend=llama.cpp",
            i,
            "summarization",
            80,
            0.4,
            [7] * 80,
            stats(80, 0, 0, 80, {0: 80}, [], [], 0.4, 80, 0.4),
        )
        for i in range(2)
    ]
    spec = [
        record(
            "lookup:backend=llama.cpp,k=4",
            i,
            "summarization",
            80,
            0.2,
            [7] * 80,
            stats(40, 40, 40, 40, {1: 40}, [40], [40], 0.2),
        )
        for i in range(2)
    ]
    rows = {(r.category, r.config): r for r in summarise(records + other + spec, "none", greedy=True, own_plain=plain)}
    row = rows[("summarization", "lookup:backend=llama.cpp,k=4")]
    assert row.own_plain == "none:backend=llama.cpp"
    assert row.identical == 1.0  # against llama.cpp's plain output, not the torch baseline's
    assert row.speedup == pytest.approx(4.0)  # 400 tok/s over the baseline's 100
    assert row.speedup_own == pytest.approx(2.0)  # over llama.cpp plain's 200
    # 5 ms rounds over its own 5 ms steps (over the torch baseline's 10 ms it would read 0.5)
    assert row.cost_steps == pytest.approx(1.0)
    assert row.efficiency == pytest.approx(row.speedup_own / row.predicted_speedup)
    other_plain = rows[("summarization", "none:backend=llama.cpp")]
    assert other_plain.identical == 0.0  # against the baseline
    # The theory predicts speed-ups within a runtime: none across runtimes, so no efficiency.
    assert other_plain.predicted_speedup is None and other_plain.efficiency is None
    assert rows[("summarization", "none")].predicted_speedup == 1.0


def test_repeated_passes_pair_each_run_with_the_baselines_run_of_the_same_pass():
    # One prompt, two passes: lookup 2x the plain run of pass 0, 1x that of pass 1 (which the
    # machine ran slower for both). Pairing within passes: sqrt(2 * 1); across them it would not.
    plain = stats(80, 0, 0, 80, {0: 80}, [], [], 0.8, 80, 0.8)
    runs = []
    for repeat, (base_seconds, lookup_seconds) in enumerate([(0.8, 0.4), (1.6, 1.6)]):
        for config, seconds in (("none", base_seconds), ("lookup", lookup_seconds)):
            runs.append({**record(config, 0, "qa", 80, seconds, [1] * 80, plain), "repeat": repeat})
    row = next(r for r in summarise(runs, "none", greedy=True) if r.config == "lookup" and r.category == OVERALL)
    assert row.prompts == 2  # runs
    assert row.speedup == pytest.approx(2**0.5, abs=RATIO_TOL)


def test_prefill_rate_from_summed_prompts(records):
    for index, r in enumerate(records):
        r["stats"].update(prompt_tokens=100 * (index + 1), prefill_seconds=0.1 * (index + 1))
    rows = summarise(records, "none", greedy=True)
    overall = {row.config: row for row in rows if row.category == OVERALL}
    # none: prompts of 100 and 200 tokens read in 0.1 + 0.2 s: 300 / 0.3
    assert overall["none"].prefill_tokens_per_second == pytest.approx(1000.0)


def test_decode_speedup_takes_each_runs_prefill_out(records):
    # Every run read its prompt in 0.2 s. Decoding alone: plain 80 tokens in 0.6 s on both
    # prompts, lookup in 0.2 and 0.3 s: ratios 3 and 2, geometric mean 6 ** 0.5 = 2.449;
    # over the whole request 0.8 / 0.4 and 0.8 / 0.5: 3.2 ** 0.5 = 1.789.
    for r in records:
        r["stats"]["prefill_seconds"] = 0.2
    row = next(r for r in summarise(records, "none", greedy=True) if r.config == "lookup:k=4")
    assert row.speedup_own == pytest.approx(3.2**0.5, abs=RATIO_TOL)
    assert row.decode_speedup_own == pytest.approx(6**0.5, abs=RATIO_TOL)
    plain = next(r for r in summarise(records, "none", greedy=True) if r.config == "none")
    assert plain.decode_speedup_own == pytest.approx(1.0)


def test_decode_speedup_only_where_both_runs_report_their_prefill(records):
    # The fixture's stats say nothing of prefill (a peer's runs, or results saved before it was
    # timed): no decode speed-up rather than the whole request's under another name.
    rows = summarise(records, "none", greedy=True)
    assert all(row.decode_speedup_own is None for row in rows)
    records[0]["stats"]["prefill_seconds"] = 0.2  # one side of one pair only
    row = next(r for r in summarise(records, "none", greedy=True) if r.config == "lookup:k=4")
    assert row.decode_speedup_own is None


def test_sampled_speed_ups_read_only_the_runs_whose_answers_have_the_same_length():
    # T > 0: the second prompt's drafted run sampled an answer of 5 tokens where plain's ran
    # to 80; its tok/s is mostly prefill (a ratio of 0.1 here) and says nothing of decoding.
    # The speed-up reads the pair of equal lengths alone and says how many pairs it read.
    plain = [
        record("none", i, "qa", 80, 0.8, [1] * 80, stats(80, 0, 0, 80, {0: 80}, [], [], 0.8, 80, 0.8)) for i in range(2)
    ]
    drafted = [
        record("head:k=1", 0, "qa", 80, 0.4, [2] * 80, stats(40, 40, 40, 40, {1: 40}, [40], [40], 0.4)),
        record("head:k=1", 1, "qa", 5, 0.5, [2] * 5, stats(4, 4, 1, 4, {1: 4}, [1], [4], 0.5)),
    ]
    rows = {(r.category, r.config): r for r in summarise(plain + drafted, "none", greedy=False)}
    row = rows[("qa", "head:k=1")]
    assert row.speedup == pytest.approx(2.0) and row.speedup_own == pytest.approx(2.0)
    assert row.paired == 1 and row.prompts == 2
    assert row.identical is None
    # Greedy answers have one length (identity): every pair is read, and none is left out.
    greedy = {(r.category, r.config): r for r in summarise(plain + drafted, "none", greedy=True)}
    assert greedy[("qa", "head:k=1")].speedup == pytest.approx((2.0 * (10 / 100)) ** 0.5)
    assert greedy[("qa", "head:k=1")].paired is None
