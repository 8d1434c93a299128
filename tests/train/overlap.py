"""The Spec-Bench dev prompts as eight-word runs, for checks that no prompt we write copies one."""

import functools
import json
from pathlib import Path

import pytest

from verispec.train.stdlib_texts import shingles

SPEC_BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question_dev.jsonl"


@functools.cache
def _bench() -> frozenset[tuple[str, ...]]:
    runs: set[tuple[str, ...]] = set()
    for line in SPEC_BENCH.read_text().splitlines():
        for turn in json.loads(line)["turns"]:
            runs |= shingles(turn)
    return frozenset(runs)


def spec_bench_shingles() -> frozenset[tuple[str, ...]]:
    """Every eight-word run of every turn of the Spec-Bench dev prompts (skips without them)."""
    if not SPEC_BENCH.is_file():
        pytest.skip(f"no Spec-Bench prompt set at {SPEC_BENCH}")
    return _bench()


__all__ = ["SPEC_BENCH", "shingles", "spec_bench_shingles"]
