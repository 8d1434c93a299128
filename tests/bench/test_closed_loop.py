"""benchmarks/closed_loop.py end to end on the tiny chat model (native kernels, 16 slots): its
runs alternate the configurations, count what the clients' finished requests hold, and split
each run's wall time into forward passes and the rest. Nothing here judges a speed."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tests.server.harness import chat_model

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def closed_loop(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("closed_loop")


def test_runs_alternate_and_count_the_finished_requests(closed_loop, tmp_path, monkeypatch, capsys):
    model = chat_model(tmp_path / "chat")
    prompts = tmp_path / "prompts.jsonl"
    records = [{"question_id": i, "category": "c", "turns": [f"say {word}"]} for i, word in enumerate("abc")]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "runs.json"
    argv = ["closed_loop.py", "--model", str(model), "--prompts", str(prompts), "--clients", "3"]
    argv += ["--duration", "0.5", "--pairs", "2", "--max-tokens", "6", "--configs", "none", "lookup", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    closed_loop.main()
    runs = json.loads(out.read_text())["runs"]
    assert [r["config"] for r in runs] == ["none", "lookup", "none", "lookup"]
    for run in runs:
        # Every client's first request finishes (the drain), each with 1 to 6 tokens.
        assert run["finished"] >= 3 and run["finished"] <= run["tokens"] <= 6 * run["finished"]
        assert run["tokens_per_s"] == pytest.approx(run["tokens"] / run["wall_s"])
        assert 0 < run["in_passes_s"] < run["wall_s"]
        assert run["in_passes_s"] + run["outside_passes_s"] == pytest.approx(run["wall_s"])
        # The rounds of the finished requests: each committed a token at least; plain drafts none.
        assert 0 < run["rounds"] <= run["tokens"] and run["passes"] > 0 and run["rows_per_pass"] >= 1
        assert 1 <= run["requests_per_pass"] <= 3 and run["verify_rows_per_pass"] >= run["requests_per_pass"]
        assert 0 <= run["accepted_per_round"] <= run["offered_per_round"]
        shares = (run["drafted"], run["shadows"], run["plain_by_load"])
        if run["config"] == "none":
            assert run["offered_per_round"] == 0 and shares == (0, 0, 0)
        else:
            assert all(0 <= share <= 1 for share in shares)
    assert "lookup / none: " in capsys.readouterr().out


def test_more_clients_than_slots_are_refused(closed_loop, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["closed_loop.py", "--clients", "17"])
    with pytest.raises(SystemExit):
        closed_loop.main()


def test_configurations_take_options_and_every_run_gets_a_fresh_drafter(closed_loop, tmp_path):
    from verispec.api import load_engine
    from verispec.bench.configs import BenchConfigError

    engine = load_engine(str(chat_model(tmp_path / "chat")))
    first = closed_loop.drafter_of(engine, "suffix:cache=0,phrases=off")
    assert first.cache.capacity == 0 and first.phrases is None
    second = closed_loop.drafter_of(engine, "suffix:cache=0,phrases=off")
    assert second is not first and second.cache is not first.cache  # no run drafts from another's answers
    with pytest.raises(BenchConfigError):
        closed_loop.drafter_of(engine, "lookup:nonsense=1")
