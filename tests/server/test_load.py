"""Concurrency, the admission queue, and clients that leave mid-stream."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server.harness import (
    LONG_MAX_TOKENS,
    ServerProcess,
    assert_clean_shutdown,
    assert_error_shape,
    sse_events,
)

# Greedy and plain decoding to nearly the end of the 4096-token context (seconds), so a
# request that is not aborted is noticed.
LONG = {
    "prompt": "hello world",
    "max_tokens": LONG_MAX_TOKENS,
    "temperature": 0,
    "stream": True,
    "speculative": {"drafter": "none", "k": 0},
}
ABORTED = ("verispec_generations_total", (("outcome", "aborted"),))
FINISHED = ("verispec_generations_total", (("outcome", "finished"),))
GENERATED = ("verispec_generated_tokens_total", ())


@pytest.fixture(scope="module")
def queued(chat_dir, tmp_path_factory):
    """A server that runs two requests at once and admits one waiting request besides them."""
    log = tmp_path_factory.mktemp("logs") / "queued.log"
    process = ServerProcess(chat_dir, log, "--max-queue", "1", "--max-running", "2")
    try:
        yield process.wait_ready()
    finally:
        status = process.terminate()
    assert_clean_shutdown(process, status)


@pytest.fixture(scope="module")
def unqueued(chat_dir, tmp_path_factory):
    """A server with no waiting room and one request at a time: a request runs if the engine
    is free, else 429."""
    log = tmp_path_factory.mktemp("logs") / "unqueued.log"
    process = ServerProcess(chat_dir, log, "--max-queue", "0", "--max-running", "1")
    try:
        yield process.wait_ready()
    finally:
        status = process.terminate()
    assert_clean_shutdown(process, status)


def first_token(lines: Iterator[str]) -> str:
    """Read a completions stream's lines up to its first piece of text.

    The caller keeps ``lines`` alive: dropping a half-read httpx iterator closes the
    connection, which is a disconnect."""
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            text = json.loads(line[6:])["choices"][0]["text"]
            if text:
                return text
    raise AssertionError("the stream ended without text")


def wait_for(condition, timeout: float = 60.0, interval: float = 0.02) -> None:
    """Wait until ``condition()`` holds. The deadline only bounds a hang: what a test checks
    is what held once it returned (counters, gauges), never how long it took, so a loaded
    machine cannot fail it."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def delta(after: dict, before: dict, key) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def stream_text(url: str, body: dict) -> tuple[str, int]:
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    return text, events[-2]["usage"]["completion_tokens"]


@pytest.mark.slow
def test_concurrent_seeded_streams_equal_the_same_requests_alone(server):
    bodies = [
        {
            "model": server.model,
            "prompt": f"request {i}: the quick brown fox",
            "max_tokens": 24,
            "temperature": 0.9,
            "top_p": 0.95,
            "seed": 1000 + i,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for i in range(16)
    ]
    alone = [stream_text(server.url, body) for body in bodies]
    together: list[tuple[str, int] | None] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def run(i: int) -> None:
        barrier.wait()
        together[i] = stream_text(server.url, bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert together == alone
    assert len({text for text, _ in alone}) > 1  # the seeds did make different outputs


def test_queue_full_gives_429_with_retry_after(queued):
    url = queued.url + "/v1/completions"
    waiting: list[httpx.Response] = []
    body = {"model": queued.model, **LONG}
    with (
        httpx.stream("POST", url, json=body, timeout=60) as running,
        httpx.stream("POST", url, json=body, timeout=60) as beside,
    ):
        lines, other = running.iter_lines(), beside.iter_lines()
        first_token(lines)
        first_token(other)  # both stream at once: --max-running 2
        thread = threading.Thread(
            target=lambda: waiting.append(
                httpx.post(url, json={"model": queued.model, "prompt": "abc", "max_tokens": 2}, timeout=60)
            )
        )
        thread.start()
        wait_for(lambda: queued.gauge("verispec_queue_depth") == 1)
        refused = httpx.post(url, json={"model": queued.model, "prompt": "abc", "max_tokens": 2}, timeout=60)
        error = assert_error_shape(refused, 429)
        assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
        assert int(refused.headers["Retry-After"]) >= 1
        assert queued.gauge("verispec_running_requests") == 2
        del lines, other
    # Leaving the streams aborts the running requests; the waiting one then runs.
    thread.join(30)
    assert waiting and waiting[0].status_code == 200


def test_max_queue_0_runs_a_request_when_the_engine_is_free_and_refuses_it_when_busy(unqueued):
    url = unqueued.url + "/v1/completions"
    short = {"model": unqueued.model, "prompt": "abc", "max_tokens": 2}
    with httpx.Client(timeout=60) as client:
        # One after another, each sent as soon as the previous answer arrived: the engine is free.
        for _ in range(5):
            response = client.post(url, json=short)
            assert response.status_code == 200, response.text
        with client.stream("POST", url, json={"model": unqueued.model, **LONG}) as running:
            lines = running.iter_lines()
            first_token(lines)
            error = assert_error_shape(client.post(url, json=short), 429)
            assert error["code"] == "queue_full" and "--max-queue 0" in error["message"]
            del lines
        wait_for(lambda: unqueued.gauge("verispec_running_requests") == 0)
        assert client.post(url, json=short).status_code == 200


def test_a_stream_cut_by_its_client_is_counted_as_499_with_its_tokens(queued):
    def count(status: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return ("verispec_requests_total", (("route", "/v1/completions"), ("status", status)))

    before = queued.metrics()
    with httpx.stream("POST", queued.url + "/v1/completions", json={"model": queued.model, **LONG}) as response:
        lines = response.iter_lines()
        pieces = [first_token(lines) for _ in range(3)]
    assert len(pieces) == 3
    # The engine stops after its current round; the request is counted once the gate sees it end.
    wait_for(lambda: queued.gauge("verispec_running_requests") == 0)
    wait_for(lambda: queued.metrics().get(count("499"), 0.0) == before.get(count("499"), 0.0) + 1)
    after = queued.metrics()
    assert after.get(count("200"), 0.0) == before.get(count("200"), 0.0)
    assert delta(after, before, GENERATED) >= len(pieces)  # at least a token a piece


@pytest.mark.slow
def test_fifty_streams_closed_after_their_first_token(queued):
    url = queued.url + "/v1/completions"
    first = queued.metrics()
    with httpx.Client(timeout=60) as client:
        for _ in range(50):
            before = queued.metrics()
            with client.stream("POST", url, json={"model": queued.model, **LONG}) as response:
                assert response.status_code == 200
                lines = response.iter_lines()
                first_token(lines)
            # The slot is free again because the client left: the request was aborted, having
            # generated far less than it asked for (a stream that kept its slot would run on
            # to thousands of tokens, and finish).
            wait_for(lambda: queued.gauge("verispec_running_requests") == 0)
            after = queued.metrics()
            assert delta(after, before, ABORTED) == 1 and delta(after, before, FINISHED) == 0
            assert delta(after, before, GENERATED) < LONG_MAX_TOKENS // 2, "a closed stream kept generating"
    samples = queued.metrics()
    assert samples[("verispec_running_requests", ())] == 0
    assert samples[("verispec_queue_depth", ())] == 0
    assert delta(samples, first, ABORTED) == 50
    assert httpx.get(queued.url + "/health").status_code == 200
    after = httpx.post(url, json={"model": queued.model, "prompt": "abc", "max_tokens": 5, "temperature": 0})
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 5


def raw_post(server, body: dict) -> socket.socket:
    """Send a request on a bare socket (to hang up on it later without reading)."""
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}"
    )
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(head.encode() + b"\r\n\r\n" + payload)
    return sock


def test_non_streaming_clients_that_leave_free_their_slot_and_their_place_in_the_queue(queued):
    body = {"model": queued.model, **LONG, "stream": False}
    before = queued.metrics()
    running = [raw_post(queued, body), raw_post(queued, body)]  # --max-running 2
    wait_for(lambda: queued.gauge("verispec_running_requests") == 2)
    waiting = raw_post(queued, body)
    wait_for(lambda: queued.gauge("verispec_queue_depth") == 1)
    waiting.close()
    wait_for(lambda: queued.gauge("verispec_queue_depth") == 0)
    assert queued.gauge("verispec_running_requests") == 2
    for client in running:
        client.close()
    wait_for(lambda: queued.gauge("verispec_running_requests") == 0)
    after = queued.metrics()
    # Two aborts, no finish: the running requests stopped because their clients left (not at
    # their end), and the waiting one left the queue without starting (else it too would count).
    assert delta(after, before, ABORTED) == 2
    assert delta(after, before, FINISHED) == 0
