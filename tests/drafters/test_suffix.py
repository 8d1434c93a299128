"""The suffix drafter: the deepest match in the request or the cache, frequencies along the
walk, the cache's bound and index, forks and scopes, and proposals that are prefixes."""

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from verispec.drafters import suffix
from verispec.drafters.base import DrafterError
from verispec.drafters.suffix import (
    KEY,
    MAX_CANDIDATES,
    SEPARATOR,
    SuffixCache,
    SuffixDrafter,
    match_lengths,
    source_of,
)
from verispec.sampling import SamplingParams
from verispec.tree_sizing import depths

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True, scope="module", params=["native", "python"])
def walks(request):
    """Every test here twice: with the C++ chain walks (the default where they build) and with
    the Python walks they must equal (VERISPEC_NATIVE_DRAFTING=0)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERISPEC_NATIVE_DRAFTING", "1" if request.param == "native" else "0")
        assert (SuffixDrafter().state is not None) == (request.param == "native"), "the drafting helpers did not build"
        yield request.param


def make(cache: SuffixCache, **options) -> SuffixDrafter:
    """A suffix drafter without the length limit (draft tokens per matched token) and with a
    low score floor, so the tests below see whole walks; the limits have their own test."""
    return SuffixDrafter(cache, **{"spec_factor": 100.0, "min_score": 0.1, **options})


def run(drafter: SuffixDrafter, document: list[int]) -> None:
    """A request that read ``document`` and ended: its document joins the cache."""
    drafter.begin(document, SamplingParams())
    drafter.reset()


def proposal(drafter: SuffixDrafter, context: list[int], k: int):
    drafter.begin(context, SamplingParams())
    return drafter.propose(context, k, RNG)


def test_the_request_alone_drafts_like_prompt_lookup():
    drafter = make(SuffixCache(0))
    draft = proposal(drafter, [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], 5)
    assert draft.tokens == [4, 5, 6, 7, 1] and draft.probs is None
    assert drafter.last.match == 3 and drafter.last.frequencies == [1.0] * 5
    assert draft.source == source_of(drafter.last) == (3, 1, 0)
    assert proposal(drafter, [1, 2, 3], 4).tokens == []  # nothing seen before: no draft
    assert proposal(drafter, [1, 2, 1], 0).tokens == []


def test_earlier_requests_teach_later_ones_and_a_zero_cache_forgets():
    for capacity, expected in ((1000, [30, 31, 32, 33]), (0, [])):
        drafter = make(SuffixCache(capacity))
        run(drafter, [5, 6, 7, 8, 9, 30, 31, 32, 33])
        assert proposal(drafter, [40, 41, 7, 8, 9], 4).tokens == expected
        assert proposal(drafter, [40, 41, 8, 9], 4).tokens == []  # the cache is asked for KEY tokens only
    drafter = make(SuffixCache(1000))
    drafter.begin([1, 2, 3], SamplingParams())
    drafter.observe([1, 2, 3, 4, 5], 1)  # the output so far belongs to the document too
    drafter.reset()
    assert proposal(drafter, [9, 2, 3, 4], 2).tokens == [5]


def test_frequencies_choose_the_continuation_and_the_score_ends_the_walk():
    drafter = make(SuffixCache(1000), min_score=0.5)
    for tail in ([10, 11], [10, 11], [10, 12]):  # after "1 2 3": 10 three times, then 11 twice
        run(drafter, [1, 2, 3, *tail])
    draft = proposal(drafter, [0, 1, 2, 3], 5)
    assert draft.tokens == [10, 11]
    assert drafter.last.count == 3 and drafter.last.frequencies == pytest.approx([1.0, 2 / 3])
    strict = make(drafter.cache, min_score=0.7)  # 1 * 2/3 < 0.7: stops after 10
    assert proposal(strict, [0, 1, 2, 3], 5).tokens == [10]
    assert strict.last.frequencies == [1.0]


def test_the_deepest_match_wins_over_a_more_frequent_shallow_one():
    drafter = make(SuffixCache(1000))
    run(drafter, [7, 8, 1, 2, 3, 50])
    for _ in range(3):
        run(drafter, [1, 2, 3, 60])
    draft = proposal(drafter, [7, 8, 1, 2, 3], 1)
    assert draft.tokens == [50] and drafter.last.match == 5 and drafter.last.count == 1
    assert proposal(drafter, [9, 1, 2, 3], 1).tokens == [60]  # match 3: four occurrences, 60 in three
    assert drafter.last.frequencies == [0.75]


def test_on_a_tie_the_request_itself_wins_then_the_most_recent():
    drafter = make(SuffixCache(1000))
    run(drafter, [3, 4, 5, 70])
    run(drafter, [3, 4, 5, 80])
    assert proposal(drafter, [9, 3, 4, 5], 1).tokens == [80]  # the later document
    assert proposal(drafter, [3, 4, 5, 90, 3, 4, 5], 1).tokens == [90]  # its own earlier "3 4 5"


def test_matches_and_walks_stop_at_document_ends():
    drafter = make(SuffixCache(1000))
    run(drafter, [1, 2, 3])
    run(drafter, [4, 5, 6])
    assert proposal(drafter, [8, 2, 3], 3).tokens == []  # "2 3" ends its document: nothing follows
    lengths = match_lengths(drafter.cache.tokens, np.array([5]), np.array([1, 2, 3, 4]), 10)
    assert lengths.tolist() == [1]  # "4" matches; the 3 before it is across the separator


def test_proposals_are_prefixes_of_longer_ones():
    drafter = make(SuffixCache(1000), min_score=0.0)
    for doc in ([1, 2, 3, 4, 5, 6, 8], [1, 2, 3, 4, 9, 9], [2, 3, 4, 5, 6, 7]):
        run(drafter, doc)
    context = [0, 2, 3, 4]
    longest = proposal(drafter, context, 8).tokens
    assert len(longest) >= 3
    for k in range(len(longest) + 1):
        assert proposal(drafter, context, k).tokens == longest[:k]


def brute_force(tokens: list[int], tail: list[int]) -> list[int]:
    """Positions right after each occurrence of ``tail`` that a token follows (not a separator)."""
    n = len(tail)
    return [
        i + n
        for i in range(len(tokens) - n + 1)
        if tokens[i : i + n] == tail and i + n < len(tokens) and tokens[i + n] != SEPARATOR
    ]


@settings(max_examples=60, deadline=None)
@given(
    documents=st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=30), min_size=1, max_size=12),
    capacity=st.integers(1, 120),
)
def test_the_cache_stays_in_its_bound_and_its_index_is_exact(documents, capacity):
    cache = SuffixCache(capacity)
    kept: list[list[int]] = []
    for doc in documents:
        cache.add(doc)
        if len(doc) >= 2 and capacity >= 3:  # the tail that fits beside its separator
            kept.append(doc[len(doc) - min(len(doc), capacity - 1) :])
        assert len(cache) <= capacity
    tokens = cache.tokens.tolist()
    # The newest documents, whole, each followed by a separator; the oldest evicted first.
    flat: list[int] = []
    for doc in reversed(kept):
        if len(flat) + len(doc) + 1 > capacity:
            break
        flat = [*doc, SEPARATOR, *flat]
    assert tokens == flat
    for n in range(1, KEY + 1):
        for start in range(len(tokens) - n + 1):
            tail = tokens[start : start + n]
            if SEPARATOR in tail:
                continue
            expected = brute_force(tokens, tail)[-MAX_CANDIDATES:]
            assert cache.occurrences(tail).tolist() == expected


def test_forks_share_the_cache_and_keep_their_own_documents():
    drafter = make(SuffixCache(1000))
    fork = drafter.fork(object())
    assert fork.cache is drafter.cache
    drafter.begin([1, 2, 3, 4], SamplingParams())
    fork.begin([5, 6, 7, 8], SamplingParams())
    assert fork.propose([5, 6, 7, 8, 1, 2, 3], 1, RNG).tokens == []  # the other request is not over
    drafter.reset()
    assert fork.propose([5, 6, 7, 8, 1, 2, 3], 1, RNG).tokens == [4]


def test_engine_scopes_keep_caches_apart(tiny_engine):
    first = tiny_engine.drafter("suffix", scope="key-a")
    assert tiny_engine.drafter("suffix", scope="key-a") is first
    other = tiny_engine.drafter("suffix", scope="key-b")
    assert other.cache is not first.cache
    run(first, [1, 2, 3, 4, 5])
    assert proposal(first, [9, 1, 2, 3], 2).tokens == [4, 5]
    assert proposal(other, [9, 1, 2, 3], 2).tokens == []
    assert len(tiny_engine.drafter("suffix", scope="key-c", suffix_cache_tokens=0).cache) == 0


@pytest.mark.parametrize(
    "options",
    [{"suffix_cache_tokens": -1}, {"suffix_cache_tokens": "many"}, {"suffix_max_match": 0}, {"suffix_min_score": 2.0}],
)
def test_bad_options_are_refused(tiny_engine, options):
    with pytest.raises(DrafterError):
        tiny_engine.drafter("suffix", **options)


def test_trees_grow_best_first_and_every_prefix_is_the_best_smaller_tree():
    drafter = make(SuffixCache(1000), min_score=0.0, branches=2)
    for tail in ([10, 11], [10, 11], [10, 12], [20, 21]):
        run(drafter, [1, 2, 3, *tail])
    draft = proposal(drafter, [0, 1, 2, 3], 8)
    # 10 follows in 3 of 4 (score .75), then 11 in 2 of those 3 (.5); 20 (.25) was a candidate
    # before 12 (.25), so it comes first; 21 follows 20 always (.25); 12 has nothing after it.
    assert draft.tokens == [10, 11, 20, 12, 21] and draft.parents == [-1, 0, -1, 0, 2]
    assert drafter.last.scores == pytest.approx([0.75, 0.5, 0.25, 0.25, 0.25])
    assert draft.is_tree and draft.main_chain().tokens == [10, 11]
    assert draft.frequencies == pytest.approx([0.75, 2 / 3, 0.25, 1 / 3, 1.0])
    for n in range(1, 6):
        # Every first n nodes are a tree of their own (each node after its parent) ...
        assert draft.first(n).tokens == draft.tokens[:n]
        assert draft.first(n).frequencies == draft.frequencies[:n]
    for k in range(1, 3):
        # ... and a proposal of depth k is the full one's nodes of depth <= k, up to 2k of them.
        smaller = proposal(drafter, [0, 1, 2, 3], k)
        shallow = [node for node, d in enumerate(depths(draft.parents)) if d <= k][: 2 * k]
        assert smaller == draft.select(shallow)
    assert proposal(drafter, [0, 1, 2, 3], 1).tokens == [10, 20]  # depth 1: both first tokens
    strict = make(drafter.cache, min_score=0.3, branches=2)
    assert proposal(strict, [0, 1, 2, 3], 8).tokens == [10, 11]  # nothing else scores 0.3
    chain = make(drafter.cache, min_score=0.0)
    assert proposal(chain, [0, 1, 2, 3], 8).tokens == [10, 11] and chain.last.parents == [-1, 0]


def stores_of(top_token: int, length: int, last_position: int) -> st.SearchStrategy:
    """One or two stores: tokens (separators among them) and positions of occurrences in them
    (up to 40 each, past FEW_OCCURRENCES; some may be past the store's end)."""
    return st.lists(
        st.tuples(
            st.lists(st.integers(-1, top_token), min_size=1, max_size=length),
            st.lists(st.integers(0, last_position), min_size=0, max_size=40),
        ),
        min_size=1,
        max_size=2,
    )


@settings(max_examples=80, deadline=None)
@given(stores=stores_of(4, 40, 45), branches=st.integers(1, 4))
def test_few_and_many_occurrences_are_counted_alike(stores, branches):
    arrays = [(np.asarray(tokens, dtype=np.int64), np.asarray(sorted(set(p)), dtype=np.int64)) for tokens, p in stores]
    few = suffix._few_continuations(arrays, branches)
    many = suffix._many_continuations(arrays, branches)
    assert few[0] == many[0]
    assert [(t, c) for t, c, _ in few[1]] == [(t, c) for t, c, _ in many[1]]
    for (_, _, a), (_, _, b) in zip(few[1], many[1], strict=True):
        assert [(id(s), p.tolist()) for s, p in a] == [(id(s), p.tolist()) for s, p in b]


@settings(max_examples=150, deadline=None)
@given(stores=stores_of(3, 60, 65), k=st.integers(1, 10), min_score=st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0]))
def test_the_chain_walk_is_the_walk_with_one_branch(stores, k, min_score):
    # Few and many occurrences (up to 40 a store, FEW_OCCURRENCES is 24), separators, ties
    # between occurrences and between the stores, positions at a store's end.
    arrays = [
        (np.asarray(tokens, dtype=np.int64), np.asarray(sorted({p for p in picks if p <= len(tokens)}), dtype=np.int64))
        for tokens, picks in stores
    ]
    fast = suffix.chain(arrays, k, min_score, 5)
    general = suffix.walk(arrays, k, min_score, 5)
    assert fast == general


def test_by_default_drafts_are_at_most_four_a_matched_token_and_score_at_least_0_3():
    drafter = SuffixDrafter(SuffixCache(1000))
    assert (drafter.spec_factor, drafter.min_score) == (4.0, 0.3)
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2]  # "1 2" matched: 2 tokens, 8 drafts
    assert proposal(drafter, context, 16).tokens == [3, 4, 5, 6, 7, 8, 9, 10] and drafter.last.match == 2
    # spec_factor 1: SuffixDecoding's own limit, no longer than the match
    matched = SuffixDrafter(SuffixCache(1000), spec_factor=1.0)
    assert proposal(matched, context, 16).tokens == [3, 4]
    assert proposal(matched, [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3, 4], 8).tokens == [5, 6, 7, 9]
    for tail in ([10, 11], [10, 12], [10, 13], [20, 21]):
        run(drafter, [7, 8, 1, 2, 3, *tail])
    # 10 follows in 3 of 4 (.75), then 11, 12, 13 a third each (.25 < 0.3): one draft.
    assert proposal(drafter, [5, 7, 8, 1, 2, 3], 8).tokens == [10]
    with pytest.raises(DrafterError):
        SuffixDrafter(spec_factor=0.0)


@settings(max_examples=120, deadline=None)
@given(
    store=st.lists(st.integers(-1, 3), min_size=1, max_size=60),
    context=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    picks=st.lists(st.integers(0, 60), min_size=0, max_size=30),
    limit=st.integers(1, 70),
)
def test_few_and_many_positions_get_the_same_match_lengths(store, context, picks, limit):
    tokens = np.asarray(store, dtype=np.int64)
    positions = np.asarray([p for p in picks if p <= len(store)], dtype=np.int64)
    tail = np.asarray(context, dtype=np.int64)
    few = suffix._few_match_lengths(tokens, positions, tail, limit)
    many = suffix._many_match_lengths(tokens, positions, tail, limit)
    assert few.tolist() == many.tolist()


def defined_search(drafter: SuffixDrafter, k: int) -> suffix.Walk:
    """A proposal by its definition, brute force: the longest key (KEY..1 of the context's last
    tokens) with an occurrence in the request or, for KEY tokens, in the cache (the most recent
    MAX_CANDIDATES a store), each occurrence's match length compared token by token, and the
    walk from the deepest ones, which rests on the cache alone where none is in the request."""
    context, cache = drafter.local.ids, drafter.cache.tokens.tolist()
    for n in range(min(KEY, len(context)), 0, -1):
        tail = context[len(context) - n :]
        asked = ((0, cache), (1, context)) if n == KEY else ((1, context),)
        stores = [(own, store, brute_force(store, tail)[-MAX_CANDIDATES:]) for own, store in asked]
        stores = [(own, store, positions) for own, store, positions in stores if positions]
        if stores:
            break
    else:
        return suffix.Walk([], 0, 0, [])

    def matched(store: list[int], p: int) -> int:
        n = 0
        while n < min(drafter.max_match, len(context)) and p - 1 - n >= 0 and store[p - 1 - n] == context[-1 - n]:
            n += 1
        return n

    deepest = max(matched(store, p) for _, store, positions in stores for p in positions)
    node = [(own, store, [p for p in positions if matched(store, p) == deepest]) for own, store, positions in stores]
    node = [(own, store, positions) for own, store, positions in node if positions]
    depth = min(k, max(1, int(drafter.spec_factor * deepest)))
    arrays = [(np.asarray(store, dtype=np.int64), np.asarray(positions)) for _, store, positions in node]
    found = suffix.walk(arrays, depth, drafter.min_score, deepest)
    return dataclasses.replace(found, cached_only=not any(own for own, _, _ in node))


@settings(max_examples=200, deadline=None)
# Past FEW_OCCURRENCES (the array path): a node in the cache alone, and one in both stores.
@example(vocab=2, documents=[[0, 1, 1] * 16] * 3, context=[1, 0, 1], k=4, max_match=64, spec_factor=1.0, min_score=0)
@example(vocab=2, documents=[[0, 1, 1] * 16] * 3, context=[0, 1, 1] * 4, k=4, max_match=5, spec_factor=1.0, min_score=0)
@given(
    vocab=st.sampled_from([2, 4, 40]),
    documents=st.lists(st.lists(st.integers(0, 39), max_size=50), max_size=6),
    context=st.lists(st.integers(0, 39), min_size=1, max_size=80),
    k=st.integers(1, 9),
    max_match=st.sampled_from([1, 2, 5, 64]),
    spec_factor=st.sampled_from([1.0, 100.0]),
    min_score=st.sampled_from([0.0, 0.3]),
)
def test_a_proposal_is_the_one_its_definition_gives(vocab, documents, context, k, max_match, spec_factor, min_score):
    # Small vocabularies make many occurrences (past FEW_OCCURRENCES: the array path), long
    # matches and ties; 40 tokens make few and short ones (the list path) and empty proposals.
    drafter = SuffixDrafter(SuffixCache(1000), max_match=max_match, spec_factor=spec_factor, min_score=min_score)
    for doc in documents:
        run(drafter, [t % vocab for t in doc])
    drafter.begin([t % vocab for t in context], SamplingParams())
    assert drafter.search(k) == defined_search(drafter, k)


@settings(max_examples=100, deadline=None)
@given(
    documents=st.lists(st.lists(st.integers(0, 5), max_size=40), max_size=4),
    context=st.lists(st.integers(0, 5), min_size=1, max_size=40),
    extra=st.lists(st.integers(0, 5), max_size=4),
    k=st.integers(0, 6),
)
def test_a_proposal_after_a_draft_is_the_one_the_extended_context_gets_and_changes_nothing(
    documents, context, extra, k
):
    """``propose_after`` (what the hybrid asks after the head's tokens) equals ``propose`` on the
    context with the tokens appended, and leaves the document as the context has it: the next
    proposal on the context is the one it would have been."""
    drafter, reference = make(SuffixCache(1000)), make(SuffixCache(1000))
    for doc in documents:
        run(drafter, doc)
        run(reference, doc)
    drafter.begin(context, SamplingParams())
    before = drafter.propose(context, 4, RNG)
    after = drafter.propose_after(context, extra, k)
    expected = proposal(reference, [*context, *extra], k)
    assert (after.tokens, after.source, after.frequencies) == (expected.tokens, expected.source, expected.frequencies)
    if expected.tokens:
        assert drafter.last == reference.last
    assert drafter.local.tokens.tolist() == context
    again = drafter.propose(context, 4, RNG)
    assert (again.tokens, again.source, again.frequencies) == (before.tokens, before.source, before.frequencies)
