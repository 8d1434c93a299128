"""The input file: one request a line in the OpenAI Batch API's input format,
``{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions", "body": {...}}``.

The envelope of every line is checked before anything runs, and a file with bad lines is
refused whole, every bad line listed with its number (as OpenAI validates a batch file
before it starts): a line that is not a JSON object, a ``custom_id`` missing, empty or seen
on an earlier line, a ``method`` other than POST, a ``url`` verispec does not serve, a
``body`` missing or not an object. The body's contents are not checked here: each body is
the server's to judge, and one it refuses gets its error record while the job goes on.
Blank lines are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from verispec.errors import UserError
from verispec.server import schemas
from verispec.server.jobs import reject_constant

ENDPOINTS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": schemas.ChatCompletionRequest,
    "/v1/completions": schemas.CompletionRequest,
}
MAX_LISTED = 20  # bad lines named in the error; the rest are counted


class BatchInputError(UserError, ValueError):
    """An input file that cannot be run: unreadable, or with bad lines (all of them listed)."""


@dataclass(frozen=True)
class BatchRequest:
    """One input line: its number (from 1), its ``custom_id``, the endpoint and the body."""

    line: int
    custom_id: str
    url: str
    body: dict[str, Any]

    @property
    def chat(self) -> bool:
        return self.url == "/v1/chat/completions"


def read_requests(path: str | Path) -> list[BatchRequest]:
    """Every request of the file, in order; ``BatchInputError`` listing each bad line."""
    try:
        raw_lines = Path(path).read_bytes().splitlines()
    except OSError as error:
        raise BatchInputError(f"cannot read {path}: {error.strerror or error}") from error
    requests: list[BatchRequest] = []
    problems: list[str] = []
    first_seen: dict[str, int] = {}
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            request = parse_line(raw, number)
        except BatchInputError as error:
            problems.append(f"line {number}: {error}")
            continue
        if request.custom_id in first_seen:
            earlier = first_seen[request.custom_id]
            problems.append(f"line {number}: custom_id {request.custom_id!r} is already used on line {earlier}")
            continue
        first_seen[request.custom_id] = number
        requests.append(request)
    if problems:
        listed = "\n  ".join(problems[:MAX_LISTED])
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise BatchInputError(
            f"{path}: {len(problems)} bad line{'s' if len(problems) > 1 else ''}, nothing was run "
            f"(each line: {{custom_id, method: POST, url: {' or '.join(ENDPOINTS)}, body}}):\n  {listed}{more}"
        )
    return requests


def parse_line(raw: bytes, number: int) -> BatchRequest:
    """Line ``number``'s envelope as a ``BatchRequest``; ``BatchInputError`` says what is wrong."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=reject_constant)
    except UnicodeDecodeError as error:
        raise BatchInputError(f"not UTF-8 (byte {error.start})") from error
    except json.JSONDecodeError as error:
        raise BatchInputError(f"not valid JSON: {error.msg} at character {error.pos}") from error
    except (ValueError, RecursionError) as error:  # NaN, Infinity, nesting too deep, huge integers
        raise BatchInputError(f"not valid JSON: {str(error)[:100] or 'nested too deeply'}") from error
    if not isinstance(data, dict):
        raise BatchInputError(f"a JSON {type(data).__name__} where a request object was expected")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        got = "missing (or null)" if custom_id is None else f"{json.dumps(custom_id)[:40]}, not a non-empty string"
        raise BatchInputError(f"custom_id is {got}")
    method = data.get("method")
    if method != "POST":
        raise BatchInputError(f"method must be POST, got {json.dumps(method)[:40]}")
    url = data.get("url")
    if url not in ENDPOINTS:
        raise BatchInputError(f"url must be {' or '.join(ENDPOINTS)}, got {json.dumps(url)[:60]}")
    body = data.get("body")
    if not isinstance(body, dict):
        raise BatchInputError("body is missing" if body is None else "body must be a JSON object (the request)")
    return BatchRequest(number, custom_id, url, body)
