"""Prompt lookup: longest n-gram first, the latest occurrence, the matched length as source,
and proposals that are prefixes of longer ones (what the engine's propose-first path needs)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from verispec.drafters.base import DrafterError
from verispec.drafters.lookup import LookupDrafter
from verispec.sampling import SamplingParams

RNG = np.random.default_rng(0)


def proposal(context, k, **options):
    drafter = LookupDrafter(**options)
    drafter.begin(context, SamplingParams())
    return drafter.propose(context, k, RNG)


def test_the_longest_match_wins_and_its_length_is_the_source():
    # "1 2 3" occurred before, followed by 7; "3" alone occurred later, followed by 9.
    context = [1, 2, 3, 7, 8, 3, 9, 5, 1, 2, 3]
    draft = proposal(context, 2)
    assert draft.tokens == [7, 8] and draft.source == 3 and draft.probs is None
    short = proposal([4, 3, 9, 5, 6, 3], 2)  # only the one-token match "3"
    assert short.tokens == [9, 5] and short.source == 1


def test_the_latest_occurrence_wins():
    assert proposal([5, 1, 5, 2, 5], 1).tokens == [2]


def test_no_match_proposes_nothing():
    draft = proposal([1, 2, 3, 4], 3)
    assert draft.tokens == [] and draft.source is None


def test_bad_ngram_bounds_are_refused():
    with pytest.raises(DrafterError, match="min_ngram <= max_ngram"):
        LookupDrafter(max_ngram=1, min_ngram=2)


@given(st.lists(st.integers(0, 4), min_size=2, max_size=40), st.integers(1, 8))
def test_a_proposal_of_k_is_the_first_k_of_a_longer_one(context, k):
    drafter = LookupDrafter()
    drafter.begin(context, SamplingParams())
    longer = drafter.propose(context, 8, RNG)
    shorter = drafter.propose(context, k, RNG)
    assert shorter.tokens == longer.tokens[:k] and shorter.source == longer.source
