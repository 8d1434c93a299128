"""benchmarks/copy_ceiling.py's counts on sequences whose answers are known by hand."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def ceiling(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("copy_ceiling")


def test_position_one_shares_tell_recent_frequent_and_any_apart(ceiling):
    # The context ends in 9 1 2: its one earlier occurrence went on with 4 (recent, frequent,
    # top 3), the shorter 1 2 and 2 also went on with 3, which only "any" counts.
    prompt = [5, 1, 2, 3, 9, 1, 2, 4, 9, 1, 2]
    counts = ceiling.analyse(prompt, [3], None, argparse.Namespace(ngram=4, k=8))
    assert counts["tokens"] == 1 and counts["matched"] == 1
    assert (counts["recent"], counts["frequent"], counts["top3"], counts["any"]) == (0, 0, 0, 1)
    counts = ceiling.analyse(prompt, [4], None, argparse.Namespace(ngram=4, k=8))
    assert (counts["recent"], counts["frequent"], counts["top3"], counts["any"]) == (1, 1, 1, 1)
    # 1 2 went on with 3 twice and 4 once: the most frequent differs from the most recent.
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 4, 7, 1, 2]
    counts = ceiling.analyse(prompt, [3], None, argparse.Namespace(ngram=2, k=8))
    assert (counts["recent"], counts["frequent"], counts["top3"]) == (0, 1, 1)


def test_chains_copy_up_to_k_and_the_oracle_picks_the_occurrence_that_goes_furthest(ceiling):
    text = list(range(10, 30))
    # The output copies the prompt's text after its last token's earlier occurrence: every
    # round drafts k and keeps them, plus its bonus token.
    prompt = [*text, 1, *text[:1]]
    output = text[1:19]
    counts = ceiling.analyse(prompt, output, None, argparse.Namespace(ngram=4, k=5))
    assert counts["rounds recent"] == 3 and counts["rounds oracle"] == 3  # 18 tokens, 6 a round
    # Two occurrences of 7: the recent one goes on 8 0, the older one 8 9 ... which the output
    # takes. Recent copies 1 draft a round; the oracle copies all of it.
    prompt = [7, 8, 9, 10, 11, 12, 3, 7, 8, 0, 3, 7]
    output = [8, 9, 10, 11, 12]
    counts = ceiling.analyse(prompt, output, None, argparse.Namespace(ngram=1, k=8))
    assert counts["rounds oracle"] == 1 and counts["rounds recent"] > 1


def test_the_cache_holds_earlier_documents_without_joining_them(ceiling):
    pool = ceiling.Seen(4)
    pool.extend([1, 2, 3, 4])
    pool.end_document()
    pool.extend([5, 6])
    assert [pool.tokens[p] for p in pool.followers((1, 2))] == [3]
    assert pool.followers((4, 5)) == [] and pool.followers((4,)) == []  # nothing crosses the boundary
    counts = ceiling.analyse([9, 1, 2], [3, 4], pool, argparse.Namespace(ngram=4, k=8))
    assert counts["any"] == 0 and counts["any+cache"] == 2
    assert counts["rounds oracle"] == 2 and counts["rounds oracle+cache"] == 1
