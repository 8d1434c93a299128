"""The ``hybrid`` drafter: suffix's proposal where it is strong, the head's elsewhere
(verispec/drafters/hybrid.py). Its exactness through the whole engine is in
tests/engine/test_equivalence.py (greedy) and tests/engine/test_distribution.py (sampled)."""

import numpy as np
import pytest

from tests.drafters import trained
from verispec.drafters import hybrid
from verispec.drafters.base import DrafterError
from verispec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)
# The tiny target's own text: the second "the cat" continues as the first one did.
REPEATING = "the cat sat on the mat. the cat sat on the mat. the cat"
FRESH = "a dog"


@pytest.fixture
def drafter(tiny_engine, tiny_drafters):
    return tiny_engine.drafter("hybrid", drafter_weights=str(tiny_drafters["head"]), suffix_cache_tokens=0, fresh=True)


@pytest.fixture
def head(tiny_engine, tiny_drafters):
    return tiny_engine.drafter("head", drafter_weights=str(tiny_drafters["head"]), fresh=True)


def proposal(engine, drafter, prompt, k, seed=0):
    """(its proposal, what ``cheap_next`` said before it, the context) of ``drafter`` on the
    prefilled ``prompt``."""
    context = trained.prepared(engine, drafter, prompt, GREEDY)
    try:
        cheap = drafter.cheap_next(context, k)
        return drafter.propose(context, k, np.random.default_rng(seed)), cheap, context
    finally:
        trained.release(engine, drafter)


def test_a_strong_match_drafts_suffix_s_proposal(tiny_engine, drafter):
    draft, cheap, context = proposal(tiny_engine, drafter, REPEATING, 4)
    copier = drafter.copier
    copier.begin(context, GREEDY)
    expected = copier.propose(context, 4, np.random.default_rng(0))
    assert cheap and draft.source[0] == "suffix" and draft.probs is None
    assert draft.tokens == expected.tokens and len(draft.tokens) > 1
    assert (drafter.copied, drafter.learnt_rounds) == (1, 0)


def test_elsewhere_the_head_drafts_at_most_head_k(tiny_engine, drafter, head):
    draft, cheap, _ = proposal(tiny_engine, drafter, FRESH, 4)
    context = trained.prepared(tiny_engine, head, FRESH, GREEDY)
    try:
        alone = head.propose(context, 1, np.random.default_rng(0))
    finally:
        trained.release(tiny_engine, head)
    assert not cheap and draft.source == hybrid.HEAD_SOURCE
    assert draft.tokens == alone.tokens and len(draft.tokens) == hybrid.DEFAULT_HEAD_K
    assert (drafter.copied, drafter.learnt_rounds) == (0, 1)


def test_its_fallback_is_the_head_s_proposal_even_where_suffix_is_strong(tiny_engine, drafter, head):
    # What a governor that would not draft suffix's strong proposal asks for instead: the
    # head's, as the head alone proposes it, of the source the governor pools (steady).
    context = trained.prepared(tiny_engine, drafter, REPEATING, GREEDY)
    try:
        assert drafter.cheap_next(context, 4)
        fallback = drafter.propose_fallback(context, 4, np.random.default_rng(0))
    finally:
        trained.release(tiny_engine, drafter)
    context = trained.prepared(tiny_engine, head, REPEATING, GREEDY)
    try:
        alone = head.propose(context, 1, np.random.default_rng(0))
    finally:
        trained.release(tiny_engine, head)
    assert fallback.source == drafter.fallback_source == hybrid.HEAD_SOURCE
    assert fallback.tokens == alone.tokens and len(fallback.tokens) == hybrid.DEFAULT_HEAD_K
    assert drafter.steady_sources == (hybrid.HEAD_SOURCE,) and drafter.learnt_rounds == 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_head_s_draft_goes_on_with_suffix_s_strong_continuation(tiny_engine, tiny_drafters, head, temperature):
    # ``hybrid_extend``: after the head's token, suffix's strong continuation of the context
    # with that token appended (a point mass given the tokens before it). Earlier requests
    # (suffix's cache) read the context, the head's token and then ``after``, twice.
    params, after = SamplingParams(temperature=temperature), [40, 41, 42, 43]
    context = trained.prepared(tiny_engine, head, FRESH, params)
    try:
        alone = head.propose(context, 1, np.random.default_rng(0))
    finally:
        trained.release(tiny_engine, head)
    extending = tiny_engine.drafter(
        "hybrid", drafter_weights=str(tiny_drafters["head"]), suffix_cache_tokens=1000, hybrid_extend=3, fresh=True
    )
    copier = tiny_engine.drafter("suffix", suffix_cache_tokens=1000, fresh=True)
    for suffixes in (extending.copier, copier):
        for _ in range(2):
            suffixes.begin([*context, *alone.tokens, *after], params)
            suffixes.reset()
    copier.begin(context, params)
    continued = copier.propose([*context, *alone.tokens], 3, np.random.default_rng(0))
    assert copier.last.match >= hybrid.DEFAULT_MIN_MATCH and continued.frequencies[0] >= hybrid.DEFAULT_MIN_FREQUENCY
    assert continued.tokens == after[:3]
    prepared = trained.prepared(tiny_engine, extending, FRESH, params)
    try:
        draft = extending.propose_fallback(prepared, 4, np.random.default_rng(0))
        shorter = extending.propose_fallback(prepared, 2, np.random.default_rng(0))  # up to k in all
    finally:
        trained.release(tiny_engine, extending)
    assert draft.source == hybrid.HEAD_SOURCE and extending.extended == 2
    assert draft.tokens == alone.tokens + continued.tokens and shorter.tokens == draft.tokens[:2]
    if temperature == 0.0:
        assert draft.probs is None and alone.probs is None
    else:  # the head's row, then each copied token's point mass
        np.testing.assert_array_equal(draft.probs[0], alone.probs[0])
        assert np.array_equal(draft.probs[1:], np.eye(draft.probs.shape[1])[continued.tokens])


def test_without_hybrid_extend_the_head_drafts_alone(tiny_engine, tiny_drafters):
    # The default (0): where suffix has the same strong continuation as above, the head's
    # token alone.
    plain = tiny_engine.drafter(
        "hybrid", drafter_weights=str(tiny_drafters["head"]), suffix_cache_tokens=1000, fresh=True
    )
    context = trained.prepared(tiny_engine, plain, FRESH, GREEDY)
    try:
        token = plain.propose_fallback(context, 4, np.random.default_rng(0)).tokens
    finally:
        trained.release(tiny_engine, plain)
    for _ in range(2):
        plain.copier.begin([*context, *token, 40, 41, 42, 43], GREEDY)
        plain.copier.reset()
    context = trained.prepared(tiny_engine, plain, FRESH, GREEDY)
    try:
        assert plain.copier.propose_after(context, token, 3).tokens == [40, 41, 42]
        assert plain.propose_fallback(context, 4, np.random.default_rng(0)).tokens == token
    finally:
        trained.release(tiny_engine, plain)
    assert plain.extend == hybrid.DEFAULT_EXTEND == 0 and plain.extended == 0


def test_a_stricter_match_floor_hands_the_round_to_the_head(tiny_engine, tiny_drafters):
    strict = tiny_engine.drafter(
        "hybrid", drafter_weights=str(tiny_drafters["head"]), suffix_cache_tokens=0, hybrid_min_match=64, fresh=True
    )
    draft, cheap, _ = proposal(tiny_engine, strict, REPEATING, 4)
    assert not cheap and draft.source == hybrid.HEAD_SOURCE


def test_proposals_are_pure_and_prefixes_of_longer_ones(tiny_engine, drafter):
    # The planner asks a pure drafter for k_max and verifies the first k: the same draft
    # whichever k it asked for, and asking again changes nothing.
    for prompt in (REPEATING, FRESH):
        context = trained.prepared(tiny_engine, drafter, prompt, GREEDY)
        try:
            longest = drafter.propose(context, 6, np.random.default_rng(0))
            drafter.observe(context, 0)
            for k in (6, 3, 1):
                again = drafter.propose(context, k, np.random.default_rng(0))
                drafter.observe(context, 0)
                assert again.tokens == longest.tokens[:k] and again.source == longest.source
        finally:
            trained.release(tiny_engine, drafter)


def test_forks_share_suffix_s_cache_and_own_their_requests(tiny_engine, tiny_drafters):
    drafter = tiny_engine.drafter("hybrid", drafter_weights=str(tiny_drafters["head"]), fresh=True)
    twin = drafter.fork(tiny_engine.target)
    assert twin.cache is drafter.cache and twin.copier is not drafter.copier
    assert twin.learnt is not drafter.learnt and twin.learnt.net is drafter.learnt.net
    assert twin.hidden_capture == drafter.hidden_capture


@pytest.mark.parametrize(
    "options",
    [
        {"hybrid_min_match": 0},
        {"hybrid_min_match": 2.5},
        {"hybrid_min_frequency": 1.5},
        {"hybrid_min_frequency": "often"},
        {"hybrid_head_k": 0},
        {"hybrid_extend": -1},
        {"hybrid_extend": True},
        {"suffix_max_match": 0},
        {"head_kernels": "q3"},
        {"draft_branches": 3},  # trees: neither part's are drafted by the hybrid
        {"suffix_branches": 2},
    ],
)
def test_bad_options_are_refused(tiny_engine, tiny_drafters, options):
    with pytest.raises(DrafterError):
        tiny_engine.drafter("hybrid", drafter_weights=str(tiny_drafters["head"]), fresh=True, **options)
