"""How much of a greedy run's output a drafter that copies from what it has seen could draft.

    .venv/bin/python benchmarks/copy_ceiling.py bench-results/RUN/results.json --per-category 2

Takes the plain (``none``) outputs of a greedy ``verispec bench`` run (single or multi-turn
workload, prompts rebuilt as ``drafter_replay.py`` rebuilds them) and asks, token by token,
what a copying drafter could have offered. At each output position the context (prompt and
output so far) is matched against itself: the longest suffix of up to ``--ngram`` tokens that
occurred before, and the tokens that followed its occurrences. Position 1, the share of output
tokens that are:

- ``recent``: what followed the most recent occurrence (prompt lookup's choice);
- ``frequent``: the most frequent follower (a suffix drafter's chain);
- ``top3``: among the three most frequent (a tree with three children at its root);
- ``any``: among the followers of any occurrence of any suffix of 1 to ``--ngram`` tokens
  (no drafter that copies from the context can offer a token outside this set).

Chains of up to ``--k`` drafts, drafted every round and for free (a ceiling: a real round costs
its rows, and the governor drafts fewer): tokens per round when each round copies what
followed the most recent occurrence of the longest suffix (``recent``), and when an oracle
picks, among every occurrence of every suffix, the one whose copy the target accepts furthest
(``oracle``: the best any copying chain drafter could do). With ``--cache``, earlier requests'
prompts and outputs of the run (what ``suffix``'s cross-request cache holds) count as seen
too, for ``any`` and ``oracle``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from drafter_replay import greedy_requests  # a sibling script: the bench's prompts, rebuilt

Index = dict[tuple[int, ...], list[int]]


class Seen:
    """Token lists with every n-gram's end positions (n = 1..ngram), grown token by token."""

    def __init__(self, ngram: int) -> None:
        self.ngram = ngram
        self.tokens: list[int] = []
        self.index: Index = defaultdict(list)  # n-gram -> positions just after its occurrences

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens)
            for n in range(1, min(self.ngram, end - 1) + 1):
                self.index[tuple(self.tokens[end - 1 - n : end - 1])].append(end - 1)

    def end_document(self) -> None:
        """A boundary no n-gram crosses (the next document's first tokens follow nothing)."""
        self.tokens.append(-1)

    def followers(self, key: tuple[int, ...]) -> list[int]:
        """Positions whose token followed an occurrence of ``key``, oldest first."""
        return self.index.get(key, [])

    def suffixes(self) -> list[tuple[int, ...]]:
        """The last ``ngram`` tokens, the last ngram - 1, ... the last one: longest first."""
        return [tuple(self.tokens[-n:]) for n in range(min(self.ngram, len(self.tokens)), 0, -1)]

    def longest(self, suffixes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
        """The longest of ``suffixes`` that occurred before (followed by something)."""
        return next((key for key in suffixes if self.followers(key)), None)


def accepted(source: Sequence[int], start: int, output: Sequence[int], at: int, k: int) -> int:
    """Drafts copied from ``source[start:]`` that the output takes at ``at`` (up to k)."""
    count = 0
    while count < k and start + count < len(source) and at + count < len(output):
        if source[start + count] != output[at + count]:
            break
        count += 1
    return count


def analyse(prompt: list[int], output: list[int], pool: Seen | None, args: argparse.Namespace) -> Counter[str]:
    counts: Counter[str] = Counter()
    own = Seen(args.ngram)
    own.extend(prompt)
    # Position 1: every output token.
    for token in output:
        counts["tokens"] += 1
        suffixes = own.suffixes()
        longest = own.longest(suffixes)
        if longest is not None:
            followers = [own.tokens[p] for p in own.followers(longest)]
            ranked = [t for t, _ in Counter(followers).most_common()]
            counts["matched"] += 1
            counts["recent"] += followers[-1] == token
            counts["frequent"] += ranked[0] == token
            counts["top3"] += token in ranked[:3]
        seen_any = any(own.tokens[p] == token for key in suffixes for p in own.followers(key))
        counts["any"] += seen_any
        if pool is not None:
            counts["any+cache"] += seen_any or any(
                pool.tokens[p] == token for key in suffixes for p in pool.followers(key)
            )
        own.extend([token])
    # Chains drafted every round: recent (the longest suffix's latest occurrence) and oracle.
    for name in ("recent", "oracle") + (("oracle+cache",) if pool is not None else ()):
        own = Seen(args.ngram)
        own.extend(prompt)
        at = rounds = 0
        while at < len(output):
            suffixes = own.suffixes()
            best = 0
            if name == "recent":
                longest = own.longest(suffixes)
                if longest is not None:
                    best = accepted(own.tokens, own.followers(longest)[-1], output, at, args.k)
            else:
                sources = [own] + ([pool] if name == "oracle+cache" and pool is not None else [])
                for seen in sources:
                    for key in suffixes:
                        for p in seen.followers(key):
                            best = max(best, accepted(seen.tokens, p, output, at, args.k))
                            if best == args.k:
                                break
            step = min(best + 1, len(output) - at)
            own.extend(output[at : at + step])
            at += step
            rounds += 1
        counts[f"rounds {name}"] += rounds
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--per-category", type=int, default=5, help="as the bench run was given")
    parser.add_argument("--ngram", type=int, default=4, help="longest suffix matched (default 4)")
    parser.add_argument("--k", type=int, default=8, help="drafts a chain round copies (default 8)")
    parser.add_argument("--cache", action="store_true", help="earlier requests count as seen")
    args = parser.parse_args()
    _, todo = greedy_requests(args.results, args.per_category)
    pool = Seen(args.ngram) if args.cache else None
    totals: dict[str, Counter[str]] = defaultdict(Counter)
    for category, prompt, output in todo:
        counts = analyse(prompt, output, pool, args)
        for key in (category, "overall"):
            totals[key].update(counts)
        if pool is not None:
            pool.extend(prompt + output)
            pool.end_document()
    shares = ["recent", "frequent", "top3", "any"] + (["any+cache"] if args.cache else [])
    chains = ["recent", "oracle"] + (["oracle+cache"] if args.cache else [])
    header = "".join(f"{s:>10s}" for s in shares) + "".join(f"{'tok/r ' + c:>20s}" for c in chains)
    print(f"{'category':16s}{'tokens':>8s}" + header)
    for category in [*sorted(c for c in totals if c != "overall"), "overall"]:
        row = totals[category]
        cells = "".join(f"{row[s] / row['tokens']:10.3f}" for s in shares)
        cells += "".join(f"{row['tokens'] / row[f'rounds {c}']:20.2f}" for c in chains)
        print(f"{category:16s}{row['tokens']:8d}" + cells)


if __name__ == "__main__":
    main()
