"""The output file: append-only, one record a line, flushed as each is written, resumable.

Opening it reads the records already there (a rerun skips their ``custom_id``s). A last line
without its newline was being written when a run was killed: it is cut off, and its request
runs again. Any other line that is not a record stops the job before anything runs (the file
is not what it should be, and appending to it would hide that). A record whose ``custom_id``
the file already holds is not written again, so a request that a retry ran twice (a Ray
task re-run after a worker died) still has exactly one record. An exclusive lock keeps two
jobs from writing one file.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from types import TracebackType
from typing import IO

from verispec.errors import UserError

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]


class OutputFileError(UserError, ValueError):
    """An output file that cannot be resumed: unreadable, locked, or holding a line that is no record."""


class ResultWriter:
    """Records appended to ``path`` (created if missing); ``done``: the custom_ids it holds.

    ``dropped_partial``: the number of the partly written last line that was cut off (None:
    there was none).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.done: set[str] = set()
        self.dropped_partial: int | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[bytes] = open(self.path, "ab+")  # noqa: SIM115  # closed by close()
        except OSError as error:
            raise OutputFileError(f"cannot open {path} for writing: {error.strerror or error}") from error
        try:
            self._lock()
            self._read_existing()
        except BaseException:
            self._file.close()
            raise

    def _lock(self) -> None:
        if fcntl is None:
            return
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            raise OutputFileError(f"{self.path} is being written by another job (it holds the file's lock)") from error

    def _read_existing(self) -> None:
        handle = self._file
        handle.seek(0)
        end = 0  # where the last complete line ends
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                self.dropped_partial = number
                break
            end += len(line)
            if line.strip():
                self.done.add(_custom_id(line, number, self.path))
        if self.dropped_partial is not None:
            handle.truncate(end)
        handle.seek(0, os.SEEK_END)

    def append(self, custom_id: str, line: str) -> bool:
        """Write one record (a JSON line without its newline) unless ``custom_id`` has one;
        True when written. The line reaches the operating system before this returns."""
        if custom_id in self.done:
            return False
        self._file.write(line.encode() + b"\n")
        self._file.flush()
        self.done.add(custom_id)
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.fsync(self._file.fileno())  # the records survive the machine too
        self._file.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _custom_id(line: bytes, number: int, path: Path) -> str:
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, ValueError) as error:
        raise OutputFileError(
            f"{path}, line {number}: not a batch output record (not valid JSON); "
            "is --out the right file? (only a partly written last line is dropped on resume)"
        ) from error
    custom_id = record.get("custom_id") if isinstance(record, dict) else None
    if not isinstance(custom_id, str) or not custom_id:
        raise OutputFileError(
            f"{path}, line {number}: not a batch output record (no custom_id); is --out the right file?"
        )
    return custom_id
