"""The official ``openai`` client against a running ``verispec serve``."""

from __future__ import annotations

import httpx
import openai
import pytest

SPECULATIVE_KEYS = {
    "rounds",
    "offered",
    "accepted",
    "bonus",
    "acceptance_rate",
    "tokens_per_round",
    "per_position_acceptance",
    "acceptance_given_reached",
    "bonus_shortfall",
}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0, timeout=120)


def speculative_block(usage) -> dict:
    block = usage.model_dump()["speculative"]
    assert set(block) >= SPECULATIVE_KEYS, block
    return block


def test_models_lists_the_served_model(client, server):
    assert [model.id for model in client.models.list()] == [server.model]


def test_completion_matches_the_engine_and_reports_speculative_usage(client, server, chat_dir):
    from verispec.api import load_engine

    response = client.completions.create(model=server.model, prompt="hello world", max_tokens=16, temperature=0)
    choice = response.choices[0]
    assert response.object == "text_completion" and response.model == server.model
    assert choice.finish_reason == "length"
    usage = response.usage
    assert usage.completion_tokens == 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    block = speculative_block(usage)
    assert block["accepted"] + block["bonus"] == 16
    assert block["rounds"] >= 1 and 0.0 <= block["acceptance_rate"] <= 1.0

    # Greedy through the server is the engine's greedy output: the server adds nothing.
    engine = load_engine(str(chat_dir), dtype="float32", device="cpu")
    local = engine.generate("hello world", chat=False, max_tokens=16, temperature=0)
    assert choice.text == local.text
    assert usage.prompt_tokens == local.prompt_tokens


def test_chat_completion(client, server):
    response = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
        max_completion_tokens=8,
        temperature=0.7,
        seed=3,
    )
    choice = response.choices[0]
    assert response.object == "chat.completion"
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= response.usage.completion_tokens <= 8
    speculative_block(response.usage)


def test_a_second_turn_reads_the_first_from_the_cache(client, server, chat_dir):
    # The server keeps a finished request's positions: the next turn of the conversation
    # carries the first turn's prompt and answer, computes only what is new, and says how
    # many prompt tokens it read from the cache (OpenAI's usage.prompt_tokens_details).
    # Behind replicas (``test_replicas`` runs this too) each engine has its own cache: a turn
    # answered by the other replica finds there only what that one holds.
    from verispec.api import load_engine

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat sat on the"}]
    asked = {"model": server.model, "max_completion_tokens": 10, "temperature": 0}
    raw = client.chat.completions.with_raw_response.create(messages=messages, **asked)
    first, first_replica = raw.parse(), raw.headers.get("x-verispec-replica")
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and then?"},
    ]
    raw = client.chat.completions.with_raw_response.create(messages=messages, **asked)
    second, second_replica = raw.parse(), raw.headers.get("x-verispec-replica")
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 <= cached < second.usage.prompt_tokens
    if first_replica == second_replica:  # one engine (None: no replicas)
        assert cached >= first.usage.prompt_tokens
    assert speculative_block(second.usage)["cached_prompt_tokens"] == cached
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    (total,) = [line for line in metrics.splitlines() if line.startswith("verispec_cached_prompt_tokens_total ")]
    assert float(total.split()[1]) >= cached
    engine = load_engine(str(chat_dir), dtype="float32", device="cpu")  # a cold engine: nothing cached
    local = engine.generate(messages, max_tokens=10, temperature=0)
    assert local.stats.cached_prompt_tokens == 0 and second.choices[0].message.content == local.text


def test_streaming_completion_equals_the_non_streaming_one(client, server):
    request = {"model": server.model, "prompt": "the quick brown fox", "max_tokens": 20, "temperature": 0}
    whole = client.completions.create(**request)
    chunks = list(client.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].text
    finishing = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishing == ["length"]
    usage_chunks = [chunk for chunk in chunks if chunk.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and not chunks[-1].choices
    assert usage_chunks[0].usage.completion_tokens == 20
    streamed = speculative_block(usage_chunks[0].usage)
    # Rounds may differ (k can be chosen from measured costs); the tokens may not.
    assert streamed["accepted"] + streamed["bonus"] == 20


def test_streaming_chat_with_usage(client, server):
    stream = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "tell me a story"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    usage = chunks[-1].usage
    assert usage is not None and 1 <= usage.completion_tokens <= 12 and text
    speculative_block(usage)


def test_streaming_without_include_usage_sends_no_usage(client, server):
    chunks = list(client.completions.create(model=server.model, prompt="abc", max_tokens=4, temperature=0, stream=True))
    assert all(chunk.usage is None for chunk in chunks)


def test_speculative_extension_per_request(client, server):
    plain = client.completions.create(
        model=server.model,
        prompt="hello world",
        max_tokens=10,
        temperature=0,
        extra_body={"speculative": {"drafter": "none", "k": 0}},
    )
    block = speculative_block(plain.usage)
    assert block["drafter"] == "none" and block["offered"] == 0 and block["rounds"] == 10
    fixed = client.completions.create(
        model=server.model,
        prompt="hello world",
        max_tokens=10,
        temperature=0,
        extra_body={"speculative": {"drafter": "lookup", "k": 2}},
    )
    block = speculative_block(fixed.usage)
    assert block["drafter"] == "lookup" and block["k"] == 2 and len(block["per_position_acceptance"]) <= 2
    assert fixed.choices[0].text == plain.choices[0].text  # greedy: speculation changes nothing


def test_seed_and_stop(client, server):
    request = {"model": server.model, "prompt": "hello world", "max_tokens": 24, "temperature": 0.9, "seed": 11}
    first = client.completions.create(**request).choices[0].text
    assert client.completions.create(**request).choices[0].text == first
    stop = first[5:7]
    stopped = client.completions.create(**request, stop=[stop]).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == first[: first.index(stop)]


def test_errors_reach_the_client_in_the_openai_shape(client, server):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    assert caught.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=server.model, prompt="hi", max_tokens=2, n=2)
    assert caught.value.body["param"] == "n"


def test_governor_decisions_in_usage_and_metrics(client, server):
    """--k auto: the k chosen for each round is in the usage block and counted in /metrics."""

    def chosen(samples):
        return {
            labels[0][1]: value
            for (name, labels), value in samples.items()
            if name == "verispec_governor_k_chosen_total"
        }

    shadows = ("verispec_governor_shadow_drafts_total", ())
    before_samples = server.metrics()
    before = chosen(before_samples)
    response = client.completions.create(
        model=server.model,
        prompt="one two three one two three one two three",
        max_tokens=24,
        temperature=0,
        extra_body={"speculative": {"drafter": "lookup", "k": "auto"}},
    )
    block = speculative_block(response.usage)
    histogram = {k: n for k, n in block["k_chosen_histogram"].items()}
    assert block["k"] == "auto" and sum(histogram.values()) == block["rounds"]
    # Plain rounds the governor chose; any other k=0 round had no draft to choose from. Which
    # rounds those are depends on where rounds fall, so on k choices that start from the
    # engine's recent acceptance: its history (another replica's, behind Ray Serve).
    assert 0 <= block["governor_plain_rounds"] <= histogram.get("0", 0)
    after_samples = server.metrics()
    after = chosen(after_samples)
    assert {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)} == histogram
    # Prompt lookup shadows its plain rounds: as many as the usage block says, in /metrics too.
    assert 0 <= block["governor_shadow_drafts"] <= block["governor_plain_rounds"]
    assert after_samples[shadows] - before_samples[shadows] == block["governor_shadow_drafts"]


def test_rounds_that_reached_each_position_in_usage_and_metrics(client, server):
    """The rounds whose chain reached each draft position: in the usage block and counted in
    /metrics alike. A fixed k, so the request drafts whatever the engine's history (under
    --k auto a request may decode plainly throughout)."""

    def reached(samples):
        name = "verispec_reached_by_position_total"
        return {labels[0][1]: value for (metric, labels), value in samples.items() if metric == name}

    was = reached(server.metrics())
    response = client.completions.create(
        model=server.model,
        prompt="one two three one two three one two three",
        max_tokens=24,
        temperature=0,
        extra_body={"speculative": {"drafter": "lookup", "k": 3}},
    )
    block = speculative_block(response.usage)
    now = reached(server.metrics())
    counted = [now.get(str(i + 1), 0.0) - was.get(str(i + 1), 0.0) for i in range(len(block["reached_by_position"]))]
    assert counted == block["reached_by_position"] and sum(counted) > 0
    assert block["reached_by_position"][0] == block["offered_by_position"][0]  # every drafted round reaches 1
