"""What a drafter's proposal and observation cost per round, with the caches cold or hot.

    .venv/bin/python benchmarks/proposal_cost.py bench-results/RUN/results.json \\
        --configs lookup suffix:native=off suffix --per-category 30

In the engine a proposal runs between forward passes, and a pass streams the whole weights
(~80 MB on the embedded model) through the CPU's caches: the drafter's data and the Python
code it runs are cold every round. This replays the plain answers of a greedy single-turn
bench run (``drafter_replay.py``'s requests, every ``--every``-th, the first ``--tokens``
tokens of each) through each configuration's drafter: before each round ``propose`` (k =
``--k``), after it ``observe``, each timed alone; with ``--flush-mb`` MB summed in between
("cold", the default 100) or nothing ("hot", ``--flush-mb 0``). Prints microseconds per call
and checks that configurations differing only in ``native`` agree proposal for proposal
(``suffix``'s C++ and Python walks).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from verispec.api import load_engine
from verispec.bench import run
from verispec.bench.configs import parse_config
from verispec.drafters.registry import drafter_names
from verispec.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from drafter_replay import requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--configs", nargs="+", default=["lookup", "suffix:native=off", "suffix"])
    parser.add_argument("--per-category", type=int, default=5, help="as the bench run was given")
    parser.add_argument("--every", type=int, default=4, help="replay every n-th request")
    parser.add_argument("--tokens", type=int, default=40, help="rounds per request (one token each)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--flush-mb", type=int, default=100, help="MB read between calls (0: hot caches)")
    args = parser.parse_args()
    engine = load_engine(None)
    todo = requests(run.load(args.results), engine, args.per_category)[:: args.every]
    flush = np.ones(args.flush_mb * 1_000_000 // 8) if args.flush_mb else None
    rng = np.random.default_rng(0)
    proposals: dict[str, list[tuple[tuple[int, ...], object]]] = {}
    for config in args.configs:
        parsed = parse_config(config, drafter_names())
        drafter = engine.drafter(parsed.name, fresh=True, **parsed.drafter_options())
        propose = observe = 0.0
        calls = 0
        same = tuple(sorted((k, v) for k, v in parsed.options.items() if k != "native"))  # walks aside
        made = proposals.setdefault(f"{parsed.name}{same}", [])
        check = bool(made)
        for _, prompt, answer in todo:
            drafter.begin(prompt, SamplingParams())
            context = list(prompt)
            for token in answer[: args.tokens]:
                if flush is not None:
                    flush.sum()
                start = time.perf_counter()
                draft = drafter.propose(context, args.k, rng)
                propose += time.perf_counter() - start
                if check:
                    assert made[calls] == (tuple(draft.tokens), draft.source), f"{config} proposes otherwise"
                else:
                    made.append((tuple(draft.tokens), draft.source))
                context.append(token)
                if flush is not None:
                    flush.sum()
                start = time.perf_counter()
                drafter.observe(context, 0)
                observe += time.perf_counter() - start
                calls += 1
            drafter.reset()
        state = "cold" if flush is not None else "hot"
        print(
            f"{config:28s} {state}: propose {propose / calls * 1e6:6.1f} us, observe {observe / calls * 1e6:6.1f} us, "
            f"both {(propose + observe) / calls * 1e6:6.1f} us ({calls} rounds{', same proposals' if check else ''})",
            flush=True,
        )


if __name__ == "__main__":
    main()
