"""Engine speed and greedy identity on the embedded model, measured in one process.

For each prompt the configurations run in turn (the order alternates from prompt to
prompt, so drift hits all alike) after a warm-up of each: greedy, 128 new tokens, chat
template applied. Reports per category the median tok/s of each drafter, the speed-up of
lookup over plain decoding as the geometric mean of per-prompt ratios, tokens per round,
acceptance, and the identity rate (greedy output equal to plain output token for token).

    .venv/bin/python benchmarks/engine_speed.py                      # summarization + rag, 10 each
    .venv/bin/python benchmarks/engine_speed.py --identity 20        # identity on 20 dev prompts
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

from verispec.api import load_engine
from verispec.cli_args import k_value
from verispec.prompts import load_prompts, round_robin, select


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--categories", nargs="*", default=["summarization", "rag"])
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--identity", type=int, default=0, help="instead: identity rate on N round-robin prompts")
    parser.add_argument("--drafters", nargs="*", default=["lookup", "none"])
    parser.add_argument("--k", type=k_value, default="auto")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    engine = load_engine(args.model, dtype=args.dtype)
    prompts = load_prompts()
    chosen = (
        round_robin(prompts, args.identity) if args.identity else select(prompts, args.categories, args.per_category)
    )
    dtype = getattr(engine.target, "dtype", "?")
    print(f"model {engine.name} dtype {dtype} threads {os.cpu_count()} k {args.k} prompts {len(chosen)}")
    print(f"load average before: {os.getloadavg()}")

    for drafter in args.drafters:  # warm-up
        engine.generate(chosen[0].text, drafter=drafter, k=args.k, temperature=0, max_tokens=8)

    records = []
    for index, prompt in enumerate(chosen):
        order = args.drafters if index % 2 == 0 else list(reversed(args.drafters))
        runs = {}
        for drafter in order:
            start = time.perf_counter()
            result = engine.generate(prompt.text, drafter=drafter, k=args.k, temperature=0, max_tokens=args.max_tokens)
            runs[drafter] = (result, time.perf_counter() - start)
        records.append((prompt, runs))
        plain = runs["none"][0] if "none" in runs else None
        marks = {d: "" if plain is None or r.token_ids == plain.token_ids else "(DIFF)" for d, (r, _) in runs.items()}
        line = " ".join(f"{d}={r.stats.tokens_per_second:5.1f}tok/s{marks[d]}" for d, (r, _) in runs.items())
        print(f"[{index + 1:2}/{len(chosen)}] {prompt.category:<14} {line}", flush=True)

    print(f"load average after: {os.getloadavg()}")
    categories = sorted({p.category for p, _ in records})
    for category in [*categories, "overall"]:
        rows = [runs for p, runs in records if category in (p.category, "overall")]
        parts = [f"{category:<14} n={len(rows):2}"]
        for drafter in args.drafters:
            tps = [runs[drafter][0].stats.tokens_per_second for runs in rows]
            parts.append(f"{drafter} {statistics.median(tps):5.1f} tok/s")
        if "none" in args.drafters:
            for drafter in (d for d in args.drafters if d != "none"):
                ratios = [
                    runs[drafter][0].stats.tokens_per_second / runs["none"][0].stats.tokens_per_second for runs in rows
                ]
                same = sum(runs[drafter][0].token_ids == runs["none"][0].token_ids for runs in rows)
                tpr = statistics.mean(runs[drafter][0].stats.tokens_per_round for runs in rows)
                acc = statistics.mean(runs[drafter][0].stats.acceptance_rate for runs in rows)
                geo = math.exp(statistics.mean(math.log(r) for r in ratios))
                parts.append(f"{drafter}: speed-up {geo:.2f}x tokens/round {tpr:.2f} acceptance {acc:.1%}")
                parts.append(f"identical {same}/{len(rows)}")
        print(" | ".join(parts))


if __name__ == "__main__":
    main()
