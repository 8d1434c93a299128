"""Response bodies and server-sent-event chunks, built from the response models in ``schemas``.

A finished generation becomes a ``CompletionResponse`` or ``ChatCompletionResponse``; a
stream is a sequence of ``CompletionChunk`` or ``ChatCompletionChunk`` events. Field names
and order are the models', which are OpenAI's; ``usage.speculative`` carries the request's
statistics (design.md's terms). Errors are ``errors.APIError``'s one shape.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from verispec.engine import Generation
from verispec.server import schemas
from verispec.server.errors import APIError

SSE_DONE = b"data: [DONE]\n\n"


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def json_response(body: BaseModel, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"), headers=headers)


def usage(result: Generation) -> schemas.Usage:
    completion = len(result.token_ids)
    speculative = {"drafter": result.drafter, "k": result.k, **result.stats.as_dict()}
    return schemas.Usage(
        prompt_tokens=result.prompt_tokens,
        completion_tokens=completion,
        total_tokens=result.prompt_tokens + completion,
        prompt_tokens_details=schemas.PromptTokensDetails(cached_tokens=result.stats.cached_prompt_tokens),
        speculative=_json_safe(speculative),
    )


def _json_safe(value: Any) -> Any:
    """JSON has no NaN or infinity: such floats become null."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def completion_body(
    request_id: str, model: str, created: int, result: Generation, chat: bool
) -> schemas.CompletionResponse | schemas.ChatCompletionResponse:
    """The whole answer of a request that did not stream."""
    if chat:
        message = schemas.AssistantMessage(content=result.text)
        return schemas.ChatCompletionResponse(
            id=request_id,
            created=created,
            model=model,
            choices=[schemas.ChatChoice(index=0, message=message, finish_reason=result.finish_reason)],
            usage=usage(result),
        )
    return schemas.CompletionResponse(
        id=request_id,
        created=created,
        model=model,
        choices=[schemas.CompletionChoice(index=0, text=result.text, finish_reason=result.finish_reason)],
        usage=usage(result),
    )


class ChunkMaker:
    """The chunks of one stream: its id, kind, model and time, and whether it reports usage
    (then every chunk has ``usage``, null but in the last)."""

    def __init__(self, request_id: str, model: str, created: int, *, chat: bool, include_usage: bool) -> None:
        self.request_id = request_id
        self.model = model
        self.created = created
        self.chat = chat
        self.include_usage = include_usage

    def piece(self, text: str | None, finish_reason: str | None = None, role: bool = False) -> bytes:
        """A chunk of text (chat: None adds nothing to the message; ``role`` opens it)."""
        if self.chat:
            delta = schemas.ChatDelta(role="assistant" if role else None, content=text)
            choice = schemas.ChatChunkChoice(index=0, delta=delta, finish_reason=finish_reason)
            return self._event(schemas.ChatCompletionChunk, [choice], None)
        text_choice = schemas.CompletionChoice(index=0, text=text or "", finish_reason=finish_reason)
        return self._event(schemas.CompletionChunk, [text_choice], None)

    def usage(self, result: Generation) -> bytes:
        """The last chunk before [DONE], when usage was asked for: no choices, the usage."""
        kind = schemas.ChatCompletionChunk if self.chat else schemas.CompletionChunk
        return self._event(kind, [], usage(result))

    def _event(self, kind: type[BaseModel], choices: list[Any], usage: schemas.Usage | None) -> bytes:
        chunk = kind(id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage)
        return sse_data(chunk.model_dump(mode="json", exclude=None if self.include_usage else {"usage"}))


def sse_data(payload: Any) -> bytes:
    """One server-sent event holding ``payload`` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
