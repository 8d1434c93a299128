"""Fixtures: the tiny chat model (the server tests' own), an engine on it, and batch files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import chat_model

SLOTS = 4  # sequences of the engine's cache: requests stepped together


@pytest.fixture(scope="session")
def chat_dir(tmp_path_factory):
    return chat_model(tmp_path_factory.mktemp("models") / "tiny-chat")


@pytest.fixture(scope="session")
def chat_engine(chat_dir):
    """The tiny chat model on the native backend, with ``SLOTS`` sequences, checked as
    ``verispec batch`` loads it."""
    from verispec.server.engine_spec import EngineSpec

    return EngineSpec(str(chat_dir), slots=SLOTS).load()


def settings_for(model: str, **overrides: Any):
    """The settings ``verispec batch`` gives the server's worker, for ``model``."""
    from verispec.batch.cli import BATCH_MAX_QUEUE
    from verispec.server.state import ServerSettings

    options: dict[str, Any] = {"drafter": "lookup", "max_queue": BATCH_MAX_QUEUE, "max_running": SLOTS}
    return ServerSettings(model_names=[model], **{**options, **overrides})


def line(custom_id: str, body: dict[str, Any], url: str = "/v1/chat/completions") -> dict[str, Any]:
    """One input line of the OpenAI batch format."""
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "tiny-chat", "messages": [{"role": "user", "content": text}], **fields}


def mixed_lines(count: int = 8) -> list[dict[str, Any]]:
    """Chat and completion requests, greedy (k auto) and seeded sampled with a fixed k."""
    lines = []
    for i in range(count):
        if i % 2 == 0:
            lines.append(line(f"greedy-{i}", chat(f"say it {i} times", max_tokens=12, temperature=0)))
        else:
            body = {"model": "tiny-chat", "prompt": f"once upon a time {i}", "max_tokens": 12, "temperature": 0.9}
            body.update(seed=100 + i, top_p=0.95, speculative={"k": 3})
            lines.append(line(f"sampled-{i}", body, url="/v1/completions"))
    return lines


def write_lines(path: Path, lines: list[Any]) -> Path:
    """``lines``: dicts (written as JSON) or strings (written as they are)."""
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in lines))
    return path


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(text) for text in path.read_text().splitlines()]


def by_custom_id(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    ids = [record["custom_id"] for record in records]
    assert len(ids) == len(set(ids)), f"duplicate records: {sorted(ids)}"
    return {record["custom_id"]: record for record in records}


# What a record's answer must equal between runs: the text and the draft counters (the
# timings, ids and times of creation differ from run to run).
SPECULATIVE_COUNTERS = ("drafter", "k", "rounds", "offered", "accepted", "bonus", "tokens", "k_histogram")


def answer_of(record: dict[str, Any], counters: bool = True) -> Any:
    """The part of a record that depends only on the request (and its seed)."""
    response = record["response"]
    body = response["body"]
    if response["status_code"] != 200:
        return response["status_code"], body
    usage = body["usage"]
    kept = {key: usage["speculative"][key] for key in SPECULATIVE_COUNTERS} if counters else {}
    tokens = (usage["prompt_tokens"], usage["completion_tokens"])
    return body["object"], body["model"], body["choices"], tokens, kept
