"""Limits and defaults: the longest prompt, max_tokens when a request sets none, prefill time."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import DEFAULT_MAX_TOKENS, MAX_PROMPT_TOKENS
from tests.server.harness import assert_error_shape

PLAIN_GREEDY = {"temperature": 0, "speculative": {"drafter": "none"}}


def test_a_prompt_over_max_prompt_tokens_is_refused_naming_the_limit(limited):
    url = limited.url + "/v1/completions"
    body = {"model": limited.model, "max_tokens": 2, **PLAIN_GREEDY}
    # The character tokenizer gives one token a character.
    response = httpx.post(url, json={**body, "prompt": "a" * (MAX_PROMPT_TOKENS + 1)}, timeout=60)
    error = assert_error_shape(response, 400, "prompt")
    assert error["code"] == "context_length_exceeded"
    assert str(MAX_PROMPT_TOKENS) in error["message"] and "--max-prompt-tokens" in error["message"]
    assert httpx.post(url, json={**body, "prompt": "a" * MAX_PROMPT_TOKENS}, timeout=60).status_code == 200
    chat = {"model": limited.model, "messages": [{"role": "user", "content": "b" * MAX_PROMPT_TOKENS}]}
    response = httpx.post(limited.url + "/v1/chat/completions", json={**chat, "max_tokens": 2}, timeout=60)
    assert assert_error_shape(response, 400, "messages")["code"] == "context_length_exceeded"


def test_chat_without_max_tokens_gets_the_server_default(limited):
    body = {"model": limited.model, "messages": [{"role": "user", "content": "hello"}], **PLAIN_GREEDY}
    response = httpx.post(limited.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS
    assert response.json()["choices"][0]["finish_reason"] == "length"
    # A request's own max_tokens still wins over the default.
    response = httpx.post(limited.url + "/v1/chat/completions", json={**body, "max_tokens": 9}, timeout=120)
    assert response.json()["usage"]["completion_tokens"] == 9


def test_prefill_time_is_in_metrics(server):
    count, total = ("verispec_prefill_seconds_count", ()), ("verispec_prefill_seconds_sum", ())
    before = server.metrics()
    body = {"model": server.model, "prompt": "hello " * 50, "max_tokens": 2, **PLAIN_GREEDY}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    after = server.metrics()
    assert after[count] - before.get(count, 0.0) == 1
    prefill = after[total] - before.get(total, 0.0)
    assert prefill == pytest.approx(response.json()["usage"]["speculative"]["prefill_seconds"], rel=1e-6)
    assert prefill > 0
