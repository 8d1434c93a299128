"""What ``verispec bench --workload`` sends: single prompts, conversations, or code edits.

- ``single``: each dev prompt's first turn, as one request (Spec-Bench's usual run).
- ``multi-turn``: the records with two turns (Spec-Bench's MT-bench part) as conversations:
  the first turn alone, then the second carrying the first turn and the configuration's own
  answer to it, so what a request taught a drafter is there for the next one.
- ``samples``: each dev prompt's first turn asked ``n`` times in a row, each request with its
  own seed (the bench's seed + the sample's number - 1): best-of-n and self-consistency
  sampling, RL rollouts. At temperature > 0 the answers part ways at random points, so what
  earlier samples said gives a drafter several plausible continuations (where trees pay).
- ``edit``: code from this repository (``verispec``'s own modules, not a benchmark) cut into
  snippets at top-level definitions, each asked for with small changes, one request per
  change: the answer repeats most of the snippet, and the next change to the same snippet
  repeats most of the previous answer.

Each item is a ``Prompt`` (its ``turn`` counts the requests of one conversation or snippet)
with the prompt's ids, or for a later turn of a conversation the function that builds them
from the configuration's earlier answers (``run.PromptIds``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from verispec.bench.run import PromptIds
from verispec.errors import UserError
from verispec.prompts import Prompt

WORKLOADS = ("single", "multi-turn", "samples", "edit")
PACKAGE = Path(__file__).resolve().parent.parent  # the verispec package: the edit workload's code
SNIPPET_LINES = (12, 40)  # a snippet's length in lines: whole top-level definitions within this
EDITS = (
    "Rename `{name}` to `{name}_v2` everywhere it appears.",
    "Add the comment `# reviewed` as the first line, and keep everything else.",
    "Add a docstring to `{name}` that says it is unchanged, and keep everything else.",
)
EDIT_REQUEST = (
    "Here is some Python code:\n\n```python\n{code}\n```\n\n{change} Reply with the complete updated code only."
)


class WorkloadError(UserError, ValueError):
    """A workload that cannot be built from what was given."""


def single(prompts: list[Prompt], engine: Any) -> list[tuple[Prompt, PromptIds]]:
    return [(p, engine.encode(p.text)) for p in prompts]


def samples(prompts: list[Prompt], engine: Any, n: int) -> list[tuple[Prompt, PromptIds]]:
    """Each prompt's first turn as ``n`` requests in a row (``Prompt.turn`` numbers them)."""
    if n < 1:
        raise WorkloadError(f"the samples workload asks each prompt at least once, not {n} times")
    items: list[tuple[Prompt, PromptIds]] = []
    for record in prompts:
        ids = engine.encode(record.text)
        for number in range(1, n + 1):
            items.append((Prompt(record.question_id, record.category, record.text, record.turns, number), ids))
    return items


def multi_turn(prompts: list[Prompt], engine: Any) -> list[tuple[Prompt, PromptIds]]:
    """Every turn of the prompts that have more than one, turn after turn, as chat."""
    conversations = [p for p in prompts if len(p.turns) > 1]
    if not conversations:
        raise WorkloadError("the multi-turn workload needs records with two turns or more (none selected)")
    items: list[tuple[Prompt, PromptIds]] = []
    for record in conversations:
        for number, text in enumerate(record.turns, start=1):
            prompt = Prompt(record.question_id, record.category, text, record.turns, number)
            if number == 1:
                items.append((prompt, engine.encode([{"role": "user", "content": text}], chat=True)))
            else:
                items.append((prompt, _follow_up(engine, record.turns[:number])))
    return items


def _follow_up(engine: Any, turns: tuple[str, ...]) -> PromptIds:
    def build(answers: list[list[int]]) -> list[int]:
        messages: list[dict[str, str]] = []
        for text, answer in zip(turns[:-1], answers, strict=True):
            reply = engine.tokenizer.decode(answer, skip_special_tokens=True)
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        messages.append({"role": "user", "content": turns[-1]})
        ids: list[int] = engine.encode(messages, chat=True)
        return ids

    return build


def snippets(count: int, root: Path = PACKAGE) -> list[tuple[str, str]]:
    """Up to ``count`` snippets (name, code) of whole top-level functions and classes of the
    package's modules, SNIPPET_LINES long, in a fixed order (one per module at most)."""
    found: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.parse("\n".join(lines)).body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.end_lineno is None:
                continue
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = node.end_lineno - start + 1
            if SNIPPET_LINES[0] <= length <= SNIPPET_LINES[1]:
                found.append((node.name, "\n".join(lines[start - 1 : node.end_lineno])))
                break
        if len(found) == count:
            break
    return found


def edit(count: int, engine: Any, edits: int = 2) -> list[tuple[Prompt, PromptIds]]:
    """``count`` snippets of this repository's code, each asked for with ``edits`` changes."""
    if not 1 <= edits <= len(EDITS):
        raise WorkloadError(f"the edit workload makes 1 to {len(EDITS)} changes a snippet, not {edits}")
    items: list[tuple[Prompt, PromptIds]] = []
    for name, code in snippets(count):
        for number, change in enumerate(EDITS[:edits], start=1):
            text = EDIT_REQUEST.format(code=code, change=change.format(name=name))
            prompt = Prompt(f"edit-{name}", "edit", text, (), number)
            items.append((prompt, engine.encode([{"role": "user", "content": text}], chat=True)))
    if not items:
        raise WorkloadError(f"no snippet of {SNIPPET_LINES[0]}-{SNIPPET_LINES[1]} lines found under {PACKAGE}")
    return items
