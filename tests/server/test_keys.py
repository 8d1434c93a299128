"""A server with two API keys and the suffix drafter: what one key's requests teach the
drafter drafts for that key's later requests, never for the other key's; a prompt prefix the
target's cache holds is reused for the same key only."""

from __future__ import annotations

import httpx
import pytest

from tests.server.harness import ServerProcess, assert_clean_shutdown, assert_error_shape

KEYS = ("key-one", "key-two")
PROMPT = "the cat sat on the mat and then the dog"


@pytest.fixture(scope="module")
def two_keys(chat_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "keys.log"
    options = ["--api-key", KEYS[0], "--api-key", KEYS[1], "--drafter", "suffix", "--k", "4"]
    process = ServerProcess(chat_dir, log, *options)
    try:
        yield process.wait_ready()
    finally:
        status = process.terminate()
    assert_clean_shutdown(process, status)


def completion(server: ServerProcess, key: str, prompt: str = PROMPT) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": 32, "temperature": 0}
    response = httpx.post(
        server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_each_key_drafts_from_its_own_requests_only(two_keys):
    first = completion(two_keys, KEYS[0])
    again = completion(two_keys, KEYS[0])
    other = completion(two_keys, KEYS[1])
    texts = {first["choices"][0]["text"], again["choices"][0]["text"], other["choices"][0]["text"]}
    assert len(texts) == 1  # greedy: the same text whoever asks, whatever was drafted
    spec = [response["usage"]["speculative"] for response in (first, again, other)]
    assert all(s["drafter"] == "suffix" for s in spec)
    # The repeat under the same key drafts the first request's output (its document in the
    # key's cache) and keeps nearly all of it; the other key's cache is empty, so its request
    # drafts exactly as the first one did (greedy, k fixed: the same drafts and verdicts).
    assert spec[1]["accepted"] > spec[0]["accepted"]
    assert spec[1]["accepted"] >= 0.9 * spec[1]["offered"]
    assert (spec[2]["offered"], spec[2]["accepted"]) == (spec[0]["offered"], spec[0]["accepted"])
    # The target's cache keeps keys apart too: the repeat reads its prompt from the cache the
    # first request left, the other key's request computes all of it.
    cached = [response["usage"]["prompt_tokens_details"]["cached_tokens"] for response in (first, again, other)]
    assert cached == [0, first["usage"]["prompt_tokens"] - 1, 0]


def test_either_key_opens_the_routes_and_others_do_not(two_keys):
    for key in KEYS:
        assert httpx.get(two_keys.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    refused = httpx.get(two_keys.url + "/v1/models", headers={"Authorization": "Bearer key-three"})
    assert assert_error_shape(refused, 401)["code"] == "invalid_api_key"
