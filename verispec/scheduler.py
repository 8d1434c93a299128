"""Continuous batching: many requests of one engine stepped together in shared forward passes.

Each running request is the engine's own coroutine (``Engine.lifecycle``) on a sequence of
the target's cache, with a drafter of its own (``Drafter.fork``). One ``step``:

    every request advances until it asks for a forward pass (its pieces of text are kept)
    verify passes (pending token + that request's k drafts) go in first, up to ``max_rows``
    prefill chunks of waiting prompts fill the rows left, ``prefill_chunk`` each at most
    one forward pass runs them all (``target.run``); each request gets its own rows back

Requests join (``start``) and leave (finished, failed or ``cancel``) between steps. A request
starts on the free sequence whose cache holds the longest prefix of its prompt (a sequence
keeps a finished request's positions; see ``NativeTarget``'s prefix reuse), and its prefill
computes only the rest; a prefix is reused only within one ``Request.scope`` (API key). A row's
logits do not depend on the other rows of its pass (the target's row invariance, checked at
load), and each request keeps its own RNG, planner, stop conditions and rollback, so a
request's output is the one it would get alone.

A target without sequences (torch, llama.cpp) runs one request at a time here, its prefill a
chunk per step, as ``Engine.stream`` would run it. The scheduler holds the engine's lock while
it has requests running, so a ``stream`` on the same engine waits for it to be idle (and the
other way round). It is driven by one thread (the server's worker).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from verispec.drafters.base import Drafter
from verispec.engine import Engine, Generation, Prefill, Request, Steps, Verify, Work
from verispec.governor import Load
from verispec.stats import RequestStats
from verispec.targets.base import Pass, Target, prefill_steps

DEFAULT_MAX_RUNNING = 16  # requests stepped together (the server's --max-running)
DEFAULT_MAX_ROWS = 256  # rows of one forward pass: verify rows first, then prefill chunks
DEFAULT_PREFILL_CHUNK = 128  # prompt tokens of one request in one step (streams keep flowing)


@dataclass(eq=False)  # a request is itself: compared and hashed by identity
class Running:
    """A request in the scheduler: its coroutine, the sequence and drafter it runs with, what it
    waits for (``work``), and what it produced since the last ``take`` (``pieces``)."""

    request: Request
    sequence: Target
    drafter: Drafter
    steps: Steps
    work: Work | None = None
    prefilled: int = 0  # tokens of a pending Prefill cached so far
    chunks: Iterator[float] | None = None  # a Prefill on a target without sequences
    pieces: list[str] = field(default_factory=list)
    tokens_per_pass: int = 1  # tokens its last verify pass committed
    finished: bool = False
    error: BaseException | None = None

    @property
    def result(self) -> Generation | None:
        return self.request.result

    @property
    def stats(self) -> RequestStats:
        return self.request.stats

    def take(self) -> list[str]:
        """The text pieces produced since the last call (empty ones included: one per round)."""
        pieces, self.pieces = self.pieces, []
        return pieces


@dataclass
class StepReport:
    """One step: requests stepped together, rows of its forward pass (0: none ran), seconds."""

    requests: int
    rows: int
    seconds: float


class Scheduler:
    """Steps the running requests of ``engine`` together (see the module docstring).

    max_running: requests running at once (capped by the target's sequences; 1 for a target
    without them); max_rows: rows of one forward pass; prefill_chunk: prompt tokens one
    request adds to a step.
    """

    def __init__(
        self,
        engine: Engine,
        max_running: int = DEFAULT_MAX_RUNNING,
        max_rows: int = DEFAULT_MAX_ROWS,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ) -> None:
        for name, value in (("max_running", max_running), ("max_rows", max_rows), ("prefill_chunk", prefill_chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.engine = engine
        target: Any = engine.target
        self.batched = callable(getattr(target, "run", None)) and getattr(target, "slots", 1) > 1
        sequences = [target.sequence(i) for i in range(target.slots)] if self.batched else [target]
        self.max_running = min(max_running, len(sequences))
        self.max_rows = max_rows
        self.prefill_chunk = prefill_chunk
        self._sequences = sequences[: self.max_running]
        self._free = list(self._sequences)
        self._scopes: dict[int, str | None] = {}  # sequence index -> scope of its last request
        self.running: list[Running] = []
        self._turn = 0  # which request's verify goes first when rows run short (rotates)
        self._locked = False
        self._forked: tuple[Request, Target, Drafter | None] | None = None  # (request, sequence, fork)

    # --- joining and leaving -----------------------------------------------------------------

    def can_start(self, request: Request) -> bool:
        """Is there a sequence free, and a drafter (a fork, or the request's own if unused)?"""
        if not self._free:
            return False
        if self._fork(request) is not None:
            return True
        return all(r.drafter is not request.drafter for r in self.running)

    def _fork(self, request: Request) -> Drafter | None:
        """The request's own drafter for its sequence (``_pick``), made once (None: it cannot fork)."""
        if not self.batched:
            return None
        sequence = self._pick(request)
        made = self._forked
        if made is None or made[0] is not request or made[1] is not sequence:
            fork = getattr(request.drafter, "fork", None)
            made = self._forked = (request, sequence, fork(sequence) if fork is not None else None)
        return made[2]

    def _pick(self, request: Request) -> Target:
        """The free sequence holding the longest prefix of the request's prompt (of its scope;
        on a tie the lowest, whose cache pages are resident)."""
        best, longest = self._free[0], 0
        for sequence in self._free:
            shared = getattr(sequence, "shared_prefix", None)
            if shared is None or not self._same_scope(sequence, request):
                continue
            length = shared(request.prompt_ids[:-1])
            if length > longest:
                best, longest = sequence, length
        return best

    def _same_scope(self, sequence: Target, request: Request) -> bool:
        # Positions left by runs outside this scheduler (``Engine.generate``) have no scope.
        return self._scopes.get(self._sequences.index(sequence)) == request.scope

    def _claim(self, running: Running) -> None:
        """Before a prefill: a sequence whose last request had another scope forgets what its
        cache holds, so no prefix crosses from one scope to another."""
        sequence = running.sequence
        if not self._same_scope(sequence, running.request):
            drop = getattr(sequence, "drop_cache", None)
            if drop is not None:
                drop()
        self._scopes[self._sequences.index(sequence)] = running.request.scope

    def _start_prefill(self, running: Running, ids: list[int]) -> None:
        """A prefill starts the sequence afresh, keeping what its cache holds of ``ids``."""
        self._claim(running)
        reuse = getattr(running.sequence, "reuse", None)
        if reuse is None:
            running.sequence.reset()
            return
        running.prefilled = reuse(ids)
        running.stats.cached_prompt_tokens = running.prefilled

    def start(self, request: Request) -> Running:
        """Admit ``request`` (``can_start`` must hold); it runs from the next step."""
        if not self.can_start(request):
            raise RuntimeError("no room for another request: check can_start first")
        if not self._locked:
            self.engine._lock.acquire()  # released when the last request leaves
            self._locked = True
        forked = self._fork(request)
        self._forked = None
        sequence = self._pick(request)
        self._free.remove(sequence)
        drafter = forked or request.drafter
        request.trees = False  # shared passes hold chains: a tree proposal is cut to its main chain
        running = Running(request, sequence, drafter, self.engine.lifecycle(request, sequence, drafter))
        self.running.append(running)
        return running

    def cancel(self, running: Running) -> None:
        """Stop a request now: its coroutine ends (its sequence and drafter are reset)."""
        if not running.finished:
            running.steps.close()
            running.finished = True
            self._leave(running)

    def _leave(self, running: Running) -> None:
        if running in self.running:
            self.running.remove(running)
            # The lowest free sequence goes next: a cache page is only resident once a sequence
            # has run over it, so one request at a time reuses the same pages.
            self._free.append(running.sequence)
            self._free.sort(key=self._sequences.index)
        if not self.running and self._locked:
            self._locked = False
            self.engine._lock.release()

    # --- one step ----------------------------------------------------------------------------

    def step(self) -> StepReport:
        """Advance every running request by one forward pass (see the module docstring)."""
        with self.engine.between_passes():
            return self._step()

    def _step(self) -> StepReport:
        for running in list(self.running):
            if running.work is None and not running.finished:
                self._advance(running, None)
        active = [r for r in self.running if r.work is not None]
        if not active:
            return StepReport(0, 0, 0.0)
        if not self.batched:
            return self._step_alone(active[0])
        plan: list[tuple[Running, list[int], bool]] = []
        rows = 0
        verifying = [r for r in active if isinstance(r.work, Verify)]
        turn = self._turn % len(verifying) if verifying else 0
        for running in verifying[turn:] + verifying[:turn]:
            ids = running.work.ids  # type: ignore[union-attr]
            if plan and rows + len(ids) > self.max_rows:
                continue  # waits for the next step
            plan.append((running, ids, True))
            rows += len(ids)
        self._turn += 1
        for running in active:  # prompts in order of arrival, in the rows the verifies left
            if isinstance(running.work, Prefill) and rows < self.max_rows:
                size = min(self.prefill_chunk, self.max_rows - rows)
                chunk = running.work.ids[running.prefilled : running.prefilled + size]
                plan.append((running, chunk, False))
                rows += len(chunk)
        start = time.perf_counter()
        try:
            results = self.engine.target.run([Pass(r.sequence, ids, logits) for r, ids, logits in plan])  # type: ignore[attr-defined]
        except Exception as error:  # the pass failed: its requests fail, the others go on
            for running, _, _ in plan:
                running.error = error
                self.cancel(running)
            return StepReport(len(plan), rows, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        verified = [r for r, _, logits in plan if logits]
        tokens = {r: r.stats.tokens for r in verified}
        verify_rows = sum(len(ids) for _, ids, logits in plan if logits)
        verify_tokens = sum(r.tokens_per_pass for r in verified)
        for (running, ids, logits), out in zip(plan, results, strict=True):
            if logits:
                # The next pass's neighbours, as this one's: the others' verify rows and recent
                # tokens. Prefill chunks are left out: they come and go, and drafts priced as
                # cheap beside a long prompt's chunk would stay in the passes after it.
                running.request.load = Load(verify_rows - len(ids), verify_tokens - running.tokens_per_pass)
                self._advance(running, (out, seconds, rows, len(plan) - 1, rows - verify_rows))
            else:
                # A prompt read to its end starts its rounds beside this pass's requests.
                running.request.load = Load(verify_rows, verify_tokens)
                self._prefilled(running, len(ids), seconds)
        for running in verified:
            running.tokens_per_pass = running.stats.tokens - tokens[running]
        return StepReport(len(plan), rows, seconds)

    def _step_alone(self, running: Running) -> StepReport:
        """A target without sequences: the request's next pass, a prefill a chunk at a time."""
        work, target = running.work, running.sequence
        start = time.perf_counter()
        if isinstance(work, Prefill):
            if running.chunks is None:
                self._claim(running)
                running.chunks = prefill_steps(target, work.ids)
            seconds = next(running.chunks, None)
            if seconds is None:
                running.chunks = None
                running.stats.cached_prompt_tokens = getattr(target, "reused_tokens", 0)
                self._advance(running, None)
                return StepReport(1, 0, time.perf_counter() - start)
            self._prefilled(running, 0, seconds)
            return StepReport(1, 0, seconds)
        assert isinstance(work, Verify)
        logits = target.verify(work.ids)
        seconds = time.perf_counter() - start
        self._advance(running, (logits, seconds, len(work.ids), 0, 0))
        return StepReport(1, len(work.ids), seconds)

    def _prefilled(self, running: Running, tokens: int, seconds: float) -> None:
        running.stats.prefill_seconds += seconds
        running.pieces.append("")  # a consumer may stop a request between prefill chunks
        running.prefilled += tokens
        work = running.work
        if self.batched and isinstance(work, Prefill) and running.prefilled >= len(work.ids):
            self._advance(running, None)

    def _advance(self, running: Running, value: Any) -> None:
        """Resume the request's coroutine with ``value`` until it asks for a forward pass."""
        running.work = None
        try:
            item = running.steps.send(value)
            while True:
                if isinstance(item, str):
                    running.pieces.append(item)
                elif isinstance(item, Prefill):
                    running.prefilled = 0
                    if self.batched:
                        self._start_prefill(running, item.ids)
                        if running.prefilled >= len(item.ids):  # nothing left to compute
                            item = running.steps.send(None)
                            continue
                    running.work = item
                    return
                else:
                    running.work = item
                    return
                item = running.steps.send(None)
        except StopIteration:
            running.finished = True
            self._leave(running)
        except Exception as error:  # this request fails; the others go on
            running.error = error
            running.finished = True
            self._leave(running)
