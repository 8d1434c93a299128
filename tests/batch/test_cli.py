"""``verispec batch`` as users run it: a real process, interrupted, killed and rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.batch.conftest import by_custom_id, chat, line, mixed_lines, read_records, write_lines


def batch_command(input_path: Path, out: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "verispec.cli", "batch", str(input_path), "--out", str(out), *options]


def run_batch(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    command = batch_command(*args)  # type: ignore[arg-type]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_a_file_with_bad_lines_is_refused_whole_before_anything_runs(tmp_path):
    lines = [line("a", chat("hi")), "{oops", line("a", chat("again")), {**line("b", chat("hi")), "url": "/v1/x"}]
    out = tmp_path / "out.jsonl"
    done = run_batch(write_lines(tmp_path / "in.jsonl", lines), out, "--model", "/no/model/needed/yet")
    assert done.returncode == 2, done.stderr
    assert "3 bad lines, nothing was run" in done.stderr
    for number in (2, 3, 4):
        assert f"line {number}:" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def wait_for_records(path: Path, count: int, process: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= count:
            return
        assert process.poll() is None, process.communicate()[1]
        time.sleep(0.02)
    raise AssertionError(f"no {count} records in {timeout} s")


def default_interrupt() -> None:
    """In the child before it runs: Ctrl+C as a terminal delivers it. A suite started in the
    background of a non-interactive shell runs with SIGINT ignored, which children inherit
    (Python then installs no KeyboardInterrupt handler, and the interrupt would be lost)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_interrupted_or_killed_job_resumes_without_losing_or_repeating_a_record(tmp_path, chat_dir):
    # Long enough (greedy, one request at a time) that the job is still running when stopped:
    # the native decoder runs the tiny model's 12 requests in under a second now, so 200.
    count = 200
    lines = [line(f"q{i}", chat(f"tell me about {i}", max_tokens=300, temperature=0)) for i in range(count)]
    source, out = write_lines(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    command = batch_command(source, out, "--model", str(chat_dir), "--max-running", "1")

    # 1. Ctrl+C: what was written stays; the job says how to resume.
    first = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_interrupt
    )
    wait_for_records(out, 2, first)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stderr
    assert "rerun the same command to resume" in stderr and "Traceback" not in stderr
    after_interrupt = out.read_text()
    assert 2 <= after_interrupt.count("\n") < count and after_interrupt.endswith("\n")

    # 2. Killed outright, then its last record torn as a kill in the middle of a write leaves it.
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_records(out, after_interrupt.count("\n") + 2, second)
    second.kill()
    second.communicate(timeout=60)
    text = out.read_text()
    assert text.startswith(after_interrupt)  # the rerun appended; it redid none of the first run's
    kept, torn = text[: text.rstrip("\n").rfind("\n") + 1], text.rstrip("\n").rsplit("\n", 1)[1]
    out.write_text(kept + torn[: len(torn) // 2])
    lost = json.loads(torn)["custom_id"]

    # 3. The rerun drops the torn line, redoes its request and the rest, and nothing twice.
    third = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr
    assert f"dropped line {kept.count(chr(10)) + 1}" in third.stderr
    skipped = kept.count("\n")
    assert f"{count - skipped} ok, 0 failed, {skipped} skipped" in third.stderr, third.stderr
    final = out.read_text()
    assert final.startswith(kept)
    records = by_custom_id(read_records(out))  # each custom_id once
    assert set(records) == {item["custom_id"] for item in lines} and lost in records
    assert all(record["response"]["status_code"] == 200 for record in records.values())

    # 4. A rerun of a finished job has nothing to do.
    fourth = run_batch(source, out, "--model", str(chat_dir))
    assert fourth.returncode == 0 and "nothing to do" in fourth.stderr, fourth.stderr
    assert out.read_text() == final


@pytest.mark.slow
def test_the_embedded_model_answers_a_small_batch(tmp_path):
    lines = mixed_lines(4)
    for item in lines:
        item["body"]["model"] = "smollm2-135m-instruct"
        item["body"]["max_tokens"] = 6
    out = tmp_path / "out.jsonl"
    done = run_batch(write_lines(tmp_path / "in.jsonl", lines), out)  # no --model: the embedded default
    assert done.returncode == 0, done.stderr[-3000:]
    assert "requests 4 ok, 0 failed, 0 skipped" in done.stderr, done.stderr[-3000:]
    records = by_custom_id(read_records(out))
    for item in lines:
        body = records[item["custom_id"]]["response"]["body"]
        assert body["model"] == "smollm2-135m-instruct" and body["object"] in ("chat.completion", "text_completion")
        usage = body["usage"]
        assert usage["completion_tokens"] == usage["speculative"]["accepted"] + usage["speculative"]["bonus"] > 0
    assert os.path.getsize(out) > 0
