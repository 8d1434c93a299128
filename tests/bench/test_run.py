"""The benchmark loop: interleaving, and one failed run that does not lose the others."""

import pytest

from verispec.bench.run import BenchSettings, run_bench
from verispec.bench.runners import RunRecord
from verispec.prompts import Prompt


class CountingRunner:
    """Emits the prompt's ids back; raises on the prompts listed in ``fail_on`` (by first id)."""

    def __init__(self, calls, label, fail_on=()):
        self.calls, self.label, self.fail_on = calls, label, set(fail_on)

    def run(self, prompt_ids, max_tokens, temperature, seed):
        self.calls.append((self.label, prompt_ids[0]))
        if prompt_ids[0] in self.fail_on:
            raise ValueError(f"overflow on {prompt_ids[0]}")
        return RunRecord(tokens=len(prompt_ids), seconds=1.0, token_ids=list(prompt_ids), peak_rss_mb=1.0)


SETTINGS = BenchSettings(model="m", max_tokens=4, temperature=0.0, seed=0, default_k="auto", prompts_file="p")
PROMPTS = [(Prompt(str(i), "qa", "x"), [i, i]) for i in range(3)]


def test_interleaved_rotation_after_warm_up():
    calls = []
    runners = {name: CountingRunner(calls, name) for name in ("a", "b", "c")}
    records = run_bench(runners, PROMPTS, SETTINGS)
    # Warm-up of each on the first prompt, then each prompt with the order rotated by one.
    assert calls[:3] == [("a", 0), ("b", 0), ("c", 0)]
    assert [name for name, _ in calls[3:]] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert len(records) == 9


def test_repeats_run_the_prompt_list_again_and_keep_rotating():
    calls = []
    runners = {name: CountingRunner(calls, name) for name in ("a", "b")}
    settings = BenchSettings(**{**SETTINGS.__dict__, "repeats": 2})
    records = run_bench(runners, PROMPTS, settings)
    assert [prompt for _, prompt in calls[2:]] == [0, 0, 1, 1, 2, 2] * 2  # two passes over the list
    assert [name for name, _ in calls[2:]] == ["a", "b", "b", "a"] * 3
    assert [(r["prompt_index"], r["repeat"]) for r in records if r["config"] == "a"] == [
        (i, repeat) for repeat in (0, 1) for i in range(3)
    ]


def test_a_failed_run_is_recorded_and_the_rest_continue():
    calls = []
    runners = {"ok": CountingRunner(calls, "ok"), "flaky": CountingRunner(calls, "flaky", fail_on={1})}
    failures = []
    records = run_bench(runners, PROMPTS, SETTINGS, failures=failures)
    assert [(r["config"], r["prompt_index"]) for r in records if r["config"] == "flaky"] == [("flaky", 0), ("flaky", 2)]
    assert len([r for r in records if r["config"] == "ok"]) == 3
    assert failures == [
        {"config": "flaky", "prompt_index": 1, "question_id": "1", "repeat": 0, "error": "ValueError('overflow on 1')"}
    ]
    # Without a list to collect them, failures propagate.
    with pytest.raises(ValueError, match="overflow on 1"):
        run_bench(runners, PROMPTS, SETTINGS)


def test_a_learning_drafter_starts_every_pass_empty(tiny_engine):
    # The suffix drafter learns across requests: within a pass from the earlier prompts, never
    # from the warm-up's or an earlier pass's run of the same prompt (it would draft it whole).
    from verispec.bench.configs import parse_config
    from verispec.bench.runners import VerispecRunner

    runner = VerispecRunner(parse_config("suffix:k=4", ["suffix"]), tiny_engine, "auto")
    prompts = [(Prompt(str(i), "qa", text), tiny_engine.encode(text)) for i, text in enumerate(["the cat", "a dog"])]
    settings = BenchSettings(**{**SETTINGS.__dict__, "repeats": 2, "max_tokens": 24})
    records = run_bench({"suffix": runner}, prompts, settings)
    by_pass = [[r for r in records if r["repeat"] == repeat] for repeat in (0, 1)]
    first, second = ([(r["stats"]["offered"], r["stats"]["accepted"]) for r in rows] for rows in by_pass)
    assert first == second  # greedy: each pass drafts exactly as the first did
    assert runner.drafter.cache.documents == len(prompts)  # this pass's runs only
    runner.start_pass()
    assert len(runner.drafter.cache) == 0
