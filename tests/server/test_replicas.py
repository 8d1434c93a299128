"""``verispec serve --replicas 2``: two engines on Ray Serve behind one address.

One real ``verispec serve --replicas 2`` process for the module (a local Ray instance of its
own, the tiny chat model loaded in each replica), started as a user starts it and stopped
by SIGTERM, after which it must exit 0 without a traceback. Against it run the single
server's OpenAI-client checks (the test functions of ``test_openai_client``, collected here
again with this module's ``server``), and the replicas' own: concurrent streams answered by
both replicas, /metrics summed over them, a malformed request answered in the server's
error shape by an app that keeps serving.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from itertools import chain

import httpx
import pytest

from tests.server import test_openai_client
from tests.server.conftest import MAIN_BODY_LIMIT
from tests.server.harness import ServerProcess, assert_clean_shutdown, assert_error_shape, sse_events
from tests.server.test_openai_client import client  # noqa: F401  # the fixture of the checks below

pytestmark = pytest.mark.slow


# First in the module (pytest runs tests in the order the module defines them): its Ray
# instance is gone before the module's replicas start.
def test_a_model_that_fails_to_load_in_the_replicas_ends_the_command_with_its_error(chat_dir, tmp_path):
    process = ServerProcess(chat_dir, tmp_path / "failing.log", "--replicas", "2", "--drafter", "model", pin=False)
    assert process.process.wait(timeout=600) == 1
    process.terminate()
    message = "the replicas failed to start: verispec.drafters.base.DrafterError: the model drafter needs a draft model"
    assert message in process.log_path.read_text(errors="replace"), process.log()


# The single server's OpenAI-client checks, each run here against the replicas: pytest
# collects a test function wherever a module holds it, with that module's fixtures.
globals().update({name: check for name, check in vars(test_openai_client).items() if name.startswith("test_")})

REPLICAS = 2
REPLICA_HEADER = "x-verispec-replica"
FINISHED = ("verispec_generations_total", (("outcome", "finished"),))
STREAMS = 8  # concurrent streams: the proxy sends each to the less busy of two replicas


@pytest.fixture(scope="module")
def server(chat_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "replicas.log"
    # Not pinned to one CPU: Ray's processes inherit the affinity, and the replicas need a core each.
    # A fixed k: a seeded sampled request then gets the same text from either replica. With
    # k auto its k schedule starts from costs its replica measured (test_seed_and_stop failed
    # when its two requests went to different replicas), so it repeats within one replica only.
    options = ("--replicas", str(REPLICAS), "--max-body-bytes", str(MAIN_BODY_LIMIT), "--k", "3")
    process = ServerProcess(chat_dir, log, *options, pin=False)
    try:
        # /health answers once one replica is up; the log line once all are.
        yield process.wait_for_log(f"with {REPLICAS} replicas").wait_ready()
    finally:
        status = process.terminate(timeout=120)
    assert_clean_shutdown(process, status)


def _stream(server: ServerProcess, prompt: str, opened: threading.Barrier, results: list) -> None:
    body = {
        "model": server.model,
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        first = next(lines)
        opened.wait(timeout=120)  # every stream has its first chunk before any is read to its end
        results.append((response.status_code, response.headers.get(REPLICA_HEADER), sse_events(chain([first], lines))))


def test_concurrent_streams_are_answered_by_both_replicas_and_counted_once(server):
    before = server.metrics().get(FINISHED, 0.0)
    opened = threading.Barrier(STREAMS)
    results: list = []
    threads = [threading.Thread(target=_stream, args=(server, "hello world", opened, results)) for _ in range(STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert len(results) == STREAMS, "a stream failed (see the captured output)"
    texts = set()
    for status, replica, events in results:
        assert status == 200 and replica, (status, replica)
        assert events[-1] == "[DONE]"
        usage = events[-2]["usage"]
        assert (
            usage["completion_tokens"] == 24 and usage["speculative"]["accepted"] + usage["speculative"]["bonus"] == 24
        )
        texts.add("".join(event["choices"][0]["text"] for event in events[:-2] if event["choices"]))
    replicas = {replica for _, replica, _ in results}
    assert len(replicas) == REPLICAS, f"all {STREAMS} streams went to {replicas}"
    assert len(texts) == 1  # greedy: the same engine in every replica, the same text
    # /metrics, whichever replica answers it, sums both: every stream counted, once.
    samples = server.metrics()
    assert samples[("verispec_replicas", ())] == REPLICAS
    assert samples[FINISHED] - before == STREAMS


def test_malformed_requests_get_the_error_shape_and_the_replicas_keep_serving(server):
    url = server.url + "/v1/completions"

    def malformed(_: int) -> list[str]:  # each replica refuses them alike
        truncated = httpx.post(url, content=b'{"model": "x", "prompt": ', headers={"Content-Type": "application/json"})
        assert_error_shape(truncated, 400)
        form = httpx.post(url, content=b"prompt=hi", headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert_error_shape(form, 415)
        invalid = httpx.post(url, json={"model": server.model, "prompt": "hi", "max_tokens": 0})
        assert_error_shape(invalid, 400, param="max_tokens")
        return [response.headers[REPLICA_HEADER] for response in (truncated, form, invalid)]

    def served(_: int) -> list[str]:
        body = {"model": server.model, "prompt": "hi", "max_tokens": 3, "temperature": 0}
        response = httpx.post(url, json=body, timeout=120)
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
        return [response.headers[REPLICA_HEADER]]

    # Sent 8 at a time: Ray Serve's router picks the replica with fewer requests in flight, so
    # requests sent one after another, each finding both idle, may all go to one replica (CI
    # saw 22 in a row do so); concurrent ones spread.
    with ThreadPoolExecutor(8) as pool:
        seen = [replica for replicas in pool.map(malformed, range(8)) for replica in replicas]
        seen += [replica for replicas in pool.map(served, range(8)) for replica in replicas]
    assert len(set(seen)) == REPLICAS, seen
