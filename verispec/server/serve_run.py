"""``serve run verispec.server.serve_run:app KEY=VALUE ...``: Ray Serve's own command line
builds the replicas application from ``verispec serve``'s options. A module of its own: it
reads the serve command's parser (``server.cli``), which starts the replicas
(``server.ray_runner`` -> ``server.replicas``), so ``replicas`` must not import ``cli``."""

from __future__ import annotations

import argparse
from typing import Any

from ray.serve import Application

from verispec.server.engine_spec import EngineSpec
from verispec.server.replicas import build


def app(args: dict[str, Any]) -> Application:
    """The builder of ``serve run verispec.server.serve_run:app KEY=VALUE ...``: each KEY is an
    option of ``verispec serve`` without its dashes (``replicas=2 model=PATH max-running=4``),
    an on/off option's VALUE true or false (``exact=false``). The proxy's address is Serve's
    own (``serve start --http-host ... --http-port ...``, or a config file's http_options)."""
    from verispec.server.cli import add_serve_parser, serve_settings

    root = argparse.ArgumentParser(prog="serve run verispec.server.serve_run:app")
    parser = add_serve_parser(root.add_subparsers())
    parsed = parser.parse_args(_serve_argv(parser, args))
    if parsed.ray_address is not None:
        raise ValueError("under serve run, Ray is serve run's: give serve run --address, not ray-address")
    spec = EngineSpec.from_args(parsed)
    return build(serve_settings(parsed), spec, parsed.replicas or 1, parsed.ray_cpus_per_replica)


def _serve_argv(parser: argparse.ArgumentParser, args: dict[str, Any]) -> list[str]:
    """``serve run``'s KEY=VALUE pairs as ``verispec serve`` arguments."""
    # Options that take no value: --exact/--no-exact and the like.
    flags = {name for action in parser._actions if action.nargs == 0 for name in action.option_strings}
    argv = []
    for key, value in args.items():
        option = "--" + str(key).replace("_", "-")
        text = str(value)
        if option in flags and text.lower() in ("true", "false"):
            argv.append(option if text.lower() == "true" else "--no-" + option[2:])
        else:
            argv += [option, text]
    return argv
