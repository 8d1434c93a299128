"""Training prompts: distinct, reproducible, and sharing nothing with the benchmark's prompts."""

import pytest

from tests.train.overlap import shingles, spec_bench_shingles
from verispec.train.prompts import FOLLOW_UPS, PASSAGE_TASKS, second_turns, training_prompts


def test_prompts_are_distinct_and_reproducible():
    prompts = training_prompts(2000, seed=3)
    assert len(set(prompts)) == 2000
    assert prompts == training_prompts(2000, seed=3)
    assert prompts != training_prompts(2000, seed=4)


def test_no_training_prompt_shares_a_phrase_with_spec_bench():
    bench = spec_bench_shingles()
    for prompt in training_prompts(3000, seed=0):
        assert not shingles(prompt) & bench, prompt


FIRST = [(f"Tell me about item {i}.", f"Item {i} is a thing with {i} parts.") for i in range(40)]


def test_second_turns_build_on_the_targets_own_answers():
    turns = second_turns(FIRST, 60, seed=1)
    assert turns == second_turns(FIRST, 60, seed=1) and turns != second_turns(FIRST, 60, seed=2)
    answers = {answer for _, answer in FIRST}
    follow_ups = [c for c in turns if len(c) == 3]
    passages = [c for c in turns if len(c) == 1]
    assert follow_ups and passages and len(follow_ups) + len(passages) == 60
    for request, answer, follow in follow_ups:  # the answer it wrote, then a follow-up
        assert (request["role"], answer["role"], follow["role"]) == ("user", "assistant", "user")
        assert (request["content"], answer["content"]) in FIRST and follow["content"] in FOLLOW_UPS
    for (message,) in passages:  # a new request quoting one of its answers
        assert message["role"] == "user" and any(answer in message["content"] for answer in answers)
    # Every answer is used once before any is used twice.
    first_use = [c[1]["content"] if len(c) == 3 else c[0]["content"] for c in turns[:40]]
    assert len({next(a for a in answers if a in text) for text in first_use}) == 40


def test_second_turns_need_an_answer():
    with pytest.raises(ValueError, match="no first answer"):
        second_turns([("a request", "  ")], 3)


def test_no_second_turn_template_shares_a_phrase_with_spec_bench():
    bench = spec_bench_shingles()
    for template in (*FOLLOW_UPS, *PASSAGE_TASKS):
        text = template.format(passage="PASSAGE")
        assert not shingles(text) & bench, template
