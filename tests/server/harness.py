"""Real ``verispec serve`` processes on loopback for the server tests, and small helpers.

Each server is a separate process started the way a user starts one (``python -m
verispec.cli serve ...``), on a free port, with its log in a file. Servers are pinned to
one CPU: torch then runs one thread, and on a small, busy machine its threads no longer
fight the test process and each other (unpinned, a decode step was seen to take 20-40x
longer under load).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests import tiny

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}, {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant, {% endif %}"
)
UNK = 2  # the char tokenizer's <unk>: any character outside its vocabulary
CONTEXT = 4096  # long enough that a greedy request for most of it runs for seconds
LONG_MAX_TOKENS = CONTEXT - 64  # max_tokens of a request meant to run until something stops it


def chat_model(directory: Path, context: int = CONTEXT) -> Path:
    """The tiny random Llama with a chat template (chars only from its vocabulary)."""
    tokenizer = tiny.char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tiny.save(tiny.tiny_model(seed=0, context=context), directory, tokenizer)


def nan_model(directory: Path) -> Path:
    """The same model whose <unk> embedding is NaN: a prompt holding a character outside
    the vocabulary ("~") makes every later logit NaN; other prompts decode normally."""
    import torch

    model = tiny.tiny_model(seed=0, context=512)
    with torch.no_grad():
        model.model.embed_tokens.weight[UNK] = float("nan")
    tokenizer = tiny.char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tiny.save(model, directory, tokenizer)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pin_to_one_cpu() -> None:
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[-1]})


class ServerProcess:
    """A running ``verispec serve``; ``url`` is its base address."""

    def __init__(
        self,
        model_dir: Path | None,
        log_path: Path,
        *options: str,
        env: dict[str, str] | None = None,
        pin: bool = True,
    ) -> None:
        """``model_dir`` None serves the embedded default model (in its default dtype)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [sys.executable, "-m", "verispec.cli", "serve", "--device", "cpu", "--port", str(self.port)]
        if model_dir is not None:
            command += ["--model", str(model_dir), "--dtype", "float32"]
        command += options
        self.model = model_dir.name if model_dir is not None else ""
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # A key in the developer's environment must not guard the test servers.
            env={**{k: v for k, v in os.environ.items() if k != "VERISPEC_API_KEY"}, **(env or {})},
            preexec_fn=_pin_to_one_cpu if pin else None,
        )
        self.health_seen: list[int] = []

    def wait_ready(self, timeout: float = 600.0) -> ServerProcess:
        """Poll /health until 200, recording every status seen (503 while loading). The
        deadline only bounds a hang (a load that fails ends the process, noticed at once):
        on a loaded machine a server pinned to one CPU was seen to need over 120 s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                status = httpx.get(self.url + "/health", timeout=2).status_code
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            self.health_seen.append(status)
            if status == 200:
                return self
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log()}")

    def wait_for_log(self, text: str, timeout: float = 600.0) -> ServerProcess:
        """Wait until the server's log holds ``text`` (a line it logs once something is done)."""
        deadline = time.monotonic() + timeout
        while text not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{text!r} not logged after {timeout} s:\n{self.log()}")
            time.sleep(0.2)
        return self

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def metrics(self, headers: dict[str, str] | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, keyed by (name, sorted labels)."""
        text = httpx.get(self.url + "/metrics", headers=headers, timeout=10).text
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def gauge(self, name: str, headers: dict[str, str] | None = None) -> float:
        return self.metrics(headers)[(name, ())]

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait (kill past ``timeout``); returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return int(self.process.returncode)


def assert_clean_shutdown(process: ServerProcess, status: int) -> None:
    """The server exited 0 after SIGTERM without a crash or a drain that had to time out
    (a request left hanging would hold the drain)."""
    log = process.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
    assert "drain timeout" not in log, log[-4000:]
    assert status == 0, log[-4000:]


def assert_error_shape(response: httpx.Response | Any, status: int | None = None, param: Any = ...) -> dict[str, Any]:
    """The response is the one error shape (and the status and param, when given)."""
    if status is not None:
        assert response.status_code == status, (response.status_code, response.text[:500])
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    if param is not ...:
        assert error["param"] == param, error
    return dict(error)


def sse_events(response: httpx.Response | Iterable[str]) -> list[Any]:
    """The data payloads of a server-sent-events response (or of its lines), "[DONE]" included."""
    import json

    events: list[Any] = []
    for line in response.iter_lines() if isinstance(response, httpx.Response) else response:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
