"""Batch requests run on one engine through the server's own path, so a request gets the
answer ``verispec serve`` would give it: ``jobs`` checks its body and makes its job, the
server's ``EngineWorker`` runs it (many at once, stepped together in shared forward passes),
``responses`` builds its body, and a refusal is the server's ``APIError`` with its status.

Requests that streamed over HTTP (``stream: true``) have no stream to go to here: they are
refused with a 400 (``param: stream``), as a batch file should not ask for one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from verispec.batch.reading import ENDPOINTS, BatchRequest
from verispec.batch.records import record_line
from verispec.engine import Engine
from verispec.server import schemas
from verispec.server.errors import APIError
from verispec.server.exchange import finish
from verispec.server.jobs import chat_job, completion_job, validate_body
from verispec.server.metrics import StreamTimer
from verispec.server.responses import completion_body
from verispec.server.state import ServerSettings, ServerState
from verispec.server.worker import GenerationJob

log = logging.getLogger("verispec.batch")

OnRecord = Callable[[BatchRequest, str], None]


class BatchRunner:
    """Answers batch requests on ``engine`` with ``settings`` (as the server's), ``window`` at
    a time: enough to keep the scheduler's ``max_running`` sequences busy as requests end."""

    def __init__(self, engine: Engine, settings: ServerSettings) -> None:
        self.state = ServerState(settings)
        self.state.attach(engine)
        assert self.state.worker is not None
        self.worker = self.state.worker
        self.window = 2 * settings.max_running

    def close(self) -> None:
        """Abort what is running and stop the worker thread."""
        self.worker.stop()

    async def answer(self, request: BatchRequest) -> str | None:
        """The request's record (a JSON line); None when it was aborted (the runner stopped):
        it gets no record, so a rerun runs it."""
        job: GenerationJob | None = None
        try:
            body = validate_body(request.body, ENDPOINTS[request.url])
            assert isinstance(body, (schemas.CompletionRequest, schemas.ChatCompletionRequest))
            if body.stream:
                raise APIError(
                    400,
                    "stream is not supported in a batch: each request's record holds its whole answer",
                    param="stream",
                    code="unsupported",
                )
            job = (
                chat_job(self.state, body)
                if isinstance(body, schemas.ChatCompletionRequest)
                else completion_job(self.state, body)
            )
            timer = StreamTimer(self.worker.metrics)
            created = int(time.time())
            self.worker.submit(job)
            try:
                result = await finish(job, timer)
            finally:
                self.worker.cancel(job)  # no-op once it has finished; stops it if this task was cancelled
            if result is None:
                return None
            answer = completion_body(job.id, body.model, created, result, job.chat)
            return record_line(request.custom_id, 200, job.id, answer.model_dump(mode="json"))
        except APIError as error:
            return record_line(request.custom_id, error.status, job.id if job else None, error.body())
        except Exception as error:  # a bug: the request gets the server's 500 and the job goes on
            log.error("request %r (line %d) failed unexpectedly", request.custom_id, request.line, exc_info=error)
            internal = APIError(500, "internal server error", code="internal_error")
            return record_line(request.custom_id, 500, job.id if job else None, internal.body())

    async def answer_all(self, requests: Iterable[BatchRequest]) -> list[str | None]:
        """Every request's record, in order, all submitted at once."""
        return list(await asyncio.gather(*(self.answer(request) for request in requests)))

    async def run(self, requests: Iterable[BatchRequest], on_record: OnRecord) -> None:
        """Answer ``requests``, ``window`` in flight, calling ``on_record`` as each ends."""
        pending = iter(requests)
        running: dict[asyncio.Task[str | None], BatchRequest] = {}
        try:
            while True:
                while len(running) < self.window:
                    request = next(pending, None)
                    if request is None:
                        break
                    running[asyncio.ensure_future(self.answer(request))] = request
                if not running:
                    return
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    request = running.pop(task)
                    line = task.result()
                    if line is not None:
                        on_record(request, line)
        finally:
            for task in running:
                task.cancel()


def run_locally(requests: list[BatchRequest], engine: Engine, settings: ServerSettings, on_record: OnRecord) -> None:
    """The job in this process, on ``engine``; an interrupt stops it with what ran recorded."""
    runner = BatchRunner(engine, settings)
    try:
        asyncio.run(runner.run(requests, on_record))
    finally:
        runner.close()
