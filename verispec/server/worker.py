"""The engine worker: one thread that runs admitted requests on the engine, one at a time.

The event loop never touches the engine. A request becomes a ``GenerationJob``; ``submit``
admits it into a bounded queue (or refuses it with 429), and the worker thread tokenizes,
checks, and generates, sending events back to the job's asyncio queue:

    ("started", prompt_tokens) -> ("piece", text)* -> ("done", Generation)
                                                    | ("failed", APIError) | ("aborted", reason)

Cancelling a job (client gone, shutdown) sets a flag the worker checks before it starts the
job and after every piece the engine yields, i.e. between rounds; it then closes the
engine's stream, which resets the target, so the slot is free within one round. A job's
last event goes out once the engine is free again, so a client that sends its next request
on receiving it finds the engine free (``--max-queue 0`` would otherwise refuse it).
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
from verispec.engine import Engine, Generation, PromptError
from verispec.errors import UserError
from verispec.models import ModelLoadError
from verispec.sampling import InvalidParameterError, NonFiniteLogitsError, SamplingParams
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

    def emit(self, kind: str, value: Any = None) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class EngineWorker:
    """Runs jobs on ``engine`` in a thread of its own, admitting at most ``max_queue`` waiting
    (0: a job runs if the engine is free, else it is refused) and prompts of at most
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
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_prompt_tokens = max_prompt_tokens
        self.default_drafter = drafter
        self.default_k = k
        self._jobs: queue.Queue[GenerationJob | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting: list[GenerationJob] = []
        self._running: GenerationJob | None = None
        self._service_seconds = 1.0
        self._thread = threading.Thread(target=self._loop, name="verispec-engine", daemon=True)

    # --- the event loop's side ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Abort everything and end the thread (waits up to ``timeout`` seconds)."""
        self.cancel_all()
        self._jobs.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: GenerationJob) -> None:
        """Admit ``job`` or raise a 429 ``APIError`` when the queue is full."""
        with self._lock:
            free = self._running is None and not self._waiting
            if not free and len(self._waiting) >= self.max_queue:
                raise APIError(
                    429,
                    f"the server is busy: {len(self._waiting)} requests are waiting (--max-queue {self.max_queue})",
                    code="queue_full",
                    headers={"Retry-After": str(self._retry_after_locked())},
                )
            job.state = "waiting"
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
        self._jobs.put(job)

    def cancel(self, job: GenerationJob) -> None:
        """Abort ``job``: dropped if still waiting, stopped after its current round if running."""
        job.cancelled.set()
        with self._lock:
            if job.state != "waiting":
                return
            self._waiting.remove(job)
            job.state = "finished"
            self.metrics.queue_depth.set(len(self._waiting))
        job.emit("aborted", "cancelled")  # whoever awaits the job learns it will not run

    def cancel_all(self) -> None:
        with self._lock:
            jobs = [*self._waiting, *([self._running] if self._running else [])]
        for job in jobs:
            self.cancel(job)

    def retry_after(self) -> int:
        with self._lock:
            return self._retry_after_locked()

    def _retry_after_locked(self) -> int:
        estimate = self._service_seconds * (len(self._waiting) + 1)
        return max(1, min(MAX_RETRY_AFTER, math.ceil(estimate)))

    # --- the worker thread ----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                if job.state != "waiting":  # cancelled while waiting
                    continue
                self._waiting.remove(job)
                job.state = "running"
                self._running = job
                self.metrics.queue_depth.set(len(self._waiting))
                self.metrics.running.set(1)
            start = time.perf_counter()
            last: Event = ("failed", APIError(500, "internal error while generating", code="internal_error"))
            try:
                last = self._run(job)
            except Exception:  # never let one request take the worker down
                log.exception("%s: unexpected failure", job.id)
            finally:
                elapsed = time.perf_counter() - start
                with self._lock:
                    job.state = "finished"
                    self._running = None
                    self._service_seconds += SERVICE_EMA * (elapsed - self._service_seconds)
                    self.metrics.running.set(0)
                job.emit(*last)

    def _run(self, job: GenerationJob) -> Event:
        """Run ``job``, emitting its events but the last, which it returns."""
        if job.cancelled.is_set():
            return ("aborted", "cancelled")
        try:
            stream, prompt_tokens = self._start(job)
        except APIError as error:
            self.metrics.generations.labels(outcome="rejected").inc()
            return ("failed", error)
        job.emit("started", prompt_tokens)
        start = time.perf_counter()
        try:
            for piece in stream:  # one piece per round, possibly empty
                if piece:
                    job.emit("piece", piece)
                if job.cancelled.is_set():
                    break
        except NonFiniteLogitsError as error:
            self.metrics.generations.labels(outcome="failed").inc()
            log.error("%s failed: %s", job.id, error)
            return ("failed", APIError(500, f"the model produced invalid logits: {error}", code="non_finite_logits"))
        except Exception as error:
            self.metrics.generations.labels(outcome="failed").inc()
            log.exception("%s failed", job.id)
            return ("failed", APIError(500, f"generation failed: {truncate(str(error), 200)}", code="internal_error"))
        finally:
            stream.close()  # ends the engine's request; its finally resets the target
        result = stream.result
        if job.cancelled.is_set() or result is None:
            # What ran before the stop counts too: the tokens generated, the prefill.
            stats = stream.stats
            self.metrics.generations.labels(outcome="aborted").inc()
            self.metrics.observe_generation(stats, stats.prompt_tokens, stats.tokens)
            log.info("%s aborted after %d tokens (%.2f s)", job.id, stats.tokens, time.perf_counter() - start)
            return ("aborted", "cancelled")
        self._finish(job, result, time.perf_counter() - start)
        return ("done", result)

    def _start(self, job: GenerationJob) -> tuple[Any, int]:
        """Tokenize, check the request against the context, and start the engine's stream."""
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
        if k is not None:
            options["k"] = k
        try:
            stream = engine.stream(ids, params=params, **options)
        except InvalidParameterError as error:
            param = "speculative.k" if error.param == "k" else error.param
            raise APIError(400, str(error), param=param, code="invalid_value") from error
        except PromptError as error:
            raise APIError(400, truncate(str(error), 300), param=job.prompt_param, code="invalid_prompt") from error
        except (DrafterError, ModelLoadError) as error:
            raise APIError(400, truncate(str(error), 300), param="speculative.drafter", code="invalid_value") from error
        except UserError as error:
            raise APIError(400, truncate(str(error), 300), code="invalid_value") from error
        return stream, len(ids)

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
