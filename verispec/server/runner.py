"""uvicorn's Server with a draining shutdown.

The first SIGTERM (or Ctrl+C) starts a drain: new requests get 503 while the listener stays
open, the requests in flight finish (up to ``--drain-timeout`` seconds, after which they are
aborted), then uvicorn shuts down and the process exits 0. A second signal stops at once.
"""

from __future__ import annotations

import logging
import threading
import time
from types import FrameType

import uvicorn

from verispec.server.state import ServerState

CANCEL_GRACE_SECONDS = 2.0  # after the drain timeout, how long aborted requests get to wind down
GRACEFUL_SHUTDOWN_SECONDS = 3  # uvicorn's own wait for connections, once the drain is over

log = logging.getLogger("verispec.server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.drain_started = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals as uvicorn does: it re-raises those at exit, and
        # a re-raised SIGTERM would end the process with a non-zero status.
        if self.drain_started:
            self.force_exit = True
            self.should_exit = True
            return
        self.drain_started = True
        threading.Thread(target=self.drain, name="verispec-drain", daemon=True).start()

    def drain(self) -> None:
        state = self.state
        state.draining = True
        timeout = state.settings.drain_timeout
        log.info("draining: %d requests in flight, waiting up to %.0f s", state.inflight, timeout)
        if not wait_idle(state, timeout) and state.worker is not None:
            log.warning("drain timeout: aborting %d requests still in flight", state.inflight)
            state.worker.cancel_all()
            wait_idle(state, CANCEL_GRACE_SECONDS)
        self.should_exit = True


def wait_idle(state: ServerState, seconds: float) -> bool:
    """Wait until no request is in flight; False when ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while state.inflight > 0:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
