"""What the job has done so far, read from the records it wrote: a rich progress bar while it
runs (requests, tok/s, acceptance) and the summary at the end.

tok/s is the job's throughput: completion tokens of this run's records over the seconds
since the bar started (a local job's engine is loaded by then; Ray's actors load after).
Acceptance is design.md's, over every round of this run: accepted / offered draft tokens.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


@dataclass
class Tally:
    """The records of this run: ``ok`` (status 200) and ``failed`` (by error code), their
    tokens and draft counters; ``skipped``: requests already in the output before it."""

    total: int
    skipped: int = 0
    ok: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    offered: int = 0
    accepted: int = 0
    started: float = field(default_factory=time.perf_counter)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def done(self) -> int:
        return self.skipped + self.ok + self.failed

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.offered if self.offered else None

    def add(self, line: str) -> None:
        record: dict[str, Any] = json.loads(line)
        response = record["response"]
        body = response["body"]
        if response["status_code"] != 200:
            self.failures[str(body.get("error", {}).get("code") or response["status_code"])] += 1
            return
        self.ok += 1
        usage = body["usage"]
        self.prompt_tokens += usage["prompt_tokens"]
        self.completion_tokens += usage["completion_tokens"]
        self.offered += usage["speculative"]["offered"]
        self.accepted += usage["speculative"]["accepted"]

    def summary(self) -> str:
        """One line: requests ok, failed (by code) and skipped; tokens, tok/s, acceptance."""
        failed = f"{self.failed} failed"
        if self.failures:
            failed += " (" + ", ".join(f"{code} {n}" for code, n in self.failures.most_common()) + ")"
        acceptance = f"{self.acceptance:.1%}" if self.acceptance is not None else "-"
        return (
            f"requests {self.ok} ok, {failed}, {self.skipped} skipped (already in the output) of {self.total} | "
            f"tokens {self.completion_tokens} (prompts {self.prompt_tokens}) in {self.seconds:.1f} s: "
            f"{self.tokens_per_second:.1f} tok/s | acceptance {acceptance} "
            f"(accepted {self.accepted} of {self.offered} drafted)"
        )


class BatchProgress:
    """A progress bar over a ``Tally``, which it starts the clock of: call ``update`` after
    each record."""

    def __init__(self, console: Console, tally: Tally) -> None:
        self.tally = tally
        self._progress = Progress(
            TextColumn("[bold]batch[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} tok/s"),
            TextColumn("acceptance {task.fields[acceptance]}"),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> BatchProgress:
        self.tally.started = time.perf_counter()  # the job's clock: tok/s is over what follows
        self._task = self._progress.add_task("batch", total=self.tally.total, rate="-", acceptance="-", failed="0")
        self.update()
        self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.update()
        self._progress.stop()

    def update(self) -> None:
        if self._task is None:
            return
        tally = self.tally
        self._progress.update(
            self._task,
            completed=tally.done,
            rate=f"{tally.tokens_per_second:.1f}",
            acceptance=f"{tally.acceptance:.1%}" if tally.acceptance is not None else "-",
            failed=str(tally.failed),
        )
