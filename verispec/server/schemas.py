"""Request and response bodies in the OpenAI shapes, with verispec's ``speculative`` extension.

Requests are validated strictly (a string is not a number, a float is not an integer) and the
ranges that OpenAI documents are part of the schema, so the OpenAPI document describes what
the server accepts. Fields that clients commonly send but verispec ignores (``user``, ...)
are accepted; fields asking for something verispec cannot do (``logprobs``, ``n`` > 1, tools)
are refused with a 400 that says so (see ``unsupported``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

MAX_STOP_STRINGS = 16
MIN_TEMPERATURE = 1e-5  # below it (but above 0), logits / temperature can overflow to inf


def _integral(value: Any) -> Any:
    # JSON Schema counts 2.0 as an integer; strict validation otherwise refuses it.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Integer = Annotated[int, BeforeValidator(_integral)]
"""An integer: a JSON number without a fractional part (2 or 2.0), never a string or a bool."""

_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")
_NULL: dict[str, Any] = {"type": "null"}
_FALSE: dict[str, Any] = {"anyOf": [{"type": "boolean", "enum": [False]}, _NULL]}


def documented_as(allowed: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """``json_schema_extra`` for a field accepted for compatibility but supported only in part:
    the OpenAPI document shows what works, validation gives a clear 400 for the rest."""

    def apply(schema: dict[str, Any]) -> None:
        for key in ("anyOf", "type", "minimum", "exclusiveMinimum", "items", "additionalProperties"):
            schema.pop(key, None)
        schema.update(allowed)

    return apply


def _one_of(*options: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": list(options)}


_TOKEN_IDS: dict[str, Any] = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}


class SpeculativeOptions(BaseModel):
    """verispec's extension: how to speculate for this request (defaults: the server's)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

    drafter: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        None, description="drafter name: lookup, model or none"
    )
    k: Annotated[Integer, Field(ge=0, le=64)] | Literal["auto"] | None = Field(
        None, description="draft tokens per round (or auto where the engine supports it)"
    )


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: bool | None = Field(None, description="send a last chunk with the usage block")


class SamplingFields(BaseModel):
    """What completions and chat completions share."""

    model_config = _STRICT

    model: Annotated[str, Field(min_length=1, max_length=256)] = Field(description="one of GET /v1/models")
    max_tokens: Annotated[Integer, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = Field(
        None,
        description=f"0 is greedy; otherwise at least {MIN_TEMPERATURE} (smaller ones overflow the logits)",
        json_schema_extra=documented_as(
            _one_of(
                {"type": "number", "enum": [0]},
                {"type": "number", "minimum": MIN_TEMPERATURE, "maximum": 2.0},
                _NULL,
            )
        ),
    )
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[Integer, Field(ge=-1)] | None = Field(None, description="0 or -1: off")
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(ge=0.01, le=10.0)] | None = None
    seed: Annotated[Integer, Field(ge=0, lt=2**63)] | None = None
    stop: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_STRINGS)]
        | None
    ) = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Annotated[Integer, Field(ge=1)] | None = Field(
        None,
        description="only 1 is supported",
        json_schema_extra=documented_as(_one_of({"type": "integer", "minimum": 1, "maximum": 1}, _NULL)),
    )
    user: str | None = None
    logit_bias: dict[str, float] | None = Field(
        None,
        description="not supported: must be empty or absent",
        json_schema_extra=documented_as(_one_of({"type": "object", "maxProperties": 0}, _NULL)),
    )
    speculative: SpeculativeOptions | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[Integer] | list[list[Integer]] = Field(
        description="a string, or token ids; a list of several prompts is not supported",
        json_schema_extra=documented_as(
            _one_of(
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
                _TOKEN_IDS,
                {"type": "array", "items": _TOKEN_IDS, "minItems": 1, "maxItems": 1},
            )
        ),
    )
    logprobs: Annotated[Integer, Field(ge=0)] | None = Field(
        None, description="not supported: must be absent", json_schema_extra=documented_as(_NULL)
    )
    echo: bool | None = Field(
        False, description="not supported: must be false", json_schema_extra=documented_as(_FALSE)
    )
    suffix: str | None = Field(
        None, description="not supported: must be absent", json_schema_extra=documented_as(_NULL)
    )
    best_of: Annotated[Integer, Field(ge=1)] | None = Field(
        None,
        description="only 1 is supported",
        json_schema_extra=documented_as(_one_of({"type": "integer", "minimum": 1, "maximum": 1}, _NULL)),
    )


class TextPart(BaseModel):
    model_config = _STRICT

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = _STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[Integer, Field(ge=1)] | None = None
    logprobs: bool | None = Field(
        None, description="not supported: must be false or absent", json_schema_extra=documented_as(_FALSE)
    )
    top_logprobs: Annotated[Integer, Field(ge=0)] | None = Field(
        None, description="not supported: must be absent", json_schema_extra=documented_as(_NULL)
    )
    tools: list[dict[str, Any]] | None = Field(
        None,
        description="not supported: must be empty or absent",
        json_schema_extra=documented_as(_one_of({"type": "array", "maxItems": 0}, _NULL)),
    )
    response_format: dict[str, Any] | None = Field(
        None,
        description='only {"type": "text"}',
        json_schema_extra=documented_as(
            _one_of(
                {
                    "type": "object",
                    "properties": {"type": {"type": "string", "enum": ["text"]}},
                    "required": ["type"],
                },
                _NULL,
            )
        ),
    )


# --- responses (documentation and construction) ------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens read from the cache an earlier request left (not computed)")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    speculative: dict[str, Any] = Field(
        description="the request's speculative statistics: rounds, offered, accepted, acceptance_rate, "
        "tokens_per_round, per_position_acceptance, bonus_shortfall and more (terms as in design.md)"
    )


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None


class _Answer(BaseModel):
    """What every answer and chunk begins with; ``object`` names its kind (set by each)."""

    id: str
    object: str
    created: int
    model: str


class CompletionResponse(_Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionResponse(_Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class CompletionChunk(_Answer):
    """One server-sent event of a streamed completion; ``usage`` is sent (null until the
    last chunk) only when the request asked for it with ``stream_options.include_usage``."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    """What a chat chunk adds to the message: fields it does not set are left out, not null."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionChunk(_Answer):
    """One server-sent event of a streamed chat completion (``usage`` as in ``CompletionChunk``)."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class HealthStatus(BaseModel):
    status: Literal["ok"] = "ok"
    model: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "verispec"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def unsupported(request: CompletionRequest | ChatCompletionRequest) -> tuple[str, str] | None:
    """(param, message) for the first field that asks for something verispec cannot do."""
    if request.n is not None and request.n > 1:
        return "n", "n > 1 is not supported: verispec returns one choice per request; send n requests"
    if request.logit_bias:
        return "logit_bias", "logit_bias is not supported"
    if isinstance(request, CompletionRequest):
        if request.logprobs is not None:
            return "logprobs", "logprobs are not supported by verispec"
        if request.echo:
            return "echo", "echo is not supported"
        if request.suffix is not None:
            return "suffix", "suffix is not supported"
        if request.best_of is not None and request.best_of > 1:
            return "best_of", "best_of > 1 is not supported"
    else:
        if request.logprobs:
            return "logprobs", "logprobs are not supported by verispec"
        if request.top_logprobs is not None:
            return "top_logprobs", "top_logprobs are not supported by verispec (logprobs are not supported)"
        if request.tools:
            return "tools", "tools (function calling) are not supported"
        if request.response_format is not None and request.response_format.get("type", "text") != "text":
            return "response_format", 'only response_format {"type": "text"} is supported'
    return None
