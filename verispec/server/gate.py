"""The ASGI gate in front of every route, and CORS.

The ``Gate`` refuses a ``Host`` that does not name this server (403, against DNS rebinding),
new work while draining (503), a missing or wrong API key (401), a generation request whose
body is not declared JSON (415: a web page can send plain text or a form to another site
without asking first, never JSON), bounds and checks the body (413, invalid UTF-8), and
records every request's metrics (499 for a response cut short by its client leaving).
Streaming responses pass through it untouched. ``CORSMiddleware`` sits outside the gate, so
the gate's errors carry CORS headers too.
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections.abc import Callable

from fastapi.responses import Response
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware as StarletteCORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from verispec.server.errors import APIError, error_bytes, truncate
from verispec.server.responses import error_response
from verispec.server.state import ServerSettings, ServerState

CLIENT_CLOSED_REQUEST = 499  # the status recorded for a client that left before its response
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
API_KEY_INDEX = "verispec_api_key_index"  # the request's key among --api-key's, in the ASGI scope's state
ALWAYS_OPEN = ("/health", "/metrics")  # answered while draining
CLEANUP_KEY = "verispec.cleanup"  # scope entry: callables the gate runs when a request ends
ANY_HOST = "*"


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
        if settings.api_keys and path not in UNGUARDED and scope["method"] != "OPTIONS":
            supplied = _bearer(scope)
            if supplied is None:
                return APIError(
                    401, "missing API key: send the header 'Authorization: Bearer <key>'", code="missing_api_key"
                )
            # Every key compared (in constant time each), so the time taken says nothing about
            # which key came close; the handlers learn which key it was (``API_KEY_INDEX``).
            matches = [hmac.compare_digest(supplied.encode(), key.encode()) for key in settings.api_keys]
            if not any(matches):
                return APIError(401, "invalid API key", code="invalid_api_key")
            scope.setdefault("state", {})[API_KEY_INDEX] = matches.index(True)
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


def api_key_scope(settings: ServerSettings, scope: Scope) -> str | None:
    """Which key's drafters a request uses: with several API keys, one scope per key (drafters
    that learn across requests never mix keys); None with one key or none."""
    if len(settings.api_keys) < 2:
        return None
    index = scope.get("state", {}).get(API_KEY_INDEX)
    return None if index is None else f"api-key-{index}"
