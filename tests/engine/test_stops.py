"""Stop conditions are exact: EOS inside an accepted prefix, stop strings, max_tokens."""

import pytest

from tests.engine.scripted import ScriptDrafter
from verispec.engine import Engine
from verispec.targets.torch_target import TorchTarget

PROMPT = "the cat sat on the mat. the cat sat"


@pytest.fixture(scope="module")
def plain(tiny_engine):
    return tiny_engine.generate(PROMPT, drafter="none", temperature=0, max_tokens=40)


def test_eos_inside_accepted_prefix_ends_there_without_bonus(tiny_engine, plain):
    # Declare the plain output's 6th token an end-of-sequence id (its first occurrence).
    position = next(i for i in range(5, 40) if plain.token_ids[i] not in plain.token_ids[:i])
    eos = plain.token_ids[position]
    model = tiny_engine.target.model
    engine = Engine(TorchTarget(model, name="tiny-eos", eos_token_ids=[eos]), tiny_engine.tokenizer)
    prompt_ids = engine.encode(PROMPT)
    oracle = ScriptDrafter(prompt_ids + plain.token_ids)
    k = position + 3  # the first round drafts past the EOS
    result = engine.generate(PROMPT, drafter=oracle, k=k, temperature=0, max_tokens=40)
    assert result.token_ids == plain.token_ids[: position + 1]
    assert result.finish_reason == "stop"
    stats = result.stats
    assert (stats.rounds, stats.offered, stats.accepted, stats.bonus) == (1, k, position + 1, 0)
    assert stats.tokens == position + 1 and stats.bonus_shortfall == 1


def test_eos_as_bonus_is_counted_as_bonus(tiny_engine, plain):
    position = next(i for i in range(5, 40) if plain.token_ids[i] not in plain.token_ids[:i])
    eos = plain.token_ids[position]
    engine = Engine(TorchTarget(tiny_engine.target.model, eos_token_ids=[eos]), tiny_engine.tokenizer)
    oracle = ScriptDrafter(engine.encode(PROMPT) + plain.token_ids)
    result = engine.generate(PROMPT, drafter=oracle, k=position, temperature=0, max_tokens=40)
    assert result.token_ids == plain.token_ids[: position + 1]
    assert (result.stats.accepted, result.stats.bonus, result.stats.bonus_shortfall) == (position, 1, 0)


@pytest.mark.parametrize("drafter", ["lookup", "none"])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_stop_string_cuts_text_and_tokens_exactly(tiny_engine, plain, drafter, k):
    text = plain.text
    stop = text[12:15]
    cut = text.find(stop)  # its first occurrence
    result = tiny_engine.generate(PROMPT, drafter=drafter, k=k, temperature=0, max_tokens=40, stop=[stop])
    assert result.text == text[:cut]
    assert result.finish_reason == "stop"
    # Character tokenizer: the token completing the stop string is the last one kept.
    assert result.token_ids == plain.token_ids[: cut + len(stop)]
    assert result.stats.tokens == len(result.token_ids)


def test_streamed_pieces_never_show_a_stop_string(tiny_engine, plain):
    stop = plain.text[20:24]
    stream = tiny_engine.stream(PROMPT, drafter="lookup", k=4, temperature=0, max_tokens=40, stop=[stop])
    pieces = list(stream)
    assert "".join(pieces) == plain.text[: plain.text.find(stop)]
    assert stream.result.text == "".join(pieces)


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 17])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_max_tokens_is_exact(tiny_engine, plain, max_tokens, k):
    oracle = ScriptDrafter(tiny_engine.encode(PROMPT) + plain.token_ids)
    result = tiny_engine.generate(PROMPT, drafter=oracle, k=k, temperature=0, max_tokens=max_tokens)
    assert result.token_ids == plain.token_ids[:max_tokens]
    assert result.finish_reason == "length"
    stats = result.stats
    assert stats.tokens == max_tokens == stats.accepted + stats.bonus
    assert stats.bonus_shortfall == 0  # k is capped so the last round's bonus still fits


def test_context_limit_ends_generation(tiny_dir):
    from tests import tiny

    model = tiny.tiny_model(seed=0, context=24)
    engine = Engine(TorchTarget(model, name="tiny-24"), tiny.char_tokenizer())
    result = engine.generate("the cat sat on the", drafter="lookup", k=8, temperature=0, max_tokens=100)
    assert result.prompt_tokens + len(result.token_ids) == 24
    assert result.finish_reason == "length"
