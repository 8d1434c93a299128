"""Replay a greedy bench run's outputs through the governor: k policies judged without timing noise.

    .venv/bin/python benchmarks/governor_replay.py bench-results/governor3/results.json

Takes the plain (``none``) outputs of a greedy ``verispec bench`` run and replays prompt lookup
over them (``verispec.bench.replay``) under fixed k in {2, 4, 8}, under the governor with shadow
drafts (as shipped: each request starts from the acceptance of those before it), without that
memory, and with probes instead, and an always-wrong drafter under the governor.
A round of d drafts costs 1 + per_row * d plain steps: 0.147 per row is what the bench measured
on the torch backend (cost steps 1.30, 1.58, 2.18 at k = 2, 4, 8). Prints per category the
speed-up over plain (geometric mean over prompts) and auto over the best fixed k.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

from verispec.api import load_engine
from verispec.bench import run
from verispec.bench.replay import Schedule, replay
from verispec.drafters.control import WrongDrafter
from verispec.drafters.lookup import LookupDrafter
from verispec.governor import AcceptanceMemory
from verispec.prompts import load_prompts

FIXED = (2, 4, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--per-row", type=float, default=0.147, help="plain steps per extra verify row")
    args = parser.parse_args()
    document = run.load(args.results)
    if document["settings"]["temperature"] != 0:
        raise SystemExit("a replay needs a greedy run")
    engine = load_engine(document["settings"]["model"])
    texts = {p.question_id: p.text for p in load_prompts()}
    speedups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    # An engine's governor starts each request from the acceptance of the ones before it
    # (per drafter); the "no memory" columns start every request from the prior.
    memories = {"lookup": AcceptanceMemory(), "wrong": AcceptanceMemory()}
    plain = [r for r in document["records"] if r["config"] == "none" and r.get("repeat", 0) == 0]
    plain.sort(key=lambda r: r["prompt_index"])
    for record in plain:
        prompt, output = engine.encode(texts[record["question_id"]]), record["token_ids"]
        if len(prompt) != record["prompt_tokens"]:
            raise SystemExit(
                f"prompt {record['question_id']}: {len(prompt)} tokens, the run had {record['prompt_tokens']}"
            )
        schedules = {f"k={k}": Schedule.fixed(k) for k in FIXED}
        schedules["auto"] = Schedule.governed(8, args.per_row, shadow=True, memory=memories["lookup"])
        schedules["auto, no memory"] = Schedule.governed(8, args.per_row, shadow=True)
        schedules["auto, probes"] = Schedule.governed(8, args.per_row, shadow=False)
        wrong = {
            "wrong (auto)": Schedule.governed(8, args.per_row, shadow=True, memory=memories["wrong"]),
            "wrong, no memory": Schedule.governed(8, args.per_row, shadow=True),
        }
        runs = [(name, schedule, LookupDrafter()) for name, schedule in schedules.items()]
        runs += [(name, schedule, WrongDrafter(-1)) for name, schedule in wrong.items()]
        for name, schedule, drafter in runs:
            speedup = replay(prompt, output, drafter, schedule, args.per_row).speedup(len(output))
            for group in (record["category"], "overall"):
                speedups[group][name].append(speedup)
        for memory, schedule in ((memories["lookup"], schedules["auto"]), (memories["wrong"], wrong["wrong (auto)"])):
            assert schedule.governor is not None
            memory.learn(schedule.governor)

    names = [*(f"k={k}" for k in FIXED), "auto", "auto, no memory", "auto, probes", "wrong (auto)", "wrong, no memory"]
    print(f"Replayed speed-up over plain decoding (a round of d drafts costs 1 + {args.per_row} d steps)\n")
    print("| category | " + " | ".join(names) + " | auto / best fixed | probes / best fixed |")
    print("|---|" + "---|" * (len(names) + 2))
    for group in [*(g for g in speedups if g != "overall"), "overall"]:
        means = {n: math.exp(sum(map(math.log, speedups[group][n])) / len(speedups[group][n])) for n in names}
        best = max(means[f"k={k}"] for k in FIXED)
        cells = [f"{means[n]:.3f}" for n in names] + [
            f"{means['auto'] / best:.3f}",
            f"{means['auto, probes'] / best:.3f}",
        ]
        print(f"| {group} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
