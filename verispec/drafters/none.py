"""``none``: plain decoding through the same loop, the baseline every measurement uses."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verispec.drafters.base import NO_DRAFT, Draft, DrafterContext
from verispec.sampling import SamplingParams


class NoDrafter:
    """Proposes nothing: every round is one plain decode step (k = 0)."""

    name = "none"
    hidden_capture = None
    pure_proposals = False

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft:
        return NO_DRAFT

    def observe(self, context: Sequence[int], accepted: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def fork(self, target: object) -> NoDrafter:
        return NoDrafter()


def _build(context: DrafterContext) -> NoDrafter:
    return NoDrafter()
