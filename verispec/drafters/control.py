"""``wrong``: a negative control that drafts tokens the target practically never produces.

It proposes k copies of one rarely used id (by default the vocabulary's last), as point
masses. Benchmarks run it to show what a useless drafter costs: with a fixed k every round
pays for verifying rows that are all rejected; with ``k="auto"`` the governor should notice
within a few rounds and decode plainly. Output is unaffected either way (the rule rejects).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verispec.drafters.base import NO_DRAFT, Draft, DrafterContext
from verispec.sampling import SamplingParams


class WrongDrafter:
    name = "wrong"
    hidden_capture = None
    pure_proposals = True  # a constant; see drafters.base

    def __init__(self, token: int) -> None:
        self.token = token

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft:
        return Draft(tokens=[self.token] * k) if k > 0 else NO_DRAFT

    def observe(self, context: Sequence[int], accepted: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def fork(self, target: object) -> WrongDrafter:
        return WrongDrafter(self.token)


def _build(context: DrafterContext) -> WrongDrafter:
    return WrongDrafter(context.option("wrong_token", context.target.vocab_size - 1))
