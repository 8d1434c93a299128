"""Replay a greedy bench run's outputs through the governor: k policies judged without timing noise.

    .venv/bin/python benchmarks/governor_replay.py bench-results/memory/results.json [--noise 0.12]
    .venv/bin/python benchmarks/governor_replay.py results.json --noise 0.12 --drafter suffix \
        --curve 1,1.04,1.15,1.25,1.41,1.58,2.06,2.27,2.27 --per-token 0.0001

Takes the plain (``none``) outputs of a greedy ``verispec bench`` run and replays prompt lookup
over them (``verispec.bench.replay``) under fixed k in {2, 4, 8}, under the governor with shadow
drafts (as shipped: each request starts from the acceptance of those before it), without that
memory, and with probes instead, and an always-wrong drafter under the governor.
A round of d drafts at context L costs 1 + (per_row + per_token L) d plain steps: the defaults
are what the torch backend measured here (0.11 of a step per extra row at 80 tokens of context,
0.22 at 1,000; the bench's cost steps 1.30, 1.58, 2.18 at k = 2, 4, 8 over all prompts).

``--curve`` charges passes by measured plain steps by rows instead (``Clock.from_curve``; the
context's ``--per-token`` on top; the governor's exact costs the line through them).
``--drafter suffix`` replays suffix (one drafter a column, carried from prompt to prompt as an
engine's is) instead of lookup.

The governor columns decide on those exact costs. With ``--noise SIGMA`` the governor also runs
as in the engine, measuring costs from noisy timings of its own rounds (``NoisyTimer``: per-round
noise SIGMA, a slow drift, stalls; a calibration at the first prompt; costs carried from request
to request), averaged over ``--seeds`` timers: the "measured" columns. Prints per category the
speed-up over plain (geometric mean over prompts) and auto over the best fixed k.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

from verispec.api import load_engine
from verispec.bench import run
from verispec.bench.replay import Clock, NoisyTimer, replay
from verispec.drafters.base import Drafter
from verispec.drafters.control import WrongDrafter
from verispec.drafters.lookup import LookupDrafter
from verispec.planner import AUTO, Planner
from verispec.prompts import load_prompts

FIXED = (2, 4, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--per-row", type=float, default=0.1, help="plain steps per extra verify row at no context")
    parser.add_argument("--per-token", type=float, default=0.00012, help="... and per context token on top")
    parser.add_argument("--noise", type=float, default=None, help="per-round timing noise (log-normal sigma)")
    parser.add_argument("--seeds", type=int, default=3, help="noisy timers to average over")
    parser.add_argument("--curve", help="plain steps by verify rows 1, 2, ...: passes priced by it, not --per-row")
    parser.add_argument("--drafter", choices=("lookup", "suffix"), default="lookup")
    args = parser.parse_args()
    document = run.load(args.results)
    if document["settings"]["temperature"] != 0:
        raise SystemExit("a replay needs a greedy run")
    engine = load_engine(document["settings"]["model"])
    clock = Clock(args.per_row, args.per_token)
    if args.curve:
        clock = Clock.from_curve([float(x) for x in args.curve.split(",")], args.per_token)
    drafters: dict[str, Drafter] = {}

    def column_drafter(column: str) -> Drafter:
        """The column's drafter: lookup (stateless), or its own suffix drafter, carried."""
        if args.drafter == "lookup":
            return LookupDrafter()
        if column not in drafters:
            drafters[column] = engine.drafter("suffix", fresh=True)
        return drafters[column]

    texts = {p.question_id: p.text for p in load_prompts()}
    speedups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    # An engine's planner carries each drafter's acceptance memory (and measured costs) from
    # request to request: one planner per column that does; the "no memory" columns start
    # every request from the prior with a fresh planner.
    carried = {"auto": Planner(), "wrong (auto)": Planner()}
    timers = [NoisyTimer(clock, args.noise, seed) for seed in range(args.seeds)] if args.noise is not None else []
    measured = [Planner() for _ in timers]  # per timer, for lookup and wrong alike (keyed by name)
    plain = [r for r in document["records"] if r["config"] == "none" and r.get("repeat", 0) == 0]
    plain.sort(key=lambda r: r["prompt_index"])
    for record in plain:
        prompt, output = engine.encode(texts[record["question_id"]]), record["token_ids"]
        if len(prompt) != record["prompt_tokens"]:
            raise SystemExit(
                f"prompt {record['question_id']}: {len(prompt)} tokens, the run had {record['prompt_tokens']}"
            )
        runs = [(f"k={k}", column_drafter(f"k={k}"), Planner(), k, None) for k in FIXED]
        runs += [("auto", column_drafter("auto"), carried["auto"], AUTO, None)]
        runs += [("auto, no memory", column_drafter("auto, no memory"), Planner(), AUTO, None)]
        runs += [("auto, probes", column_drafter("auto, probes"), Planner(shadows=False), AUTO, None)]
        runs += [("wrong (auto)", WrongDrafter(-1), carried["wrong (auto)"], AUTO, None)]
        runs += [("wrong, no memory", WrongDrafter(-1), Planner(), AUTO, None)]
        for i, (timer, planner) in enumerate(zip(timers, measured, strict=True)):
            runs += [("auto, measured", column_drafter(f"measured {i}"), planner, AUTO, timer)]
            runs += [("wrong, measured", WrongDrafter(-1), planner, AUTO, timer)]
        for name, drafter, planner, k, timer in runs:
            speedup = replay(prompt, output, drafter, planner, clock, k=k, timer=timer).speedup(len(output))
            for group in (record["category"], "overall"):
                speedups[group][name].append(speedup)

    names = [*(f"k={k}" for k in FIXED), "auto", "auto, no memory", "auto, probes", "wrong (auto)", "wrong, no memory"]
    names += ["auto, measured", "wrong, measured"] if timers else []
    ratios = ["auto", "auto, probes", *(["auto, measured"] if timers else [])]
    cost = f"1 + ({args.per_row} + {args.per_token} L) d steps"
    if args.curve:
        cost = f"the curve {args.curve}, its rows' cost + {args.per_token} L a row"
    print(
        f"Replayed speed-up of {args.drafter} over plain decoding (a round of d drafts at context L costs {cost})"
        + (f"; measured: timing noise {args.noise}, {args.seeds} timers\n" if timers else "\n")
    )
    print("| category | " + " | ".join(names) + " | " + " | ".join(f"{r} / best fixed" for r in ratios) + " |")
    print("|---|" + "---|" * (len(names) + len(ratios)))
    for group in [*(g for g in speedups if g != "overall"), "overall"]:
        means = {n: math.exp(sum(map(math.log, speedups[group][n])) / len(speedups[group][n])) for n in names}
        best = max(means[f"k={k}"] for k in FIXED)
        cells = [f"{means[n]:.3f}" for n in names] + [f"{means[r] / best:.3f}" for r in ratios]
        print(f"| {group} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
