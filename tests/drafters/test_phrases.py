"""The phrase table: its entries against a brute-force count, the longest context first, chains
under the score floor, files, the shipped table, and the suffix drafter drafting from it."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.drafters import suffix
from verispec.drafters.base import DrafterError
from verispec.drafters.phrases import SHIPPED, PhraseTable, _context_keys, context_key
from verispec.drafters.suffix import PHRASES, REQUEST, SuffixCache, SuffixDrafter, source_of
from verispec.sampling import SamplingParams

RNG = np.random.default_rng(0)
GREEDY_DATA = Path(__file__).parents[2] / "data" / "train" / "smollm2-t0"

documents_strategy = st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=30), min_size=1, max_size=6)


def brute_force(documents: list[list[int]], n: int) -> dict[tuple[int, ...], Counter]:
    """What followed each context of n tokens, counted inside each document."""
    seen: dict[tuple[int, ...], Counter] = {}
    for document in documents:
        for end in range(n, len(document)):
            seen.setdefault(tuple(document[end - n : end]), Counter())[document[end]] += 1
    return seen


@settings(max_examples=60, deadline=None)
@given(documents_strategy, st.integers(1, 3))
def test_every_entry_is_the_most_frequent_continuation_of_a_context_seen_min_count_times(documents, min_count):
    table = PhraseTable.build(documents, orders=(3, 2, 1), min_count=min_count)
    for n, order in table.orders.items():
        counted = brute_force(documents, n)
        expected = {context: counts for context, counts in counted.items() if sum(counts.values()) >= min_count}
        assert order.keys.shape[0] == len(expected)
        assert np.all(order.keys[1:] > order.keys[:-1])  # sorted, one entry a context
        for context, counts in expected.items():
            at = order.find(context_key(context))
            assert at >= 0, context
            best = max(counts.values())
            assert int(order.tokens[at]) == min(t for t, c in counts.items() if c == best)  # ties: the lower id
            assert (int(order.counts[at]), int(order.totals[at])) == (best, sum(counts.values()))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50_000), min_size=1, max_size=40), st.integers(1, 5))
def test_the_scalar_key_is_the_array_key(tokens, n):
    array = np.asarray(tokens, dtype=np.int64)
    keys, broken = _context_keys(array, n)
    assert not broken.any()
    for end in range(n, len(tokens) + 1):
        assert int(keys[end - n]) == context_key(tokens[end - n : end])


def test_no_context_crosses_from_one_document_to_the_next():
    table = PhraseTable.build([[1, 2, 3], [4, 5], [1, 2, 3]], orders=(2, 1), min_count=1)
    assert table.orders[2].find(context_key([3, 4])) == -1  # (3, 4) never occurred
    assert table.next([3, 4]) == (5, 1.0, 1)  # so the context of 1 token decides
    assert table.orders[1].find(context_key([3])) == -1  # 3 ends both documents: nothing followed it
    assert table.next([1, 2]) == (3, 1.0, 2)
    assert table.header["documents"] == 3 and table.header["tokens"] == 8 and table.header["max_token"] == 5


def test_the_longest_context_held_decides_and_shorter_ones_stand_in():
    documents = [[7, 1, 2, 3], [8, 1, 2, 4], [9, 1, 2, 4], [7, 1, 2, 3]]
    table = PhraseTable.build(documents, orders=(3, 2), min_count=2)
    assert table.next([7, 1, 2]) == (3, 1.0, 3)  # (7, 1, 2) was followed by 3 both times
    assert table.next([5, 1, 2]) == (3, 0.5, 2)  # (5, 1, 2) unseen: (1, 2) split 2:2, the lower id
    assert table.next([8, 1, 2]) == (3, 0.5, 2)  # (8, 1, 2) seen once: below min_count, left out
    assert table.next([2]) is None  # shorter than every order


def test_a_chain_multiplies_frequencies_and_stops_at_the_floor_or_k():
    documents = [[1, 2, 3, 4, 5]] * 3 + [[1, 2, 3, 6, 7]]
    table = PhraseTable.build(documents, orders=(2,), min_count=1)
    tokens, frequencies, first = table.chain([1, 2], 8, min_score=0.5)
    assert tokens == [3, 4, 5] and frequencies == [1.0, 0.75, 1.0] and first == 2
    assert table.chain([1, 2], 8, min_score=0.8)[0] == [3]  # 0.75 is below the floor
    assert table.chain([1, 2], 2, min_score=0.0)[0] == [3, 4]
    assert table.chain([9, 9], 4, min_score=0.0) == ([], [], 0)
    longer = PhraseTable.build([[7, 1, 2, 3, 4]] * 2, orders=(4, 2), min_count=2)
    assert longer.chain([7, 1, 2], 2, min_score=0.0) == ([3, 4], [1.0, 1.0], 2)  # shorter than 4: all of it


def test_files_round_trip_and_bad_ones_are_refused(tmp_path):
    table = PhraseTable.build([[1, 2, 3, 1, 2, 3, 4]], header={"target": {"name": "x", "vocab_size": 10}})
    path = tmp_path / "table.npz"
    table.save(path)
    again = PhraseTable.load(path)
    assert again.header == table.header and list(again.orders) == list(table.orders)
    for n, order in table.orders.items():
        for name in ("keys", "tokens", "counts", "totals"):
            assert np.array_equal(getattr(again.orders[n], name), getattr(order, name))
    (tmp_path / "junk.npz").write_bytes(b"not a table")
    with pytest.raises(DrafterError, match="cannot read"):
        PhraseTable.load(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", header=np.frombuffer(b'{"format": "other"}', dtype=np.uint8))
    with pytest.raises(DrafterError, match="not a verispec-phrases table"):
        PhraseTable.load(tmp_path / "other.npz")
    with pytest.raises(DrafterError, match="beyond the target's vocabulary"):
        table.check_vocabulary(4)
    table.check_vocabulary(5)


@pytest.mark.parametrize("orders, min_count", [((), 2), ((0,), 2), ((2,), 0), ((2,), 1.5)])
def test_bad_build_settings_are_refused(orders, min_count):
    with pytest.raises(DrafterError):
        PhraseTable.build([[1, 2, 3]], orders=orders, min_count=min_count)


def test_the_suffix_drafter_asks_the_table_where_its_stores_have_nothing():
    table = PhraseTable.build([[10, 11, 12, 13]] * 2, orders=(2,), min_count=2)
    drafter = SuffixDrafter(SuffixCache(0), phrases=table)
    drafter.begin([5, 10, 11], SamplingParams())
    draft = drafter.propose([5, 10, 11], 4, RNG)
    assert draft.tokens == [12, 13] and drafter.last.phrases
    assert draft.source == source_of(drafter.last) == (2, 1, PHRASES)
    # The request's own text wins where it has a match: 10, 11 was followed by 20 here.
    drafter.begin([10, 11, 20, 5, 10, 11], SamplingParams())
    draft = drafter.propose([10, 11, 20, 5, 10, 11], 4, RNG)
    assert draft.tokens[0] == 20 and draft.source[2] == REQUEST and not drafter.last.phrases
    assert drafter.fork(None).phrases is table  # forks share the table
    assert SuffixDrafter(SuffixCache(0)).propose([5, 10, 11], 4, RNG).tokens == []  # no table: nothing


class Named:
    def __init__(self, name, vocab_size):
        self.name, self.vocab_size = name, vocab_size


def test_the_shipped_table_is_for_the_embedded_model_only():
    table = suffix.phrase_table("auto", Named("smollm2-135m-instruct", 49152))
    assert table is not None and table.header["target"]["name"] == "smollm2-135m-instruct"
    assert suffix.phrase_table("auto", Named("another-model", 49152)) is None
    assert suffix.phrase_table("auto", Named("smollm2-135m-instruct", 32000)) is None
    assert suffix.phrase_table("off", Named("smollm2-135m-instruct", 49152)) is None
    with pytest.raises(DrafterError, match="no phrase table"):
        suffix.phrase_table("/nowhere/table.npz", Named("x", 10))
    with pytest.raises(DrafterError, match="auto"):
        suffix.phrase_table(3, Named("x", 10))


def test_the_shipped_table_is_rebuilt_from_the_committed_data_by_the_cli(tmp_path):
    """``verispec train-data phrases`` on the greedy answers in data/train gives the shipped file."""
    from verispec.cli import main

    out = tmp_path / "table.npz"
    assert main(["train-data", "phrases", str(GREEDY_DATA), "--out", str(out)]) == 0
    rebuilt, shipped = PhraseTable.load(out), PhraseTable.load(SHIPPED)
    assert rebuilt.header == shipped.header
    assert shipped.header["built_from"]["temperature"] == 0.0 and shipped.header["tokens"] > 2_000_000
    for n, order in shipped.orders.items():
        assert np.array_equal(rebuilt.orders[n].keys, order.keys)
        assert np.array_equal(rebuilt.orders[n].tokens, order.tokens)
    assert main(["train-data", "phrases", str(tmp_path), "--out", str(tmp_path / "none.npz")]) == 2


def test_engine_suffix_drafts_from_a_phrase_file_and_stays_exact(tiny_engine, tmp_path):
    """The table holds the tiny target's own greedy answers: with it the suffix drafter (no
    cache) offers more drafts, and the output is still plain decoding's."""
    prompts = ["Hello world", "the quick brown fox", "abc def"]
    plain = [tiny_engine.generate(p, drafter="none", temperature=0, max_tokens=40).token_ids for p in prompts]
    path = tmp_path / "tiny.npz"
    made_for = {"name": "tiny", "vocab_size": tiny_engine.target.vocab_size}
    table = PhraseTable.build(plain * 2, header={"target": made_for})
    table.save(path)
    offered = {}
    for option in ("off", str(path)):
        drafter = tiny_engine.drafter("suffix", suffix_cache_tokens=0, suffix_phrases=option, fresh=True)
        offered[option] = 0
        for prompt, expected in zip(prompts, plain, strict=True):
            result = tiny_engine.generate(prompt, drafter=drafter, k=3, temperature=0, max_tokens=40)
            assert result.token_ids == expected
            offered[option] += result.stats.offered
    assert offered[str(path)] > offered["off"], offered
    big = tmp_path / "big.npz"
    PhraseTable.build([[1, 2, 500]] * 2).save(big)
    with pytest.raises(DrafterError, match="vocabulary"):
        tiny_engine.drafter("suffix", suffix_phrases=str(big), fresh=True)
