"""``verispec serve`` on the embedded default model, as a fresh clone starts it."""

from __future__ import annotations

import openai
import pytest

from tests.server.harness import ServerProcess


@pytest.mark.slow
def test_serve_starts_on_the_embedded_model(tmp_path):
    server = ServerProcess(None, tmp_path / "embedded.log")
    try:
        server.wait_ready(timeout=600)  # the first start converts the GGUF (tens of seconds)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        (model,) = client.models.list()
        assert model.id == "smollm2-135m-instruct"
        response = client.chat.completions.create(
            model=model.id,
            messages=[{"role": "user", "content": "Repeat after me: the cat sat on the mat."}],
            max_tokens=8,
            temperature=0,
        )
        assert response.choices[0].message.content
        speculative = response.usage.model_dump()["speculative"]
        assert speculative["accepted"] + speculative["bonus"] == response.usage.completion_tokens
    finally:
        assert server.terminate() == 0
