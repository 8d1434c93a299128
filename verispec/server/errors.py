"""The one error shape every failed response has: ``{"error": {message, type, param, code}}``.

Everything that can fail (validation, routing, auth, limits, the engine) ends up as an
``APIError`` or is turned into one here, so clients see a single shape for 4xx and 5xx.
Messages are capped, and echoes of the request are truncated, so an error is never larger
than a small constant, whatever was sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from verispec.server.schemas import ErrorDetail, ErrorResponse

MAX_MESSAGE_CHARS = 400
MAX_ECHO_CHARS = 40
LOADING_RETRY_AFTER = 5  # seconds a client is told to wait while the model loads
# pydantic error types meaning "the value is not of this type" (a union member that does not apply)
TYPE_MISMATCHES = frozenset(
    {"string_type", "int_type", "float_type", "bool_type", "list_type", "dict_type", "none_required", "model_type"}
    | {"literal_error", "is_instance_of", "model_attributes_type", "dataclass_type"}
)

# The OpenAI "type" of an error, by status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """A request that ends in an error response; ``headers`` go out with it (Retry-After)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def truncate(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters, marked when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The ``ErrorResponse`` of ``schemas``, as the dict that goes out."""
    detail = ErrorDetail(
        message=truncate(message, MAX_MESSAGE_CHARS),
        type=type,
        param=None if param is None else truncate(param, MAX_ECHO_CHARS * 2),
        code=code,
    )
    return ErrorResponse(error=detail).model_dump()


def model_loading() -> APIError:
    """503 with Retry-After, while the model loads."""
    return APIError(
        503, "the model is loading", code="model_loading", headers={"Retry-After": str(LOADING_RETRY_AFTER)}
    )


def aborted_by_shutdown() -> APIError:
    """A request the drain aborted (past --drain-timeout)."""
    return APIError(503, "the request was aborted: the server is shutting down", code="aborted")


def error_bytes(error: APIError) -> bytes:
    return json.dumps(error.body()).encode()


# --- pydantic validation errors -> 400 ----------------------------------------------------


def param_path(loc: Sequence[Any]) -> str | None:
    """``("body", "messages", 0, "content")`` -> ``"messages[0].content"``; None for the body."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or None


def validation_error(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """One 400 for a list of pydantic/FastAPI errors, naming the first field at fault.

    A value that matches no member of a union yields one error per member (their ``loc``
    ends in the member's name); the field is their common prefix, and the message is that
    of the member whose type the value has (17 stop strings: the list's length limit, not
    "a valid string"), where there is one.
    """
    if not errors:
        return APIError(400, "invalid request body")
    first = errors[0]
    loc = _body_loc(first)
    kind = str(first.get("type", ""))
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        position = f" at character {loc[0]}" if loc and isinstance(loc[0], int) else ""
        return APIError(400, f"the request body is not valid JSON: {detail}{position}", code="invalid_json")
    # Errors from the same field (a union's members) share a prefix; keep only that.
    located = [(_body_loc(e), e) for e in errors]
    field_errors = [e for s, e in located if s[:1] == loc[:1]]
    same_field = [s for s, _ in located if s[:1] == loc[:1]]
    prefix = _common_prefix(same_field) if len(same_field) > 1 else loc
    param = param_path(prefix)
    if not param:
        if kind == "missing":
            return APIError(400, "the request body is missing: send a JSON object", code="invalid_body")
        return APIError(400, "the request body must be a JSON object", code="invalid_body")
    if kind == "missing":
        message = f"{param}: a required field is missing"
    elif len(same_field) > 1 and prefix != loc:
        of_its_type = [e for e in field_errors if e.get("type") not in TYPE_MISMATCHES]
        if of_its_type:
            message = f"{param}: {_message(of_its_type[0])}"
        else:
            message = f"{param}: invalid type or value ({_message(first)})"
    else:
        message = f"{param}: {_message(first)}"
    return APIError(400, message, param=param, code="invalid_value" if kind != "missing" else "missing_field")


def _body_loc(error: Mapping[str, Any]) -> tuple[Any, ...]:
    loc = tuple(error.get("loc", ()))
    return loc[1:] if loc and loc[0] == "body" else loc


def _message(error: Mapping[str, Any]) -> str:
    text = str(error.get("msg", "invalid value"))
    text = text[0].lower() + text[1:] if text else text
    return truncate(text, 200)


def _common_prefix(locs: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    prefix: list[Any] = []
    for parts in zip(*locs, strict=False):
        if all(p == parts[0] for p in parts):
            prefix.append(parts[0])
        else:
            break
    return tuple(prefix)
