"""``verispec batch --ray`` on a real local Ray instance with two engine actors: the records of
a local run, a worker killed mid-job, and the command line joining a running instance."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.batch.conftest import (
    SLOTS,
    answer_of,
    by_custom_id,
    chat,
    line,
    mixed_lines,
    read_records,
    settings_for,
    write_lines,
)
from verispec.batch.reading import BatchRequest
from verispec.batch.runner import BatchRunner
from verispec.batch.writer import ResultWriter
from verispec.server.engine_spec import EngineSpec

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

WORKERS = 2


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance for the module, started as ``verispec batch --ray`` starts its own."""
    from verispec.batch.ray_job import start_local_ray

    temp_dir = tempfile.mkdtemp(prefix="verispec-ray-test-")
    start_local_ray(WORKERS, temp_dir)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def job_lines() -> list[dict[str, Any]]:
    """Greedy (k auto) and seeded sampled (k 3) requests, chat and completions, and one that fails."""
    return [*mixed_lines(10), line("too-long", chat("hi", max_tokens=10**6))]


def requests_of(lines: list[dict[str, Any]]) -> list[BatchRequest]:
    return [BatchRequest(n, item["custom_id"], item["url"], item["body"]) for n, item in enumerate(lines, start=1)]


@pytest.fixture(scope="module")
def local_records(chat_engine):
    """The records of a local run of ``job_lines``, by custom_id."""
    runner = BatchRunner(chat_engine, settings_for("tiny-chat"))
    try:
        records = asyncio.run(runner.answer_all(requests_of(job_lines())))
    finally:
        runner.close()
    return by_custom_id([json.loads(text) for text in records if text is not None])


def same_answers(records: dict[str, Any], local: dict[str, Any]) -> None:
    """Equal to the local run: text, tokens and errors; the draft counters too where k is fixed
    (k auto's choices follow measured times)."""
    assert set(records) == set(local)
    for custom_id, record in records.items():
        fixed_k = "seed" in json.dumps(record) or record["response"]["status_code"] != 200
        assert answer_of(record, counters=fixed_k) == answer_of(local[custom_id], counters=fixed_k), custom_id


def run_job(path: Path, chat_dir: Path, actor: Any = None) -> dict[str, Any]:
    from verispec.batch.ray_job import EngineActor, RayOptions, run_on_ray

    spec = EngineSpec(str(chat_dir), slots=SLOTS)
    options = RayOptions(workers=WORKERS, cpus_per_worker=1, batch_size=2)
    with ResultWriter(path) as writer:
        todo = [request for request in requests_of(job_lines()) if request.custom_id not in writer.done]
        run_on_ray(
            todo,
            spec,
            settings_for("tiny-chat"),
            options,
            lambda request, text: writer.append(request.custom_id, text),
            actor or EngineActor,
        )
    return by_custom_id(read_records(path))


def test_two_workers_give_the_records_of_a_local_run(ray_instance, chat_dir, local_records, tmp_path):
    records = run_job(tmp_path / "out.jsonl", chat_dir)
    same_answers(records, local_records)
    assert records["too-long"]["response"]["body"]["error"]["code"] == "context_length_exceeded"


def dying_actor(marker: Path, after: int) -> type:
    """An ``EngineActor`` that kills its own process, once (``marker`` then exists), when it
    has answered ``after`` requests, before returning the batch that got it there."""
    from verispec.batch.ray_job import EngineActor

    class DyingActor(EngineActor):
        answered = 0

        async def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
            out = await super().__call__(batch)
            self.answered += len(batch["custom_id"])
            if self.answered >= after and not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
            return out

    return DyingActor


def test_a_worker_killed_mid_job_loses_and_repeats_no_record(ray_instance, chat_dir, local_records, tmp_path):
    marker = tmp_path / "killed"
    records = run_job(tmp_path / "out.jsonl", chat_dir, dying_actor(marker, after=3))
    assert marker.exists(), "no worker was killed: the test tested nothing"
    same_answers(records, local_records)  # each custom_id once (by_custom_id), all of them, as locally


def test_the_command_line_joins_a_running_instance_and_resumes(ray_instance, chat_dir, local_records, tmp_path):
    source, out = write_lines(tmp_path / "in.jsonl", job_lines()), tmp_path / "out.jsonl"
    already = [json.dumps(local_records[custom_id]) for custom_id in ("greedy-0", "sampled-1", "too-long")]
    out.write_text("\n".join(already) + "\n")
    command = [sys.executable, "-m", "verispec.cli", "batch", str(source), "--out", str(out), "--model", str(chat_dir)]
    command += [f"--ray={ray_instance}", "--ray-workers", str(WORKERS), "--ray-batch-size", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"on the Ray cluster at {ray_instance}" in done.stderr
    assert f"{len(job_lines()) - 3} ok, 0 failed, 3 skipped" in done.stderr, done.stderr[-4000:]
    lines = out.read_text().splitlines()
    assert lines[:3] == already  # kept as they were: not run again
    same_answers(by_custom_id(read_records(out)), local_records)
