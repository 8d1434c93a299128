"""Prefix reuse on the next request of a conversation or of an edit: warm against cold.

A chat's second turn carries the first turn and its answer; the second change to a code
snippet repeats the snippet. Warm, the target's cache still holds what the earlier request left
and the prefill computes only the rest; cold, ``drop_cache`` runs first. For each conversation
(the dev set's records with two turns, as ``verispec bench --workload multi-turn`` builds them)
or snippet (``--workload edit``), the earlier request runs, then the next one warm and cold,
the order alternating from item to item (before a cold-first pair the earlier request runs
again, to leave its positions in the cache). Printed: per arm, the next requests' prefill
seconds, time to the first token, whole-request seconds and cached prompt tokens (sums and
medians), and whether each warm output equals its cold output token for token.

    .venv/bin/python benchmarks/prefix_reuse.py --workload multi-turn --per-category 2 --max-tokens 128
    .venv/bin/python benchmarks/prefix_reuse.py --workload edit --count 6 --max-tokens 384
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from verispec.api import load_engine
from verispec.bench import workloads
from verispec.prompts import load_prompts, select


def pairs(engine: Any, args: argparse.Namespace) -> list[tuple[list[int], Any]]:
    """(earlier request's ids, the next one's ids or the function building them from the
    earlier answer) per conversation or snippet."""
    if args.workload == "edit":
        items = workloads.edit(args.count, engine, edits=2)
        return [(items[i][1], items[i + 1][1]) for i in range(0, len(items), 2)]
    items = workloads.multi_turn(select(load_prompts(), per_category=args.per_category), engine)
    return [(ids, items[i + 1][1]) for i, (prompt, ids) in enumerate(items) if prompt.turn == 1]


def timed(engine: Any, ids: list[int], args: argparse.Namespace, cold: bool) -> dict[str, Any]:
    if cold:
        engine.target.drop_cache()
    start = time.perf_counter()
    first = None
    stream = engine.stream(ids, drafter=args.drafter, max_tokens=args.max_tokens, temperature=0)
    for piece in stream:
        if piece and first is None:
            first = time.perf_counter() - start
    seconds = time.perf_counter() - start
    result = stream.result
    stats = result.stats
    return {
        "ids": result.token_ids,
        "prefill": stats.prefill_seconds,
        "first": first if first is not None else seconds,
        "seconds": seconds,
        "cached": stats.cached_prompt_tokens,
        "prompt": stats.prompt_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--workload", choices=["multi-turn", "edit"], default="multi-turn")
    parser.add_argument("--per-category", type=int, default=2, help="multi-turn: dev records per category")
    parser.add_argument("--count", type=int, default=6, help="edit: snippets")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--drafter", default="lookup")
    args = parser.parse_args()

    engine = load_engine(args.model)
    if not getattr(engine.target, "prefix_reuse_exact", False):
        raise SystemExit(f"{engine.target.description}: no exact prefix reuse on this target")
    engine.generate("warm-up", max_tokens=8)
    arms: dict[str, list[dict[str, Any]]] = {"warm": [], "cold": []}
    for number, (earlier, follow) in enumerate(pairs(engine, args)):
        engine.target.drop_cache()
        answer = engine.generate(earlier, drafter=args.drafter, max_tokens=args.max_tokens, temperature=0)
        ids = follow if isinstance(follow, list) else follow([answer.token_ids])
        if number % 2 == 0:
            arms["warm"].append(timed(engine, ids, args, cold=False))
            arms["cold"].append(timed(engine, ids, args, cold=True))
        else:
            arms["cold"].append(timed(engine, ids, args, cold=True))
            engine.target.drop_cache()
            engine.generate(earlier, drafter=args.drafter, max_tokens=args.max_tokens, temperature=0)
            arms["warm"].append(timed(engine, ids, args, cold=False))
    warm, cold = arms["warm"], arms["cold"]
    same = sum(w["ids"] == c["ids"] for w, c in zip(warm, cold, strict=True))
    print(f"{engine.target.description}, {args.workload}, {len(warm)} next requests, drafter {args.drafter}")
    print(f"prompt tokens: mean {statistics.mean(r['prompt'] for r in cold):.0f}")
    print("| arm | cached prompt tokens (mean) | prefill s (sum / median) | first token s (median) | request s (sum) |")
    print("|---|---|---|---|---|")
    for name, runs in arms.items():
        print(
            f"| {name} | {statistics.mean(r['cached'] for r in runs):.0f} "
            f"| {sum(r['prefill'] for r in runs):.2f} / {statistics.median(r['prefill'] for r in runs):.3f} "
            f"| {statistics.median(r['first'] for r in runs):.3f} | {sum(r['seconds'] for r in runs):.2f} |"
        )
    total = sum(r["seconds"] for r in cold) / sum(r["seconds"] for r in warm)
    first = statistics.median(c["first"] / w["first"] for w, c in zip(warm, cold, strict=True))
    print(f"cold / warm: whole requests {total:.2f}x, first token {first:.2f}x (median of pairs)")
    print(f"warm output identical to cold: {same}/{len(warm)}")


if __name__ == "__main__":
    main()
