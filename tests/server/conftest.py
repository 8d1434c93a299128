"""Fixtures: the tiny chat model on disk and the server processes shared by the modules."""

from __future__ import annotations

import pytest

from tests.server.harness import ServerProcess, assert_clean_shutdown, chat_model

MAIN_BODY_LIMIT = 65536
ALLOWED_HOSTS = ("models.internal", "Other.Example")
MAX_PROMPT_TOKENS = 40
DEFAULT_MAX_TOKENS = 5


@pytest.fixture(scope="session")
def chat_dir(tmp_path_factory):
    return chat_model(tmp_path_factory.mktemp("models") / "tiny-chat")


@pytest.fixture(scope="session")
def server(chat_dir, tmp_path_factory):
    """The main server: tiny chat model, default queue, a 64 KiB body limit."""
    log = tmp_path_factory.mktemp("logs") / "main.log"
    process = ServerProcess(chat_dir, log, "--max-body-bytes", str(MAIN_BODY_LIMIT))
    try:
        yield process.wait_ready()
    finally:
        status = process.terminate()
    # Whatever the tests sent, nothing crashed inside the server, and it shut down cleanly.
    assert_clean_shutdown(process, status)


@pytest.fixture(scope="session")
def limited(chat_dir, tmp_path_factory):
    """A server with the limits and defaults set: host names, prompt length, chat's max_tokens."""
    log = tmp_path_factory.mktemp("logs") / "limited.log"
    options = ["--allowed-hosts", ",".join(ALLOWED_HOSTS), "--max-prompt-tokens", str(MAX_PROMPT_TOKENS)]
    process = ServerProcess(chat_dir, log, *options, "--default-max-tokens", str(DEFAULT_MAX_TOKENS))
    try:
        yield process.wait_ready()
    finally:
        status = process.terminate()
    assert_clean_shutdown(process, status)
