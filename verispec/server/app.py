"""The OpenAI-compatible HTTP API: the app, its routes and its error handlers.

``create_app`` builds a FastAPI app around a ``ServerState``. The model loads in a thread
started at startup, so the server listens (and ``/health`` answers 503) while it loads.
The app's jobs live in modules named for them: ``gate`` (every request passes it first:
hosts, drain, API keys, body size, metrics; and CORS), ``jobs`` (request bodies into
``GenerationJob``s), ``exchange`` (a job run into a JSON answer or an SSE stream),
``responses`` (bodies and chunks from the models of ``schemas``), ``openapi`` (the
document), ``state`` (settings and live state).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from verispec.engine import Engine
from verispec.server import schemas
from verispec.server.errors import APIError, error_body, model_loading, validation_error
from verispec.server.exchange import respond
from verispec.server.gate import CORSMiddleware, Gate, api_key_scope
from verispec.server.jobs import chat_job, completion_job, parse_body
from verispec.server.openapi import ERRORS, body_doc, install_openapi
from verispec.server.responses import error_response, json_response
from verispec.server.state import ServerSettings, ServerState

__all__ = ["ServerSettings", "ServerState", "create_app"]

log = logging.getLogger("verispec.server")


def create_app(
    settings: ServerSettings,
    load: Callable[[], Engine] | Engine,
    on_load_failure: Callable[[BaseException], None] | None = None,
    *,
    metrics: Callable[[], Awaitable[bytes]] | None = None,
) -> FastAPI:
    """The app; ``load`` builds the engine in a background thread once the server starts, or
    is an engine already loaded, ready when the server starts (a Ray Serve replica loads
    before it takes requests). ``metrics`` answers ``/metrics`` (default: this app's own
    registry; replicas answer the sum over all of them)."""
    state = ServerState(settings)

    def load_in_background() -> None:
        assert not isinstance(load, Engine)  # an engine already loaded is attached at startup
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
        if isinstance(load, Engine):
            state.attach(load)
        else:
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
    _install_routes(app, state, metrics)
    app.add_middleware(Gate, state=state)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,  # outside the gate: the gate's errors carry CORS headers too
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    install_openapi(app, settings)
    return app


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


def _install_routes(app: FastAPI, state: ServerState, exposition: Callable[[], Awaitable[bytes]] | None) -> None:
    @app.get("/health", responses={503: ERRORS[503]})
    async def health() -> Response:
        if state.draining:
            return error_response(APIError(503, "the server is shutting down", code="server_draining"))
        if state.load_error is not None:
            return error_response(APIError(503, f"the model failed to load: {state.load_error}", code="load_failed"))
        if state.worker is None:
            return error_response(model_loading())
        return json_response(schemas.HealthStatus(model=state.settings.model_names[0]))

    @app.get("/v1/models", response_model=schemas.ModelList, responses={401: ERRORS[401]})
    async def models() -> schemas.ModelList:
        cards = [schemas.ModelCard(id=name, created=state.created) for name in state.settings.model_names]
        return schemas.ModelList(data=cards)

    @app.get("/metrics", response_class=Response, responses={401: ERRORS[401]})
    async def metrics() -> Response:
        body = await exposition() if exposition is not None else state.metrics.exposition()
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/v1/completions",
        response_model=schemas.CompletionResponse,
        responses=ERRORS,
        openapi_extra=body_doc(schemas.CompletionRequest),
    )
    async def completions(request: Request) -> Response:
        body = await parse_body(request, schemas.CompletionRequest)
        assert isinstance(body, schemas.CompletionRequest)
        job = completion_job(state, body)
        job.scope = api_key_scope(state.settings, request.scope)
        assert state.worker is not None  # the job checked that the model is loaded
        return await respond(state.worker, request, job, body)

    @app.post(
        "/v1/chat/completions",
        response_model=schemas.ChatCompletionResponse,
        responses=ERRORS,
        openapi_extra=body_doc(schemas.ChatCompletionRequest),
    )
    async def chat_completions(request: Request) -> Response:
        body = await parse_body(request, schemas.ChatCompletionRequest)
        assert isinstance(body, schemas.ChatCompletionRequest)
        job = chat_job(state, body)
        job.scope = api_key_scope(state.settings, request.scope)
        assert state.worker is not None  # the job checked that the model is loaded
        return await respond(state.worker, request, job, body)
