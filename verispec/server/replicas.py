"""Replicas of the server on Ray Serve: N engines behind one OpenAI-compatible address.

A *replica* is one Ray Serve replica (a Ray actor process) holding a whole verispec server:
the app of ``create_app``, so every route, error shape, SSE stream and ``usage.speculative``
block is the single server's, with an engine, engine worker and metrics of its own. Ray
Serve's HTTP proxy listens on the server's address and routes each request to a replica
(the less loaded of two picked at random), up to ``--max-running`` + ``--max-queue`` (+
``HEADROOM`` for /health, /metrics and /v1/models) requests in flight on each; past that a
replica answers 429 as the single server does.

What is per replica: the engine, its slots and queue (so N replicas hold N times as many
requests), the suffix drafter's cross-request cache (each learns from the requests routed
to it), and the counters. ``/metrics`` answers the sum over all replicas (see
``metrics_board``): each publishes its counters to the deployment's board actor every
``PUBLISH_SECONDS`` and before the last byte of each generation's response, so a client
that got its answer finds it counted, whichever replica answers ``/metrics``. ``/health``
is one replica's. Every response names its replica in the ``x-verispec-replica`` header.

``verispec.server.serve_run:app`` is the builder for ``serve run`` (``replicas=2 model=...``);
``verispec serve --replicas N`` (``ray_runner``) builds the same application.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
from typing import Any

import ray
import torch
from ray import serve
from ray.serve import Application
from ray.serve.config import DeploymentActorConfig
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from verispec.server.app import create_app
from verispec.server.engine_spec import EngineSpec
from verispec.server.gate import JSON_ROUTES
from verispec.server.metrics_board import MetricsBoard, exposition, merge, snapshot
from verispec.server.state import ServerSettings, ServerState

log = logging.getLogger("verispec.server")

APP_NAME = "verispec"
DEPLOYMENT_NAME = "verispec-server"
BOARD = "metrics-board"  # the deployment-scoped actor holding every replica's latest metrics
REPLICA_HEADER = "x-verispec-replica"
HEADROOM = 8  # requests in flight on a replica past its slots and queue: /health, /metrics, /v1/models
PUBLISH_SECONDS = 2.0
BOARD_TIMEOUT_SECONDS = 5.0  # /metrics waits this long for the board, then answers this replica's own
PUBLISH_WAIT_SECONDS = 1.0  # the most a response's last byte waits for its replica's counters to be published
BOARD_START_SECONDS = 60.0  # a starting replica waits this long for the board to answer
CONSTRUCTOR_RETRIES = 3  # a model that failed to load is not retried twenty times (Serve's default)


class ReplicaFront:
    """ASGI wrapper in front of one replica's app: names the replica on every response,
    publishes its metrics before the last byte of a generation request's response, and turns
    Serve's way of saying that the client left into the ASGI one."""

    def __init__(self, app: ASGIApp, replica: ServerReplica) -> None:
        self.app = app
        self.replica = replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        generation = scope["method"] == "POST" and scope["path"] in JSON_ROUTES

        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append(REPLICA_HEADER, self.replica.name)
            elif generation and message["type"] == "http.response.body" and not message.get("more_body", False):
                await self.replica.publish()
            await send(message)

        gone = False

        async def receive_or_disconnect() -> Message:
            # Serve's receive raises TaskCancelledError once the proxy has cancelled the request
            # (its client left, say right after a stream's [DONE]), where an ASGI server answers
            # http.disconnect; and after raising it would wait forever.
            nonlocal gone
            if not gone:
                try:
                    return await receive()
                except ray.exceptions.TaskCancelledError:
                    gone = True
            return {"type": "http.disconnect"}

        await self.app(scope, receive_or_disconnect, send_named)


@serve.ingress()
class ServerReplica:
    """One replica: loads the engine before it takes requests, then serves ``create_app``'s
    app around it (built by ``__serve_build_asgi_app__``, which Serve calls after this).
    ``threads``: torch's threads (the native and torch backends; llama.cpp's are set at load)."""

    # async: Serve awaits an ingress class's constructor (and requires it async in subclasses).
    async def __init__(self, settings: ServerSettings, spec: EngineSpec, threads: int) -> None:  # type: ignore[misc]
        self.name = serve.get_replica_context().replica_id.unique_id
        self.settings = settings
        self.state: ServerState | None = None
        self._sequence = 0
        self._board: Any = None
        # Board calls are submitted in this context, the constructor's, never a request's: Ray
        # cancels the calls a request submitted when the request is cancelled (its client left).
        self._context = contextvars.copy_context()
        # Loading takes seconds: in a thread, so the replica's event loop answers Serve meanwhile.
        self.engine = await asyncio.to_thread(spec.load)
        # The backends size torch's thread pool by the cores the process may run on: on a
        # node all of them, shared with the other replicas. A replica keeps to what Ray reserved.
        torch.set_num_threads(threads)
        await self._wait_for_board()
        self._publisher = asyncio.get_running_loop().create_task(self._publish_every())

    def __serve_build_asgi_app__(self) -> ASGIApp:
        app = create_app(self.settings, self.engine, metrics=self.metrics)
        self.state = app.state.verispec
        return ReplicaFront(app, self)

    async def check_health(self) -> None:
        """Serve's health check: a replica whose engine worker died is replaced."""
        state = self.state
        if state is not None and state.worker is not None and not state.worker.alive():
            raise RuntimeError("the engine worker thread has stopped")

    async def __del__(self) -> None:
        publisher = getattr(self, "_publisher", None)  # none when the constructor failed
        if publisher is not None:
            publisher.cancel()
            await self._call("leave", self.name, timeout=BOARD_TIMEOUT_SECONDS)

    # --- metrics ------------------------------------------------------------------------

    def _snapshot(self) -> tuple[int, list[Any]]:
        assert self.state is not None
        self._sequence += 1
        return self._sequence, snapshot(self.state.metrics.registry)

    async def publish(self) -> None:
        """Send this replica's counters to the board (not waited for past ``PUBLISH_WAIT_SECONDS``)."""
        if self.state is not None:
            await self._call("publish", self.name, *self._snapshot(), timeout=PUBLISH_WAIT_SECONDS)

    async def metrics(self) -> bytes:
        """``/metrics``: the sum over the live replicas, or this one's alone without a board."""
        sequence, families = self._snapshot()
        every = await self._call("exchange", self.name, sequence, families, timeout=BOARD_TIMEOUT_SECONDS)
        snapshots = every if every is not None else [families]
        return exposition(merge(snapshots), len(snapshots))

    async def _publish_every(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_SECONDS)
            await self.publish()

    async def _wait_for_board(self) -> None:
        """Take requests only once the board answers: Serve creates it before the replicas,
        but its process may still be starting (on a busy machine, for seconds)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BOARD_START_SECONDS
        while loop.time() < deadline:
            if await self._call("__ray_ready__", timeout=BOARD_START_SECONDS) is not None:
                return
            await asyncio.sleep(0.5)
        log.warning("the metrics board did not start in %.0f s: /metrics answers one replica's", BOARD_START_SECONDS)

    async def _call(self, method: str, *args: Any, timeout: float) -> Any:
        """The board's answer, or None when it failed or took over ``timeout`` seconds. A call
        not waited for is left to finish, not cancelled: Ray runs one caller's calls to an
        actor in order, and one cancelled before it ran was seen to hold up all that followed."""
        call = self._context.run(asyncio.get_running_loop().create_task, self._submit(method, *args))
        call.add_done_callback(self._check)
        try:
            return await asyncio.wait_for(asyncio.shield(call), timeout)
        except TimeoutError:
            log.warning("metrics board: %s took over %.1f s, not waited for", method, timeout)
        except ray.exceptions.RayError:
            pass  # logged by _check
        return None

    async def _submit(self, method: str, *args: Any) -> Any:
        if self._board is None:
            try:
                self._board = serve.get_deployment_actor(BOARD)
            except ValueError:  # not registered yet, or being recreated by Serve: asked again next time
                return None
        return await getattr(self._board, method).remote(*args)

    def _check(self, call: asyncio.Task[Any]) -> None:
        error = None if call.cancelled() else call.exception()
        if error is not None:
            log.warning("metrics board call failed: %s", error)
            if isinstance(error, ray.exceptions.RayActorError):
                self._board = None  # a handle to a dead actor stays dead: look it up again


def build(settings: ServerSettings, spec: EngineSpec, replicas: int, cpus_per_replica: float) -> Application:
    """The Serve application: ``replicas`` copies of the server, each with ``cpus_per_replica``."""
    deployment = serve.deployment(
        name=DEPLOYMENT_NAME,
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica},
        max_ongoing_requests=settings.max_running + settings.max_queue + HEADROOM,
        graceful_shutdown_timeout_s=settings.drain_timeout,
        max_constructor_retry_count=CONSTRUCTOR_RETRIES,
        deployment_actors=[
            DeploymentActorConfig(name=BOARD, actor_class=ray.remote(MetricsBoard), actor_options={"num_cpus": 0})
        ],
    )(ServerReplica)
    return deployment.bind(settings, spec, max(1, math.floor(cpus_per_replica)))
