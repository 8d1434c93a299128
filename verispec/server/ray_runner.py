"""``verispec serve --replicas N``: Ray started (or joined), the replicas' application run on
Ray Serve with its HTTP proxy on --host/--port, and all of it stopped on SIGINT or SIGTERM.

Without ``--ray-address`` a *local* Ray instance starts for this command alone: its own
temporary directory (removed at exit), a small object store (requests and answers are
small; each replica loads its model itself) and as many CPUs as the machine has, or as the
replicas reserve when that is more (then they share cores: warned). With an address, the
command joins that cluster and, at exit, deletes its application (and stops Serve only when
no other application is left on it).

The first signal stops the application the way Serve drains a replica: no new requests go
to it, those in flight get up to ``--drain-timeout`` seconds to finish, then the replicas
stop (each stops its engine worker) and Ray shuts down; the command exits 0. A second
signal stops at once.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from types import FrameType

from verispec.server.engine_spec import EngineSpec
from verispec.server.state import ServerSettings

log = logging.getLogger("verispec.server")

LOCAL_OBJECT_STORE_BYTES = 256 << 20


class Stop(BaseException):
    """SIGINT or SIGTERM arrived (a BaseException: nothing on the way catches it by mistake)."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def run_replicas(args: argparse.Namespace, settings: ServerSettings, spec: EngineSpec) -> int:
    try:
        import ray
        from ray import serve
    except ImportError:
        print("verispec: error: --replicas runs on Ray Serve: pip install 'verispec[ray]'", file=sys.stderr)
        return 2
    from verispec.server.replicas import APP_NAME, build

    application = build(settings, spec, args.replicas, args.ray_cpus_per_replica)
    local = args.ray_address is None
    temp_dir = tempfile.mkdtemp(prefix="verispec-serve-") if local else None
    started = False
    status = 0
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if temp_dir is not None:
            _start_local_ray(temp_dir, args.replicas * args.ray_cpus_per_replica)
        else:
            ray.init(address=args.ray_address)
        # After ray.init, which installs a SIGTERM handler of its own (exit at once).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _raise_stop)
        serve.start(http_options={"host": args.host, "port": args.port})
        started = True
        log.info("starting %d replicas of %s (each loads the model)", args.replicas, settings.model_names[0])
        serve.run(application, name=APP_NAME, route_prefix="/")
        log.info(
            "serving %s on http://%s:%d with %d replicas", settings.model_names[0], args.host, args.port, args.replicas
        )
        while True:
            time.sleep(3600)  # a signal ends the wait (Stop)
    except Stop as stop:
        log.info("%s: stopping the replicas (requests in flight get up to %.0f s)", stop, settings.drain_timeout)
    except RuntimeError as error:  # a deployment that failed: a model that does not load, say
        print(f"verispec: error: the replicas failed to start: {_why(error)}", file=sys.stderr)
        status = 1
    finally:
        _shut_down(started, local)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    return status


def _why(error: RuntimeError) -> str:
    """The replicas' own error (the last line of their deployment's status: the exception a
    replica's constructor raised), rather than Serve's "failed to update the deployments"."""
    from ray import serve

    from verispec.server.replicas import APP_NAME, DEPLOYMENT_NAME

    try:
        message = serve.status().applications[APP_NAME].deployments[DEPLOYMENT_NAME].message
    except Exception:  # Serve itself failed: its own words, then
        return str(error)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else str(error)


PROXY_PATIENCE = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
}


def _start_local_ray(temp_dir: str, cpus_needed: float) -> None:
    import ray

    cpus = os.cpu_count() or 1
    if cpus_needed > cpus:
        log.warning("the replicas reserve %g CPUs, this machine has %d: they will share cores", cpus_needed, cpus)
    # A local instance started for one command reports no usage statistics unless asked to.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray Serve gives its HTTP proxy 5 s to report ready and 10 s per health check, three
    # strikes: on a small machine busy loading models (2 cores, the replicas starting) the
    # proxy was seen to miss them and be killed, ending the command. Longer, unless set.
    for name, seconds in PROXY_PATIENCE.items():
        os.environ.setdefault(name, seconds)
    ray.init(
        num_cpus=max(cpus, math.ceil(cpus_needed)),
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        include_dashboard=False,
        _temp_dir=temp_dir,
    )


def _shut_down(started: bool, local: bool) -> None:
    """Serve's graceful stop (the application drains), then Ray's; a second signal skips the
    drain."""
    import ray
    from ray import serve

    from verispec.server.replicas import APP_NAME

    try:
        if started and local:
            serve.shutdown()
        elif started:
            serve.delete(APP_NAME)
            if not serve.status().applications:
                serve.shutdown()
    except Stop:
        log.warning("second signal: stopping now, requests in flight are cut")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # Ray's own shutdown is not to be interrupted
        ray.shutdown()
