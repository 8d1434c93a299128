"""Training prompts: distinct, reproducible, and sharing nothing with the benchmark's prompts."""

import json
from pathlib import Path

import pytest

from verispec.train.prompts import training_prompts

SPEC_BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question_dev.jsonl"
SHINGLE = 8  # words: a run this long in common would mean a copied phrase, not shared idiom


def shingles(text: str) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def test_prompts_are_distinct_and_reproducible():
    prompts = training_prompts(2000, seed=3)
    assert len(set(prompts)) == 2000
    assert prompts == training_prompts(2000, seed=3)
    assert prompts != training_prompts(2000, seed=4)


def test_no_training_prompt_shares_a_phrase_with_spec_bench():
    if not SPEC_BENCH.is_file():
        pytest.skip(f"no Spec-Bench prompt set at {SPEC_BENCH}")
    bench = set()
    for line in SPEC_BENCH.read_text().splitlines():
        for turn in json.loads(line)["turns"]:
            bench |= shingles(turn)
    for prompt in training_prompts(3000, seed=0):
        assert not shingles(prompt) & bench, prompt
