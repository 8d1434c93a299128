"""The output lines: one record per request, in the OpenAI Batch API's output format.

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code": 200,
     "request_id": ..., "body": {...}}, "error": null}

``body`` is what ``verispec serve`` answers the same request: the completion (with its
``usage.speculative`` block) for status 200, else the server's one error shape
``{"error": {message, type, param, code}}`` with the status the server would have sent.
``request_id`` is the server's ``x-request-id`` (the completion's id); a request refused
before it became a job gets an id of its own. The top-level ``error`` is for a request that
got no response at all; verispec always answers, so it is null.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from pydantic import BaseModel


class BatchResponse(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class BatchRecord(BaseModel):
    id: str
    custom_id: str
    response: BatchResponse
    error: None = None  # OpenAI's {code, message} for a request that got no response: never here


def record_line(custom_id: str, status: int, request_id: str | None, body: dict[str, Any]) -> str:
    """One output line (JSON, no newline) for a request answered with ``status`` and ``body``."""
    response = BatchResponse(status_code=status, request_id=request_id or new_id("req"), body=body)
    record = BatchRecord(id=new_id("batch_req"), custom_id=custom_id, response=response)
    return json.dumps(record.model_dump(mode="json"))  # ASCII: any custom_id, even a lone surrogate, survives


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"
