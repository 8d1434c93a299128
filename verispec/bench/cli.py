"""``verispec bench``: argument parsing and printing around the benchmark loop."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from verispec.cli_args import add_model_options, k_value, model_options
from verispec.errors import UserError

DEFAULT_CONFIGS = ["none", "lookup", "hf-generate", "hf-prompt-lookup", "llama.cpp", "llama.cpp-lookup"]


def add_bench_parser(commands: Any) -> None:
    bench = commands.add_parser("bench", help="compare configurations and peers on a Spec-Bench prompt set")
    bench.add_argument("--prompts", default=None, help="Spec-Bench JSONL (default: the dev set in ../shared)")
    bench.add_argument("--categories", nargs="*", default=None, help="categories to include (default: all)")
    bench.add_argument(
        "--per-category", type=int, default=5, help="prompts per category (the edit workload: code snippets)"
    )
    bench.add_argument(
        "--workload",
        default="single",
        choices=["single", "multi-turn", "samples", "edit"],
        help="single: each prompt's first turn; multi-turn: the two-turn records as conversations, the second "
        "turn carrying the first and its answer; samples: each prompt asked --samples times in a row, each with "
        "its own seed (best-of-n; use --temperature > 0); edit: this repository's code snippets, each asked for "
        "with two small changes (default: single)",
    )
    bench.add_argument("--samples", type=int, default=4, help="requests per prompt in the samples workload")
    bench.add_argument("--max-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=1, help="passes over the prompts (narrows the noise)")
    bench.add_argument("--temperature", type=float, default=0.0, help="0 (greedy) or > 0 with fixed seeds")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--k", type=k_value, default="auto", help="default k of verispec configs: auto or a number")
    bench.add_argument("--configs", nargs="*", default=DEFAULT_CONFIGS, help="e.g. none lookup:k=8 hf-generate")
    add_model_options(bench)
    bench.add_argument("--out", default=None, help="output directory (default: bench-results/<time>)")
    bench.add_argument("--plot", default=None, metavar="RESULTS_JSON", help="redraw table and plots from a saved run")
    bench.add_argument(
        "--baseline",
        default="none",
        metavar="LABEL",
        help="the configuration speed-ups are measured against (default: none, verispec's plain decoding); "
        "with --plot, e.g. --baseline llama.cpp redraws a saved run against llama-cpp-python's plain decoding",
    )
    bench.set_defaults(run=run_bench_command)


class BenchInputError(UserError, ValueError):
    """Bad benchmark input: files, categories, configurations."""


def _console() -> Any:
    import sys

    from rich.console import Console

    # A wide table: when writing to a file or pipe, do not squeeze it into 80 columns.
    return Console(width=None if sys.stdout.isatty() else 320)


def _report(document: dict[str, Any], directory: Path, baseline: str) -> None:
    from verispec.bench import plots, report
    from verispec.bench.configs import BASELINE, BenchConfig, own_plain

    settings = document["settings"]
    configs = [BenchConfig(label=c["label"], name=c["name"], options=c["options"]) for c in document["configs"]]
    labels = [c.label for c in configs]
    if baseline not in labels:
        raise BenchInputError(f"--baseline {baseline!r} is not a configuration of this run: {', '.join(labels)}")
    rows = report.summarise(
        document["records"], baseline, greedy=settings["temperature"] == 0, own_plain=own_plain(configs, BASELINE)
    )
    title = f"{settings['model']}, T={settings['temperature']}, {settings['max_tokens']} new tokens"
    if settings.get("workload", "single") != "single":
        title += f", {settings['workload']} workload"
    if settings.get("repeats", 1) > 1:
        title += f", {settings['repeats']} passes (n counts runs)"
    console = _console()
    console.print(report.render_table(rows, title))
    for label, reason in document.get("skipped", {}).items():
        console.print(f"[yellow]skipped {label}[/yellow]: {reason}")
    for failure in document.get("failures", []):
        console.print(
            f"[red]failed[/red] {failure['config']} on prompt {failure['prompt_index']} "
            f"(question {failure['question_id']}, pass {failure.get('repeat', 0) + 1}): {failure['error']}"
        )
    suffix = "" if baseline == "none" else f"_vs_{_file_safe(baseline)}"
    for path in plots.draw_all(rows, baseline, directory, title, suffix):
        console.print(f"wrote {path}")
    (directory / f"table{suffix}.md").write_text(report.markdown_table(rows) + "\n")


def _file_safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)


def run_bench_command(args: argparse.Namespace) -> int:
    from verispec.bench import run, workloads
    from verispec.bench.configs import parse_configs
    from verispec.drafters.registry import drafter_names
    from verispec.prompts import load_prompts, select

    if args.plot:
        path = Path(args.plot)
        _report(run.load(path), path.parent, args.baseline)
        return 0
    if args.per_category < 1 or args.max_tokens < 1 or args.repeats < 1 or args.temperature < 0:
        raise BenchInputError("--per-category, --max-tokens and --repeats must be >= 1 and --temperature >= 0")
    configs = parse_configs(args.configs, drafter_names())
    if args.baseline not in [c.label for c in configs]:
        raise BenchInputError(f"--baseline {args.baseline!r} is not among the configurations")
    prompts = select(load_prompts(args.prompts), args.categories, args.per_category)

    from rich.progress import Progress

    from verispec import models
    from verispec.api import load_engine

    console = _console()
    engines: dict[tuple[tuple[str, object], ...], Any] = {}
    stock: dict[str | None, tuple[Any, list[int]]] = {}

    def engine_for(options: dict[str, object]) -> Any:
        merged = {**model_options(args), **options}
        key = tuple(sorted(merged.items()))
        if key not in engines:
            engines[key] = load_engine(args.model, **merged)  # type: ignore[arg-type]
        return engines[key]

    def stock_model_for(dtype: str | None) -> tuple[Any, list[int]]:
        from verispec.targets.torch_target import default_device, parse_dtype

        if dtype not in stock:
            device = args.device or default_device()
            loaded = models.load(args.model, dtype=parse_dtype(dtype or args.dtype, device), device=device)
            stock[dtype] = (loaded.model, loaded.eos_ids)
        return stock[dtype]

    source = models.resolve(args.model)
    default = engine_for({})
    if args.workload == "multi-turn":
        encoded = workloads.multi_turn(prompts, default)
    elif args.workload == "edit":
        encoded = workloads.edit(args.per_category, default)
    elif args.workload == "samples":
        encoded = workloads.samples(prompts, default, args.samples)
    else:
        encoded = workloads.single(prompts, default)
    runners, skipped = run.build_runners(
        configs, engine_for, stock_model_for, source.location if source.kind == "gguf" else None, args.k
    )
    for label, reason in skipped.items():
        console.print(f"[yellow]skipping {label}[/yellow]: {reason}")
    settings = run.BenchSettings(
        model=default.name,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
        default_k=args.k,
        prompts_file=str(args.prompts or "default dev set"),
        repeats=args.repeats,
        workload=args.workload,
    )
    env = run.environment()
    env["load_average_before"] = os.getloadavg()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmark", total=len(encoded) * len(runners) * args.repeats)
        failures: list[dict[str, Any]] = []
        records = run.run_bench(runners, encoded, settings, lambda label: progress.advance(task), failures)
    env["load_average_after"] = os.getloadavg()
    directory = Path(args.out or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S"))
    run.save(directory / "results.json", settings, configs, skipped, records, env, failures)
    console.print(f"wrote {directory / 'results.json'}")
    _report(run.load(directory / "results.json"), directory, args.baseline)
    return 0
