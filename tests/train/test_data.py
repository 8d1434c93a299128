"""The training-set cache: corpora and hidden states on disk, keyed by target and settings."""

import hashlib
import json

import torch

from verispec.train import data


def test_a_corpus_round_trips_and_another_key_misses(tmp_path):
    corpus = data.Corpus.from_sequences([([1, 2, 3], [4, 5]), ([6], [7, 8, 9])])
    assert corpus.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert corpus.starts.tolist() == [0, 5] and corpus.prompt_lengths.tolist() == [3, 1]
    assert corpus.response_tokens == 5
    path = tmp_path / "sequences.safetensors"
    data.save_corpus(corpus, path, "key-a")
    loaded = data.load_corpus(path, "key-a")
    assert loaded is not None and loaded.tokens.equal(corpus.tokens) and loaded.lengths.equal(corpus.lengths)
    assert data.load_corpus(path, "key-b") is None


def test_states_of_some_layers_are_read_from_a_file_holding_more(tmp_path):
    hidden_size = 3
    stored = torch.arange(4 * 9, dtype=torch.float32).view(4, 9).to(torch.bfloat16)  # layers 1, 4, 7 side by side
    data.save_hidden(stored, data.hidden_path(tmp_path, "k", (1, 4, 7)), "k")
    assert data.load_hidden_layers(tmp_path, "k", (1, 4, 7), hidden_size).equal(stored)
    assert data.load_hidden_layers(tmp_path, "k", (7,), hidden_size).equal(stored[:, 6:9])
    assert data.load_hidden_layers(tmp_path, "k", (4, 7), hidden_size).equal(stored[:, 3:9])
    assert data.load_hidden_layers(tmp_path, "k", (2,), hidden_size) is None  # not held
    assert data.load_hidden_layers(tmp_path, "other", (7,), hidden_size) is None  # other data


def test_settings_key_depends_on_target_and_settings():
    settings = data.DataSettings(tokens=100)
    assert settings.key("a") != settings.key("b")
    assert settings.key("a") != data.DataSettings(tokens=101).key("a")
    assert settings.key("a") == data.DataSettings(tokens=100).key("a")


def test_second_turns_change_the_key_and_first_turns_only_keep_the_old_one():
    # The key of training sets made before second turns existed (cached ones stay valid).
    fields = {"tokens": 100, "max_new_tokens": 192, "temperature": 0.0, "seed": 0, "batch_size": 32}
    text = json.dumps({"target": "a", **fields, "prompts": "v1"}, sort_keys=True)
    before = hashlib.sha256(text.encode()).hexdigest()[:16]
    assert data.DataSettings(tokens=100).key("a") == before
    assert data.DataSettings(tokens=100, second_turns=0.5).key("a") != before


def test_sequences_that_quote_a_response_are_grouped_and_stock_phrases_link_nothing():
    rng = torch.Generator().manual_seed(0)

    def fresh(n):  # tokens no other sequence holds
        return (torch.randint(1000, 10**6, (n,), generator=rng)).tolist()

    answer = fresh(30)
    stock = fresh(20)  # a phrase many responses end with
    sequences = [
        (fresh(5), answer),  # 0: a first answer
        ([*fresh(4), *answer[3:25], *fresh(3)], fresh(20)),  # 1: quotes 22 tokens of it
        (fresh(5), [*fresh(10), *answer[:16]]),  # 2: writes 16 tokens of it again (a continuation)
        (fresh(5), fresh(30)),  # 3: unrelated
        (fresh(5), [*fresh(10), *answer[:15]]),  # 4: 15 tokens: below the run length
    ]
    sequences += [(fresh(5), [*fresh(12), *stock]) for _ in range(data.QUOTE_COMMON + 1)]  # 5..13
    groups = data.quote_groups(data.Corpus.from_sequences(sequences)).tolist()
    assert groups[0] == groups[1] == groups[2]
    assert len({groups[0], groups[3], groups[4], *groups[5:]}) == 2 + len(sequences) - 4
    # With one sequence fewer the phrase is no longer common: it links its sequences.
    fewer = data.quote_groups(data.Corpus.from_sequences(sequences[:-1])).tolist()
    assert len(set(fewer[5:])) == 1 and fewer[5] not in {fewer[0], fewer[3]}
    # A prompt holding a run of no response links nothing: prompts share chat templates.
    template = fresh(20)
    alike = data.quote_groups(data.Corpus.from_sequences([(template, fresh(8)), (template, fresh(8))])).tolist()
    assert alike[0] != alike[1]
