"""PNG plots of a benchmark run: speed-up per category, acceptance by draft position,
measured against predicted speed-up. Drawn from report rows, so ``--plot`` can redraw
them from a saved JSON file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verispec.bench.report import OVERALL, Row


def draw_all(rows: list[Row], baseline: str, directory: Path, title: str, suffix: str = "") -> list[Path]:
    """The three plots into ``directory``; ``suffix`` is appended to the file names."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    directory.mkdir(parents=True, exist_ok=True)
    return [
        _speedup(rows, baseline, directory / f"speedup_by_category{suffix}.png", title),
        _acceptance(rows, directory / f"acceptance_by_position{suffix}.png", title),
        _predicted(rows, directory / f"measured_vs_predicted{suffix}.png", title),
    ]


def _speedup(rows: list[Row], baseline: str, path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    categories = list(dict.fromkeys(r.category for r in rows))
    configs = [c for c in dict.fromkeys(r.config for r in rows) if c != baseline]
    lookup = {(r.category, r.config): r.speedup for r in rows}
    width = 0.8 / max(len(configs), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(categories)), 4.5))
    for i, config in enumerate(configs):
        values = [lookup.get((c, config)) or 0.0 for c in categories]
        ax.bar([x + i * width for x in range(len(categories))], values, width, label=config)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks([x + width * (len(configs) - 1) / 2 for x in range(len(categories))], categories, rotation=30)
    ax.set_ylabel(f"speed-up over {baseline} (geometric mean)")
    return _finish(fig, ax, path, title)


def _acceptance(rows: list[Row], path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        # The acceptance given the position was reached (where the records count it), as the
        # axis says; per-position (accepted / offered) falls with every chance before it.
        if row.category == OVERALL and row.given_reached:
            positions = range(1, len(row.given_reached) + 1)
            ax.plot(positions, row.given_reached, marker="o", label=row.config)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance given the position was reached")
    ax.set_ylim(0, 1.02)
    return _finish(fig, ax, path, title)


def _predicted(rows: list[Row], path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    # Both the theory and the measurement are relative to the configuration's own plain run.
    points = [r for r in rows if r.config != r.own_plain and r.predicted_speedup and r.speedup_own]
    for config in dict.fromkeys(r.config for r in points):
        chosen = [r for r in points if r.config == config]
        ax.scatter([r.predicted_speedup or 0.0 for r in chosen], [r.speedup_own or 0.0 for r in chosen], label=config)
    values = [v for r in points for v in (r.predicted_speedup, r.speedup_own) if v]
    high = max(values, default=2.0) * 1.1
    ax.plot([0, high], [0, high], color="black", linewidth=0.8, linestyle="--", label="measured = predicted")
    ax.set_xlim(0, high)
    ax.set_ylim(0, high)
    ax.set_xlabel("predicted speed-up (theory from measured acceptance and cost)")
    ax.set_ylabel("measured speed-up over its own plain decoding")
    return _finish(fig, ax, path, title)


def _finish(fig: Any, ax: Any, path: Path, title: str) -> Path:
    """Title, legend, layout; write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
