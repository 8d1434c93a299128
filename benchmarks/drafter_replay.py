"""Replay a greedy bench run's outputs through drafters under the governor, without the model.

    .venv/bin/python benchmarks/drafter_replay.py bench-results/RUN/results.json \\
        --configs lookup suffix suffix:branches=3 --per-row 0.35

Takes the plain (``none``) outputs of a greedy ``verispec bench`` run (single, multi-turn or
edit workload), rebuilds each request's prompt as the bench built it (a later turn carries the
earlier plain answers), and replays each configuration's drafter over them
(``verispec.bench.replay``) with ``--k auto`` (the engine's planner and governor) or a fixed
``k``, one planner and one drafter per configuration across all requests, in the run's order,
as one engine would (the suffix drafter's cache learns from the earlier requests). A round of
d drafted rows costs ``1 + per_row d`` plain steps (drafting counted free). Prints per category
the speed-up over plain (tokens over steps, summed), tokens per round and tree rounds.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

from verispec.api import load_engine
from verispec.bench import run, workloads
from verispec.bench.configs import parse_config
from verispec.bench.replay import Clock, replay
from verispec.drafters.registry import LEARNING_DRAFTERS, drafter_names
from verispec.planner import AUTO, Planner
from verispec.prompts import load_prompts, select


def requests(document: dict, engine, per_category: int) -> list[tuple[str, list[int], list[int]]]:
    """(category, prompt ids, plain output ids) per request, in the run's order."""
    settings = document["settings"]
    prompts = select(load_prompts(None), None, per_category)
    workload = settings.get("workload", "single")
    if workload == "multi-turn":
        items = workloads.multi_turn(prompts, engine)
    elif workload == "single":
        items = workloads.single(prompts, engine)
    elif workload == "edit":  # --per-category is the number of snippets, as the bench reads it
        items = workloads.edit(per_category, engine)
    else:
        raise SystemExit(f"the {workload} workload is not replayed here")
    plain = {r["prompt_index"]: r for r in document["records"] if r["config"] == "none" and r.get("repeat", 0) == 0}
    said: dict[str, list[list[int]]] = defaultdict(list)
    out = []
    for index, (prompt, ids) in enumerate(items):
        answer = plain[index]["token_ids"]
        earlier = said[prompt.question_id]
        out.append((prompt.category, ids(earlier) if callable(ids) else list(ids), answer))
        earlier.append(answer)
    return out


def greedy_requests(path: Path, per_category: int) -> tuple[Any, list[tuple[str, list[int], list[int]]]]:
    """The engine of a greedy bench run's model and its requests (``requests``)."""
    document = run.load(path)
    if document["settings"]["temperature"] != 0:
        raise SystemExit("needs a greedy run")
    engine = load_engine(document["settings"]["model"])
    return engine, requests(document, engine, per_category)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--configs", nargs="+", default=["lookup", "suffix", "suffix:branches=3"])
    parser.add_argument("--per-row", type=float, default=0.35, help="plain steps per drafted verify row")
    parser.add_argument("--k", default=AUTO)
    parser.add_argument("--per-category", type=int, default=5, help="as the bench run was given")
    args = parser.parse_args()
    engine, todo = greedy_requests(args.results, args.per_category)
    clock = Clock(args.per_row)
    k = args.k if args.k == AUTO else int(args.k)
    table: dict[str, dict[str, list[float]]] = {}
    for config in args.configs:
        # Options as the bench reads them (``suffix:cache=0`` is the cache's size, ...).
        parsed = parse_config(config, drafter_names())
        scope = {"scope": f"replay-{config}"} if parsed.name in LEARNING_DRAFTERS else {}
        drafter = engine.drafter(parsed.name, **scope, **parsed.drafter_options())
        planner = Planner()
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        for category, prompt, output in todo:
            result = replay(prompt, output, drafter, planner, clock, k=k)
            for key in (category, "overall"):
                row = sums[key]
                row[0] += len(output)
                row[1] += result.steps
                row[2] += result.rounds
                row[3] += result.stats.tree_rounds
            drafter.reset()
        table[config] = sums
    categories = [*sorted({c for sums in table.values() for c in sums if c != "overall"}), "overall"]
    print(f"speed-up over plain (tokens / replayed steps), per row {args.per_row} steps, k {args.k}")
    print(f"{'category':22s}" + "".join(f"{c:>24s}" for c in args.configs))
    for category in categories:
        cells = []
        for config in args.configs:
            tokens, steps, rounds, trees = table[config][category]
            cells.append(f"{tokens / steps:.3f} ({tokens / rounds:.2f}/r, {int(trees)}t)")
        print(f"{category:22s}" + "".join(f"{c:>24s}" for c in cells))


if __name__ == "__main__":
    main()
