"""Latency histograms in /metrics (time to first token, inter-piece latency, queue time) and
the batch scheduler's step histograms.

The latency counts are checked against what the clients received: one time to first token
per request that produced text, one inter-piece gap per streamed chunk of text after a
request's first. Only counts and signs are asserted, never durations.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.harness import sse_events
from verispec.server.metrics import Metrics

TTFT = ("verispec_time_to_first_token_seconds_count", ())
TTFT_SUM = ("verispec_time_to_first_token_seconds_sum", ())
ITL = ("verispec_inter_piece_latency_seconds_count", ())
QUEUE = ("verispec_queue_seconds_count", ())
PLAIN = {"drafter": "none", "k": 0}  # one token a round: many pieces
DRAFTED = {"drafter": "lookup", "k": 4}


def _chat(server, stream: bool, speculative: dict[str, object]) -> httpx.Response:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "hello hello hello world"}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": stream,
        "speculative": speculative,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def _pieces(response: httpx.Response) -> list[str]:
    """The non-empty text chunks of a chat stream, in order."""
    texts = []
    for event in sse_events(response):
        if event != "[DONE]" and event["choices"]:
            content = event["choices"][0]["delta"].get("content")
            if content:
                texts.append(content)
    return texts


def test_latency_histograms_count_what_the_clients_received(server):
    before = server.metrics()
    drafted = _pieces(_chat(server, True, DRAFTED))
    plain = _pieces(_chat(server, True, PLAIN))
    whole = _chat(server, False, PLAIN).json()["choices"][0]["message"]["content"]
    after = server.metrics()

    def delta(key):
        return after[key] - before.get(key, 0.0)

    assert drafted and len(plain) > 1
    # Greedy and deterministic: the non-streaming request ran the same rounds, so it had the
    # streamed request's pieces (its client just received them joined).
    assert whole == "".join(plain)
    assert delta(QUEUE) == 3
    assert delta(TTFT) == 3
    assert delta(TTFT_SUM) > 0
    assert delta(ITL) == (len(drafted) - 1) + 2 * (len(plain) - 1)


def test_a_request_that_fails_before_text_observes_no_time_to_first_token(server):
    before = server.metrics()
    body = {"model": server.model, "prompt": "hi", "max_tokens": 2, "speculative": {"drafter": "no-such-drafter"}}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    after = server.metrics()
    for key in (TTFT, ITL, QUEUE):  # refused by the worker before it started the job: no text
        assert after[key] == before.get(key, 0.0), key


def _buckets(metrics: Metrics, name: str) -> dict[str, float]:
    """Cumulative bucket counts of histogram ``name`` by upper bound, from the exposition text."""
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        if family.name == name:
            return {s.labels["le"]: s.value for s in family.samples if s.name == name + "_bucket"}
    raise AssertionError(f"{name} not in the exposition")


def test_observe_step_fills_batch_size_and_rows_per_step():
    metrics = Metrics()
    metrics.observe_step(1, 1)
    metrics.observe_step(3, 12)
    metrics.observe_step(16, 200)
    batch = _buckets(metrics, "verispec_batch_size")
    rows = _buckets(metrics, "verispec_rows_per_step")
    assert (batch["1.0"], batch["2.0"], batch["4.0"], batch["16.0"], batch["+Inf"]) == (1, 1, 2, 3, 3)
    assert (rows["1.0"], rows["8.0"], rows["16.0"], rows["128.0"], rows["256.0"]) == (1, 1, 2, 2, 3)
    with pytest.raises(ValueError, match="a row per request"):
        metrics.observe_step(4, 3)
    with pytest.raises(ValueError, match="at least one request"):
        metrics.observe_step(0, 0)
