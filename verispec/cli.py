"""The ``verispec`` command line: parse, validate, print. No algorithm lives here."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from verispec.cli_args import add_model_options, k_value, model_options
from verispec.sampling_options import add_sampling_options, sampling_from_args

if TYPE_CHECKING:
    from verispec.stats import RequestStats

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verispec", description="Lossless speculative decoding, measured.")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate text and print acceptance beside tok/s")
    gen.add_argument("prompt")
    gen.add_argument("--drafter", default="lookup", help="lookup, suffix, head, block, model or none")
    gen.add_argument("--k", type=k_value, default="auto", help="drafts per round: auto (governed) or a number")
    gen.add_argument("--k-max", type=int, default=8, help="the most drafts per round --k auto may choose")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None, help="apply the chat template")
    gen.add_argument("--compare", action="store_true", help="also decode plainly and report the speed-up")
    add_model_options(gen)
    add_sampling_options(gen)
    gen.set_defaults(run=run_generate)

    from verispec.bench.cli import add_bench_parser

    add_bench_parser(commands)
    from verispec.server.cli import add_serve_parser

    add_serve_parser(commands)
    from verispec.batch.cli import add_batch_parser

    add_batch_parser(commands)
    from verispec.train.cli import add_train_parser

    add_train_parser(commands)
    from verispec.train.data_cli import add_data_parser

    add_data_parser(commands)
    return parser


def summary_line(stats: RequestStats) -> str:
    """One line of the request's statistics, the terms of design.md."""
    per_position = " ".join(f"{a:.2f}" for a in stats.per_position_acceptance) or "-"
    parts = [
        f"tokens {stats.tokens}",
        f"{stats.tokens_per_second:.1f} tok/s",
        f"prefill {stats.prompt_tokens} at {stats.prefill_tokens_per_second:.0f} tok/s"
        + (f" ({stats.cached_prompt_tokens} cached)" if stats.cached_prompt_tokens else ""),
        f"acceptance {stats.acceptance_rate:.1%}",
        f"tokens/round {stats.tokens_per_round:.2f}",
        f"per-position [{per_position}]",
        f"rounds {stats.rounds} (plain {stats.plain_rounds})",
        f"bonus shortfall {stats.bonus_shortfall}",
    ]
    if stats.cost_steps is not None:
        parts.append(f"cost {stats.cost_steps:.2f} steps, pays {'yes' if stats.pays else 'no'}")
    if stats.k_chosen_histogram:
        chosen = " ".join(f"{k}:{n}" for k, n in sorted(stats.k_chosen_histogram.items()))
        parts.append(f"governor k chosen {{{chosen}}}, plain {stats.governor_plain_rounds}")
        if stats.governor_shadow_drafts:
            parts.append(f"shadow drafts {stats.governor_shadow_drafts}")
        if stats.governor_start_acceptance is not None:
            parts.append(f"started from acceptance {stats.governor_start_acceptance:.2f}")
    return " | ".join(parts)


def run_generate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from verispec.api import load_engine

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    start = time.perf_counter()
    engine = load_engine(args.model, **model_options(args))  # type: ignore[arg-type]
    description = getattr(engine.target, "description", engine.target.name)
    err.print(f"[dim]loaded {engine.name} in {time.perf_counter() - start:.1f} s: {description}[/dim]")
    kernels = sys.modules.get("verispec.native.kernels")
    if kernels is not None and kernels.build_seconds is not None:  # once per machine, not in any tok/s
        err.print(f"[dim]compiled the native kernels in {kernels.build_seconds:.0f} s ({kernels.build_dir()})[/dim]")
    sampling = sampling_from_args(args)
    options = {"drafter": args.drafter, "k": args.k, "k_max": args.k_max, "chat": args.chat}
    if args.compare:  # warm both paths up so neither pays first-call costs in the timing
        for drafter in (args.drafter, "none"):
            engine.generate(args.prompt, **{**options, "drafter": drafter}, **{**sampling, "max_tokens": 4})
    stream = engine.stream(args.prompt, **options, **sampling)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    result = stream.result
    assert result is not None
    err.print(f"[bold]{args.drafter}[/bold] k={args.k}: {summary_line(result.stats)}")
    if args.compare:
        plain = engine.generate(args.prompt, **{**options, "drafter": "none"}, **sampling)
        speedup = result.stats.tokens_per_second / plain.stats.tokens_per_second
        same = "identical" if plain.token_ids == result.token_ids else "different"
        note = "" if args.temperature == 0 else " (sampled: outputs differ by chance, both follow the target)"
        err.print(
            f"[bold]plain[/bold]: {plain.stats.tokens_per_second:.1f} tok/s | speed-up {speedup:.2f}x | "
            f"output {same} to plain decoding{note}"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from verispec.errors import UserError

    try:
        return int(args.run(args))
    except UserError as error:
        print(f"verispec: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
