"""Request parsing into jobs: a request body becomes a ``GenerationJob`` for the worker.

``parse_body`` reads the JSON into the request models of ``schemas`` (``decode_body``, then
``validate_body``, which ``verispec batch`` calls on the bodies of its lines); every way a body
can be wrong is a 400 naming the field. ``completion_job`` and ``chat_job`` check what the
models cannot (the model name, unsupported options, the model being loaded) and map the
sampling fields through the one table of ``sampling_options``.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from verispec.sampling import InvalidParameterError, SamplingParams
from verispec.sampling_options import sampling_from_request
from verispec.server import schemas
from verispec.server.errors import APIError, model_loading, param_path, validation_error
from verispec.server.state import ServerState
from verispec.server.worker import GenerationJob, flatten_messages

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_SURROGATE = re.compile("[\ud800-\udfff]")


def reject_constant(name: str) -> Any:
    """``json.loads``'s ``parse_constant``: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


async def parse_body(request: Request, model: type[BaseModel]) -> BaseModel:
    """The body as ``model``; every way it can be wrong is a 400 naming the field."""
    raw = await request.body()
    return validate_body(decode_body(raw), model, escaped=b"\\u" in raw)


def decode_body(raw: bytes) -> Any:
    """The JSON value of a request body; a missing body or one that is not JSON is a 400."""
    if not raw.strip():
        raise APIError(400, "the request body is missing: send a JSON object", code="invalid_body")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=reject_constant)
    except json.JSONDecodeError as error:
        raise APIError(
            400, f"the request body is not valid JSON: {error.msg} at character {error.pos}", code="invalid_json"
        ) from error
    except RecursionError as error:
        raise APIError(400, "the request body is nested too deeply", code="invalid_json") from error
    except ValueError as error:  # NaN/Infinity, integers with too many digits
        raise APIError(400, f"the request body is not valid JSON: {str(error)[:100]}", code="invalid_json") from error


def validate_body(data: Any, model: type[BaseModel], *, escaped: bool = True) -> BaseModel:
    """A decoded body as ``model``: a 400 naming the field for anything wrong in it.

    ``escaped``: whether the JSON held a \\u escape, the only way it can spell a lone
    surrogate (False skips that search).
    """
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_body")
    where = _lone_surrogate(data) if escaped else None
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


def _check_served(state: ServerState, body: schemas.CompletionRequest | schemas.ChatCompletionRequest) -> None:
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
        raise model_loading()


def _sampling(body: schemas.SamplingFields) -> SamplingParams:
    if body.temperature is not None and 0.0 < body.temperature < schemas.MIN_TEMPERATURE:
        raise APIError(
            400,
            f"temperature must be 0 (greedy) or at least {schemas.MIN_TEMPERATURE}, got {body.temperature:.3g}",
            param="temperature",
            code="invalid_value",
        )
    try:
        # max_tokens: the real value needs the prompt's length; the worker sets it
        return SamplingParams(**sampling_from_request(body), max_tokens=1)
    except InvalidParameterError as error:
        raise APIError(400, str(error), param=error.param, code="invalid_value") from error


def _speculative(body: schemas.SamplingFields) -> tuple[str | None, int | str | None]:
    spec = body.speculative
    return (spec.drafter, spec.k) if spec is not None else (None, None)


def completion_job(state: ServerState, body: schemas.CompletionRequest) -> GenerationJob:
    _check_served(state, body)
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


def chat_job(state: ServerState, body: schemas.ChatCompletionRequest) -> GenerationJob:
    _check_served(state, body)
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
