"""The output file: append-only, resumable, one record per custom_id."""

from __future__ import annotations

import json

import pytest

from verispec.batch.records import record_line
from verispec.batch.writer import OutputFileError, ResultWriter


def record(custom_id: str) -> str:
    return record_line(custom_id, 200, f"req-{custom_id}", {"text": custom_id})


def test_records_are_appended_and_known_on_reopening(tmp_path):
    path = tmp_path / "sub" / "out.jsonl"  # its folder is made
    with ResultWriter(path) as writer:
        assert writer.done == set()
        assert writer.append("a", record("a")) and writer.append("b", record("b"))
        # Each record is on disk as soon as it is appended, before the writer closes.
        assert [json.loads(text)["custom_id"] for text in path.read_text().splitlines()] == ["a", "b"]
    first = path.read_bytes()
    with ResultWriter(path) as writer:
        assert writer.done == {"a", "b"} and writer.dropped_partial is None
        assert writer.append("c", record("c"))
    assert path.read_bytes().startswith(first)  # appended: what was written stays as it was
    assert len(path.read_text().splitlines()) == 3


def test_a_second_record_of_a_custom_id_is_not_written(tmp_path):
    path = tmp_path / "out.jsonl"
    with ResultWriter(path) as writer:
        assert writer.append("a", record("a"))
        assert not writer.append("a", record("a"))  # a retried request answered twice
    with ResultWriter(path) as writer:
        assert not writer.append("a", record("a"))  # and in a later run
    assert len(path.read_text().splitlines()) == 1


def test_a_partly_written_last_line_is_dropped_and_its_request_redone(tmp_path):
    path = tmp_path / "out.jsonl"
    complete = record("a") + "\n" + record("b") + "\n"
    cut = record("c")[:25]  # a run killed while it wrote c's record
    path.write_text(complete + cut)
    with ResultWriter(path) as writer:
        assert writer.done == {"a", "b"}
        assert writer.dropped_partial == 3
        assert path.read_text() == complete  # cut off before anything is appended
        assert writer.append("c", record("c"))
    lines = path.read_text().splitlines()
    assert [json.loads(text)["custom_id"] for text in lines] == ["a", "b", "c"]


def test_a_complete_record_without_its_newline_is_redone_too(tmp_path):
    # The newline is written with the record; a record without it may be cut anywhere.
    path = tmp_path / "out.jsonl"
    path.write_text(record("a") + "\n" + record("b"))
    with ResultWriter(path) as writer:
        assert writer.done == {"a"} and writer.dropped_partial == 2


def test_a_line_that_is_no_record_stops_the_job_before_any_write(tmp_path):
    path = tmp_path / "out.jsonl"
    text = record("a") + "\n" + "not json\n" + record("b") + "\n"
    path.write_text(text)
    with pytest.raises(OutputFileError, match=r"out.jsonl, line 2: not a batch output record \(not valid JSON\)"):
        ResultWriter(path)
    text = record("a") + "\n" + '{"id": 1}\n'
    path.write_text(text)
    with pytest.raises(OutputFileError, match=r"line 2: not a batch output record \(no custom_id\)"):
        ResultWriter(path)
    assert path.read_text() == text  # untouched


def test_two_writers_cannot_hold_one_file(tmp_path):
    path = tmp_path / "out.jsonl"
    with ResultWriter(path), pytest.raises(OutputFileError, match="being written by another job"):
        ResultWriter(path)
    with ResultWriter(path):  # the lock went with the first writer
        pass
