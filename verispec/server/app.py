"""The OpenAI-compatible HTTP API: routes, the request gate, and the SSE stream.

``create_app`` builds a FastAPI app around a ``ServerState``. The model loads in a thread
started at startup, so the server listens (and ``/health`` answers 503) while it loads.
Every request passes the ``Gate`` first: it refuses a ``Host`` that does not name this
server (403, against DNS rebinding), new work while draining (503), a missing or wrong API
key (401), a generation request whose body is not declared JSON (415: a web page can send
plain text or a form to another site without asking first, never JSON), bounds and checks
the body (413, invalid UTF-8), and records the request's metrics (499 for a response cut
short by its client leaving). Generation requests are parsed here and run by the
``EngineWorker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware as StarletteCORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from verispec.engine import Engine, Generation
from verispec.sampling import InvalidParameterError, SamplingParams
from verispec.server import schemas
from verispec.server.errors import APIError, error_body, error_bytes, param_path, truncate, validation_error
from verispec.server.metrics import Metrics
from verispec.server.worker import EngineWorker, GenerationJob, flatten_messages

log = logging.getLogger("verispec.server")

DISCONNECT_POLL_SECONDS = 0.1
CLIENT_CLOSED_REQUEST = 499  # the status recorded for a client that left before its response
LOADING_RETRY_AFTER = 5
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
ROUTES = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/openapi.json",
    "/docs",
    "/redoc",
)
JSON_ROUTES = ("/v1/completions", "/v1/chat/completions")  # POST routes whose body must be declared JSON
UNGUARDED = ("/health",)
ALWAYS_OPEN = ("/health", "/metrics")  # answered while draining
CLEANUP_KEY = "verispec.cleanup"  # scope entry: callables the gate runs when a request ends
ANY_HOST = "*"
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class ServerSettings:
    """What ``verispec serve`` was told; ``model_names`` are the names requests may use."""

    model_names: list[str]
    drafter: str | None = None
    k: int | str | None = None
    api_key: str | None = None
    max_queue: int = 64  # requests that may wait while one runs; 0: run when free, else 429
    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None  # None: the model's context is the only limit
    default_max_tokens: int = 1024  # chat requests without max_tokens (completions: OpenAI's 16)
    drain_timeout: float = 30.0
    cors_origins: list[str] = field(default_factory=list)
    # Host names requests may be addressed to besides localhost and IP addresses ("*": any).
    allowed_hosts: list[str] = field(default_factory=list)
    drafters: list[str] = field(default_factory=list)  # usable drafter names, for the OpenAPI document


class ServerState:
    """The live state one app shares between the event loop, the loader and the worker."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.engine: Engine | None = None
        self.worker: EngineWorker | None = None
        self.load_error: str | None = None
        self.draining = False
        self.inflight = 0
        self.created = int(time.time())

    def attach(self, engine: Engine) -> None:
        settings = self.settings
        worker = EngineWorker(
            engine,
            self.metrics,
            max_queue=settings.max_queue,
            max_prompt_tokens=settings.max_prompt_tokens,
            drafter=settings.drafter,
            k=settings.k,
        )
        worker.start()
        self.engine = engine
        self.worker = worker


def create_app(
    settings: ServerSettings,
    load: Callable[[], Engine],
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The app; ``load`` builds the engine in a background thread once the server starts."""
    state = ServerState(settings)

    def load_in_background() -> None:
        start = time.perf_counter()
        try:
            engine = load()
        except BaseException as error:
            state.load_error = str(error)
            log.error("loading the model failed: %s", error)
            if on_load_failure is not None:
                on_load_failure(error)
            return
        state.attach(engine)
        log.info("model %s ready in %.1f s", engine.name, time.perf_counter() - start)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        threading.Thread(target=load_in_background, name="verispec-load", daemon=True).start()
        yield
        if state.worker is not None:
            await asyncio.to_thread(state.worker.stop)

    app = FastAPI(
        title="verispec",
        summary="OpenAI-compatible API for lossless speculative decoding",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.verispec = state
    _install_error_handlers(app)
    _install_routes(app, state)
    app.add_middleware(Gate, state=state)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,  # outside the gate: the gate's errors carry CORS headers too
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.openapi = _openapi(app, settings)  # type: ignore[method-assign]
    return app


# --- the gate: drain, auth, body limits, request metrics ------------------------------------


class Gate:
    """Pure ASGI middleware in front of every route (streaming passes through untouched)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        path = scope["path"]
        route = path if path in ROUTES else "other"
        status = 500
        complete = False  # the response's last byte went out
        disconnected = False  # the client left

        async def send_recording(message: Message) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True

        async def receive_recording() -> Message:
            nonlocal disconnected
            message = await receive()
            disconnected = disconnected or message["type"] == "http.disconnect"
            return message

        try:
            refusal = self._refusal(scope)
            body: bytes | None = None
            if refusal is None and scope["method"] in ("POST", "PUT", "PATCH"):
                body, refusal = await self._read_body(scope, receive_recording)
            if refusal is not None:
                await send_error(send_recording, refusal)
                return
            self.state.inflight += 1
            cleanup: list[Callable[[], None]] = []
            scope[CLEANUP_KEY] = cleanup
            try:
                app_receive = _replay(body, receive_recording) if body is not None else receive_recording
                await self.app(scope, app_receive, send_recording)
            finally:
                self.state.inflight -= 1
                for action in cleanup:
                    action()
        finally:
            if disconnected and not complete:  # a stream cut short, say: not a 200 to count
                status = CLIENT_CLOSED_REQUEST
            self.state.metrics.requests.labels(route=route, status=str(status)).inc()
            self.state.metrics.latency.labels(route=route).observe(time.perf_counter() - start)

    def _refusal(self, scope: Scope) -> APIError | None:
        path = scope["path"]
        settings = self.state.settings
        host = _header(scope, b"host")
        if host is not None and not host_allowed(host, settings.allowed_hosts):
            name = truncate(host_name(host))
            return APIError(
                403,
                f"requests to host {name!r} are refused (a guard against DNS rebinding): address the server as "
                f"localhost or by IP address, or start it with --allowed-hosts {name}",
                code="host_not_allowed",
            )
        if self.state.draining and path not in ALWAYS_OPEN:
            return APIError(503, "the server is shutting down and accepts no new requests", code="server_draining")
        if settings.api_key is not None and path not in UNGUARDED and scope["method"] != "OPTIONS":
            supplied = _bearer(scope)
            if supplied is None:
                return APIError(
                    401, "missing API key: send the header 'Authorization: Bearer <key>'", code="missing_api_key"
                )
            if not hmac.compare_digest(supplied.encode(), settings.api_key.encode()):
                return APIError(401, "invalid API key", code="invalid_api_key")
        if scope["method"] == "POST" and path in JSON_ROUTES:
            media_type = (_header(scope, b"content-type") or "").partition(";")[0].strip().lower()
            if media_type != "application/json":
                sent = f"not {truncate(media_type)!r}" if media_type else "sent without one"
                return APIError(
                    415,
                    f"the body must be JSON, with the header 'Content-Type: application/json' ({sent})",
                    code="unsupported_media_type",
                )
        return None

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[bytes, APIError | None]:
        limit = self.state.settings.max_body_bytes
        too_large = APIError(
            413, f"the request body is larger than the limit of {limit} bytes (--max-body-bytes)", code="body_too_large"
        )
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    if int(value) > limit:
                        return b"", too_large
                except ValueError:
                    return b"", APIError(400, "invalid Content-Length header", code="invalid_body")
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return b"", too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as error:
            return b"", APIError(
                400,
                f"the request body is not valid UTF-8 (invalid byte at position {error.start})",
                code="invalid_utf8",
            )
        return body, None


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return value.decode("latin-1")
    return None


def _bearer(scope: Scope) -> str | None:
    text = _header(scope, b"authorization")
    if text is None:
        return None
    scheme, _, token = text.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port: ``[::1]:8000`` -> ``::1``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def host_allowed(host: str, allowed: list[str]) -> bool:
    """Whether a request addressed to ``host`` may be served.

    A DNS-rebinding page reaches a local server through a name the attacker controls; an IP
    address or ``localhost`` (and ``*.localhost``, which resolves to loopback) cannot be such
    a name. Other names must be listed (``--allowed-hosts``; ``--host`` adds its own).
    """
    if ANY_HOST in allowed:
        return True
    name = host_name(host).rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name in {entry.lower().rstrip(".") for entry in allowed}


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the buffered body once, then passes through (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def send_error(send: Send, error: APIError) -> None:
    payload = error_bytes(error)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class CORSMiddleware(StarletteCORSMiddleware):
    """Starlette's CORS, its refusal of a preflight in the one error shape (not plain text)."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        headers = {k: v for k, v in response.headers.items() if k not in ("content-type", "content-length")}
        refused = bytes(response.body).decode().removeprefix("Disallowed CORS ")  # "origin, method"
        message = f"CORS preflight refused: disallowed {refused} (allowed origins are set with --cors-origin)"
        return error_response(APIError(400, message, code="cors_refused", headers=headers))


# --- errors --------------------------------------------------------------------------------


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        messages = {404: f"no route {request.url.path[:80]}", 405: f"method {request.method} not allowed here"}
        codes = {404: "not_found", 405: "method_not_allowed"}
        error = APIError(
            exc.status_code,
            messages.get(exc.status_code, str(exc.detail)),
            code=codes.get(exc.status_code),
            headers=exc.headers,
        )
        return error_response(error)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(list(exc.errors())))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("unexpected error on %s", request.url.path, exc_info=exc)
        return JSONResponse(error_body("internal server error", "server_error", None, "internal_error"), 500)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)


# --- routes --------------------------------------------------------------------------------

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.ErrorResponse, "description": description}
    for status, description in {
        400: "invalid request",
        401: "missing or wrong API key",
        403: "Host not allowed (--allowed-hosts)",
        404: "unknown model",
        413: "body over --max-body-bytes",
        415: "body not sent as application/json",
        429: "admission queue full (Retry-After)",
        500: "generation failed",
        503: "model loading or server draining",
    }.items()
}


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def _install_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", responses={503: _ERRORS[503]})
    async def health() -> Response:
        if state.draining:
            return error_response(APIError(503, "the server is shutting down", code="server_draining"))
        if state.load_error is not None:
            return error_response(APIError(503, f"the model failed to load: {state.load_error}", code="load_failed"))
        if state.worker is None:
            return error_response(
                APIError(
                    503,
                    "the model is loading",
                    code="model_loading",
                    headers={"Retry-After": str(LOADING_RETRY_AFTER)},
                )
            )
        return JSONResponse({"status": "ok", "model": state.settings.model_names[0]})

    @app.get("/v1/models", response_model=schemas.ModelList, responses={401: _ERRORS[401]})
    async def models() -> schemas.ModelList:
        cards = [schemas.ModelCard(id=name, created=state.created) for name in state.settings.model_names]
        return schemas.ModelList(data=cards)

    @app.get("/metrics", response_class=Response, responses={401: _ERRORS[401]})
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/v1/completions",
        response_model=schemas.CompletionResponse,
        responses=_ERRORS,
        openapi_extra=_body_doc(schemas.CompletionRequest),
    )
    async def completions(request: Request) -> Response:
        body = await _parse(request, schemas.CompletionRequest)
        assert isinstance(body, schemas.CompletionRequest)
        job = _completion_job(state, body)
        return await _respond(state, request, job, body, chat=False)

    @app.post(
        "/v1/chat/completions",
        response_model=schemas.ChatCompletionResponse,
        responses=_ERRORS,
        openapi_extra=_body_doc(schemas.ChatCompletionRequest),
    )
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, schemas.ChatCompletionRequest)
        assert isinstance(body, schemas.ChatCompletionRequest)
        job = _chat_job(state, body)
        return await _respond(state, request, job, body, chat=True)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def _parse(request: Request, model: type[BaseModel]) -> BaseModel:
    """The body as ``model``; every way it can be wrong is a 400 naming the field."""
    raw = await request.body()
    if not raw.strip():
        raise APIError(400, "the request body is missing: send a JSON object", code="invalid_body")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except json.JSONDecodeError as error:
        raise APIError(
            400, f"the request body is not valid JSON: {error.msg} at character {error.pos}", code="invalid_json"
        ) from error
    except RecursionError as error:
        raise APIError(400, "the request body is nested too deeply", code="invalid_json") from error
    except ValueError as error:  # NaN/Infinity, integers with too many digits
        raise APIError(400, f"the request body is not valid JSON: {str(error)[:100]}", code="invalid_json") from error
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_body")
    where = _lone_surrogate(data) if b"\\u" in raw else None  # JSON spells one only as an escape
    if where is not None:
        param = param_path(where)
        raise APIError(
            400,
            f"{param}: holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not a character",
            param=param,
            code="invalid_value",
        )
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise validation_error(error.errors(include_url=False, include_input=False)) from error
    except RecursionError as error:
        raise APIError(400, "the request body is nested too deeply", code="invalid_body") from error


def _lone_surrogate(data: dict[str, Any]) -> tuple[Any, ...] | None:
    """Where the first string (value or key) holding an unpaired surrogate is, if any."""
    pending: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while pending:
        loc, value = pending.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return loc
        elif isinstance(value, (dict, list)):
            items = list(value.items() if isinstance(value, dict) else enumerate(value))
            for key, _ in items:
                if isinstance(key, str) and _SURROGATE.search(key):
                    return (*loc, key)
            pending.extend(((*loc, key), item) for key, item in reversed(items))  # popped in document order
    return None


def _check_common(state: ServerState, body: schemas.CompletionRequest | schemas.ChatCompletionRequest) -> None:
    if body.model not in state.settings.model_names:
        served = ", ".join(state.settings.model_names)
        raise APIError(
            404,
            f"model {body.model[:64]!r} is not served here; served: {served}",
            param="model",
            code="model_not_found",
        )
    refused = schemas.unsupported(body)
    if refused is not None:
        param, message = refused
        raise APIError(400, message, param=param, code="unsupported")
    if state.worker is None:
        raise APIError(
            503, "the model is loading", code="model_loading", headers={"Retry-After": str(LOADING_RETRY_AFTER)}
        )


def _sampling(body: schemas.SamplingFields) -> SamplingParams:
    if body.temperature is not None and 0.0 < body.temperature < schemas.MIN_TEMPERATURE:
        raise APIError(
            400,
            f"temperature must be 0 (greedy) or at least {schemas.MIN_TEMPERATURE}, got {body.temperature:.3g}",
            param="temperature",
            code="invalid_value",
        )
    stop: tuple[str, ...] = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    try:
        return SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_k=max(0, body.top_k or 0),
            top_p=1.0 if body.top_p is None else body.top_p,
            min_p=body.min_p or 0.0,
            repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            seed=body.seed,
            max_tokens=1,  # the real value needs the prompt's length; the worker sets it
            stop=stop,
        )
    except InvalidParameterError as error:
        raise APIError(400, str(error), param=error.param, code="invalid_value") from error


def _speculative(body: schemas.SamplingFields) -> tuple[str | None, int | str | None]:
    spec = body.speculative
    return (spec.drafter, spec.k) if spec is not None else (None, None)


def _completion_job(state: ServerState, body: schemas.CompletionRequest) -> GenerationJob:
    _check_common(state, body)
    raw: Any = body.prompt
    if isinstance(raw, list) and raw and isinstance(raw[0], (str, list)):
        if len(raw) > 1:
            raise APIError(
                400, "a list of several prompts is not supported: send one request per prompt", param="prompt"
            )
        raw = raw[0]
    prompt: str | list[int] = raw if isinstance(raw, str) else [int(t) for t in raw]
    if not prompt:
        raise APIError(400, "prompt: must not be empty", param="prompt", code="empty_prompt")
    drafter, k = _speculative(body)
    return GenerationJob(
        id=f"cmpl-{secrets.token_hex(12)}",
        prompt=prompt,
        chat=False,
        params=_sampling(body),
        max_tokens=body.max_tokens,
        default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
        drafter=drafter,
        k=k,
        prompt_param="prompt",
        loop=asyncio.get_running_loop(),
    )


def _chat_job(state: ServerState, body: schemas.ChatCompletionRequest) -> GenerationJob:
    _check_common(state, body)
    drafter, k = _speculative(body)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return GenerationJob(
        id=f"chatcmpl-{secrets.token_hex(12)}",
        prompt=flatten_messages(body.messages),
        chat=True,
        params=_sampling(body),
        max_tokens=max_tokens,
        default_max_tokens=state.settings.default_max_tokens,
        drafter=drafter,
        k=k,
        prompt_param="messages",
        loop=asyncio.get_running_loop(),
    )


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


async def _respond(
    state: ServerState,
    request: Request,
    job: GenerationJob,
    body: schemas.CompletionRequest | schemas.ChatCompletionRequest,
    *,
    chat: bool,
) -> Response:
    worker = state.worker
    assert worker is not None
    worker.submit(job)
    # However the exchange ends (finished, client gone, error, cancelled), the job ends with it.
    request.scope.get(CLEANUP_KEY, []).append(lambda: worker.cancel(job))
    model = body.model
    created = int(time.time())
    headers = {"x-request-id": job.id}
    watch = DisconnectWatch(request, worker, job)
    try:
        # Wait for the first text (or the end) before choosing the status: a request that
        # fails before its first token gets a real error status, even when streaming.
        kind, value = await job.events.get()
        if kind == "started":
            kind, value = await job.events.get()
        if body.stream and kind == "piece":
            await watch.stop()
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = _sse(job, worker, (kind, value), chat, model, created, include_usage)
            return StreamingResponse(
                events, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
            )
        while kind == "piece":
            kind, value = await job.events.get()
        if kind == "failed":
            raise value
        if kind == "aborted":
            if watch.gone:
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            raise APIError(503, "the request was aborted: the server is shutting down", code="aborted")
        result: Generation = value
        if body.stream:  # finished before a first piece of text (an empty completion)
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = _sse(job, worker, (kind, value), chat, model, created, include_usage)
            return StreamingResponse(
                events, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
            )
        return JSONResponse(_completion_body(job.id, model, created, result, chat), headers=headers)
    except BaseException:
        worker.cancel(job)  # no-op when the job has finished
        raise
    finally:
        await watch.stop()


def _usage(result: Generation) -> dict[str, Any]:
    completion = len(result.token_ids)
    speculative = {"drafter": result.drafter, "k": result.k, **result.stats.as_dict()}
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
        "speculative": _json_safe(speculative),
    }


def _json_safe(value: Any) -> Any:
    """JSON has no NaN or infinity: such floats become null."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _completion_body(request_id: str, model: str, created: int, result: Generation, chat: bool) -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "logprobs": None,
            "finish_reason": result.finish_reason,
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
        kind = "text_completion"
    return {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(result),
    }


def _sse_data(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _sse(
    job: GenerationJob,
    worker: EngineWorker,
    first: tuple[str, Any],
    chat: bool,
    model: str,
    created: int,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """Server-sent events: one chunk per piece, a finishing chunk, the usage chunk, [DONE].

    When the client goes away Starlette cancels this generator; its ``finally`` cancels the
    job, and the worker stops it after the current round.
    """
    object_name = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish_reason: str | None = None, role: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        payload: dict[str, Any] = {
            "id": job.id,
            "object": object_name,
            "created": created,
            "model": model,
            "choices": [choice],
        }
        if include_usage:
            payload["usage"] = None
        return payload

    try:
        if chat:
            yield _sse_data(chunk("", role=True))
        kind, value = first
        while kind == "piece":
            yield _sse_data(chunk(value))
            kind, value = await job.events.get()
        if kind == "done":
            result: Generation = value
            yield _sse_data(chunk(None if chat else "", finish_reason=result.finish_reason))
            if include_usage:
                yield _sse_data(
                    {
                        "id": job.id,
                        "object": object_name,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(result),
                    }
                )
        else:
            error = (
                value
                if isinstance(value, APIError)
                else APIError(503, "the request was aborted: the server is shutting down", code="aborted")
            )
            yield _sse_data(error.body())
        yield b"data: [DONE]\n\n"
    finally:
        worker.cancel(job)


# --- the OpenAPI document ------------------------------------------------------------------


def _openapi(app: FastAPI, settings: ServerSettings) -> Callable[[], dict[str, Any]]:
    """FastAPI's document, with the request bodies' schemas and without its 422 responses
    (validation errors are 400 here)."""
    original = app.openapi

    def build() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = original()
        components = document.setdefault("components", {}).setdefault("schemas", {})
        for model in (schemas.CompletionRequest, schemas.ChatCompletionRequest):
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(schema.pop("$defs", {}))
            components[model.__name__] = schema
        # The served names and usable drafters are known here: document them as enums.
        for name in ("CompletionRequest", "ChatCompletionRequest"):
            components[name]["properties"]["model"]["enum"] = list(settings.model_names)
        if settings.drafters:
            drafter = components["SpeculativeOptions"]["properties"]["drafter"]
            drafter["anyOf"] = [{"type": "string", "enum": list(settings.drafters)}, {"type": "null"}]
        for path in document.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        app.openapi_schema = document
        return document

    return build
