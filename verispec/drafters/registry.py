"""Drafters by name: the one table where the engine, the CLI, the server and the benchmarks
look a drafter's name up.

Each built-in drafter's module has a factory ``_build(DrafterContext) -> Drafter``, private
to this package; the table below names them. The arrows run one way: the registry imports
the drafters (on the first look-up, since ``head`` and ``block`` load torch and ``--help``
should not), and no drafter imports the registry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from verispec.drafters.base import Drafter, DrafterContext, DrafterError

DrafterFactory = Callable[[DrafterContext], Drafter]

# Negative controls: buildable for benchmarks and tests, left out of the names offered to users.
CONTROLS = frozenset({"wrong"})
# Drafters that learn from earlier requests (the suffix cache): a server with several API keys
# builds one per key (``scope`` option), so one key's prompts never draft for another.
LEARNING_DRAFTERS = frozenset({"suffix", "hybrid"})

# The options each drafter reads from its context (``DrafterContext.option``). ``Engine.drafter``
# and the bench refuse any other option asked for a drafter by name, so a misspelt or misplaced
# one fails instead of being ignored. The engine-wide options (``Engine.drafter_options``, the
# same for every drafter) are not checked. ``scope`` keys a learning drafter's instance.
_TRAINED = ("drafter_weights", "min_confidence", "draft_branches")
_SUFFIX = (
    "suffix_cache_tokens",
    "suffix_max_match",
    "suffix_min_score",
    "suffix_branches",
    "suffix_spec_factor",
    "suffix_phrases",
    "suffix_native",
)
_HYBRID = ("hybrid_min_match", "hybrid_min_frequency", "hybrid_head_k", "hybrid_extend")
DRAFTER_OPTIONS: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "lookup": frozenset({"max_ngram", "min_ngram"}),
    "suffix": frozenset({*_SUFFIX, "scope"}),
    "model": frozenset({"draft_target", "draft_tokenizer"}),
    "head": frozenset({*_TRAINED, "head_kernels"}),
    "block": frozenset(_TRAINED),
    "hybrid": frozenset({*_SUFFIX, "scope", *_TRAINED, "head_kernels", *_HYBRID}),
    "wrong": frozenset({"wrong_token"}),
}


@functools.cache
def _factories() -> dict[str, DrafterFactory]:
    from verispec.drafters import block, control, head, hybrid, lookup, model, none, suffix

    return {
        "none": none._build,
        "lookup": lookup._build,
        "suffix": suffix._build,
        "model": model._build,
        "head": head._build,
        "block": block._build,
        "hybrid": hybrid._build,
        "wrong": control._build,
    }


def drafter_names(*, controls: bool = True) -> list[str]:
    """The names ``create_drafter`` knows, sorted; ``controls=False`` leaves out the negative controls."""
    return sorted(name for name in _factories() if controls or name not in CONTROLS)


def create_drafter(name: str, context: DrafterContext) -> Drafter:
    """A new drafter ``name`` for ``context``'s target; ``DrafterError`` for an unknown name."""
    factory = _factories().get(name)
    if factory is None:
        raise DrafterError(f"unknown drafter {name!r}; known: {', '.join(drafter_names())}")
    return factory(context)


def check_options(name: str, options: Iterable[str]) -> None:
    """``DrafterError`` where ``options`` (keys) holds one that drafter ``name`` does not read
    (an unknown name is left to ``create_drafter``, which says so)."""
    if name not in DRAFTER_OPTIONS:
        return
    takes = DRAFTER_OPTIONS[name]
    unknown = sorted(set(options) - takes)
    if unknown:
        accepted = ", ".join(sorted(takes)) or "none"
        raise DrafterError(f"drafter {name!r} takes no option {', '.join(unknown)}; its options: {accepted}")
