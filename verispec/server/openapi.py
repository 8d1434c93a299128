"""The OpenAPI document: FastAPI's, with the request bodies' schemas (the routes read their
bodies themselves, so FastAPI does not see them), the served model names and usable drafters
as enums, and without FastAPI's 422 responses (validation errors are 400 here).

``ERRORS`` and ``body_doc`` are what the routes declare; ``install_openapi`` is the hook.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from verispec.server import schemas
from verispec.server.state import ServerSettings

ERRORS: dict[int | str, dict[str, Any]] = {
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


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def install_openapi(app: FastAPI, settings: ServerSettings) -> None:
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

    app.openapi = build  # type: ignore[method-assign]
