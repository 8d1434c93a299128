"""The one table of sampling options: each ``SamplingParams`` field, its command-line flag,
its default and help, and how a request body's value becomes the parameter.

``verispec generate`` builds its flags from it (``add_sampling_options``, read back by
``sampling_from_args``) and the server reads request bodies through it
(``sampling_from_request``), so a field added here reaches both. No numpy here: the command
line imports this module to parse its arguments.

Terms: an option's *default* is ``SamplingParams``'s (what a request that leaves the field
out or sends null gets); ``cli_default`` differs only where the command line chooses
otherwise (it decodes greedily unless told). ``from_request`` converts a request's value
where the request's range is wider than the parameter's (``top_k`` -1 means off).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_SAME = object()  # cli_default: the same as default


def _strings(value: str | Sequence[str]) -> tuple[str, ...]:
    """A stop string or a list of them -> a tuple (``SamplingParams.stop``)."""
    return (value,) if isinstance(value, str) else tuple(value)


def _off_below_zero(value: int) -> int:
    return max(0, value)


@dataclass(frozen=True)
class SamplingOption:
    """One sampling parameter as the command line and request bodies see it.

    name: the ``SamplingParams`` field, the request field and (dashed) the flag.
    parse: the flag's argument type. repeatable: the flag may be given once per value.
    in_requests: read from request bodies here (``max_tokens`` is not: the server sets it from
    the prompt's length). convert: applied to every value given, from a flag or a request.
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    cli_default: Any = _SAME
    repeatable: bool = False
    in_requests: bool = True
    convert: Callable[[Any], Any] | None = None
    from_request: Callable[[Any], Any] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def command_line_default(self) -> Any:
        return self.default if self.cli_default is _SAME else self.cli_default


SAMPLING_OPTIONS: tuple[SamplingOption, ...] = (
    SamplingOption("temperature", float, 1.0, "0 is greedy (the command line's default)", cli_default=0.0),
    SamplingOption("top_k", int, 0, "keep the k likeliest tokens; 0 is off", from_request=_off_below_zero),
    SamplingOption("top_p", float, 1.0, "keep the likeliest tokens holding this much mass; 1 is off"),
    SamplingOption("min_p", float, 0.0, "drop tokens below this fraction of the likeliest one's probability"),
    SamplingOption("repetition_penalty", float, 1.0, "on tokens seen in prompt or output; 1 is off"),
    SamplingOption("presence_penalty", float, 0.0, "subtracted once per token seen in the output"),
    SamplingOption("frequency_penalty", float, 0.0, "subtracted per occurrence in the output"),
    SamplingOption("seed", int, None, "the request's RNG seed (default: drawn)"),
    SamplingOption("max_tokens", int, 128, "the most tokens to generate", in_requests=False),
    SamplingOption("stop", str, (), "stop string (repeatable)", cli_default=[], repeatable=True, convert=_strings),
)


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """A "sampling" group with one flag per option."""
    group = parser.add_argument_group("sampling")
    for option in SAMPLING_OPTIONS:
        action = "append" if option.repeatable else "store"
        group.add_argument(
            option.flag, type=option.parse, default=option.command_line_default, action=action, help=option.help
        )


def sampling_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments from flags added by ``add_sampling_options``."""
    return {option.name: _converted(option, getattr(args, option.name)) for option in SAMPLING_OPTIONS}


def sampling_from_request(body: Any) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments from a request body's fields (absent or null:
    the default); ``max_tokens`` is left to the caller."""
    kwargs = {}
    for option in SAMPLING_OPTIONS:
        if not option.in_requests:
            continue
        value = getattr(body, option.name)
        if value is None:
            kwargs[option.name] = option.default
            continue
        if option.from_request is not None:
            value = option.from_request(value)
        kwargs[option.name] = _converted(option, value)
    return kwargs


def _converted(option: SamplingOption, value: Any) -> Any:
    return value if option.convert is None or value is None else option.convert(value)
