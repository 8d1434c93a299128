"""The governor against fixed k on a simulated drafter: where does `--k auto` leave speed?

A drafter accepts draft position i with a fixed chance (given per position, conditional on the
positions before it being accepted: the chain stops at the first rejection). Rounds are priced
in plain decode steps by a ``CostModel`` line: a plain step costs 1, each extra verify row
``--per-row``, each drafted token ``--draft``, and a drafted round after a plain one pays the
catch-up ``--catch-up`` on top (a trained head's defaults, measured on 2 Zen 4 cores: a k 1
round ~1.31 steps warm, a catch-up ~0.5 steps). The real ``Governor`` chooses k before each
round and observes each round's accepted prefix, with its costs frozen (as for a seeded
sampled request), so the only randomness is the drafter's.

It reports, per acceptance profile, the speed-up over plain decoding (tokens per step) of
`--k auto` and of fixed k 1 and 2 over ``--requests`` requests of ``--tokens`` tokens, and how
many rounds a request auto drafted and probed. Nothing is timed: the numbers are the policy's.

    .venv/bin/python benchmarks/governor_sim.py
    .venv/bin/python benchmarks/governor_sim.py --memory  # start from the acceptance an engine learned
    .venv/bin/python benchmarks/governor_sim.py --profile 0.45,0.5,0.6 --requests 1000
    .venv/bin/python benchmarks/governor_sim.py --learn --profile "0.2,0.3/0.7,0.7"  # a mixed workload

``--learn`` runs the requests in turn through one engine's ``AcceptanceMemory``, as the planner
does: each starts from what the requests before it taught, and teaches the next. A profile of
several parts joined by "/" is a mixed workload: request i takes part i modulo their number.

``--drift SIGMA`` lets `--k auto` learn its costs as the engine does, from timings of its rounds
on a machine whose speed drifts (``NoisyTimer``: per-round noise SIGMA, a slow drift, stalls;
one cost model carried from request to request, starting from the exact line). Speed-ups are
still counted in the true costs, which the drift scales alike for plain and drafted rounds.

    .venv/bin/python benchmarks/governor_sim.py --learn --drift 0.12 --profile 0.43

``--curve`` prices verify passes by a measured curve instead of the ``--per-row`` line (plain
steps by rows 1, 2, ..., from ``verify_cost.py``); the governor's cost model is the
least-squares line through it, as a calibration fits one:

    .venv/bin/python benchmarks/governor_sim.py --curve 1,1.04,1.15,1.25,1.41,1.58,2.06,2.27,2.27 \
        --draft 0.01 --catch-up 0 --learn --drift 0.12 --profile 0.5,0.7,0.8,0.85
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import numpy as np

from verispec.bench.replay import Clock, NoisyTimer
from verispec.governor import AcceptanceMemory, CostModel, Governor

PROFILES = ("0", "0.2,0.3,0.4", "0.35,0.45,0.5,0.6", "0.45,0.5,0.6,0.65", "0.6,0.65,0.7,0.7", "0.8,0.8,0.85,0.85")


@dataclass
class Outcome:
    tokens: int = 0
    steps: float = 0.0
    drafted: int = 0  # rounds that drafted (probes included)
    probes: int = 0


def accepted_prefix(profile: list[float], k: int, rng: np.random.Generator) -> int:
    for i in range(k):
        if rng.random() >= profile[min(i, len(profile) - 1)]:
            return i
    return k


def simulate(
    profile: list[float],
    costs: CostModel,
    tokens: int,
    seed: int,
    fixed: int | None,
    k_max: int,
    memory: bool,
    learned: AcceptanceMemory | None = None,
    live: tuple[CostModel, NoisyTimer] | None = None,
    clock: Clock | None = None,
) -> Outcome:
    """One request: ``fixed`` k every round, or the governor's choice (None). ``memory``: the
    governor starts from the profile itself, as from an engine's acceptance memory that has
    learned it over earlier requests; else from the prior. ``learned``: it starts from this
    memory, and teaches it what the request saw (``--learn``). ``live``: the governor decides
    on this cost model and teaches it the timer's timings of its rounds (``--drift``).
    ``clock``: the true verify passes (a ``--curve``), where not ``costs``' line."""
    rng = np.random.default_rng(seed)
    seen, adapt = (costs, False) if live is None else (live[0], True)
    if learned is not None:
        governor = Governor(k_max, seen, adapt_costs=adapt, start=learned.start(), schedule=learned.schedule)
    else:
        governor = Governor(k_max, seen, adapt_costs=adapt, start=profile if memory else ())
    out = Outcome()
    while out.tokens < tokens:
        after_plain = not governor.proposed_last
        k = fixed if fixed is not None else governor.next_k().k
        accepted = accepted_prefix(profile, k, rng)
        verify = clock.steps(k, 0) if clock is not None else costs.verify(k + 1)  # a plain step is 1
        drafting = costs.draft_seconds(k, after_plain)
        out.steps += max(1.0, drafting + verify) if k else 1.0
        if live is None:
            governor.observe(k, accepted, 0.0, 1.0)
        else:
            factor = live[1].factor()
            governor.observe(k, accepted, drafting * factor, verify * factor)
        out.tokens += accepted + 1
        out.drafted += int(k > 0)
    out.probes = governor.probes
    if live is not None:  # the engine carries a request's costs to the next (``Planner.finish``)
        vars(live[0]).update(vars(governor.costs))
    if learned is not None:
        learned.learn(governor)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", help="acceptance per draft position, comma-separated")
    parser.add_argument("--per-row", type=float, default=0.13, help="an extra verify row, in plain steps")
    parser.add_argument("--draft", type=float, default=0.18, help="a drafted token, in plain steps")
    parser.add_argument("--catch-up", type=float, default=0.5, help="a drafted round after a plain one, extra steps")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--k-max", type=int, default=8)
    parser.add_argument("--memory", action="store_true", help="start from the true acceptance (a learned memory)")
    parser.add_argument("--learn", action="store_true", help="carry one engine's acceptance memory across requests")
    parser.add_argument("--drift", type=float, default=None, help="auto learns its costs: timing noise (sigma)")
    parser.add_argument("--curve", help="verify passes' plain steps by rows 1, 2, ... (default: the --per-row line)")
    args = parser.parse_args()
    clock = Clock.from_curve([float(x) for x in args.curve.split(",")]) if args.curve else Clock(args.per_row)
    costs = CostModel.line(1.0, clock.per_row, args.draft, False, args.catch_up)
    start = "the prior"
    if args.memory or args.learn:
        start = "a memory learned request by request" if args.learn else "the true acceptance"
    print(
        f"a round of k 1 costs {costs.round_steps(1):.2f} steps warm, {costs.round_steps(1, True):.2f} after a plain "
        f"one; {args.requests} requests of {args.tokens} tokens each, starting from {start}"
    )
    print("| acceptance by position | auto | fixed k 1 | fixed k 2 | auto: drafted rounds / probes per request |")
    print("|---|---|---|---|---|")
    for text in args.profile or PROFILES:
        profiles = [[float(x) for x in part.split(",")] for part in text.split("/")]
        speed = {}
        for name, fixed in (("auto", None), ("k1", 1), ("k2", 2)):
            learned = AcceptanceMemory() if args.learn else None
            live = None
            if args.drift is not None and fixed is None:
                live = (dataclasses.replace(costs), NoisyTimer(clock, args.drift, seed=1))
            runs = [
                simulate(
                    profiles[seed % len(profiles)],
                    costs,
                    args.tokens,
                    seed,
                    fixed,
                    args.k_max,
                    args.memory,
                    learned,
                    live,
                    clock,
                )
                for seed in range(args.requests)
            ]
            speed[name] = float(np.mean([r.tokens / r.steps for r in runs]))
            if fixed is None:
                drafted = np.mean([r.drafted for r in runs])
                probes = np.mean([r.probes for r in runs])
        speeds = " | ".join(f"{speed[name]:.3f}x" for name in ("auto", "k1", "k2"))
        print(f"| {text} | {speeds} | {drafted:.1f} / {probes:.1f} |")


if __name__ == "__main__":
    main()
