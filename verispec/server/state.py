"""What one server shares between the event loop, the loader thread and the engine worker:
its settings (what ``verispec serve`` was told) and its live state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from verispec.engine import Engine
from verispec.scheduler import DEFAULT_MAX_ROWS
from verispec.server.metrics import Metrics
from verispec.server.worker import EngineWorker


@dataclass
class ServerSettings:
    """What ``verispec serve`` was told; ``model_names`` are the names requests may use."""

    model_names: list[str]
    drafter: str | None = None
    k: int | str | None = None
    # Bearer keys that open the guarded routes (none: no key needed). With several, each key's
    # requests get drafters of their own where drafters learn across requests (suffix).
    api_keys: list[str] = field(default_factory=list)
    max_queue: int = 64  # requests that may wait for room; 0: run if there is room, else 429
    max_running: int = 1  # requests stepped together (a target without sequences runs one)
    max_rows: int = DEFAULT_MAX_ROWS  # rows of one forward pass
    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None  # None: the model's context is the only limit
    default_max_tokens: int = 1024  # chat requests without max_tokens (completions: OpenAI's 16)
    drain_timeout: float = 30.0
    cors_origins: list[str] = field(default_factory=list)
    # Host names requests may be addressed to besides localhost and IP addresses ("*": any).
    allowed_hosts: list[str] = field(default_factory=list)
    drafters: list[str] = field(default_factory=list)  # usable drafter names, for the OpenAPI document


class ServerState:
    """The live state one app shares between the event loop, the loader and the worker."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.engine: Engine | None = None
        self.worker: EngineWorker | None = None
        self.load_error: str | None = None
        self.draining = False
        self.inflight = 0
        self.created = int(time.time())

    def attach(self, engine: Engine) -> None:
        settings = self.settings
        worker = EngineWorker(
            engine,
            self.metrics,
            max_queue=settings.max_queue,
            max_prompt_tokens=settings.max_prompt_tokens,
            drafter=settings.drafter,
            k=settings.k,
            max_running=settings.max_running,
            max_rows=settings.max_rows,
        )
        worker.start()
        self.engine = engine
        self.worker = worker
