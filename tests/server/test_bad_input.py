"""Bad input gets a clear 4xx in the one error shape, naming the field; never a 5xx."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import MAIN_BODY_LIMIT
from tests.server.harness import CONTEXT, assert_error_shape

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MODEL = "tiny-chat"


def completion(**fields):
    return {"model": MODEL, "prompt": "hello", "max_tokens": 4, **fields}


def chat(**fields):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **fields}


def without(body, key):
    return {k: v for k, v in body.items() if k != key}


CASES = [
    # (id, route, body, status, param)
    ("missing prompt", COMPLETIONS, without(completion(), "prompt"), 400, "prompt"),
    ("missing model", COMPLETIONS, without(completion(), "model"), 400, "model"),
    ("missing messages", CHAT, without(chat(), "messages"), 400, "messages"),
    ("temperature string", COMPLETIONS, completion(temperature="hot"), 400, "temperature"),
    ("temperature below 0", COMPLETIONS, completion(temperature=-0.1), 400, "temperature"),
    ("temperature above 2", CHAT, chat(temperature=2.5), 400, "temperature"),
    ("temperature denormal", COMPLETIONS, completion(temperature=5e-324), 400, "temperature"),
    ("repetition_penalty denormal", COMPLETIONS, completion(repetition_penalty=5e-324), 400, "repetition_penalty"),
    ("top_p 0", COMPLETIONS, completion(top_p=0), 400, "top_p"),
    ("top_p above 1", CHAT, chat(top_p=1.5), 400, "top_p"),
    ("max_tokens 0", COMPLETIONS, completion(max_tokens=0), 400, "max_tokens"),
    ("max_tokens negative", CHAT, chat(max_tokens=-3), 400, "max_tokens"),
    ("max_tokens string", COMPLETIONS, completion(max_tokens="5"), 400, "max_tokens"),
    ("max_tokens float", COMPLETIONS, completion(max_tokens=2.5), 400, "max_tokens"),
    ("max_completion_tokens 0", CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    ("completion logprobs", COMPLETIONS, completion(logprobs=1), 400, "logprobs"),
    ("chat logprobs", CHAT, chat(logprobs=True), 400, "logprobs"),
    ("chat top_logprobs", CHAT, chat(top_logprobs=2), 400, "top_logprobs"),
    ("n 2", CHAT, chat(n=2), 400, "n"),
    ("best_of 3", COMPLETIONS, completion(best_of=3), 400, "best_of"),
    ("echo", COMPLETIONS, completion(echo=True), 400, "echo"),
    ("tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    ("empty prompt", COMPLETIONS, completion(prompt=""), 400, "prompt"),
    ("empty prompt list", COMPLETIONS, completion(prompt=[]), 400, "prompt"),
    ("several prompts", COMPLETIONS, completion(prompt=["a", "b"]), 400, "prompt"),
    ("prompt wrong type", COMPLETIONS, completion(prompt=5), 400, "prompt"),
    ("token id out of vocabulary", COMPLETIONS, completion(prompt=[1, 2, 10**6]), 400, "prompt"),
    ("empty messages", CHAT, chat(messages=[]), 400, "messages"),
    ("messages not a list", CHAT, chat(messages="hello"), 400, "messages"),
    ("unknown role", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    ("missing role", CHAT, chat(messages=[{"content": "x"}]), 400, "messages[0].role"),
    ("content wrong type", CHAT, chat(messages=[{"role": "user", "content": 7}]), 400, "messages[0].content"),
    (
        "image part",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        400,
        "messages[0].content",
    ),
    ("stop empty string", COMPLETIONS, completion(stop=["", "x"]), 400, "stop"),
    ("stop wrong type", COMPLETIONS, completion(stop=3), 400, "stop"),
    ("seed negative", COMPLETIONS, completion(seed=-1), 400, "seed"),
    ("stream wrong type", COMPLETIONS, completion(stream="yes"), 400, "stream"),
    ("presence_penalty out of range", CHAT, chat(presence_penalty=3), 400, "presence_penalty"),
    ("top_k below -1", COMPLETIONS, completion(top_k=-2), 400, "top_k"),
    ("unknown drafter", COMPLETIONS, completion(speculative={"drafter": "nope"}), 400, "speculative.drafter"),
    (
        "model drafter without a draft model",
        COMPLETIONS,
        completion(speculative={"drafter": "model"}),
        400,
        "speculative.drafter",
    ),
    ("negative k", COMPLETIONS, completion(speculative={"k": -1}), 400, "speculative.k"),
    ("k string", COMPLETIONS, completion(speculative={"k": "many"}), 400, "speculative.k"),
    ("unknown speculative field", COMPLETIONS, completion(speculative={"depth": 3}), 400, "speculative.depth"),
    ("unknown model", COMPLETIONS, completion(model="gpt-4"), 404, "model"),
    ("model as a path", CHAT, chat(model="/etc/passwd"), 404, "model"),
]


@pytest.mark.parametrize(("route", "body", "status", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_field(server, route, body, status, param):
    response = httpx.post(server.url + route, json=body, timeout=60)
    error = assert_error_shape(response, status)
    if param is not None:
        assert error["param"] == param, error
    assert len(error["message"]) <= 400


def test_refusals_say_what_is_unsupported(server):
    error = assert_error_shape(httpx.post(server.url + COMPLETIONS, json=completion(logprobs=2), timeout=60), 400)
    assert "logprobs are not supported" in error["message"]
    error = assert_error_shape(httpx.post(server.url + CHAT, json=chat(n=3), timeout=60), 400)
    assert "n > 1 is not supported" in error["message"]


def test_prompt_plus_max_tokens_over_the_context_names_both_numbers(server):
    body = completion(prompt="a" * 100, max_tokens=CONTEXT)
    error = assert_error_shape(httpx.post(server.url + COMPLETIONS, json=body, timeout=60), 400, "max_tokens")
    assert error["code"] == "context_length_exceeded"
    for number in (CONTEXT, 100, CONTEXT + 100):
        assert str(number) in error["message"], error["message"]


def test_prompt_alone_over_the_context(server):
    body = completion(prompt="b" * (CONTEXT + 10), max_tokens=None)
    error = assert_error_shape(httpx.post(server.url + COMPLETIONS, json=body, timeout=60), 400, "prompt")
    assert str(CONTEXT + 10) in error["message"] and str(CONTEXT) in error["message"]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{", "invalid_json"),
        (b'{"model": "tiny-chat", "prompt": "a", "temperature": NaN}', "invalid_json"),
        (b'{"model": "tiny-chat", "prompt": "\xff\xfe"}', "invalid_utf8"),
        (b"[1, 2]", "invalid_body"),
        (b"null", "invalid_body"),
        (b"", "invalid_body"),
        (b"[" * 100_000 + b"]" * 100_000, "body_too_large"),
        (b"[" * 30_000 + b"]" * 30_000, "invalid_json"),
    ],
    ids=["truncated", "nan", "invalid utf-8", "array", "null", "empty", "too large", "deep"],
)
def test_bad_bodies(server, raw, code):
    response = httpx.post(server.url + COMPLETIONS, content=raw, headers={"content-type": "application/json"})
    error = assert_error_shape(response, 413 if code == "body_too_large" else 400)
    assert error["code"] == code and error["param"] is None


def test_body_over_the_limit_is_413_with_or_without_content_length(server):
    big = json.dumps(completion(prompt="x" * MAIN_BODY_LIMIT)).encode()
    headers = {"content-type": "application/json"}
    error = assert_error_shape(httpx.post(server.url + CHAT, content=big, headers=headers, timeout=60), 413)
    assert str(MAIN_BODY_LIMIT) in error["message"]

    def chunks():  # chunked transfer: no Content-Length to check up front
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    assert_error_shape(httpx.post(server.url + CHAT, content=chunks(), headers=headers, timeout=60), 413)


def test_error_messages_never_echo_large_input(server):
    body = completion(model="m" * 250)
    error = assert_error_shape(httpx.post(server.url + COMPLETIONS, json=body, timeout=60), 404, "model")
    assert len(error["message"]) < 250
    body = completion(stop=["s" * 3000] * 17)
    error = assert_error_shape(httpx.post(server.url + COMPLETIONS, json=body, timeout=60), 400, "stop")
    assert len(error["message"]) <= 400


def test_routes_and_methods(server):
    assert_error_shape(httpx.get(server.url + "/v1/nothing-here"), 404)
    assert_error_shape(httpx.post(server.url + "/v2/completions", json={}), 404)
    error = assert_error_shape(httpx.get(server.url + COMPLETIONS), 405)
    assert error["code"] == "method_not_allowed"
    assert_error_shape(httpx.post(server.url + "/health"), 405)


def test_seventeen_stop_strings_name_the_limit_of_16(server):
    body = completion(stop=[f"s{i}" for i in range(17)])
    error = assert_error_shape(httpx.post(server.url + COMPLETIONS, json=body, timeout=60), 400, "stop")
    assert "16" in error["message"] and "valid string" not in error["message"], error
    assert error["code"] == "invalid_value"
    sixteen = completion(stop=[f"s{i}" for i in range(16)])
    assert httpx.post(server.url + COMPLETIONS, json=sixteen, timeout=60).status_code == 200


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (COMPLETIONS, completion(prompt="a\ud800b"), "prompt"),
        (COMPLETIONS, completion(prompt=["\udfff"]), "prompt[0]"),
        (
            CHAT,
            chat(messages=[{"role": "user", "content": "hi"}, {"role": "user", "content": "\ud800"}]),
            "messages[1].content",
        ),
        (COMPLETIONS, completion(stop=["ok", "x\udc00"]), "stop[1]"),
    ],
    ids=["prompt", "prompt list", "chat content", "stop"],
)
def test_a_lone_surrogate_is_an_invalid_value_of_its_field(server, route, body, param):
    raw = json.dumps(body).encode()  # "\ud800" as JSON spells it: an escape (httpx's json= cannot encode it)
    response = httpx.post(server.url + route, content=raw, headers={"content-type": "application/json"}, timeout=60)
    error = assert_error_shape(response, 400, param)
    assert error["code"] == "invalid_value" and "surrogate" in error["message"], error
    paired = json.dumps(completion(prompt="a\ud83d\ude00b")).encode()  # a valid pair: one character
    response = httpx.post(server.url + COMPLETIONS, content=paired, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text


def test_completions_without_max_tokens_get_openai_default_of_16(server):
    body = without(completion(prompt="hello world", temperature=0, speculative={"drafter": "none"}), "max_tokens")
    response = httpx.post(server.url + COMPLETIONS, json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 16
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_the_server_still_serves_after_bad_input(server):
    response = httpx.post(server.url + COMPLETIONS, json=completion(max_tokens=3, temperature=0), timeout=60)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
