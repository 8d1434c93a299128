"""The pure parts of benchmarks/serve_load.py: reading a chat stream into time to first token
and inter-chunk gaps, token counts, percentiles, the report's rows, table and plot. The
timestamps are given, so every figure is exact; nothing here times anything. And the
llama.cpp server it starts, as a real process answering a real request."""

from __future__ import annotations

import argparse
import importlib
import json
from collections import Counter
from pathlib import Path

import pytest

from tests import tiny

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def serve_load(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # a script beside load_test.py, which it imports
    return importlib.import_module("serve_load")


def _data(chunk) -> str:
    return "data: " + (chunk if isinstance(chunk, str) else json.dumps(chunk))


def _delta(content=None, role=None, finish=None):
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


VERISPEC_STREAM = [  # (arrival time, line): a role chunk, three pieces, finish, usage, [DONE]
    (1.0, _data(_delta("", role="assistant"))),
    (1.0, ""),
    (1.2, _data(_delta("Hello"))),
    (1.2, ""),
    (1.5, _data(_delta(" wor"))),
    (2.0, _data(_delta("ld!"))),
    (2.0, _data(_delta(finish="stop"))),
    (2.0, _data({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}})),
    (2.1, _data("[DONE]")),
]


def test_a_stream_gives_ttft_gaps_text_and_usage(serve_load):
    record = serve_load.StreamRecord(sent=0.5)
    for now, line in VERISPEC_STREAM:
        record.feed(line, now)
    assert record.done and record.error is None
    assert "".join(record.text) == "Hello world!"
    assert record.ttft == pytest.approx(0.7)  # the role chunk has no text: the first is at 1.2
    assert record.gaps == pytest.approx([0.3, 0.5])
    assert record.completion_tokens == 4


def test_an_error_event_and_a_stream_without_usage(serve_load):
    failed = serve_load.StreamRecord(sent=0.0)
    failed.feed(_data(_delta("a")), 1.0)
    failed.feed(_data({"error": {"message": "server shutting down", "code": "shutting_down"}}), 2.0)
    failed.feed(_data("[DONE]"), 2.0)
    assert failed.error == "shutting_down"
    garbled = serve_load.StreamRecord(sent=0.0)
    garbled.feed("data: {not json", 1.0)
    assert garbled.error.startswith("not JSON")
    # llama-cpp-python sends no usage chunk: the text is tokenized after the point.
    plain = serve_load.StreamRecord(sent=0.0)
    for now, content in ((1.0, "ab"), (2.0, "c d")):
        plain.feed(_data(_delta(content)), now)
    assert plain.completion_tokens is None
    counted = serve_load.StreamRecord(sent=0.0, completion_tokens=7)
    serve_load.count_missing_tokens([plain, counted], tiny.char_tokenizer())
    assert (plain.completion_tokens, counted.completion_tokens) == (5, 7)  # one token a character


def test_percentile_is_the_nearest_rank(serve_load):
    assert serve_load.percentile([], 0.5) is None
    assert serve_load.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    values = [float(v) for v in range(100, 0, -1)]
    assert serve_load.percentile(values, 0.0) == 1.0
    assert serve_load.percentile(values, 0.95) == 95.0
    assert serve_load.percentile(values, 1.0) == 100.0


def _point(serve_load):
    first = serve_load.StreamRecord(sent=0.0, chunk_times=[1.0, 2.0, 4.0], text=["a"] * 3, completion_tokens=6)
    second = serve_load.StreamRecord(sent=1.0, chunk_times=[4.0], text=["b"], completion_tokens=2)
    statuses = Counter({"ok": 2, "429": 1, "unfinished": 1})
    return serve_load.Point(records=[first, second], statuses=statuses)


def test_summarize_pools_requests(serve_load):
    row = serve_load.summarize("plain", 2, _point(serve_load), wall=4.0)
    assert (row["finished"], row["errors"], row["completion_tokens"]) == (2, 2, 8)
    assert row["tokens_per_s"] == 2.0
    assert row["tokens_per_chunk"] == 2.0
    assert (row["ttft_p50_s"], row["ttft_p95_s"]) == (1.0, 3.0)
    assert (row["itl_p50_s"], row["itl_p95_s"]) == (1.0, 2.0)  # gaps 1 and 2; a one-chunk request has none


def test_report_table_plot_and_replot(serve_load, tmp_path):
    rows = [
        serve_load.summarize(server, clients, _point(serve_load), wall=4.0)
        for clients in (1, 4)
        for server in ("llamacpp", "verispec")
    ]
    settings = {"model": "m", "max_tokens": 8, "duration_s": 5.0}
    serve_load.write_outputs({"settings": settings, "rows": rows}, tmp_path)
    table = (tmp_path / "table.md").read_text().splitlines()
    assert table[0].startswith("| clients | server | tok/s")
    assert [line.split(" | ")[1] for line in table[2:6]] == ["verispec", "llamacpp", "verispec", "llamacpp"]
    assert table[7].startswith("| clients | server | runs | tok/s (median)")  # the ratios, below
    assert (tmp_path / "serve_load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratios_pair_each_run_with_the_same_repeat_of_the_references(serve_load):
    # Points 1, 16, 1, 16 in run order: each server ran every point twice.
    speeds = {
        (1, "verispec"): [120.0, 100.0],
        (1, "plain"): [100.0, 80.0],
        (1, "verispec-none"): [100.0, 100.0],
        (16, "verispec"): [400.0, 500.0],
        (16, "plain"): [400.0, 400.0],
        (16, "verispec-none"): [500.0, 400.0],
    }
    rows = [
        {"concurrency": clients, "server": server, "tokens_per_s": tokens[repeat]}
        for repeat in (0, 1)
        for (clients, server), tokens in speeds.items()
    ]
    entries = {(e["concurrency"], e["server"]): e for e in serve_load.ratio_rows(rows)}
    fast = entries[(16, "verispec")]
    assert (fast["runs"], fast["tokens_per_s"]) == (2, 450.0)
    assert fast["times_one_client"] == pytest.approx(450.0 / 110.0)  # medians over medians
    assert fast["over_plain"] == pytest.approx([1.0, 1.25])  # run n against run n
    assert fast["over_verispec-none"] == pytest.approx([0.8, 1.25])
    assert entries[(16, "plain")]["over_plain"] == []  # no server against itself
    assert entries[(1, "plain")]["over_verispec-none"] == pytest.approx([1.0, 0.8])
    table = serve_load.ratio_table(rows).splitlines()
    assert table[0].startswith("| clients | server | runs | tok/s (median) | x its 1 client")
    assert [line.split(" | ")[1] for line in table[2:]] == ["verispec", "plain", "verispec-none"] * 2
    assert "| 16 | verispec | 2 | 450.0 | 4.09 | 1.000, 1.250 (median 1.125) | 0.800, 1.250 (median 1.025) |" in table
    assert "| 16 | plain | 2 | 400.0 | 4.44 | - |" in serve_load.ratio_table(rows)


def test_a_repeated_point_runs_its_servers_in_another_order(serve_load):
    points = [1, 4, 16, 1, 4, 16]
    shifts = [serve_load.rotation(points, i, 3) for i in range(len(points))]
    assert shifts == [0, 1, 2, 1, 2, 0]
    for clients in (1, 4, 16):  # each point's two runs start from different servers
        assert len({s for s, c in zip(shifts, points, strict=True) if c == clients}) == 2
    assert [serve_load.rotation([4, 4, 4], i, 3) for i in range(3)] == [0, 1, 2]  # each server last once
    assert [serve_load.rotation([1, 4], i, 1) for i in range(2)] == [0, 0]


def test_option_parsing_names_what_is_wrong(serve_load):
    assert serve_load._concurrency("1,4,16") == [1, 4, 16]
    assert serve_load._servers("plain,verispec,plain") == ["plain", "verispec"]
    for bad in ("", "0,4", "1,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="1,4,16|1..256"):
            serve_load._concurrency(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="verispec, plain, llamacpp"):
        serve_load._servers("vllm")


def test_llama_cpp_server_starts_and_answers_on_the_embedded_model(serve_load, tmp_path):
    # The benchmark's llama.cpp server, a real process on the shipped GGUF: on a CPU with AMX
    # tiles it started through the plain ``-m llama_cpp.server`` and died at its first
    # completion (ggml's AMX matmul), so the launcher keeps weights out of those buffers.
    import httpx

    from verispec import models

    pytest.importorskip("llama_cpp.server.app", reason="needs llama-cpp-python[server] (the llamacpp extra)")
    args = argparse.Namespace(model=None, max_queue=8)
    server = serve_load.start("llamacpp", args, models.embedded_gguf_path(), tmp_path)
    try:
        body = {"model": server.model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
        answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        assert server.process.poll() is None  # still serving after the completion
    finally:
        serve_load.stop_server(server.process)


def test_verispec_none_runs_in_the_verispec_servers_process_without_a_drafter(serve_load, tmp_path):
    # "verispec-none" compares plain decoding with speculation inside one server process: it
    # shares the verispec server's process and port, its requests ask for no drafter (the
    # server answers that it used none), and only the verispec entry stops the process. Alone,
    # it starts a verispec server of its own and stops it.
    import httpx

    from verispec import models

    args = argparse.Namespace(model=None, max_queue=8)
    gguf = models.embedded_gguf_path()
    servers = serve_load.start_all(["verispec-none", "verispec"], args, gguf, tmp_path)
    try:
        none, speculating = servers
        assert (none.name, speculating.name) == ("verispec-none", "verispec")
        assert none.process is speculating.process and none.url == speculating.url
        assert (none.owner, speculating.owner) == (False, True)
        used = []
        for server in servers:
            body = serve_load.request_bodies(server, ["Name three colours."], 8)[0] | {"stream": False}
            answer = httpx.post(server.url + "/v1/chat/completions", json=body, headers=serve_load._auth(), timeout=120)
            assert answer.status_code == 200, answer.text
            used.append(answer.json()["usage"]["speculative"]["drafter"])
        assert used == ["none", "lookup"]
    finally:
        serve_load.stop_server(servers[1].process)
    assert none.process.poll() is not None
    alone = serve_load.start_all(["verispec-none"], args, gguf, tmp_path)
    try:
        assert [(s.name, s.owner, s.speculative) for s in alone] == [("verispec-none", True, {"drafter": "none"})]
    finally:
        serve_load.stop_server(alone[0].process)
