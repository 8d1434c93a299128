"""Prompt sets in Spec-Bench form: JSONL lines with "question_id", "category" and "turns"."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from verispec.errors import UserError

DEFAULT_PROMPTS = (
    Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "spec_bench" / "question_dev.jsonl"
)


class PromptSetError(UserError, ValueError):
    """A prompt file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Prompt:
    question_id: str
    category: str
    text: str  # the first turn (a workload's turn: this request's user text)
    turns: tuple[str, ...] = ()  # every turn of the record (Spec-Bench's second turns)
    turn: int = 1  # which turn of its conversation this request is


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """All prompts of a Spec-Bench JSONL file, in file order; errors name the line."""
    path = Path(path) if path is not None else DEFAULT_PROMPTS
    if not path.is_file():
        raise PromptSetError(f"prompt file {path} not found")
    prompts = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                turns = record["turns"]
                text = turns[0]
                category = record["category"]
                if not isinstance(text, str) or not isinstance(category, str) or not text:
                    raise TypeError("turns[0] and category must be non-empty strings")
                if not all(isinstance(t, str) and t for t in turns):
                    raise TypeError("every turn must be a non-empty string")
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as error:
                raise PromptSetError(f"{path}:{number}: not a Spec-Bench record ({error})") from error
            prompts.append(Prompt(str(record.get("question_id", number)), category, text, tuple(turns)))
    if not prompts:
        raise PromptSetError(f"{path} holds no prompts")
    return prompts


def select(prompts: list[Prompt], categories: list[str] | None = None, per_category: int | None = None) -> list[Prompt]:
    """The first ``per_category`` prompts of each wanted category, in file order."""
    known = sorted({p.category for p in prompts})
    if categories is not None and not categories:
        raise PromptSetError(f"no categories selected; the file has {known}")
    wanted = categories if categories is not None else known
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise PromptSetError(f"unknown categories {unknown}; the file has {known}")
    taken: dict[str, int] = {}
    chosen = []
    for prompt in prompts:
        if prompt.category in wanted and (per_category is None or taken.get(prompt.category, 0) < per_category):
            taken[prompt.category] = taken.get(prompt.category, 0) + 1
            chosen.append(prompt)
    return chosen


def round_robin(prompts: list[Prompt], count: int) -> list[Prompt]:
    """``count`` prompts taken one category at a time, so every category is represented."""
    by_category: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    chosen: list[Prompt] = []
    depth = 0
    while len(chosen) < count and any(depth < len(v) for v in by_category.values()):
        for group in by_category.values():
            if depth < len(group) and len(chosen) < count:
                chosen.append(group[depth])
        depth += 1
    return chosen
