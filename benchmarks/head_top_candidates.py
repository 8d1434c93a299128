"""How often the target's greedy token is among a trained drafter's top m candidates at draft
position 1, on dev prompts: what a tree of m candidates a position can win over the chain.

    .venv/bin/python benchmarks/head_top_candidates.py [--kind head] [--per-category 2] [--max-tokens 128]

Runs each prompt greedily with the drafter proposing trees of its ``--top`` best candidates at
position 1 (``draft_branches``, k = that many nodes: one drafted position), records every
proposal, and ranks the token the target then emitted among them (the output is plain
decoding's: greedy identity). Prints the hit rate of the top 1 .. m and, where the first
candidate was wrong, how often the second was right by its share of the rest
(``tree_sizing.later_shares``: what the governor's later-child estimate reads), and, from
``--draft-steps`` and ``--row-steps``, the predicted tokens per plain step of a round that
verifies the top m (``(1 + hit rate) / (1 + draft + m x row)``).
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

from verispec.api import load_engine
from verispec.prompts import load_prompts


class Recording:
    """A drafter that proposes what ``inner`` does and keeps (context length, tree proposed)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.proposals: list[tuple[int, list[int], list[float]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def propose_tree(self, context, k, rng):  # type: ignore[no-untyped-def]
        draft = self.inner.propose_tree(context, k, rng)
        if draft.tokens:
            self.proposals.append((len(context), list(draft.tokens), list(draft.frequencies or [])))
        return draft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", default="head")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-steps", type=float, default=0.19, help="a drafted position's cost in plain steps")
    parser.add_argument("--row-steps", type=float, nargs="*", default=[0.14, 0.05, 0.01])
    args = parser.parse_args()
    engine = load_engine(None)
    drafter = Recording(engine.drafter(args.kind, draft_branches=args.top))
    chosen: dict[str, list[Any]] = collections.defaultdict(list)
    for prompt in load_prompts():
        if len(chosen[prompt.category]) < args.per_category:
            chosen[prompt.category].append(prompt)
    ranks: collections.Counter[int] = collections.Counter()  # 0: not among the candidates
    second: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])  # share bucket -> [right, seen]
    for prompts in chosen.values():
        for prompt in prompts:
            ids = engine.encode(prompt.text)
            drafter.proposals.clear()
            result = engine.generate(ids, drafter=drafter, k=args.top, temperature=0, max_tokens=args.max_tokens)
            output = list(ids) + result.token_ids
            for length, tokens, frequencies in drafter.proposals:
                if length >= len(output):
                    continue
                truth = output[length]
                ranks[tokens.index(truth) + 1 if truth in tokens else 0] += 1
                if tokens[0] != truth and len(tokens) > 1 and frequencies[0] < 1.0:
                    bucket = min(9, int(10 * frequencies[1] / (1.0 - frequencies[0])))
                    second[bucket][0] += int(tokens[1] == truth)
                    second[bucket][1] += 1
    total = sum(ranks.values())
    hits = [sum(ranks[r] for r in range(1, m + 1)) / total for m in range(1, args.top + 1)]
    print(f"{args.kind}: {total} positions; " + ", ".join(f"top {m} {h:.3f}" for m, h in enumerate(hits, 1)))
    for bucket in sorted(second):
        right, seen = second[bucket]
        print(
            f"  share of the rest {bucket / 10:.1f}-{(bucket + 1) / 10:.1f}: second right {right / seen:.2f} of {seen}"
        )
    for row in args.row_steps:
        speeds = [(1 + h) / (1 + args.draft_steps + m * row) for m, h in enumerate(hits, 1)]
        print(f"  a row at {row} steps: top m tokens/step " + " ".join(f"{s:.3f}" for s in speeds))


if __name__ == "__main__":
    main()
