"""The Drafter protocol and the registry of drafters by name.

Lifecycle, one line each:

- ``begin(prompt_ids, params)``: a new request starts with this prompt.
- ``propose(context, k, rng)``: up to k tokens to follow ``context`` (the committed
  tokens), with the rows they were sampled from, or ``None`` for point masses.
- ``observe(context, accepted)``: the round committed ``context`` (now ending with the
  bonus) after keeping ``accepted`` drafts; a drafter with a cache trims it here.
- ``reset()``: forget the request.

A drafter conditioned on the target's hidden states (``head``, ``block``) also has a
``hidden_capture`` attribute (a ``verispec.targets.base.HiddenCapture``): the engine turns
the target's capture on for the request, so ``begin`` finds the prompt's states in
``target.last_hidden`` and ``observe`` the last verify pass's (rows 0..accepted are the
committed positions).

A drafter whose ``propose`` is pure (it changes nothing a later call sees) and cheap may
set ``pure_proposals = True``: the engine then asks it for its proposal of up to k_max
tokens before the governor decides how many of them to verify (a proposal of k tokens must
be the first k of a longer one), and in plain rounds its first token is a shadow draft that
shows whether drafting would pay again (``verispec.governor``).

A drafter proposes and observes; it never decides acceptance. The engine creates drafters
through ``create_drafter(name, ...)``; the registry is the only place names are looked up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from verispec.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Proposed tokens (n,) and the rows (n, V) they were drawn from; ``probs`` None = point masses.

    ``source``: what the proposal is based on, where a drafter's acceptance differs by it
    (prompt lookup: the length of the matched n-gram); the governor keeps its acceptance
    estimates per source. None: one kind of proposal.
    """

    tokens: list[int]
    probs: NDArray[np.float64] | None = None
    source: Hashable = None

    def __post_init__(self) -> None:
        if self.probs is not None and self.probs.shape[0] != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} draft tokens but {self.probs.shape[0]} draft rows")


NO_DRAFT = Draft(tokens=[])


@runtime_checkable
class Drafter(Protocol):
    name: str

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams) -> None: ...

    def propose(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft: ...

    def observe(self, context: Sequence[int], accepted: int) -> None: ...

    def reset(self) -> None: ...


class DrafterError(ValueError):
    """A drafter cannot be built for this target (unknown name, vocabulary mismatch, ...)."""


@dataclass(frozen=True)
class DrafterContext:
    """What a drafter factory may need: the loaded target and its tokenizer, plus options."""

    target: Any
    tokenizer: Any = None
    options: dict[str, Any] | None = None

    def option(self, key: str, default: Any = None) -> Any:
        return (self.options or {}).get(key, default)


DrafterFactory = Callable[[DrafterContext], Drafter]
_REGISTRY: dict[str, DrafterFactory] = {}
_CONTROLS: set[str] = set()  # negative controls: for benchmarks and tests, not offered to users


def register_drafter(name: str, *, control: bool = False) -> Callable[[DrafterFactory], DrafterFactory]:
    """Class or function decorator: make ``name`` buildable by ``create_drafter``;
    ``control``: a negative control (buildable, but left out of the names offered to users)."""

    def decorate(factory: DrafterFactory) -> DrafterFactory:
        _REGISTRY[name] = factory
        if control:
            _CONTROLS.add(name)
        return factory

    return decorate


def drafter_names(*, controls: bool = True) -> list[str]:
    _load_builtin()
    return sorted(name for name in _REGISTRY if controls or name not in _CONTROLS)


def create_drafter(name: str, context: DrafterContext) -> Drafter:
    _load_builtin()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise DrafterError(f"unknown drafter {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return factory(context)


def _load_builtin() -> None:
    # Importing the modules registers their drafters.
    from verispec.drafters import block, control, head, lookup, model, none  # noqa: F401


# A trained drafter stops drafting where its confidence (``SharedTarget.distribution``) falls
# below this (drafter option ``min_confidence``; 0 drafts whatever k asks).
DEFAULT_MIN_CONFIDENCE = 0.0


def check_confidence(value: object) -> float:
    """A ``min_confidence`` option: a number in [0, 1]."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise DrafterError(f"min_confidence must be a number in [0, 1], got {value!r}")
    return number
