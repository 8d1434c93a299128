"""Batch requests on the tiny engine: OpenAI batch records, the server's bodies and errors."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.batch.conftest import answer_of, by_custom_id, chat, line, mixed_lines, settings_for
from tests.server.harness import LONG_MAX_TOKENS, ServerProcess, assert_error_shape
from verispec.batch.reading import BatchRequest
from verispec.batch.runner import BatchRunner
from verispec.server import schemas


def requests_of(lines):
    return [BatchRequest(n, item["custom_id"], item["url"], item["body"]) for n, item in enumerate(lines, start=1)]


def run(engine, lines, **settings):
    """Every line's record, through ``BatchRunner.run`` (as a local job runs them)."""
    runner = BatchRunner(engine, settings_for("tiny-chat", **settings))
    records = []
    try:
        asyncio.run(runner.run(requests_of(lines), lambda request, text: records.append(json.loads(text))))
    finally:
        runner.close()
    return by_custom_id(records)


BAD_BODIES = {
    "bad-type": (chat("hi", temperature="hot"), 400, "temperature"),
    "over-context": (chat("hi", max_tokens=10**6), 400, "max_tokens"),
    "unknown-model": ({**chat("hi"), "model": "gpt-4o"}, 404, "model"),
    "streamed": (chat("hi", stream=True), 400, "stream"),
    "several": (chat("hi", n=2), 400, "n"),
    "no-messages": ({"model": "tiny-chat"}, 400, "messages"),
}


def test_records_are_openai_batch_records_with_the_speculative_usage(chat_engine):
    lines = mixed_lines(6)
    records = run(chat_engine, lines)
    assert set(records) == {item["custom_id"] for item in lines}
    for item in lines:
        record = records[item["custom_id"]]
        assert set(record) == {"id", "custom_id", "response", "error"}
        assert record["id"].startswith("batch_req_") and record["error"] is None
        response = record["response"]
        assert set(response) == {"status_code", "request_id", "body"} and response["status_code"] == 200
        body = response["body"]
        model = schemas.ChatCompletionResponse if item["url"] == "/v1/chat/completions" else schemas.CompletionResponse
        model.model_validate(body)  # the server's response model, every field
        assert response["request_id"] == body["id"]  # the server's x-request-id
        usage = body["usage"]
        speculative = usage["speculative"]
        assert speculative["drafter"] == "lookup"
        assert speculative["accepted"] + speculative["bonus"] == usage["completion_tokens"] > 0
        assert speculative["rounds"] >= 1 and 0.0 <= speculative["acceptance_rate"] <= 1.0
        if "seed" in item["body"]:
            assert speculative["k"] == 3 and max(map(int, speculative["k_histogram"])) <= 3


def test_a_failing_request_gets_its_error_record_and_the_others_their_answers(chat_engine):
    good = mixed_lines(4)
    bad = [line(custom_id, body) for custom_id, (body, _, _) in BAD_BODIES.items()]
    records = run(chat_engine, [good[0], *bad[:3], good[1], good[2], *bad[3:], good[3]])
    for item in good:
        assert records[item["custom_id"]]["response"]["status_code"] == 200
    for custom_id, (_, status, param) in BAD_BODIES.items():
        response = records[custom_id]["response"]
        assert response["status_code"] == status, response
        assert_error_shape(httpx.Response(status, json=response["body"]), status, param)
        assert response["request_id"]


def test_prompts_over_the_limit_are_refused_as_the_server_refuses_them(chat_engine):
    lines = [line("long", chat("a very long prompt " * 4)), line("short", chat("hi", max_tokens=4))]
    records = run(chat_engine, lines, max_prompt_tokens=20)
    error = records["long"]["response"]["body"]["error"]
    assert records["long"]["response"]["status_code"] == 400
    assert error["code"] == "context_length_exceeded" and "--max-prompt-tokens" in error["message"]
    assert records["short"]["response"]["status_code"] == 200


# Greedy plain decoding to nearly the end of the tiny model's context: seconds.
LONG = {"prompt": "hello world", "max_tokens": LONG_MAX_TOKENS, "temperature": 0, "speculative": {"drafter": "none"}}


def test_stopping_the_runner_leaves_unfinished_requests_without_a_record(chat_engine):
    async def stopped_early():
        runner = BatchRunner(chat_engine, settings_for("tiny-chat"))
        try:
            long = BatchRequest(1, "long", "/v1/completions", {"model": "tiny-chat", **LONG})
            task = asyncio.ensure_future(runner.answer(long))
            # Stopped once it runs: the tiny model writes its ~4,000 tokens in 0.2 s on a Zen 4
            # core, so a fixed wait could outlast it.
            while runner.worker.running_jobs() == 0 and not task.done():
                await asyncio.sleep(0.001)
            runner.worker.cancel_all()  # what stopping the job does to what runs
            return await task
        finally:
            runner.close()

    assert asyncio.run(stopped_early()) is None  # no record: a rerun runs it


@pytest.fixture(scope="module")
def server(chat_dir, tmp_path_factory):
    process = ServerProcess(chat_dir, tmp_path_factory.mktemp("logs") / "server.log", "--max-running", "4")
    try:
        yield process.wait_ready()
    finally:
        process.terminate()


def test_bodies_are_what_the_server_answers(chat_engine, server):
    # Greedy and seeded requests with a fixed k: the text and the draft counters depend on
    # the request alone; errors are compared whole.
    greedy_fixed = line("greedy-k2", chat("say it twice", max_tokens=12, temperature=0, speculative={"k": 2}))
    lines = [greedy_fixed, *[item for item in mixed_lines(4) if "seed" in item["body"]]]
    lines += [line(custom_id, body) for custom_id, (body, _, _) in BAD_BODIES.items() if custom_id != "streamed"]
    records = run(chat_engine, lines)
    for item in lines:
        answer = httpx.post(server.url + item["url"], json=item["body"], timeout=120)
        expected = {"id": "x", "custom_id": item["custom_id"], "error": None}
        expected["response"] = {"status_code": answer.status_code, "request_id": "x", "body": answer.json()}
        assert answer_of(records[item["custom_id"]]) == answer_of(expected), item["custom_id"]
