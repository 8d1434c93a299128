"""``verispec train-data``: grow a drafter's training-data directory, show what it holds, and
build the suffix drafter's phrase table from it.

    verispec train-data grow DIR --source passages --tokens 500000 --temperature 1
    verispec train-data show DIR
    verispec train-data phrases DIR --out table.npz

``grow`` loads the target on the native backend with ``--running`` sequences and answers the
source's prompts in shared passes (``verispec.train.shards``); rerun it with a larger
``--tokens`` (or after Ctrl+C) and it carries on where the directory stands.
"""

from __future__ import annotations

import argparse
import signal
import time
from typing import Any

from verispec.train.cli import LOG_SECONDS  # one log cadence for both training commands


def add_data_parser(commands: Any) -> None:
    from verispec.train.shards import DEFAULT_RUNNING, DEFAULT_SHARD_SEQUENCES

    data = commands.add_parser(
        "train-data",
        help="grow (or show) a directory of the target's own answers for drafter training",
        description="Self-distilled training data, written in shards by batched generation on the native "
        "target; resumable: a rerun skips the prompts already answered.",
    )
    actions = data.add_subparsers(dest="action", required=True)
    grow = actions.add_parser("grow", help="answer a source's prompts until the directory holds --tokens of them")
    grow.add_argument("dir", help="the data directory (made if missing; holds one target's data)")
    grow.add_argument("--source", required=True, help="prompt source (see `verispec train-data sources`)")
    grow.add_argument("--tokens", type=int, required=True, help="response tokens of this source and settings to hold")
    grow.add_argument("--temperature", type=float, default=0.0, help="0: greedy answers; else sampled at it")
    grow.add_argument("--max-new-tokens", type=int, default=256, help="longest answer")
    grow.add_argument("--seed", type=int, default=0, help="with the prompt id, seeds each request")
    grow.add_argument("--running", type=int, default=DEFAULT_RUNNING, help="sequences generated together")
    grow.add_argument("--shard-sequences", type=int, default=DEFAULT_SHARD_SEQUENCES, help="answers per shard")
    grow.add_argument("--target", default=None, help="GGUF file or model directory (default: embedded)")
    grow.set_defaults(run=run_grow)
    show = actions.add_parser("show", help="a table of what the directory holds, per source and settings")
    show.add_argument("dir")
    show.set_defaults(run=run_show)
    listing = actions.add_parser("sources", help="the prompt sources, their sizes and licences")
    listing.set_defaults(run=run_sources)
    phrases = actions.add_parser(
        "phrases",
        help="build the suffix drafter's phrase table from the answers (drafter option suffix_phrases=FILE)",
    )
    phrases.add_argument("dirs", nargs="+", help="data directories of the target")
    phrases.add_argument("--out", required=True, help="the table file to write (.npz)")
    phrases.add_argument("--temperature", type=float, default=0.0, help="answers generated at it (0: greedy)")
    phrases.add_argument("--orders", type=int, nargs="+", default=None, help="context lengths (default 4 3 2)")
    phrases.add_argument("--min-count", type=int, default=None, help="contexts seen fewer times are left out")
    phrases.add_argument("--target", default=None, help="GGUF file or model directory (default: embedded)")
    phrases.set_defaults(run=run_phrases)


def run_grow(args: argparse.Namespace) -> int:
    from rich.console import Console

    from verispec.api import load_engine
    from verispec.train.shards import DataDir, GenerationSettings, ShardError, grow, resolve

    console = Console(stderr=True, highlight=False)
    if args.running < 1 or args.tokens < 1 or args.shard_sequences < 1:
        console.print("[red]error:[/red] --running, --tokens and --shard-sequences must be >= 1")
        return 2
    try:
        settings = GenerationSettings(args.temperature, args.max_new_tokens, args.seed)
        source = resolve(args.source)
    except ShardError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    engine = load_engine(args.target, backend="native", slots=args.running)
    target: Any = engine.target  # the native target: it has sequences and a weights fingerprint
    try:
        data = DataDir(args.dir, target.weights_fingerprint())
    except ShardError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    last = [time.perf_counter()]

    def progress(held: int, wanted: int, seconds: float) -> None:
        if time.perf_counter() - last[0] >= LOG_SECONDS:
            last[0] = time.perf_counter()
            console.print(f"{source.name}: {held:,}/{wanted:,} tokens, {seconds:.0f} s generating")

    # Ctrl+C, and a TERM signal (a job scheduler, `timeout`, a shell that started it in the
    # background with SIGINT ignored), stop the run the same way: what finished is kept.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = grow(data, engine, source, settings, args.tokens, args.shard_sequences, progress)
    except KeyboardInterrupt:
        console.print("interrupted: the answers finished so far are in a shard; rerun to carry on")
        return 130
    console.print(
        f"{report.source}: {report.held:,} response tokens held ({report.held - report.held_before:,} new in "
        f"{report.sequences} answers, {report.shards} shards, {report.seconds:.0f} s, "
        f"{report.tokens_per_second:.0f} tok/s)" + ("; the source has no more prompts" if report.exhausted else "")
    )
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_show(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from verispec.train.shards import DataDir, summary

    console = Console(highlight=False)
    rows = summary(DataDir(args.dir))
    table = Table(title=f"{args.dir}")
    for name in ("source", "temperature", "max new", "shards", "answers", "tokens", "hours", "tok/s", "licence"):
        table.add_column(name, justify="left" if name in ("source", "licence") else "right")
    for row in rows:
        rate = row["tokens"] / row["seconds"] if row["seconds"] else 0.0
        table.add_row(
            row["source"],
            f"{row['temperature']:g}",
            str(row["max_new_tokens"]),
            str(row["shards"]),
            f"{row['sequences']:,}",
            f"{row['tokens']:,}",
            f"{row['seconds'] / 3600:.2f}",
            f"{rate:.0f}",
            row["licence"],
        )
    console.print(table)
    console.print(f"total: {sum(r['tokens'] for r in rows):,} response tokens")
    return 0


def run_sources(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from verispec.train import sources
    from verispec.train.shards import derived_sources

    table = Table(title="prompt sources")
    for name in ("source", "prompts", "licence"):
        table.add_column(name)
    for name, source in sources.SOURCES.items():
        table.add_row(name, "unbounded" if source.size is None else f"{source.size:,}", source.licence)
    for name, derived in derived_sources().items():
        table.add_row(name, f"one per answer of {', '.join(derived.parents)}", derived.licence)
    Console(highlight=False).print(table)
    return 0


def run_phrases(args: argparse.Namespace) -> int:
    """The phrase table of every answer at ``--temperature`` in the directories (responses
    only: the prompts are not the target's words), for the target the data is of."""
    from pathlib import Path

    from rich.console import Console

    from verispec.api import load_engine
    from verispec.drafters.base import DrafterError
    from verispec.drafters.phrases import DEFAULT_MIN_COUNT, DEFAULT_ORDERS, PhraseTable
    from verispec.train.shards import DataDir, ShardError

    console = Console(stderr=True, highlight=False)
    began = time.perf_counter()
    engine = load_engine(args.target, backend="native")
    target: Any = engine.target
    fingerprint = target.weights_fingerprint()
    documents: list[list[int]] = []
    sources: dict[str, int] = {}
    try:
        for root in args.dirs:
            data = DataDir(Path(root))  # read only: no target.json is written here
            if data.fingerprint is None:
                raise ShardError(f"{root} holds no training data (no target.json)")
            if data.fingerprint != fingerprint:
                raise ShardError(f"{root} holds data of another target (weights {data.fingerprint[:12]})")
            for info in data.shards():
                if info.settings["temperature"] != args.temperature:
                    continue
                for _, response in data.sequences([info]):
                    documents.append(response)
                    sources[info.source] = sources.get(info.source, 0) + len(response)
        if not documents:
            raise ShardError(f"no answers at temperature {args.temperature:g} in {', '.join(args.dirs)}")
        table = PhraseTable.build(
            documents,
            orders=args.orders or DEFAULT_ORDERS,
            min_count=DEFAULT_MIN_COUNT if args.min_count is None else args.min_count,
            header={
                "target": {
                    "name": target.name,
                    "vocab_size": target.vocab_size,
                    "weights_sha256": fingerprint,
                },
                "built_from": {"temperature": args.temperature, "response_tokens_by_source": sources},
            },
        )
    except (ShardError, DrafterError) as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    table.save(Path(args.out))
    console.print(
        f"{args.out}: {len(table):,} contexts from {len(documents):,} answers "
        f"({sum(sources.values()):,} tokens), {time.perf_counter() - began:.0f} s"
    )
    return 0
