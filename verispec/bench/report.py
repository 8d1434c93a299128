"""From per-prompt records to the per-category table. Every ratio is a property of the summed
``RequestStats`` of the runs (and so goes through rounds.py).

Per category (and overall) and configuration:

- tok/s: generated tokens over wall-clock seconds (prefill included), summed over prompts;
- prefill tok/s: prompt tokens over prefill seconds (verispec configurations; peers do not
  report their prefill apart);
- speed-up: geometric mean over runs of tok/s relative to the baseline's run of the same
  prompt in the same pass (verispec's plain decoding, ``none``, unless another is chosen).
  Sampled runs (T > 0) draw different answers of different lengths (the same law, other
  draws), and a run whose answer ends after a few tokens is mostly prefill: one such run
  gave a ratio of 0.08. So at T > 0 every speed-up is over the pairs of runs whose answers
  have the same length ("paired": how many; mostly both reached --max-tokens). Which pairs
  those are depends on the answers alone, which every configuration samples from the same
  law, so the choice favours none;
- own plain: the plain decoding of the configuration's own runtime (``configs.own_plain``:
  ``none:backend=llama.cpp`` for ``lookup:backend=llama.cpp``, ``llama.cpp`` for
  ``llama.cpp-lookup``), and the speed-up over it (``vs own``). Cost steps, efficiency and
  identity are measured against that run;
- decode vs own: the same geometric mean with each run's prefill taken out (tokens over
  wall-clock seconds less prefill seconds), where both runs report their prefill (verispec
  runtimes). Speculation changes only the decoding: where prompts are long against the
  answers, the speed-up over the whole request is this one diluted by the prefill;
- tokens per round, acceptance rate, per-position acceptance, bonus shortfall: from the
  summed round counts; "given reached": the acceptance at each position among the rounds
  whose chain reached it (the held-out score's figures), where per-position (design.md's)
  counts every round that drafted the position, so it falls with the chances before it;
- cost steps: mean time of a drafted round over the own plain run's mean step time;
- pays: tokens per drafted round > cost steps;
- predicted speed-up: the theory (rounds.predicted_speedup_for_rounds) fed with the measured
  mix of round sizes, per-position acceptance and cost; efficiency = measured (vs own plain,
  prefill included) / predicted;
- identical: for greedy runs, the share of prompts whose tokens equal the own plain run's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verispec.stats import RequestStats

OVERALL = "overall"


@dataclass
class Row:
    category: str
    config: str
    prompts: int
    tokens_per_second: float
    speedup: float | None
    identical: float | None
    own_plain: str = ""
    speedup_own: float | None = None
    decode_speedup_own: float | None = None
    tokens_per_round: float | None = None
    acceptance_rate: float | None = None
    per_position: list[float] = field(default_factory=list)
    given_reached: list[float] = field(default_factory=list)
    bonus_shortfall: int | None = None
    cost_steps: float | None = None
    pays: bool | None = None
    predicted_speedup: float | None = None
    efficiency: float | None = None
    # Sampled runs: the pairs (this configuration's run, its own plain run's) of equal-length
    # answers that vs own and decode vs own read; speed-up reads the same pairs with the
    # baseline's runs, the same ones where the baseline is its own plain (None: greedy, all).
    paired: int | None = None
    peak_rss_mb: float = 0.0
    prefill_tokens_per_second: float | None = None


def _round_fields(row: Row, runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> None:
    total = RequestStats.total(RequestStats.from_dict(r["stats"]) for r in runs)
    if total.prefill_seconds > 0:
        row.prefill_tokens_per_second = total.prefill_tokens_per_second
    row.tokens_per_round = total.tokens_per_round
    row.acceptance_rate = total.acceptance_rate
    row.per_position = total.per_position_acceptance
    row.given_reached = total.acceptance_given_reached
    row.bonus_shortfall = total.bonus_shortfall
    # The unit of cost: the own plain run's step on the same prompts.
    step = RequestStats.total(RequestStats.from_dict(r["stats"]) for r in baseline if r.get("stats")).plain_step_seconds
    if not step:
        return
    if total.drafted_rounds:
        row.cost_steps = total.cost_steps_at(step)
        row.pays = total.pays_at(step)
        row.predicted_speedup = total.predicted_speedup_at(step)
    elif row.own_plain == row.config:
        row.predicted_speedup = 1.0
    else:
        return  # a plain run of another runtime: the theory says nothing about runtimes
    if row.speedup_own is not None and row.predicted_speedup:
        row.efficiency = row.speedup_own / row.predicted_speedup


def _geometric_mean_ratio(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> float | None:
    ratios = [r["tokens_per_second"] / b["tokens_per_second"] for r, b in pairs if b["tokens_per_second"] > 0]
    if not ratios or min(ratios) <= 0:
        return None
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios))


def _decode_seconds(record: dict[str, Any]) -> float | None:
    """A run's wall-clock seconds less its prefill; None where it does not report its prefill."""
    prefill = (record.get("stats") or {}).get("prefill_seconds")
    if prefill is None:
        return None
    return float(record["seconds"]) - float(prefill)


def _decode_ratio(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> float | None:
    """The geometric mean of decode tok/s ratios (``_decode_seconds``); None unless every pair
    reports its prefill on both sides."""
    decoded = []
    for run, base in pairs:
        seconds, base_seconds = _decode_seconds(run), _decode_seconds(base)
        if seconds is None or base_seconds is None or seconds <= 0 or base_seconds <= 0:
            return None
        decoded.append(
            ({"tokens_per_second": run["tokens"] / seconds}, {"tokens_per_second": base["tokens"] / base_seconds})
        )
    return _geometric_mean_ratio(decoded) if decoded else None


def run_key(record: dict[str, Any]) -> tuple[int, int]:
    """A run is a prompt in a pass (results saved before repeats existed have one pass)."""
    return record["prompt_index"], record.get("repeat", 0)


def summarise(
    records: list[dict[str, Any]], baseline_label: str, greedy: bool, own_plain: dict[str, str] | None = None
) -> list[Row]:
    """Rows per (category, config), categories in first-seen order, then ``overall``.

    ``own_plain`` maps a configuration to the plain run of its own runtime (default: the
    baseline for all)."""
    categories: list[str] = []
    configs: list[str] = []
    for r in records:
        if r["category"] not in categories:
            categories.append(r["category"])
        if r["config"] not in configs:
            configs.append(r["config"])
    own_plain = own_plain or {}
    rows = []
    for category in [*categories, OVERALL]:
        chosen = [r for r in records if category in (r["category"], OVERALL)]
        by_config: dict[str, dict[tuple[int, int], dict[str, Any]]] = defaultdict(dict)
        for r in chosen:
            by_config[r["config"]][run_key(r)] = r
        for config in configs:
            runs = [r for r in chosen if r["config"] == config]
            if not runs:
                continue
            base = by_config[baseline_label]
            own_label = own_plain.get(config, baseline_label)
            own = by_config[own_label]
            pairs = [(r, base[run_key(r)]) for r in runs if run_key(r) in base]
            own_pairs = [(r, own[run_key(r)]) for r in runs if run_key(r) in own]
            # Sampled: speed read on answers of equal length only (see the module docstring).
            timed, own_timed = pairs, own_pairs
            if not greedy:
                timed = [(r, b) for r, b in pairs if r["tokens"] == b["tokens"]]
                own_timed = [(r, b) for r, b in own_pairs if r["tokens"] == b["tokens"]]
            row = Row(
                category=category,
                config=config,
                prompts=len(runs),
                tokens_per_second=sum(r["tokens"] for r in runs) / (sum(r["seconds"] for r in runs) or math.inf),
                speedup=_geometric_mean_ratio(timed),
                identical=(
                    sum(r["token_ids"] == b["token_ids"] for r, b in own_pairs) / len(own_pairs)
                    if greedy and own_pairs
                    else None
                ),
                own_plain=own_label,
                speedup_own=_geometric_mean_ratio(own_timed),
                decode_speedup_own=_decode_ratio(own_timed),
                paired=None if greedy else len(own_timed),
            )
            row.peak_rss_mb = max(r["peak_rss_mb"] for r in runs)
            if all(r.get("stats") for r in runs):
                _round_fields(row, runs, [b for _, b in own_pairs])
            rows.append(row)
    return rows


def _fmt(value: Any, pattern: str = "{:.2f}") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return pattern.format(value)


@dataclass(frozen=True)
class Column:
    """A column of the results table, the same in the terminal and in markdown."""

    name: str
    cell: Callable[[Row], str]
    left: bool = False  # text columns align left, numbers right


COLUMNS = (
    Column("category", lambda row: row.category, left=True),
    Column("config", lambda row: row.config, left=True),
    Column("n", lambda row: str(row.prompts)),
    Column("tok/s", lambda row: f"{row.tokens_per_second:.1f}"),
    Column("prefill tok/s", lambda row: _fmt(row.prefill_tokens_per_second, "{:.0f}")),
    Column("speed-up", lambda row: _fmt(row.speedup, "{:.2f}x")),
    Column("paired", lambda row: _fmt(row.paired, "{}")),
    Column("own plain", lambda row: row.own_plain, left=True),
    Column("vs own", lambda row: _fmt(row.speedup_own, "{:.2f}x")),
    Column("decode vs own", lambda row: _fmt(row.decode_speedup_own, "{:.2f}x")),
    Column("tok/round", lambda row: _fmt(row.tokens_per_round)),
    Column("accept", lambda row: _fmt(row.acceptance_rate, "{:.0%}")),
    Column("per-position", lambda row: " ".join(f"{a:.2f}" for a in row.per_position[:8]) or "-", left=True),
    Column("given reached", lambda row: " ".join(f"{a:.2f}" for a in row.given_reached[:8]) or "-", left=True),
    Column("shortfall", lambda row: _fmt(row.bonus_shortfall, "{}")),
    Column("cost steps", lambda row: _fmt(row.cost_steps)),
    Column("pays", lambda row: _fmt(row.pays)),
    Column("predicted", lambda row: _fmt(row.predicted_speedup, "{:.2f}x")),
    Column("efficiency", lambda row: _fmt(row.efficiency, "{:.0%}")),
    Column("identical", lambda row: _fmt(row.identical, "{:.0%}")),
    Column("peak MB", lambda row: f"{row.peak_rss_mb:.0f}"),
)


def render_table(rows: list[Row], title: str) -> Any:
    """A rich Table of the rows (a category named once for its block of rows)."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for column in COLUMNS:
        table.add_column(column.name, justify="left" if column.left else "right")
    previous = None
    for row in rows:
        cells = [column.cell(row) for column in COLUMNS]
        if row.category == previous:
            cells[0] = ""
        table.add_row(*cells)
        previous = row.category
    return table


def markdown_table(rows: list[Row]) -> str:
    """The same table as GitHub markdown, for BENCHMARKS.md."""
    lines = ["| " + " | ".join(column.name for column in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(column.cell(row) for column in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)
