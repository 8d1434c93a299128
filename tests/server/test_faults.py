"""A server with an API key, CORS for one origin and any Host, serving a model whose logits
turn NaN on some prompts."""

from __future__ import annotations

import httpx
import pytest

from tests.server.harness import ServerProcess, assert_clean_shutdown, assert_error_shape, nan_model, sse_events

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "http://allowed.example"
NAN_PROMPT = "hello ~ world"  # "~" is outside the vocabulary: <unk>, whose embedding is NaN


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    directory = nan_model(tmp_path_factory.mktemp("models") / "tiny-nan")
    log = tmp_path_factory.mktemp("logs") / "guarded.log"
    # The key comes from the environment; browsers may call from one origin; any Host is served
    # (a server behind a proxy, say).
    options = ["--cors-origin", ORIGIN, "--allowed-hosts", "*"]
    process = ServerProcess(directory, log, *options, env={"VERISPEC_API_KEY": KEY})
    try:
        yield process.wait_ready()
    finally:
        status = process.terminate()
    assert_clean_shutdown(process, status)


GUARDED_ROUTES = [
    ("GET", "/v1/models"),
    ("GET", "/metrics"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/no-such-route"),
]


@pytest.mark.parametrize(("method", "path"), GUARDED_ROUTES)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Bearer {KEY}x"}],
    ids=["missing", "wrong", "no scheme", "longer"],
)
def test_every_guarded_route_needs_the_key(guarded, method, path, headers):
    body = {"model": guarded.model, "prompt": "hi", "max_tokens": 1} if method == "POST" else None
    response = httpx.request(method, guarded.url + path, json=body, headers=headers, timeout=30)
    error = assert_error_shape(response, 401)
    assert error["type"] == "authentication_error"


def test_the_key_opens_the_routes_and_health_needs_none(guarded):
    assert httpx.get(guarded.url + "/health").status_code == 200
    assert httpx.get(guarded.url + "/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(guarded.url + "/metrics", headers=AUTH).status_code == 200
    assert_error_shape(httpx.get(guarded.url + "/no-such-route", headers=AUTH), 404)


def completion(server, prompt, **fields):
    body = {"model": server.model, "prompt": prompt, "max_tokens": 8, "temperature": 0, **fields}
    return httpx.post(server.url + "/v1/completions", json=body, headers=AUTH, timeout=60)


def test_nan_logits_end_that_request_with_500_and_the_next_succeeds(guarded):
    assert completion(guarded, "hello world").status_code == 200
    error = assert_error_shape(completion(guarded, NAN_PROMPT), 500)
    assert error["code"] == "non_finite_logits" and error["type"] == "server_error"
    after = completion(guarded, "hello world")
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 8
    # Streaming: the failure comes before the first token, so it is still a 500 status.
    error = assert_error_shape(completion(guarded, NAN_PROMPT, stream=True), 500)
    assert error["code"] == "non_finite_logits"
    with httpx.stream(
        "POST",
        guarded.url + "/v1/completions",
        json={"model": guarded.model, "prompt": "abc", "max_tokens": 4, "temperature": 0, "stream": True},
        headers=AUTH,
        timeout=60,
    ) as response:
        assert response.status_code == 200
        assert sse_events(response)[-1] == "[DONE]"
    samples = guarded.metrics(AUTH)
    assert samples[("verispec_generations_total", (("outcome", "failed"),))] == 2
    assert samples[("verispec_running_requests", ())] == 0


def test_cors_only_for_the_configured_origin(guarded, server):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    allowed = httpx.options(guarded.url + "/v1/completions", headers={"Origin": ORIGIN, **preflight})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(guarded.url + "/v1/completions", headers={"Origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in other.headers
    error = assert_error_shape(other, 400)
    assert error["code"] == "cors_refused" and "origin" in error["message"]
    response = httpx.get(guarded.url + "/v1/models", headers={"Origin": ORIGIN, **AUTH})
    assert response.headers["access-control-allow-origin"] == ORIGIN
    # The main server was started without --cors-origin: no CORS headers at all.
    plain = httpx.get(server.url + "/v1/models", headers={"Origin": ORIGIN})
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers
    assert (
        "access-control-allow-origin"
        not in httpx.options(server.url + "/v1/models", headers={"Origin": ORIGIN, **preflight}).headers
    )


def test_allowed_hosts_star_serves_any_host(guarded):
    headers = {"Host": f"attacker.example:{guarded.port}", **AUTH}
    assert httpx.get(guarded.url + "/v1/models", headers=headers, timeout=30).status_code == 200
