"""Replay a greedy output under any k schedule: governor policies judged without timing noise.

At temperature 0 the output is fixed (the plain run's tokens), and a deterministic drafter's
proposals (prompt lookup) depend only on the context, so every round of any k schedule can be
replayed without the model: the accepted prefix is the draft's agreement with the output, and
the bonus is the output's next token. A round of d drafts costs ``1 + per_row * d`` plain steps
(the verify of d + 1 rows; drafting counted free, as prompt lookup nearly is). The replayed
rounds are the engine's own for a fixed k (tests/bench/test_replay.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from verispec.drafters.base import Drafter
from verispec.governor import AcceptanceMemory, CostModel, Governor
from verispec.sampling import SamplingParams


@dataclass(frozen=True)
class Replayed:
    rounds: int
    steps: float  # plain decode steps the rounds cost

    def speedup(self, tokens: int) -> float:
        """Over plain decoding, which spends one step per token."""
        return tokens / self.steps


@dataclass
class Schedule:
    """Chooses each round's k and hears what the round did (a fixed k, or a governor)."""

    choose: Callable[[], int]
    observe: Callable[[int, int], None] = lambda offered, accepted: None
    shadow: Callable[[float], None] | None = None
    governor: Governor | None = None

    @classmethod
    def fixed(cls, k: int) -> Schedule:
        return cls(lambda: k)

    @classmethod
    def governed(cls, k_max: int, per_row: float, shadow: bool, memory: AcceptanceMemory | None = None) -> Schedule:
        """The shipped governor on a simulated clock: r(m) = 1 + per_row (m - 1), drafting free.
        With ``memory`` it starts from the acceptance of the requests replayed before, as an
        engine's governor does (the caller has ``memory.learn(schedule.governor)`` after)."""
        costs = CostModel({m: 1.0 + per_row * (m - 1) for m in range(1, k_max + 2)}, 0.0)
        start = memory.start() if memory is not None else ()
        governor = Governor(k_max, costs, adapt_costs=False, shadow=shadow, start=start)
        return cls(
            lambda: governor.next_k().k,
            lambda offered, accepted: governor.observe(offered, accepted, 0.0, 0.0),
            governor.observe_shadow if shadow else None,
            governor,
        )


def replay(
    prompt: Sequence[int], output: Sequence[int], drafter: Drafter, schedule: Schedule, per_row: float
) -> Replayed:
    """The rounds and plain steps that produce ``output`` after ``prompt`` under ``schedule``."""
    rng = np.random.default_rng(0)  # unused by deterministic drafters; the protocol wants one
    drafter.begin(prompt, SamplingParams())
    context, end = list(prompt), len(prompt) + len(output)
    rounds, steps = 0, 0.0
    while len(context) < end:
        chosen = schedule.choose()
        k = min(chosen, end - len(context) - 1)
        draft = drafter.propose(context, k, rng).tokens[:k] if k > 0 else []
        truth = output[len(context) - len(prompt) :]
        accepted = next((i for i, (d, t) in enumerate(zip(draft, truth, strict=False)) if d != t), len(draft))
        rounds, steps = rounds + 1, steps + 1.0 + per_row * len(draft)
        schedule.observe(len(draft), accepted)
        if schedule.shadow is not None and chosen == 0:
            guess = drafter.propose(context, 1, rng).tokens
            if guess:
                schedule.shadow(1.0 if guess[0] == truth[0] else 0.0)
        context.extend(truth[: accepted + 1])
        drafter.observe(context, accepted)
    return Replayed(rounds, steps)
