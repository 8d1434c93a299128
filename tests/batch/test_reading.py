"""The input file: every bad line refused up front, named by its number."""

from __future__ import annotations

import pytest

from tests.batch.conftest import chat, line, write_lines
from verispec.batch.reading import MAX_LISTED, BatchInputError, read_requests


def test_a_good_file_gives_its_requests_in_order(tmp_path):
    lines = [line("a", chat("hi")), "", line("b", {"model": "m", "prompt": "x"}, url="/v1/completions")]
    requests = read_requests(write_lines(tmp_path / "in.jsonl", lines))
    assert [(r.line, r.custom_id, r.url, r.chat) for r in requests] == [
        (1, "a", "/v1/chat/completions", True),
        (3, "b", "/v1/completions", False),
    ]
    assert requests[0].body == chat("hi")


def test_every_bad_line_is_listed_with_its_number(tmp_path):
    good = line("ok", chat("hi"))
    lines = [
        good,  # 1
        '{"custom_id": "x", "method": "POST"',  # 2: cut short
        "[1, 2]",  # 3
        {"method": "POST", "url": "/v1/completions", "body": {}},  # 4: no custom_id
        {**good, "custom_id": 7},  # 5
        {**good, "custom_id": ""},  # 6
        {**good, "method": "GET", "custom_id": "get"},  # 7
        {**good, "url": "/v1/embeddings", "custom_id": "emb"},  # 8
        {**good, "body": "hi", "custom_id": "str-body"},  # 9
        {"custom_id": "no-body", "method": "POST", "url": "/v1/completions"},  # 10
        good,  # 11: the custom_id of line 1 again
        '{"custom_id": "nan", "method": "POST", "url": "/v1/completions", "body": {"top_p": NaN}}',  # 12
    ]
    path = write_lines(tmp_path / "in.jsonl", lines)
    with pytest.raises(BatchInputError) as caught:
        read_requests(path)
    message = str(caught.value)
    assert "11 bad lines, nothing was run" in message, message
    expected = [
        "line 2: not valid JSON",
        "line 3: a JSON list where a request object was expected",
        "line 4: custom_id is missing",
        "line 5: custom_id is 7, not a non-empty string",
        'line 6: custom_id is "", not a non-empty string',
        'line 7: method must be POST, got "GET"',
        'line 8: url must be /v1/chat/completions or /v1/completions, got "/v1/embeddings"',
        "line 9: body must be a JSON object",
        "line 10: body is missing",
        "line 11: custom_id 'ok' is already used on line 1",
        "line 12: not valid JSON: NaN is not valid JSON",
    ]
    for text in expected:
        assert text in message, (text, message)
    assert "line 1:" not in message


def test_a_long_list_of_bad_lines_is_cut_and_counted(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", ["not json"] * (MAX_LISTED + 5))
    with pytest.raises(BatchInputError) as caught:
        read_requests(path)
    message = str(caught.value)
    assert f"{MAX_LISTED + 5} bad lines" in message and "... and 5 more" in message
    assert f"line {MAX_LISTED}:" in message and f"line {MAX_LISTED + 1}:" not in message


def test_bytes_that_are_not_utf8_name_their_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"custom_id": "a"}\n{"custom_id": "\xff"}\n')
    with pytest.raises(BatchInputError, match=r"line 2: not UTF-8 \(byte 15\)"):
        read_requests(path)


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(BatchInputError, match="cannot read .*nothing.jsonl"):
        read_requests(tmp_path / "nothing.jsonl")
