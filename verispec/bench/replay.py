"""Replay a greedy output under any k schedule: governor policies judged without timing noise.

At temperature 0 the output is fixed (the plain run's tokens), and a deterministic drafter's
proposals (prompt lookup) depend only on the context, so every round of any k schedule can be
replayed without the model: the accepted prefix is the draft's agreement with the output, and
the bonus is the output's next token. A ``Clock`` says what a round costs in plain steps: the
verify of d + 1 rows at context length L costs ``1 + (per_row + per_token L) d`` (drafting
counted free, as prompt lookup nearly is). The replayed rounds are the engine's own for a
fixed k (tests/bench/test_replay.py checks it).

A governor can decide on the clock's exact costs, or, with a ``NoisyTimer``, measure them as
it does in the engine: from timings of its own rounds that carry per-round noise and a slow
drift, starting from a noisy calibration and carrying its costs from request to request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Clock:
    """A round's true cost in plain steps: verify rows cost more with context (attention)."""

    per_row: float  # steps per extra verify row at context 0
    per_token: float = 0.0  # steps per extra row per context token

    def row_steps(self, context: int) -> float:
        return self.per_row + self.per_token * context

    def steps(self, drafts: int, context: int) -> float:
        return 1.0 + self.row_steps(context) * drafts

    def costs(self, context: int) -> CostModel:
        """Exact costs at a context, as a governor's cost model (in steps as seconds)."""
        return CostModel.line(1.0, self.row_steps(context))


@dataclass
class NoisyTimer:
    """Timings as a governor on a noisy machine reads them: a round's true cost times
    ``exp(noise + drift)``, noise normal with ``sigma`` per round, drift a slow AR(1) process
    (correlation ``1 - 1 / drift_rounds`` a round, standard deviation ``drift``), and now and
    then a stall (probability ``stall``, 1.6 times as long)."""

    clock: Clock
    sigma: float
    seed: int = 0
    drift: float = 0.2
    drift_rounds: float = 50.0
    stall: float = 0.05
    _state: float = 0.0
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def __call__(self, drafts: int, context: int) -> float:
        keep = 1.0 - 1.0 / self.drift_rounds
        self._state = keep * self._state + self._rng.normal(0.0, self.drift * math.sqrt(1.0 - keep**2))
        seconds = self.clock.steps(drafts, context) * math.exp(self._rng.normal(0.0, self.sigma) + self._state)
        return seconds * (1.6 if self._rng.random() < self.stall else 1.0)

    def calibrate(self, context: int, k_max: int, repeats: int = 3) -> CostModel:
        """The engine's calibration: the median of a few timings per size."""
        timings = {m: float(np.median([self(m - 1, context) for _ in range(repeats)])) for m in range(1, k_max + 2)}
        return CostModel.from_timings(timings)


@dataclass
class Schedule:
    """Chooses each round's k at a context length and hears what the round did there
    (a fixed k, or a governor)."""

    choose: Callable[[int, Hashable], int]  # (context length, the offer's source) -> k
    observe: Callable[[int, int, int], None] = lambda offered, accepted, context: None
    shadow: Callable[[float], None] | None = None
    governor: Governor | None = None
    # The engine asks a shadowing governor's drafter for up to ``offer`` tokens before k is
    # chosen (``Draft.source``); None: k is chosen first.
    offer: int | None = None

    @classmethod
    def fixed(cls, k: int) -> Schedule:
        return cls(lambda context, source: k)

    @classmethod
    def governed(
        cls,
        k_max: int,
        clock: Clock,
        shadow: bool,
        memory: AcceptanceMemory | None = None,
        timer: NoisyTimer | None = None,
        costs: CostModel | None = None,
    ) -> Schedule:
        """The shipped governor. Without ``timer`` it decides on the clock's exact costs at
        each round's context; with one it measures: it starts from ``costs`` (an earlier
        request's ``schedule.governor.costs``, else the timer's calibration at the prompt)
        and refines them from the timer's readings of its rounds. With ``memory`` it starts
        from the acceptance of the requests replayed before, as an engine's governor does
        (the caller has ``memory.learn(schedule.governor)`` after)."""
        start = memory.start() if memory is not None else ()
        governor = Governor(k_max, costs or clock.costs(0), adapt_costs=timer is not None, shadow=shadow, start=start)
        calibrate = timer is not None and costs is None

        def choose(context: int, source: Hashable) -> int:
            nonlocal calibrate
            if timer is None:
                governor.costs = clock.costs(context)
            elif calibrate:
                governor.costs, calibrate = timer.calibrate(context, k_max), False
            return governor.next_k(source).k

        def observe(offered: int, accepted: int, context: int) -> None:
            seconds = 0.0 if timer is None else timer(offered, context)
            governor.observe(offered, accepted, 0.0, seconds)

        return cls(choose, observe, governor.observe_shadow if shadow else None, governor, k_max if shadow else None)


def replay(
    prompt: Sequence[int], output: Sequence[int], drafter: Drafter, schedule: Schedule, clock: Clock
) -> Replayed:
    """The rounds and plain steps that produce ``output`` after ``prompt`` under ``schedule``."""
    rng = np.random.default_rng(0)  # unused by deterministic drafters; the protocol wants one
    drafter.begin(prompt, SamplingParams())
    context, end = list(prompt), len(prompt) + len(output)
    rounds, steps = 0, 0.0
    while len(context) < end:
        room = end - len(context) - 1  # drafts beyond the output's end cannot be replayed
        if schedule.offer is not None:  # as the engine does for a shadowing governor
            offer = drafter.propose(context, min(schedule.offer, room), rng)
            chosen = schedule.choose(len(context), offer.source) if offer.tokens else 0
            draft = offer.tokens[: min(chosen, room)]
        else:
            offer = None
            chosen = schedule.choose(len(context), None)
            k = min(chosen, room)
            draft = drafter.propose(context, k, rng).tokens[:k] if k > 0 else []
        truth = output[len(context) - len(prompt) :]
        accepted = next((i for i, (d, t) in enumerate(zip(draft, truth, strict=False)) if d != t), len(draft))
        rounds, steps = rounds + 1, steps + clock.steps(len(draft), len(context))
        schedule.observe(len(draft), accepted, len(context))
        if schedule.shadow is not None and chosen == 0:
            guess = offer.tokens if offer is not None else drafter.propose(context, 1, rng).tokens
            if guess:
                schedule.shadow(1.0 if guess[0] == truth[0] else 0.0)
        context.extend(truth[: accepted + 1])
        drafter.observe(context, accepted)
    return Replayed(rounds, steps)
