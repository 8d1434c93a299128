"""Start-up (503 while loading) and SIGTERM (drain, refuse new work with 503, exit 0)."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest

from tests.server.harness import LONG_MAX_TOKENS, ServerProcess, assert_error_shape

# Greedy and plain decoding to nearly the end of the context: 0.2 s on a Zen 4 core, seconds on
# slower ones, so a test that needs it still running must not wait a fixed time for it.
LONG = {
    "prompt": "hello world",
    "max_tokens": LONG_MAX_TOKENS,
    "temperature": 0,
    "stream": True,
    "speculative": {"drafter": "none", "k": 0},
}


def start(chat_dir, tmp_path, *options: str) -> ServerProcess:
    return ServerProcess(chat_dir, tmp_path / "server.log", *options)


def wait_draining(server: ServerProcess, timeout: float = 60.0) -> None:
    """Wait until the drain has begun (/health answers 503); the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout
    while httpx.get(server.url + "/health", timeout=30).status_code != 503:
        assert time.monotonic() < deadline, f"no drain within {timeout} s of SIGTERM"
        time.sleep(0.02)


def read_stream(lines) -> tuple[str, list]:
    """The text and the events of the rest of a completions stream."""
    events = [line[6:] for line in lines if line.startswith("data: ")]
    payloads = [json.loads(e) for e in events if e != "[DONE]"]
    text = "".join(p["choices"][0]["text"] for p in payloads if p.get("choices"))
    return text, events


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0(chat_dir, tmp_path):
    server = start(chat_dir, tmp_path, "--drain-timeout", "60")
    try:
        server.wait_ready()
        # The server listened before the model was ready, and said so.
        assert server.health_seen[0] == 503 and server.health_seen[-1] == 200
        # Always-wrong drafts of 8 a round: a slower round (9 rows for each token), and the same
        # greedy text. Plain, the request ran to its end in ~0.2 s, at times before the refused
        # request below reached the server, which had then exited (connection refused).
        slow = {"drafter": "wrong", "k": 8}
        body = {"model": server.model, **LONG, "max_tokens": 3000, "speculative": slow}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            server.process.send_signal(signal.SIGTERM)
            wait_draining(server)
            # Still listening, but refusing: new requests and health get 503.
            refused = httpx.post(server.url + "/v1/completions", json={**body, "stream": False}, timeout=30)
            assert assert_error_shape(refused, 503)["code"] == "server_draining"
            assert_error_shape(httpx.get(server.url + "/v1/models", timeout=30), 503)
            assert_error_shape(httpx.get(server.url + "/health", timeout=30), 503)
            assert server.process.poll() is None
            # The request in flight runs to its end.
            _, events = read_stream(lines)
        assert events[-1] == "[DONE]"
        finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        assert finish[-1] == "length"
        assert server.process.wait(30) == 0
    finally:
        server.terminate()
    assert "draining: 1 requests in flight" in server.log_path.read_text()


@pytest.mark.slow
def test_drain_timeout_aborts_what_is_left_and_still_exits_0(chat_dir, tmp_path):
    # No wait at all: the tiny model ends its ~4,000 tokens within 0.2 s of the first on a
    # Zen 4 core, so any drain timeout long enough to matter could let it finish.
    server = start(chat_dir, tmp_path, "--drain-timeout", "0")
    try:
        server.wait_ready()
        body = {"model": server.model, **LONG}  # would run to nearly the end of the context
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            server.process.send_signal(signal.SIGTERM)
            _, events = read_stream(lines)
        # The stream ends with an error event in the error shape, then [DONE].
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["error"]["code"] == "aborted"
        assert server.process.wait(30) == 0
    finally:
        server.terminate()
    # It ended because the drain timed out and aborted it, not by running to its end.
    assert "drain timeout: aborting 1 requests still in flight" in server.log_path.read_text()


@pytest.mark.slow
def test_a_model_that_fails_to_load_is_reported_and_the_process_exits_1(tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')  # no weights, no tokenizer
    server = ServerProcess(broken, tmp_path / "server.log")
    assert server.process.wait(120) == 1
    log = server.log_path.read_text()
    assert "the model failed to load" in log and "Traceback" not in log
