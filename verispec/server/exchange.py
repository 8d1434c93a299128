"""One exchange: a job submitted to the worker, its events turned into a JSON answer or a
stream of server-sent events, and the job cancelled however the exchange ends.

The status is chosen once the first text (or the end) arrives: a request that fails before
its first token gets a real error status, even when it asked to stream. A client that leaves
cancels its job: ``DisconnectWatch`` notices until a stream starts, Starlette from then on.
Every event taken from the job passes through a ``StreamTimer`` (time to first token,
inter-piece latency, queue time), streaming or not: the events arrive the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from verispec.engine import Generation
from verispec.server import schemas
from verispec.server.errors import APIError, aborted_by_shutdown
from verispec.server.gate import CLEANUP_KEY, CLIENT_CLOSED_REQUEST
from verispec.server.metrics import StreamTimer
from verispec.server.responses import SSE_DONE, ChunkMaker, completion_body, json_response, sse_data
from verispec.server.worker import EngineWorker, Event, GenerationJob

DISCONNECT_POLL_SECONDS = 0.1


class DisconnectWatch:
    """Polls for the client leaving while a response is being prepared, and cancels the job.

    Needed until a streaming response starts (Starlette watches from then on) and for the
    whole of a non-streaming one; events arriving steadily must not hide a disconnect.
    """

    def __init__(self, request: Request, worker: EngineWorker, job: GenerationJob) -> None:
        self.gone = False
        self._task = asyncio.ensure_future(self._watch(request, worker, job))

    async def _watch(self, request: Request, worker: EngineWorker, job: GenerationJob) -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_SECONDS)
        self.gone = True
        worker.cancel(job)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def respond(
    worker: EngineWorker,
    request: Request,
    job: GenerationJob,
    body: schemas.CompletionRequest | schemas.ChatCompletionRequest,
) -> Response:
    """Run ``job`` and answer: JSON, or (``body.stream``) server-sent events."""
    timer = StreamTimer(worker.metrics)  # the request's arrival: its latencies count from here
    worker.submit(job)
    # However the exchange ends (finished, client gone, error, cancelled), the job ends with it.
    request.scope.get(CLEANUP_KEY, []).append(lambda: worker.cancel(job))
    created = int(time.time())
    headers = {"x-request-id": job.id}
    watch = DisconnectWatch(request, worker, job)
    try:
        kind, value = await _next(job, timer)
        if kind == "started":
            kind, value = await _next(job, timer)
        if body.stream and kind in ("piece", "done"):  # "done" first: an empty completion
            await watch.stop()
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chunks = ChunkMaker(job.id, body.model, created, chat=job.chat, include_usage=include_usage)
            return StreamingResponse(
                _events(job, worker, (kind, value), chunks, timer),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache"},
            )
        result = await finish(job, timer, (kind, value))
        if result is None:
            if watch.gone:
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            raise aborted_by_shutdown()
        return json_response(completion_body(job.id, body.model, created, result, job.chat), headers=headers)
    except BaseException:
        worker.cancel(job)  # no-op when the job has finished
        raise
    finally:
        await watch.stop()


async def finish(job: GenerationJob, timer: StreamTimer, event: Event | None = None) -> Generation | None:
    """Wait for the end of a submitted job, from ``event`` (one already taken) or its next:
    its ``Generation``, or None when it was aborted; a job that failed raises its ``APIError``."""
    kind, value = event if event is not None else await _next(job, timer)
    while kind in ("started", "piece"):
        kind, value = await _next(job, timer)
    if kind == "failed":
        raise value
    return value if kind == "done" else None


async def _next(job: GenerationJob, timer: StreamTimer) -> Event:
    """The job's next event, timed as it reaches the event loop."""
    kind, value = await job.events.get()
    timer.saw(kind, value)
    return kind, value


async def _events(
    job: GenerationJob, worker: EngineWorker, first: Event, chunks: ChunkMaker, timer: StreamTimer
) -> AsyncIterator[bytes]:
    """Server-sent events: one chunk per piece, a finishing chunk, the usage chunk, [DONE].

    When the client goes away Starlette cancels this generator; its ``finally`` cancels the
    job, and the worker stops it after the current round.
    """
    try:
        if chunks.chat:
            yield chunks.piece("", role=True)
        kind, value = first
        while kind == "piece":
            yield chunks.piece(value)
            kind, value = await _next(job, timer)
        if kind == "done":
            result: Generation = value
            yield chunks.piece(None if chunks.chat else "", finish_reason=result.finish_reason)
            if chunks.include_usage:
                yield chunks.usage(result)
        else:
            error = value if isinstance(value, APIError) else aborted_by_shutdown()
            yield sse_data(error.body())
        yield SSE_DONE
    finally:
        worker.cancel(job)
