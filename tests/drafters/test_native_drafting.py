"""The C++ drafting helpers (``verispec/native/csrc/drafting.cpp``) against the Python walks
they replace: the same proposals, frequencies, match lengths, counts and stores, request after
request (documents joining the cache, evictions, the phrase table's fallback), and bad input
refused."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file

from verispec.drafters import suffix
from verispec.drafters.base import DrafterError
from verispec.drafters.phrases import SHIPPED, PhraseTable
from verispec.drafters.suffix import KEY, MAX_CANDIDATES, TOKEN_BITS, SuffixCache, SuffixDrafter
from verispec.native import kernels
from verispec.sampling import SamplingParams

RNG = np.random.default_rng(0)
GREEDY_SHARD = Path(__file__).parents[2] / "data" / "train" / "smollm2-t0" / "shards" / "000000.safetensors"


@pytest.fixture(scope="module")
def core():
    module = kernels.load_drafting()
    assert module is not None, f"the drafting helpers did not build: {kernels.drafting_error()}"
    return module


def pair(cache_tokens: int, phrases: PhraseTable | None, **options) -> tuple[SuffixDrafter, SuffixDrafter]:
    native = SuffixDrafter(SuffixCache(cache_tokens), phrases=phrases, native=True, **options)
    python = SuffixDrafter(SuffixCache(cache_tokens), phrases=phrases, native=False, **options)
    assert native.state is not None and python.state is None
    return native, python


def walk_of(drafter: SuffixDrafter) -> tuple:
    last = drafter.last
    return None if last is None else (last.tokens, last.frequencies, last.match, last.count, last.cached_only)


def replay(drafters: tuple[SuffixDrafter, ...], requests: list[tuple[list[int], list[int]]], k: int) -> int:
    """Each request (prompt, output) through every drafter as the engine drives one: begin,
    then a proposal before each output token and an observation after it; the proposals and
    walks must agree. Returns how many proposals drafted something."""
    drafted = 0
    for prompt, output in requests:
        for drafter in drafters:
            drafter.begin(prompt, SamplingParams())
        context = list(prompt)
        for token in [*output, None]:
            drafts = [drafter.propose(context, k, RNG) for drafter in drafters]
            first = drafts[0]
            for draft, drafter in zip(drafts[1:], drafters[1:], strict=True):
                assert (draft.tokens, draft.source) == (first.tokens, first.source)
                assert draft.frequencies == first.frequencies and walk_of(drafter) == walk_of(drafters[0])
            drafted += bool(first.tokens)
            if token is None:
                break
            context.append(token)
            for drafter in drafters:
                drafter.observe(context, 0)
        for drafter in drafters:
            drafter.reset()
        assert all(d.cache.tokens.tolist() == drafters[0].cache.tokens.tolist() for d in drafters)
    return drafted


texts = st.lists(st.integers(0, 39), max_size=60)


@settings(max_examples=150, deadline=None)
@given(
    vocab=st.sampled_from([2, 3, 8, 40]),
    requests=st.lists(st.tuples(texts, texts), min_size=1, max_size=5),
    cache_tokens=st.sampled_from([0, 40, 1000]),
    k=st.integers(1, 10),
    max_match=st.sampled_from([1, 3, 64]),
    spec_factor=st.sampled_from([1.0, 4.0, 100.0]),
    min_score=st.sampled_from([0.0, 0.3, 0.7]),
    with_table=st.booleans(),
)
def test_native_proposals_equal_the_python_walks(
    core, vocab, requests, cache_tokens, k, max_match, spec_factor, min_score, with_table
):
    # Small vocabularies give many occurrences (the Python array path), long matches and ties;
    # a 40-token one gives few and short ones, and empty proposals where the table stands in.
    requests = [([t % vocab for t in prompt], [t % vocab for t in output]) for prompt, output in requests]
    table = PhraseTable.build([p + o for p, o in requests], orders=(3, 2, 1), min_count=1) if with_table else None
    drafters = pair(cache_tokens, table, max_match=max_match, spec_factor=spec_factor, min_score=min_score)
    replay(drafters, requests, k)


def test_more_occurrences_than_candidates_and_long_documents(core):
    # Past MAX_CANDIDATES occurrences of a key in both stores, documents past the cache's
    # bound (evictions), and a context that stops being an extension (the document restarts).
    rng = np.random.default_rng(1)
    requests = [(rng.integers(0, 4, 700).tolist(), rng.integers(0, 4, 120).tolist()) for _ in range(4)]
    native, python = pair(2000, None, min_score=0.05)
    assert replay((native, python), requests, 8) > 400
    assert len(native.cache) <= 2000 and native.cache.documents < 4  # the oldest were evicted
    for drafter in (native, python):
        drafter.begin([1, 2, 3, 1, 2], SamplingParams())
        drafter.propose([1, 2, 3, 1, 2], 4, RNG)
        assert drafter.propose([0, 2, 1], 4, RNG) is not None  # not an extension: starts over
        assert drafter.local.ids == [0, 2, 1]
    assert walk_of(native) == walk_of(python)


def test_the_shipped_table_chains_alike(core):
    table = PhraseTable.load(SHIPPED)
    index = table.native_index()
    assert index is not None and index.bytes > 0
    rng = np.random.default_rng(2)
    contexts = [rng.integers(0, int(table.header["max_token"]) + 1, 6) for _ in range(200)]
    # Contexts the table holds: stretches of the target's answers it was built from.
    tokens = load_file(str(GREEDY_SHARD))["tokens"]
    contexts += [tokens[at : at + 6] for at in rng.integers(0, tokens.shape[0] - 6, 400)]
    hits = 0
    for context in contexts:
        doc = np.asarray(context, dtype=np.int64)
        for cut in {1, min(2, doc.shape[0]), doc.shape[0]}:  # shorter than the longest order too
            for min_score in (0.0, 0.3):
                expected = table.chain(doc[:cut].tolist(), 8, min_score)
                assert index.chain(doc, cut, 8, min_score) == expected
                hits += bool(expected[0])
    assert hits > 300


def test_bad_input_is_refused(core):
    with pytest.raises(ValueError, match="bad suffix settings"):
        core.Suffix(0.3, 0, 4.0, KEY, MAX_CANDIDATES, TOKEN_BITS, None)
    state = core.Suffix(0.3, 64, 4.0, KEY, MAX_CANDIDATES, TOKEN_BITS, None)
    with pytest.raises(ValueError, match="token ids are >= 0"):
        state.extend([1, -2])
    with pytest.raises(TypeError):
        state.extend(["a"])
    with pytest.raises(TypeError):
        state.sync(5)
    with pytest.raises(ValueError, match="differ"):
        state.set_cache(np.zeros(3, np.int64), np.zeros(2, np.int64), np.zeros(1, np.int64))
    with pytest.raises(TypeError):  # another dtype is refused, not converted
        state.set_cache(np.zeros(3, np.int32), np.zeros(1, np.int64), np.zeros(1, np.int64))
    keys = np.array([5, 3], dtype=np.uint64)
    orders = [(2, keys, np.zeros(2, np.int32), np.ones(2, np.uint32), np.ones(2, np.uint32))]
    with pytest.raises(ValueError, match="sorted and unique"):
        core.Phrases(orders)
    with pytest.raises(ValueError, match="longest first"):
        good = (np.array([1], np.uint64), np.zeros(1, np.int32), np.ones(1, np.uint32), np.ones(1, np.uint32))
        core.Phrases([(2, *good), (3, *good)])


def test_the_option_chooses_the_walks_and_on_fails_where_they_did_not_build(core, monkeypatch):
    assert SuffixDrafter(native=None).state is not None
    assert SuffixDrafter(native=False).state is None
    assert SuffixDrafter(native=True, branches=2).state is None  # trees walk in Python
    for option, expected in (("auto", None), ("on", True), ("off", False)):
        assert suffix.native_choice(option) is expected
    with pytest.raises(DrafterError, match="suffix_native is auto, on or off"):
        suffix.native_choice("yes")
    monkeypatch.setenv("VERISPEC_NATIVE_DRAFTING", "0")
    assert SuffixDrafter(native=None).state is None
    with pytest.raises(DrafterError, match="not available"):
        SuffixDrafter(native=True)


def test_engine_drafts_alike_with_either_walk(tiny_engine):
    prompts = ["the cat sat on the mat and the cat sat on the hat", "abc abc abc", "Hello world"]
    plain = [tiny_engine.generate(p, drafter="none", temperature=0, max_tokens=40).token_ids for p in prompts]
    runs = {}
    for option in ("on", "off"):
        drafter = tiny_engine.drafter("suffix", suffix_native=option, fresh=True)
        assert (drafter.state is not None) == (option == "on")
        runs[option] = []
        for prompt, expected in zip(prompts, plain, strict=True):
            result = tiny_engine.generate(prompt, drafter=drafter, k=3, temperature=0, max_tokens=40)
            assert result.token_ids == expected
            runs[option].append((result.stats.offered, result.stats.accepted))
    assert runs["on"] == runs["off"] and sum(offered for offered, _ in runs["on"]) > 0
