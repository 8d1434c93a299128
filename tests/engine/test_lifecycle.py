"""Interrupted streams leave the target usable; same seed, same output."""

import pytest


def test_closing_a_stream_midway_resets_the_target(tiny_engine):
    prompt = "the cat sat on the mat. the cat sat"
    fresh = tiny_engine.generate(prompt, drafter="lookup", k=4, temperature=0, max_tokens=40)
    stream = tiny_engine.stream(prompt, drafter="lookup", k=4, temperature=0, max_tokens=40)
    next(iter(stream))
    assert tiny_engine.target.cached_tokens > 0
    stream.close()
    assert tiny_engine.target.cached_tokens == 0
    assert stream.result is None
    again = tiny_engine.generate(prompt, drafter="lookup", k=4, temperature=0, max_tokens=40)
    assert again.token_ids == fresh.token_ids


def test_a_long_prompt_can_be_stopped_between_prefill_chunks(either_engine, monkeypatch):
    from verispec.targets import native, torch_target

    monkeypatch.setattr(native, "PREFILL_CHUNK", 16)
    monkeypatch.setattr(torch_target, "PREFILL_CHUNK", 16)
    prompt = "the cat sat on the mat. " * 8  # 192 characters: twelve chunks
    target = either_engine.target
    stream = either_engine.stream(prompt, drafter="none", temperature=0, max_tokens=4)
    pieces = iter(stream)
    assert next(pieces) == "" and target.cached_tokens == 16  # control back after one chunk
    assert next(pieces) == "" and target.cached_tokens == 32
    stream.close()  # a client that left: the rest of the prompt is never read
    assert target.cached_tokens == 0 and stream.result is None
    whole = either_engine.generate(prompt, drafter="none", temperature=0, max_tokens=4)
    assert whole.stats.prefill_seconds > 0 and whole.stats.prompt_tokens == len(either_engine.encode(prompt))


@pytest.mark.parametrize("drafter", ["lookup", "model", "none"])
def test_same_seed_same_output(tiny_engine, drafter):
    options = {"drafter": drafter, "k": 3, "temperature": 1.0, "top_p": 0.95, "max_tokens": 30}
    first = tiny_engine.generate("abc abc abc", seed=1234, **options)
    second = tiny_engine.generate("abc abc abc", seed=1234, **options)
    other = tiny_engine.generate("abc abc abc", seed=99, **options)
    assert first.token_ids == second.token_ids
    assert first.seed == 1234
    assert other.token_ids != first.token_ids


def test_unseeded_requests_report_their_seed(tiny_engine):
    result = tiny_engine.generate("abc", drafter="none", temperature=1.0, max_tokens=10)
    replay = tiny_engine.generate("abc", drafter="none", temperature=1.0, max_tokens=10, seed=result.seed)
    assert replay.token_ids == result.token_ids
