"""Compact markdown views of a ``verispec bench`` run, for BENCHMARKS.md.

    .venv/bin/python benchmarks/bench_summary.py bench-results/full/results.json

Prints: the speed-up matrix (category x configuration, over verispec's plain decoding);
fixed k against ``--k auto`` per category (the governor's targets: auto >= 0.97 everywhere,
and within 5% of the best fixed k where a fixed k pays); the trained drafters' tokens per
round and acceptance; the llama.cpp rows against llama-cpp-python's own plain decoding and
its prompt-lookup mode; and the identity rates. ``--pool MORE.json ...`` adds the always-wrong
control pooled over this run and the others (its behaviour does not depend on the costs).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from verispec.bench import run
from verispec.bench.configs import BenchConfig, own_plain
from verispec.bench.report import OVERALL, Row, run_key, summarise


def rows_for(document: dict, baseline: str) -> dict[tuple[str, str], Row]:
    configs = [BenchConfig(label=c["label"], name=c["name"], options=c["options"]) for c in document["configs"]]
    greedy = document["settings"]["temperature"] == 0
    rows = summarise(document["records"], baseline, greedy=greedy, own_plain=own_plain(configs, "none"))
    return {(r.category, r.config): r for r in rows}


def fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def matrix(rows: dict[tuple[str, str], Row], categories: list[str], configs: list[str], field: str) -> str:
    lines = ["| category | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    for category in categories:
        cells = [fmt(getattr(rows[(category, c)], field)) if (category, c) in rows else "-" for c in configs]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def log_ratios(records: list[dict], category: str, config: str, baseline: str = "none") -> list[float]:
    """Per run, log(speed / the baseline's speed on the same prompt in the same pass)."""
    chosen = [r for r in records if category in (r["category"], OVERALL)]
    base = {run_key(r): r for r in chosen if r["config"] == baseline}
    return [
        math.log(r["tokens_per_second"] / base[run_key(r)]["tokens_per_second"])
        for r in chosen
        if r["config"] == config and run_key(r) in base
    ]


def interval(logs: list[float]) -> tuple[float, float] | None:
    """95% interval of a speed-up (geometric mean of per-run ratios): a t-interval on the log
    ratios, taken as independent (the spread is mostly timing noise)."""
    from scipy import stats

    if len(logs) < 2:
        return None
    mean, spread = sum(logs) / len(logs), stats.tstd(logs)
    half = stats.t.ppf(0.975, len(logs) - 1) * spread / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean + half)


def pooled(documents: list[dict], config: str) -> None:
    """One configuration over several runs (its behaviour unchanged between their commits)."""
    print(f"\n### `{config}` pooled over {len(documents)} runs (t-interval from their own spread)\n")
    print("| category | runs | speed-up | 95% interval |")
    print("|---|---|---|---|")
    categories = [*dict.fromkeys(r["category"] for d in documents for r in d["records"]), OVERALL]
    for category in categories:
        logs = [x for d in documents for x in log_ratios(d["records"], category, config)]
        spread = interval(logs)
        cells = [
            str(len(logs)),
            f"{math.exp(sum(logs) / len(logs)):.3f}",
            f"{spread[0]:.2f}-{spread[1]:.2f}" if spread else "-",
        ]
        print(f"| {category} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument(
        "--pool", type=Path, nargs="+", default=[], help="more runs: the control (`wrong`) pooled over all"
    )
    args = parser.parse_args()
    document = run.load(args.results)
    rows = rows_for(document, "none")
    labels = [c["label"] for c in document["configs"]]
    categories = [*dict.fromkeys(r["category"] for r in document["records"]), OVERALL]

    print("### Speed-up over verispec plain decoding (`none`), geometric mean of per-prompt ratios\n")
    print(matrix(rows, categories, [c for c in labels if c != "none"], "speedup"))

    fixed = [c for c in ("lookup:k=2", "lookup:k=4", "lookup:k=8") if c in labels]
    if "lookup" in labels and fixed:
        print("\n### Fixed k against `--k auto` (lookup), and the always-wrong control\n")
        print(
            "| category | " + " | ".join(fixed) + " | lookup (auto) | auto / best fixed | wrong (auto) | wrong, 95% |"
        )
        print("|---|" + "---|" * (len(fixed) + 4))
        for category in categories:
            speeds = [rows[(category, c)].speedup or 0.0 for c in fixed]
            auto = rows[(category, "lookup")].speedup or 0.0
            wrong = rows.get((category, "wrong"))
            spread = interval(log_ratios(document["records"], category, "wrong")) if wrong else None
            cells = [fmt(v) for v in speeds] + [
                fmt(auto),
                fmt(auto / max(speeds), "{:.3f}"),
                fmt(wrong.speedup if wrong else None, "{:.3f}"),
                f"{spread[0]:.2f}-{spread[1]:.2f}" if spread else "-",
            ]
            print(f"| {category} | " + " | ".join(cells) + " |")

    if args.pool:
        pooled([document, *(run.load(p) for p in args.pool)], "wrong")

    trained = [c for c in labels if c.split(":")[0] in ("head", "block")]
    if trained:
        print("\n### Trained drafters: tokens per round (accepted + bonus) and acceptance per category\n")
        print(matrix(rows, categories, trained, "tokens_per_round"))
        print()
        print(matrix(rows, categories, trained, "acceptance_rate"))
        for label in trained:
            positions = " ".join(f"{a:.2f}" for a in rows[(OVERALL, label)].per_position)
            print(f"\n{label}: per-position acceptance overall {positions or '-'}")

    if "llama.cpp" in labels:
        versus = rows_for(document, "llama.cpp")
        llama = [c for c in labels if "llama.cpp" in c and c != "llama.cpp"]
        print("\n### llama.cpp: speed-up over llama-cpp-python plain decoding (`llama.cpp`)\n")
        print(matrix(versus, categories, llama, "speedup"))
        focus = [c for c in ("summarization", "rag", "extraction") if (c, "lookup:backend=llama.cpp") in versus]
        if focus and "llama.cpp-lookup" in labels:
            spec = [versus[(c, "lookup:backend=llama.cpp")].speedup or 0.0 for c in focus]
            over_lookup = rows_for(document, "llama.cpp-lookup")[(OVERALL, "lookup:backend=llama.cpp")].speedup
            print(
                f"\nlookup:backend=llama.cpp over llama.cpp plain, geometric mean over {', '.join(focus)}: "
                f"{geomean(spec):.2f}x; over llama.cpp-lookup overall: {fmt(over_lookup)}x"
            )

    title = "Greedy identity with the plain decoding of the same runtime (share of prompts)"
    print(f"\n### {title if document['settings']['temperature'] == 0 else 'Acceptance (sampled: no identity)'}\n")
    print("| config | own plain | identical | tokens/round | acceptance |")
    print("|---|---|---|---|---|")
    for label in labels:
        row = rows[(OVERALL, label)]
        print(
            f"| {label} | {row.own_plain} | {fmt(row.identical, '{:.0%}')} | {fmt(row.tokens_per_round)} "
            f"| {fmt(row.acceptance_rate, '{:.0%}')} |"
        )


if __name__ == "__main__":
    main()
