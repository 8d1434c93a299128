"""The Target protocol: what the engine needs from a model it verifies drafts with.

A target runs forward passes over a KV cache and rolls back; it never samples. The cache
holds every committed token but the last (the *pending* token): a verify pass feeds the
pending token followed by k drafts and returns k + 1 rows of logits, row i scoring the
token after input i. Rolling back to ``n`` keeps the first ``n`` cached positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

Logits = NDArray[np.float32]


class TargetError(RuntimeError):
    """A target cannot do what was asked (rollback unsupported, context exceeded, ...)."""


@runtime_checkable
class Target(Protocol):
    """A model under a KV cache, driven by the engine one verify pass at a time."""

    name: str

    @property
    def vocab_size(self) -> int:
        """Width of a row of logits."""
        ...

    @property
    def context_length(self) -> int:
        """Most positions (prompt + output) one sequence may occupy."""
        ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a sequence."""
        ...

    @property
    def supports_rollback(self) -> bool:
        """Whether ``rollback`` restores the cache exactly; checked before a run starts."""
        ...

    @property
    def cached_tokens(self) -> int:
        """Positions currently held in the KV cache."""
        ...

    def prefill(self, token_ids: Sequence[int]) -> None:
        """Start a new sequence: empty the cache, then cache ``token_ids`` (no logits kept)."""
        ...

    def verify(self, token_ids: Sequence[int]) -> Logits:
        """Append ``token_ids`` to the cache in one forward pass; logits (len, V) float32."""
        ...

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached positions."""
        ...

    def reset(self) -> None:
        """Drop the whole cache."""
        ...


def check_can_run(target: Target, prompt_tokens: int) -> None:
    """Refuse up front what a run could not finish: no rollback, or a prompt over the context."""
    if not target.supports_rollback:
        raise TargetError(f"{target.name} cannot roll back its cache; speculative rounds need it")
    if prompt_tokens >= target.context_length:
        raise TargetError(
            f"the prompt has {prompt_tokens} tokens but {target.name} has a context of "
            f"{target.context_length}: no room to generate"
        )
