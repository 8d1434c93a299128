"""The engine worker: one thread that runs admitted requests on the engine, many at once.

The event loop never touches the engine. A request becomes a ``GenerationJob``; ``submit``
admits it into a bounded queue (or refuses it with 429), and the worker thread tokenizes,
checks, and hands jobs in order of arrival to the engine's ``Scheduler``, which steps every
running request in one forward pass (continuous batching; a target without sequences runs
one at a time). After each step the worker sends each job's new text to its asyncio queue:

    ("started", prompt_tokens) -> ("piece", text)* -> ("done", Generation)
                                                    | ("failed", APIError) | ("aborted", reason)

Cancelling a job (client gone, shutdown) sets a flag the worker checks before it starts the
job and after every step; it then cancels the job in the scheduler, which resets its
sequence, so the slot is free within one step. A job's last event goes out once its slot is
free again, so a client that sends its next request on receiving it finds room
(``--max-queue 0`` would otherwise refuse it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verispec.drafters.base import DrafterError
from verispec.engine import Engine, Generation, PromptError, Request
from verispec.errors import UserError
from verispec.models import ModelLoadError
from verispec.sampling import InvalidParameterError, NonFiniteLogitsError, SamplingParams
from verispec.scheduler import DEFAULT_MAX_ROWS, Running, Scheduler
from verispec.server.errors import APIError, truncate
from verispec.server.metrics import Metrics

log = logging.getLogger("verispec.server")

SERVICE_EMA = 0.2  # weight of a finished job's duration in the running estimate (Retry-After)
MAX_RETRY_AFTER = 60

Event = tuple[str, Any]


@dataclass
class GenerationJob:
    """One admitted request: what to run, and where its events go."""

    id: str
    prompt: str | list[int] | list[dict[str, str]]
    chat: bool
    params: SamplingParams  # max_tokens is replaced once the prompt's length is known
    max_tokens: int | None  # None: default_max_tokens, cut to the room the context leaves
    default_max_tokens: int
    drafter: str | None  # None: the engine's default
    k: int | str | None
    prompt_param: str  # the request field the prompt came from, for errors
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    state: str = "new"  # new -> waiting -> running -> finished
    request: Request | None = None  # once tokenized and checked (by the worker)
    running: Running | None = None  # once started in the scheduler
    started_at: float = 0.0
    scope: str | None = None  # the API key's scope for drafters that learn across requests

    def emit(self, kind: str, value: Any = None) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class EngineWorker:
    """Runs jobs on ``engine`` in a thread of its own: up to ``max_running`` at once (in one
    forward pass per step, at most ``max_rows`` rows), admitting at most ``max_queue`` waiting
    (0: a job runs if there is room, else it is refused) and prompts of at most
    ``max_prompt_tokens`` (None: the context is the limit)."""

    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        *,
        max_queue: int,
        max_prompt_tokens: int | None = None,
        drafter: str | None = None,
        k: int | str | None = None,
        max_running: int = 1,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_prompt_tokens = max_prompt_tokens
        self.default_drafter = drafter
        self.default_k = k
        self.scheduler = Scheduler(engine, max_running=max_running, max_rows=max_rows)
        self._wake: queue.Queue[GenerationJob | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting: list[GenerationJob] = []
        self._running: list[GenerationJob] = []
        self._service_seconds = 1.0
        self._thread = threading.Thread(target=self._loop, name="verispec-engine", daemon=True)

    # --- the event loop's side ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Abort everything and end the thread (waits up to ``timeout`` seconds)."""
        self.cancel_all()
        self._wake.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def alive(self) -> bool:
        """The worker thread runs (it ends only when stopped, or by a bug)."""
        return self._thread.is_alive()

    def submit(self, job: GenerationJob) -> None:
        """Admit ``job`` or raise a 429 ``APIError`` when the queue is full."""
        with self._lock:
            # Jobs not yet picked up by the worker thread wait too: a burst of requests fills
            # the free slots first, and only those beyond them count against --max-queue.
            slots = max(0, self.scheduler.max_running - len(self._running))
            if len(self._waiting) >= slots + self.max_queue:
                raise APIError(
                    429,
                    f"the server is busy: {len(self._running)} requests are running and {len(self._waiting)} "
                    f"waiting (--max-running {self.scheduler.max_running}, --max-queue {self.max_queue})",
                    code="queue_full",
                    headers={"Retry-After": str(self._retry_after_locked())},
                )
            job.state = "waiting"
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
        self._wake.put(job)

    def cancel(self, job: GenerationJob) -> None:
        """Abort ``job``: dropped if still waiting, stopped after the current step if running."""
        job.cancelled.set()
        with self._lock:
            if job.state != "waiting":
                if job.state == "running":
                    self._wake.put(job)  # an idle-looking worker notices at once
                return
            self._waiting.remove(job)
            job.state = "finished"
            self.metrics.queue_depth.set(len(self._waiting))
        job.emit("aborted", "cancelled")  # whoever awaits the job learns it will not run

    def cancel_all(self) -> None:
        with self._lock:
            jobs = [*self._waiting, *self._running]
        for job in jobs:
            self.cancel(job)

    def running_jobs(self) -> int:
        """Jobs started in the scheduler and not yet finished."""
        with self._lock:
            return len(self._running)

    def retry_after(self) -> int:
        with self._lock:
            return self._retry_after_locked()

    def _retry_after_locked(self) -> int:
        # Jobs ahead finish max_running at a time, each taking about the mean service time.
        estimate = self._service_seconds * (len(self._waiting) + 1) / self.scheduler.max_running
        return max(1, min(MAX_RETRY_AFTER, math.ceil(estimate)))

    # --- the worker thread ----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                # Idle only with nothing waiting either: when the last running jobs end in one
                # step, a job queued behind them starts now, not at the next request's arrival.
                idle = not self._running and not self._waiting
            if idle and self._wake.get() is None:  # sleep until a job or the stop
                return
            while not self._wake.empty():
                if self._wake.get_nowait() is None:
                    self._abandon_running()
                    return
            try:
                self._admit()
                if self._running:
                    self._step()
            except Exception:  # never let one request take the worker down
                log.exception("unexpected failure in the engine worker")
                self._abandon_running()

    def _admit(self) -> None:
        """Start waiting jobs in order of arrival while the scheduler has room for the next one."""
        while True:
            with self._lock:
                if not self._waiting:
                    return
                job = self._waiting[0]
            if job.request is None and not job.cancelled.is_set():
                try:
                    job.request = self._start(job)
                except APIError as error:
                    self.metrics.generations.labels(outcome="rejected").inc()
                    self._end(job, ("failed", error), waiting=True)
                    continue
            if job.cancelled.is_set():
                self._end(job, ("aborted", "cancelled"), waiting=True)
                continue
            assert job.request is not None
            if not self.scheduler.can_start(job.request):
                return  # the first in line waits for room; those behind it wait for it
            with self._lock:
                self._waiting.remove(job)
                job.state = "running"
                self._running.append(job)
                self.metrics.queue_depth.set(len(self._waiting))
                self.metrics.running.set(len(self._running))
            job.started_at = time.perf_counter()
            job.running = self.scheduler.start(job.request)
            job.emit("started", len(job.request.prompt_ids))

    def _step(self) -> None:
        report = self.scheduler.step()
        if report.rows > 0:
            self.metrics.observe_step(report.requests, report.rows)
        for job in list(self._running):
            running = job.running
            assert running is not None
            for piece in running.take():
                if piece:
                    job.emit("piece", piece)
            if job.cancelled.is_set() and not running.finished:
                self.scheduler.cancel(running)
            if running.finished:
                self._end(job, self._outcome(job, running))

    def _outcome(self, job: GenerationJob, running: Running) -> Event:
        """The last event of a job that left the scheduler, its metrics and log line."""
        error, result = running.error, running.result
        if isinstance(error, NonFiniteLogitsError):
            self.metrics.generations.labels(outcome="failed").inc()
            log.error("%s failed: %s", job.id, error)
            return ("failed", APIError(500, f"the model produced invalid logits: {error}", code="non_finite_logits"))
        if error is not None:
            self.metrics.generations.labels(outcome="failed").inc()
            log.error("%s failed", job.id, exc_info=error)
            return ("failed", APIError(500, f"generation failed: {truncate(str(error), 200)}", code="internal_error"))
        seconds = time.perf_counter() - job.started_at
        if job.cancelled.is_set() or result is None:
            # What ran before the stop counts too: the tokens generated, the prefill.
            stats = running.stats
            self.metrics.generations.labels(outcome="aborted").inc()
            self.metrics.observe_generation(stats, stats.prompt_tokens, stats.tokens)
            log.info("%s aborted after %d tokens (%.2f s)", job.id, stats.tokens, seconds)
            return ("aborted", "cancelled")
        self._finish(job, result, seconds)
        return ("done", result)

    def _end(self, job: GenerationJob, last: Event, waiting: bool = False) -> None:
        with self._lock:
            if waiting:
                if job in self._waiting:
                    self._waiting.remove(job)
                self.metrics.queue_depth.set(len(self._waiting))
            else:
                self._running.remove(job)
                elapsed = time.perf_counter() - job.started_at
                self._service_seconds += SERVICE_EMA * (elapsed - self._service_seconds)
                self.metrics.running.set(len(self._running))
            job.state = "finished"
        job.emit(*last)

    def _abandon_running(self) -> None:
        """Stop every running job (the worker stops, or a step failed unexpectedly)."""
        for job in list(self._running):
            if job.running is not None:
                self.scheduler.cancel(job.running)
            self._end(job, ("failed", APIError(500, "internal error while generating", code="internal_error")))

    def _start(self, job: GenerationJob) -> Request:
        """Tokenize and check the request against the context: the engine's ``Request``."""
        engine = self.engine
        if job.chat and getattr(engine.tokenizer, "chat_template", None) is None:
            raise APIError(
                400,
                f"model {engine.name} has no chat template: use /v1/completions with a plain prompt",
                param="messages",
                code="no_chat_template",
            )
        try:
            ids = engine.encode(job.prompt, chat=job.chat)
        except UserError as error:
            raise APIError(400, str(error), param=job.prompt_param, code="invalid_prompt") from error
        except Exception as error:  # a chat template that refuses these messages, a tokenizer error
            raise APIError(
                400, f"the prompt could not be tokenized: {truncate(str(error), 200)}", param=job.prompt_param
            ) from error
        limit = self.max_prompt_tokens
        if limit is not None and len(ids) > limit:
            raise APIError(
                400,
                f"the prompt has {len(ids)} tokens, over this server's limit of {limit} prompt tokens "
                "(--max-prompt-tokens): shorten the prompt",
                param=job.prompt_param,
                code="context_length_exceeded",
            )
        context = engine.target.context_length
        if len(ids) >= context:
            raise APIError(
                400,
                f"the prompt has {len(ids)} tokens but the model's context is {context} tokens: no room to generate",
                param=job.prompt_param,
                code="context_length_exceeded",
            )
        max_tokens = job.max_tokens if job.max_tokens is not None else min(job.default_max_tokens, context - len(ids))
        if len(ids) + max_tokens > context:
            raise APIError(
                400,
                f"the model's context is {context} tokens but this request needs {len(ids) + max_tokens}: "
                f"{len(ids)} in the prompt plus {max_tokens} max_tokens; lower max_tokens or shorten the prompt",
                param="max_tokens",
                code="context_length_exceeded",
            )
        params = dataclasses.replace(job.params, max_tokens=max_tokens)
        options: dict[str, Any] = {}
        drafter = job.drafter if job.drafter is not None else self.default_drafter
        k = job.k if job.k is not None else self.default_k
        if drafter is not None:
            options["drafter"] = drafter
        if job.scope is not None:
            options["scope"] = job.scope  # a learning drafter keeps this API key's documents apart
        if k is not None:
            options["k"] = k
        try:
            return engine.request(ids, params=params, **options)
        except InvalidParameterError as error:
            param = "speculative.k" if error.param == "k" else error.param
            raise APIError(400, str(error), param=param, code="invalid_value") from error
        except PromptError as error:
            raise APIError(400, truncate(str(error), 300), param=job.prompt_param, code="invalid_prompt") from error
        except (DrafterError, ModelLoadError) as error:
            raise APIError(400, truncate(str(error), 300), param="speculative.drafter", code="invalid_value") from error
        except UserError as error:
            raise APIError(400, truncate(str(error), 300), code="invalid_value") from error

    def _finish(self, job: GenerationJob, result: Generation, seconds: float) -> None:
        stats = result.stats
        completion = len(result.token_ids)
        self.metrics.generations.labels(outcome="finished").inc()
        self.metrics.observe_generation(stats, result.prompt_tokens, completion)
        log.info(
            "%s finished: %d tokens, %.1f tok/s, acceptance %.1f%%, tokens/round %.2f "
            "(drafter %s, k %s, %d rounds, finish %s, %.2f s)",
            job.id,
            completion,
            stats.tokens_per_second,
            100 * stats.acceptance_rate,
            stats.tokens_per_round,
            result.drafter,
            result.k,
            stats.rounds,
            result.finish_reason,
            seconds,
        )


def flatten_messages(messages: Sequence[Any]) -> list[dict[str, str]]:
    """Chat messages as the plain {"role", "content"} dicts a chat template takes."""
    flat = []
    for message in messages:
        content = message.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if message.role == "developer" else message.role
        flat.append({"role": role, "content": content or ""})
    return flat
