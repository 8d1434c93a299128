"""The Target protocol: what the engine needs from a model it verifies drafts with.

A target runs forward passes over a KV cache and rolls back; it never samples. The cache
holds every committed token but the last (the *pending* token): a verify pass feeds the
pending token followed by k drafts and returns k + 1 rows of logits, row i scoring the
token after input i. Rolling back to ``n`` keeps the first ``n`` cached positions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from verispec.errors import UserError

Logits = NDArray[np.float32]


class TargetError(UserError, RuntimeError):
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


@dataclass(frozen=True)
class Pass:
    """A sequence's part of a forward pass shared by several sequences of one target's cache
    (a target with ``sequence(i)`` and ``run(passes)``, the native one): ``ids`` appended to
    its cache; ``logits`` whether its rows' logits come back (a verify) or not (a prefill)."""

    sequence: Any
    ids: Sequence[int]
    logits: bool


def prefill_steps(target: Target, token_ids: Sequence[int]) -> Iterator[float]:
    """Prefill ``token_ids`` on ``target``, yielding the seconds of each piece as it ends.

    A target may offer ``prefill_chunks(token_ids)``, a generator that prefills a chunk at a
    time and yields (the positions cached so far) between chunks; then a long prompt yields several times, and whoever
    drives the engine can stop a request between chunks (a client that left). Otherwise the
    whole prefill is one piece."""
    chunks = getattr(target, "prefill_chunks", None)
    if chunks is None:
        start = time.perf_counter()
        target.prefill(token_ids)
        yield time.perf_counter() - start
        return
    pieces = iter(chunks(token_ids))
    while True:
        start = time.perf_counter()
        more = next(pieces, None) is not None
        yield time.perf_counter() - start
        if not more:
            return


def check_can_run(target: Target, prompt_tokens: int) -> None:
    """Refuse up front what a run could not finish: no rollback, or a prompt over the context."""
    if not target.supports_rollback:
        raise TargetError(f"{target.name} cannot roll back its cache; speculative rounds need it")
    if prompt_tokens >= target.context_length:
        raise TargetError(
            f"the prompt has {prompt_tokens} tokens but {target.name} has a context of "
            f"{target.context_length}: no room to generate"
        )


@dataclass(frozen=True)
class HiddenCapture:
    """Which hidden states a target keeps from its forward passes, for drafters trained on them.

    layers: indices into the model's hidden states, 0 = the token embeddings, i = the output
    of decoder layer i, the last index (= number of layers) = the final normed state the LM
    head reads. prefill_rows: how many of the prompt's last positions ``prefill`` keeps.
    """

    layers: tuple[int, ...]
    prefill_rows: int = 1

    def __post_init__(self) -> None:
        if not self.layers or min(self.layers) < 0:
            raise ValueError(f"hidden layers must be a non-empty list of indices >= 0, got {self.layers}")
        if self.prefill_rows < 0:
            raise ValueError(f"prefill_rows must be >= 0, got {self.prefill_rows}")


@runtime_checkable
class HiddenStateTarget(Protocol):
    """A target that can hand its hidden states to a drafter (the torch backend).

    After ``capture_hidden(capture)``, every ``prefill`` and ``verify`` leaves in
    ``last_hidden`` a float tensor (rows, len(layers) * hidden_size): for verify one row per
    input token, for prefill the last ``prefill_rows`` prompt positions; the layers'
    states side by side in the order asked. ``capture_hidden(None)`` stops it.
    """

    @property
    def hidden_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def last_hidden(self) -> Any: ...

    def capture_hidden(self, capture: HiddenCapture | None) -> None: ...

    def token_embeddings(self) -> Any:
        """The input embedding matrix (V, hidden), shared (never copied into a drafter's weights)."""
        ...

    def lm_head_weight(self) -> Any:
        """The output projection (V, hidden): logits = final hidden @ weight.T."""
        ...

    def weights_fingerprint(self) -> str:
        """A hash of the model's weights that trained drafters record and check."""
        ...
