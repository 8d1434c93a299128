"""Replay a greedy output under any k schedule: governor policies judged without timing noise.

At temperature 0 the output is fixed (the plain run's tokens), and a deterministic drafter's
proposals (prompt lookup) depend only on the context, so every round of any k schedule can be
replayed without the model: the accepted prefix is the draft's agreement with the output, and
the bonus is the output's next token. A ``Clock`` says what a round costs in plain steps: the
verify of d + 1 rows at context length L costs ``1 + (per_row + per_token L) d`` (drafting
counted free, as prompt lookup nearly is). Every round is planned by the engine's own round
planner (``verispec.planner``), so the replayed rounds are the engine's (for a fixed k,
tests/bench/test_replay.py checks it against the engine's counts).

A governor can decide on the clock's exact costs, or, with a ``NoisyTimer``, measure them as
it does in the engine: from timings of its own rounds that carry per-round noise and a slow
drift, starting from a noisy calibration and carrying its costs from request to request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from verispec.accept_tree import tree_depths
from verispec.drafters.base import Drafter
from verispec.governor import CostModel
from verispec.planner import AUTO, DEFAULT_K_MAX, Planner, ShadowAcceptance
from verispec.sampling import SamplingParams
from verispec.stats import RequestStats


@dataclass(frozen=True)
class Replayed:
    rounds: int
    steps: float  # plain decode steps the rounds cost
    stats: RequestStats  # the rounds as the engine counts them (timings: the clock's or timer's)

    def speedup(self, tokens: int) -> float:
        """Over plain decoding, which spends one step per token."""
        return tokens / self.steps


@dataclass(frozen=True)
class Clock:
    """A round's true cost in plain steps: verify rows cost more with context (attention).
    ``extra_rows``: the passes' shape where it is not a line (a measured curve), x(m) for
    m = 1..n rows (x(1) = 0; past n the line through x(n)): a pass of d + 1 rows costs
    ``1 + row_steps(L) x(d + 1)``; () for a line, x(m) = m - 1. A governor's exact costs
    (``costs``) are the line, whatever the shape: its cost model is one."""

    per_row: float  # steps per extra verify row at context 0
    per_token: float = 0.0  # steps per extra row per context token
    extra_rows: tuple[float, ...] = ()

    @classmethod
    def from_curve(cls, curve: Sequence[float], per_token: float = 0.0) -> Clock:
        """From plain steps by rows, ``curve[m - 1]`` a pass of m rows (``curve[0]`` 1): the
        least-squares row cost through it (as a calibration fits it), and its shape in those
        row costs (never falling)."""
        if len(curve) < 2 or curve[0] != 1.0:
            raise ValueError(f"a curve gives plain steps from 1 row on (1.0 first), got {list(curve)}")
        per_row = CostModel.from_timings(dict(enumerate(curve, start=1))).per_row
        if per_row == 0 or len(curve) < 3:
            return cls(per_row, per_token)
        shape = np.maximum.accumulate([(steps - 1.0) / per_row for steps in curve])
        return cls(per_row, per_token, tuple(float(x) for x in shape))

    def row_steps(self, context: int) -> float:
        return self.per_row + self.per_token * context

    def extra(self, rows: int) -> float:
        """x(rows): a pass's extra rows, in row costs."""
        shape = self.extra_rows
        if not shape:
            return rows - 1.0
        return shape[rows - 1] if rows <= len(shape) else shape[-1] * (rows - 1) / (len(shape) - 1)

    def steps(self, drafts: int, context: int) -> float:
        return 1.0 + self.row_steps(context) * self.extra(drafts + 1)

    def costs(self, context: int) -> CostModel:
        """Exact costs at a context, as a governor's cost model (in steps as seconds): the
        line (through the shape, where there is one)."""
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
        return self.clock.steps(drafts, context) * self.factor()

    def factor(self) -> float:
        """The next round's time over its true cost: the drift moves on a round, noise and
        stalls are drawn afresh."""
        keep = 1.0 - 1.0 / self.drift_rounds
        self._state = keep * self._state + self._rng.normal(0.0, self.drift * math.sqrt(1.0 - keep**2))
        factor = math.exp(self._rng.normal(0.0, self.sigma) + self._state)
        return factor * (1.6 if self._rng.random() < self.stall else 1.0)

    def calibrate(self, context: int, k_max: int, repeats: int = 3) -> CostModel:
        """The engine's calibration: the fastest of a few timings per size."""
        timings = {m: min(self(m - 1, context) for _ in range(repeats)) for m in range(1, k_max + 2)}
        return CostModel.from_timings(timings)


def replay(
    prompt: Sequence[int],
    output: Sequence[int],
    drafter: Drafter,
    planner: Planner,
    clock: Clock,
    *,
    k: int | str = AUTO,
    k_max: int = DEFAULT_K_MAX,
    timer: NoisyTimer | None = None,
) -> Replayed:
    """The rounds and plain steps that produce ``output`` after ``prompt``, planned by
    ``planner`` as the engine plans them (a fixed ``k``, or the governor up to ``k_max``).

    Reuse one planner across prompts to carry the drafter's costs and acceptance memory from
    request to request as an engine does; a fresh one per prompt starts each from the prior.
    Without ``timer`` the governor decides on the clock's exact costs at each round's context;
    with one it measures them as the engine does: a calibration through the timer (at the
    first prompt), refined by the timer's readings of its own rounds."""

    def calibrate(limit: int) -> CostModel:
        return timer.calibrate(len(prompt), limit) if timer is not None else clock.costs(len(prompt))

    stats = RequestStats()
    request = planner.begin(drafter, stats, calibrate, k, k_max)
    rng = np.random.default_rng(0)  # unused by deterministic drafters; the protocol wants one
    drafter.begin(prompt, SamplingParams())
    context, end = list(prompt), len(prompt) + len(output)
    steps = 0.0
    while len(context) < end:
        if timer is None and request.governor is not None:
            request.governor.costs = clock.costs(len(context))
        # Room for what is left of the output: drafts beyond its end cannot be replayed.
        draft = request.plan(context, end - len(context), rng).draft
        truth = output[len(context) - len(prompt) :]
        rows = len(draft.tokens)  # drafted rows: a tree's nodes
        path: list[int] | None = None
        if draft.is_tree:
            assert draft.parents is not None
            path = greedy_path(draft.tokens, draft.parents, truth)
            accepted, offered = len(path), int(max(tree_depths(draft.parents)))
        else:
            offered = rows
            accepted = next((i for i, (d, t) in enumerate(zip(draft.tokens, truth, strict=False)) if d != t), rows)
        cost = clock.steps(rows, len(context))
        seconds = timer(rows, len(context)) if timer is not None else cost
        steps += cost
        stats.observe(offered, accepted, 1, 0.0, seconds)
        if path is not None:
            stats.tree_rounds += 1
            stats.tree_nodes += rows
        request.observe(offered, accepted, 0.0, seconds, _greedy_acceptance(truth[0]), rows + 1, path)
        context.extend(truth[: accepted + 1])
        drafter.observe(context, accepted)
    planner.finish(request)
    return Replayed(stats.rounds, steps, stats)


def greedy_path(tokens: Sequence[int], parents: Sequence[int], truth: Sequence[int]) -> list[int]:
    """The nodes the greedy rule accepts in a tree whose target tokens are ``truth``: from the
    root, the child holding the next true token, while there is one."""
    path: list[int] = []
    reached = -1
    for token in truth:
        child = next((n for n, p in enumerate(parents) if p == reached and tokens[n] == token), None)
        if child is None:
            break
        path.append(child)
        reached = child
    return path


def _greedy_acceptance(token: int) -> ShadowAcceptance:
    """At temperature 0 the rule accepts a draft exactly when it is the target's ``token``."""
    return lambda shadow: float(shadow.tokens[0] == token)
