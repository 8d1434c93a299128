"""``verispec serve``: its options, and starting the app under uvicorn (see ``runner``) or as Ray Serve
replicas (``--replicas``, see ``replicas`` and ``ray_runner``)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from verispec.cli_args import add_model_options, bounded_int, k_value
from verispec.drafters.suffix import DEFAULT_CACHE_TOKENS
from verispec.scheduler import DEFAULT_MAX_ROWS, DEFAULT_MAX_RUNNING

if TYPE_CHECKING:
    from verispec.server.engine_spec import EngineSpec
    from verispec.server.state import ServerSettings

API_KEY_ENV = "VERISPEC_API_KEY"

log = logging.getLogger("verispec.server")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from error
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


class _DrafterNames:
    """The drafters offered to users, read from the registry only when help is printed (the
    registry's modules import torch)."""

    def __str__(self) -> str:
        from verispec.drafters.registry import drafter_names

        return ", ".join(drafter_names(controls=False))


def _host_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    serve = subparsers.add_parser("serve", help="serve an OpenAI-compatible API (completions, chat, streaming)")
    add_model_options(serve)
    add_speculation_options(serve)
    http = serve.add_argument_group("server")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    http.add_argument("--port", type=bounded_int(0), default=8000, help="port (default: 8000)")
    http.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health; repeat for several keys, "
        f"whose requests then never share what the suffix drafter learns (default: ${API_KEY_ENV}, "
        "comma-separated for several)",
    )
    http.add_argument(
        "--allowed-hosts",
        type=_host_names,
        action="extend",
        default=[],
        help="host names requests may be addressed to (Host header), besides localhost, IP addresses and --host; "
        "comma-separated or repeated; * allows any (default: none; a guard against DNS rebinding)",
    )
    http.add_argument(
        "--max-queue",
        type=bounded_int(0),
        default=64,
        help="requests that may wait for room; 0: a request runs if there is room, else 429 (default: 64)",
    )
    add_request_limits(http)
    http.add_argument(
        "--max-body-bytes", type=bounded_int(1), default=1 << 20, help="largest request body (default: 1 MiB)"
    )
    http.add_argument(
        "--drain-timeout", type=_seconds, default=30.0, help="on SIGTERM, seconds to let requests finish (default: 30)"
    )
    http.add_argument(
        "--cors-origin", action="append", default=[], help="allow browser requests from this origin (repeatable)"
    )
    _add_replica_options(serve)
    serve.set_defaults(run=run_serve)
    return serve


def add_speculation_options(parser: argparse.ArgumentParser) -> None:
    """--drafter, --k, --suffix-cache: the defaults of requests (``EngineSpec.from_args``)."""
    spec = parser.add_argument_group("speculation (per-request defaults; requests may override)")
    drafter = spec.add_argument(
        "--drafter", default="lookup", help="%(drafters)s; model needs --draft-model (default: %(default)s)"
    )
    drafter.drafters = _DrafterNames()  # type: ignore[attr-defined]  # expanded into the help text
    spec.add_argument("--k", type=k_value, default=None, help="drafts per round: auto or a number (default: auto)")
    spec.add_argument(
        "--suffix-cache",
        type=bounded_int(0),
        default=DEFAULT_CACHE_TOKENS,
        help="tokens of earlier requests (prompts and outputs) the suffix drafter keeps to draft from, per API "
        "key; 0 turns the cross-request cache off (default: %(default)s)",
    )


def add_request_limits(group: Any) -> None:
    """--max-running, --max-rows, --max-prompt-tokens, --default-max-tokens: how the engine
    worker runs requests (``ServerSettings``)."""
    group.add_argument(
        "--max-running",
        type=bounded_int(1),
        default=DEFAULT_MAX_RUNNING,
        help="requests generated at once, stepped together in one forward pass each step (native backend; "
        f"others run one at a time) (default: {DEFAULT_MAX_RUNNING})",
    )
    group.add_argument(
        "--max-rows",
        type=bounded_int(1),
        default=DEFAULT_MAX_ROWS,
        help="rows of one forward pass: the running requests' verify rows, then prefill chunks of new prompts "
        f"(default: {DEFAULT_MAX_ROWS})",
    )
    group.add_argument(
        "--max-prompt-tokens",
        type=bounded_int(1),
        default=None,
        help="longest prompt in tokens; longer ones get 400 context_length_exceeded (default: the model's context)",
    )
    group.add_argument(
        "--default-max-tokens",
        type=bounded_int(1),
        default=1024,
        help="max_tokens of chat requests that set none (default: 1024; /v1/completions: 16, as OpenAI's)",
    )


def _cpus(text: str) -> float:
    try:
        value = float(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected a number of CPUs, got {text!r}") from error
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _add_replica_options(serve: argparse.ArgumentParser) -> None:
    replicas = serve.add_argument_group("replicas (Ray Serve, the ray extra: pip install 'verispec[ray]')")
    replicas.add_argument(
        "--replicas",
        type=bounded_int(1),
        default=None,
        help="run N copies of the server (each its own engine) behind Ray Serve's proxy on --host/--port; "
        "--max-running and --max-queue apply to each (default: one process, no Ray)",
    )
    replicas.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting a local Ray instance",
    )
    replicas.add_argument(
        "--ray-cpus-per-replica",
        type=_cpus,
        default=1.0,
        help="CPUs Ray reserves for each replica; its torch threads: as many whole CPUs, at least one (default: 1)",
    )


def serve_settings(args: argparse.Namespace) -> ServerSettings:
    """The server's settings from ``verispec serve``'s options (the model's name resolved:
    fails fast on a model that cannot exist)."""
    from verispec import models
    from verispec.drafters.registry import drafter_names
    from verispec.server.state import ServerSettings

    return ServerSettings(
        model_names=[models.resolve(args.model).name],
        drafter=args.drafter,
        k=args.k,
        api_keys=api_keys_of(args),
        max_queue=args.max_queue,
        max_running=args.max_running,
        max_rows=args.max_rows,
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        default_max_tokens=args.default_max_tokens,
        drain_timeout=args.drain_timeout,
        cors_origins=list(args.cors_origin),
        allowed_hosts=[*args.allowed_hosts, args.host],
        drafters=[d for d in drafter_names(controls=False) if d != "model" or args.draft_model is not None],
    )


def run_serve(args: argparse.Namespace) -> int:
    _configure_logging()
    if args.replicas is None and (args.ray_address is not None or args.ray_cpus_per_replica != 1.0):
        print("verispec: error: --ray-address and --ray-cpus-per-replica need --replicas", file=sys.stderr)
        return 2
    settings = serve_settings(args)
    if not _is_loopback(args.host) and not settings.api_keys:
        log.warning("binding %s without --api-key: anyone who can reach this address can use the model", args.host)
    from verispec.server.engine_spec import EngineSpec

    spec = EngineSpec.from_args(args)
    if args.replicas is not None:
        from verispec.server.ray_runner import run_replicas

        return run_replicas(args, settings, spec)
    return _run_one(args, settings, spec)


def _run_one(args: argparse.Namespace, settings: ServerSettings, spec: EngineSpec) -> int:
    """One server process under uvicorn, the model loading in the background."""
    import uvicorn

    from verispec.server.app import create_app
    from verispec.server.runner import GRACEFUL_SHUTDOWN_SECONDS, DrainingServer

    failed: list[BaseException] = []
    server: DrainingServer | None = None

    def on_load_failure(error: BaseException) -> None:
        failed.append(error)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, spec.load, on_load_failure)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        server_header=False,
    )
    server = DrainingServer(config, app.state.verispec)
    name = settings.model_names[0]
    log.info("serving %s on http://%s:%d (loading the model in the background)", name, args.host, args.port)
    server.run()
    if failed:
        print(f"verispec: error: the model failed to load: {failed[0]}", file=sys.stderr)
        return 1
    return 0


def api_keys_of(args: argparse.Namespace) -> list[str]:
    """The keys of ``--api-key`` (repeated), else of $VERISPEC_API_KEY (comma-separated)."""
    if args.api_key:
        return list(dict.fromkeys(args.api_key))
    return list(dict.fromkeys(key.strip() for key in os.environ.get(API_KEY_ENV, "").split(",") if key.strip()))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _configure_logging() -> None:
    logger = logging.getLogger("verispec")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
