"""Schema fuzzing with schemathesis against the server's own OpenAPI document.

Valid (positive) and invalid (negative) inputs for every operation: no response is a 5xx,
and every error is the one error shape. Bounded: a fixed number of examples per operation
and mode, derandomized so CI runs the same cases, and generations kept short.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

EXAMPLES = 50
MAX_TOKENS = 6


def _bound_generation(case) -> None:
    """Keep valid requests quick: cap or add max_tokens (invalid values stay invalid)."""
    body = case.body
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS


def _check(case, response) -> None:
    where = f"{case.method} {case.path} body={json.dumps(case.body, default=str)[:300]}"
    assert response.status_code < 500, f"{where} -> {response.status_code} {response.text[:300]}"
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, where
        assert set(body["error"]) == {"message", "type", "param", "code"}, where
        assert len(body["error"]["message"]) <= 400, where


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_no_5xx_and_one_error_shape(server, mode):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {operation.path for operation in operations}
    assert {"/v1/completions", "/v1/chat/completions"} <= paths
    seen = {"requests": 0, "errors": 0}

    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # nothing to make invalid: these routes take no input
        strategy = operation.as_strategy(generation_mode=mode)

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def run(case) -> None:
            _bound_generation(case)
            response = case.call(base_url=server.url, timeout=60)
            seen["requests"] += 1
            seen["errors"] += response.status_code >= 400
            _check(case, response)

        run()
    print(mode, seen)
    assert seen["requests"] >= EXAMPLES  # the fuzzing ran
