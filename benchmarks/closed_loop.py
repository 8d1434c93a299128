"""Batched throughput in-process: closed-loop clients on the engine's scheduler, no HTTP.

    .venv/bin/python benchmarks/closed_loop.py --clients 16 --duration 25 --pairs 2 --configs none lookup

``serve_load.py``'s workload without its server and clients: the same prompts (the dev set's
first turns, 64 in category order), as chat messages, greedy, ``--max-tokens`` each. Each of
``--clients`` clients sends its next request as soon as its last one finishes, for
``--duration`` seconds; then the requests in flight finish. A run's tokens/s is the tokens of
finished requests over its wall time, drain included, as in ``serve_load.py``. Configurations
(drafters as the bench writes them, ``NAME[:option=value,...]``, e.g. ``suffix:cache=0``; all
but ``none`` with ``k`` auto) alternate run by run, ``--pairs`` rounds of them, after one
untimed request each. Each run has a drafter of its own: ``suffix``'s cache of earlier
requests starts empty, so a run never drafts from an earlier run's answers (the prompts
repeat every 64 requests within a run, as they do in ``serve_load.py``). Also printed: the
seconds spent in forward passes and outside them (the planner, governor, drafters and rule
between passes); over the finished requests' rounds, the drafts offered and accepted a round,
the shares of rounds that drafted, that asked the drafter for a shadow only, and that the load
kept plain without asking it; and the forward passes' count, rows and mean time. On a 2-core
machine this is what the engine gives with nothing else on the cores; the HTTP figures are
lower by what the server's event loop and the benchmark's client take.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from verispec.api import load_engine
from verispec.bench.configs import parse_config
from verispec.drafters.base import Drafter
from verispec.drafters.registry import drafter_names
from verispec.engine import Engine, Request
from verispec.prompts import load_prompts, round_robin
from verispec.sampling import SamplingParams
from verispec.scheduler import Running, Scheduler

SLOTS = 16  # the server's default --max-running


def drafter_of(engine: Engine, config: str) -> Drafter:
    """A new drafter of ``config`` (``NAME[:option=value,...]``), kept apart from the engine's."""
    parsed = parse_config(config, drafter_names())
    return engine.drafter(parsed.name, fresh=True, **parsed.drafter_options())


def request(engine: Engine, prompt: str, drafter: Drafter, max_tokens: int) -> Request:
    ids = engine.encode([{"role": "user", "content": prompt}], chat=True)
    k: dict[str, Any] = {} if drafter.name == "none" else {"k": "auto"}
    return engine.request(ids, params=SamplingParams(temperature=0.0, max_tokens=max_tokens), drafter=drafter, **k)


def run_point(
    engine: Engine, scheduler: Scheduler, prompts: list[str], config: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One run of ``args.clients`` closed-loop clients: tokens/s and where the time went."""
    sent = 0
    drafter = drafter_of(engine, config)  # the scheduler forks it for each request

    def start() -> Running:
        nonlocal sent
        sent += 1
        return scheduler.start(request(engine, prompts[(sent - 1) % len(prompts)], drafter, args.max_tokens))

    began = time.perf_counter()
    deadline = began + args.duration
    running = [start() for _ in range(args.clients)]
    tokens = finished = 0
    in_passes = 0.0
    rounds = offered = accepted = plain_by_load = shadows = drafted = pass_requests = pass_rows = 0
    steps = step_rows = 0
    while running:
        report = scheduler.step()
        in_passes += report.seconds
        steps += report.rows > 0
        step_rows += report.rows
        for item in list(running):
            item.take()  # the text a stream would send: decoded as the server decodes it
            if item.finished:
                running.remove(item)
                if item.result is None:
                    raise RuntimeError(f"a request failed: {item.error!r}")
                tokens += len(item.result.token_ids)
                finished += 1
                stats = item.stats
                rounds += stats.rounds
                offered += stats.offered
                accepted += stats.accepted
                plain_by_load += stats.governor_plain_by_load
                shadows += stats.governor_shadow_drafts
                drafted += stats.rounds - stats.plain_rounds
                pass_requests += stats.pass_requests
                pass_rows += stats.pass_rows
                if time.perf_counter() < deadline:
                    running.append(start())
    wall = time.perf_counter() - began
    return {
        "config": config,
        "clients": args.clients,
        "tokens_per_s": tokens / wall,
        "tokens": tokens,
        "finished": finished,
        "wall_s": wall,
        "in_passes_s": in_passes,
        "outside_passes_s": wall - in_passes,
        "passes": steps,
        "rows_per_pass": step_rows / max(steps, 1),
        # Over the finished requests' rounds: drafts offered and accepted a round, the share of
        # rounds the load kept plain without asking the drafter, and the verify passes' mean
        # requests and rows (each pass counted once per request in it).
        "rounds": rounds,
        "offered_per_round": offered / max(rounds, 1),
        "accepted_per_round": accepted / max(rounds, 1),
        "plain_by_load": plain_by_load / max(rounds, 1),
        "shadows": shadows / max(rounds, 1),
        "drafted": drafted / max(rounds, 1),
        "requests_per_pass": pass_requests / max(rounds, 1),
        "verify_rows_per_pass": pass_rows / max(rounds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16, help=f"at most {SLOTS} (default 16)")
    parser.add_argument("--duration", type=float, default=25.0, help="seconds of sending per run")
    parser.add_argument("--pairs", type=int, default=2, help="rounds of alternating configurations")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["none", "lookup"],
        help="drafters, NAME[:option=value,...]; the first is the base",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", default=None, help="Spec-Bench JSONL (default: the shared dev set)")
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--out", default=None, help="also write the runs to this JSON file")
    args = parser.parse_args()
    if not 1 <= args.clients <= SLOTS or args.duration <= 0 or args.pairs < 1 or args.max_tokens < 1:
        parser.error(f"need 1 <= --clients <= {SLOTS}, --duration > 0, --pairs >= 1, --max-tokens >= 1")
    engine = load_engine(args.model, slots=SLOTS)
    scheduler = Scheduler(engine, max_running=SLOTS)
    prompts = [p.text for p in round_robin(load_prompts(args.prompts), 64)]
    for config in args.configs:  # untimed: first-call costs, the governor's calibration
        warm = scheduler.start(request(engine, prompts[0], drafter_of(engine, config), 8))
        while not warm.finished:
            scheduler.step()
    runs = []
    for _ in range(args.pairs):
        for config in args.configs:
            row = run_point(engine, scheduler, prompts, config, args)
            runs.append(row)
            print(
                f"{row['clients']:>3} clients  {config:<8} {row['tokens_per_s']:7.1f} tok/s  finished "
                f"{row['finished']:>4}  wall {row['wall_s']:5.1f} s  outside passes {row['outside_passes_s']:4.2f} s  "
                f"drafts/round {row['offered_per_round']:.2f} accepted {row['accepted_per_round']:.2f}  "
                f"drafted {row['drafted']:.0%} shadows {row['shadows']:.0%} "
                f"plain by load {row['plain_by_load']:.0%}  requests/pass {row['requests_per_pass']:.1f} "
                f"rows/its pass {row['verify_rows_per_pass']:.1f}  "
                f"passes {row['passes']} of {row['rows_per_pass']:.1f} rows, "
                f"{1e3 * (row['wall_s'] - row['outside_passes_s']) / max(row['passes'], 1):.2f} ms",
                flush=True,
            )
    base = args.configs[0]
    for drafter in args.configs[1:]:
        ratios = [
            b["tokens_per_s"] / a["tokens_per_s"]
            for a, b in zip(
                [r for r in runs if r["config"] == base], [r for r in runs if r["config"] == drafter], strict=True
            )
        ]
        listed = ", ".join(f"{r:.3f}" for r in ratios)
        print(f"{drafter} / {base}: {listed} (median {statistics.median(ratios):.3f})")
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": vars(args), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
