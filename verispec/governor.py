"""The economics governor: how many tokens to draft in the next round (0 = a plain step).

A round with k drafts costs ``d(k) + r(k + 1)`` seconds, where ``d(k)`` is the drafter's time
(``k c`` for a drafter that computes each token, c per token; one proposal's time, whatever
k, for a pure one such as prompt lookup) and ``r(m)`` the verify time of m rows, and is
expected to yield ``E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k`` tokens, where ``a_i`` is
the acceptance at draft position i given the chain reached it
(rounds.expected_tokens_positional). Plain
decoding yields 1 token per ``r(1)``. Before each round the governor picks the k in
[0, k_max] with the most predicted tokens per second; drafting pays when that beats plain.

When nothing pays it decodes plainly for a back-off period, then probes with a small k; the
period doubles each time a probe still does not pay and resets when one does, so a workload
that changes mid-request is noticed at a cost bounded by the probes. The periods are priced
too: a dear probe (a trained head's, ~2.5 plain steps here) waits longer, so that probes cost
at most a few percent of plain decoding whatever the drafter. A probe counts only
when the drafter offers something: a round it leaves empty is a plain step and examined
nothing, so the probe waits for the next round.

Shadow drafting replaces back-off and probes for a drafter whose proposals are free and
pure (prompt lookup: a dictionary read that changes nothing): in a plain round the first
token of the proposal it made anyway is a shadow draft, and the target's own row of that
round says how likely the rule would have accepted it (``min(1, p(x) / q(x))``), which is
evidence at position 1 at no cost. The governor then decides afresh every round, and resumes drafting the round the
drafter starts being right; probes at fixed intervals missed the short stretches in which
prompt lookup is right (math: 0 of 7 probed drafts accepted where a fixed k = 2 had 23 of 116).

Sources: with shadow drafting the engine asks the drafter for its proposal first, and the
governor decides for the proposal in hand. A drafter may say what a proposal is based on
(``Draft.source``; prompt lookup: the length of the n-gram it matched, a three-token match
being right far more often than a one-token one), and the governor keeps its acceptance
estimates, and the memory its starts, per source. Replayed over the 65 dev prompts
(``benchmarks/governor_replay.py``), estimates per source raised auto / best fixed k in
math_reasoning from 0.983 to 1.003 and overall from 1.038 to 1.045. Verifying a prefix of a
proposal is lossless whatever its length: the cut depends on the drafter's side alone.

Trees: a drafter that proposes a tree of alternatives with its frequencies (the suffix
drafter with ``branches`` > 1) has it sized by ``tree`` (``verispec.tree_sizing``): the
main chain is valued by the acceptance per position, as a chain is; each alternative by the
drafter's frequency, scaled by what later children actually won; the nodes kept are those
with the most predicted tokens per second at the measured cost of rows. Where alternatives
do not pay for their rows, the round verifies the chain the governor would have chosen. A
probing governor's drafter (a trained head with ``draft_branches`` > 1) is asked for its
tree of the k that ``next_k`` chose; its drafted positions are priced as drafted, and each
alternative as the verify row it adds (it comes from the same drafter call). Probes verify
chains: they measure the chain's acceptance.

Batches: where requests share forward passes (``verispec.scheduler``), a request's drafts
are rows every request of the pass waits for. With ``load`` (the other requests' rows in the
pass, and the tokens they are expected to commit in it), a round of k drafts is priced for the
batch: it yields ``(S + E(k)) / (S + 1)`` times the batch's plain tokens for
``(d(k) + r(R + 1 + k)) / r(R + 1)`` of its plain passes, R and S the others' rows and tokens,
so k shrinks as load grows and drafting stops where it would lower the batch's throughput.
Alone (R = S = 0) this is the formula above. The margin MIN_GAIN is the request's own: the
batch's speed-up must clear 1 + (MIN_GAIN - 1) / (S + 1) (``batch_floor``). Verify timings
then count for the pass's rows, except a pass that also read other requests' prompt chunks
(rows of another kind, whose time says little of a verify row's). Where no k could pay even
if every draft were accepted (``load_allows_drafting``), a shadowing planner does not ask the
drafter at all; where none could at the best position-1 estimate a proposal could be judged
by (``first_needed``, ``first_ceiling``), a proposal is evidence only, and the planner asks
for one in a few rounds (``RequestPlanner._asks_beside_load``): beside 15 requests each round's
Python is paid by the whole batch.

The governor only decides how many tokens are drafted. The acceptance rule, and so the
output distribution, is untouched.

Costs: ``CostModel`` keeps r(m) as a line in m (a plain step plus a slope per row, both
following the newest timings) and the drafting time as a running mean, per token or, for
a pure drafter, per proposal: a lookup or suffix proposal costs its index reads whatever
the k it is cut to, and priced per offered token it read as 1 to 8 times dearer from round
to round (whether suffix shadowed flipped from request to request). An engine keeps one per
drafter, calibrated once and refined by every request; a request uses a snapshot of it.

Catching up: a drafter that keeps state of its own (a trained head's keys of the positions it
has read, a draft model's cache) does its share of a plain round's work only when next asked:
the first drafted round after plain rounds first runs it over the positions it missed (a head
over its window of 64 target states: ~5 ms against ~1.2 ms for a drafted round that follows a
drafted one, on 2 Zen 4 cores). ``CostModel.catch_up_seconds`` prices that surcharge, paid by a
drafted round that follows a plain one (and by every probe); ``draft_seconds_per_token`` is
then what a drafted round costs after another. A stretch of drafted rounds pays it once, so
a governor started from a memory chooses k on rounds priced without it; the back-off before a
probe is priced with it. Priced per token alone, the surcharge was spread over every k and
hidden from the calibration (warm proposals on one context): seeded T = 1 requests, which
keep the calibrated costs, priced a head's round at 1.30 plain steps against the 1.6-2.0 they
paid drafting now and then, and ran `--k auto` at 0.82-0.89x of plain.

Acceptance: ``AcceptanceMemory`` keeps, per drafter, the acceptance at draft position 1 of
recent requests (each round examined there counting once, older ones fading by half per
MEMORY_HALF_LIFE rounds, so a request that only probed once moves it little), and a request's
estimate there starts from it instead of the prior (counting as one observation, so the
request's own rounds soon outweigh it; for a probing governor, as MEMORY_ROUNDS of them,
pooled with the request's own: see there). A drafter known to be wrong then drafts nothing at
the start of the next request (from the prior it drafted up to 10 rounds before its estimate
fell), and one known to be right drafts from the start. A probing drafter known not to pay
also goes on with the back-off the last request ended in (``Backoff``): its probes are spaced
across requests, at PROBE_BUDGET, instead of starting each request at the first back-off's
dearer FIRST_PROBE_BUDGET.

Requests that promise a reproducible sampled output (a seed and temperature > 0) start
from the costs as calibrated and the prior, and change neither, because their k schedule,
and with it which uniforms the rule reads, must not depend on timing noise or on the
requests that came before.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from verispec import rounds
from verispec.tree_sizing import BranchCalibration, TreeChoice, best_nodes, depths, node_chances, tree_outcome

# What a proposal is based on (``Draft.source``): the governor's estimates are kept per source.
Source = Hashable


class _Current:
    """The source of the round being decided (``Governor.current``), where None is a source."""


CURRENT = _Current()

ACCEPT_EMA = 0.2  # weight of the newest round in the acceptance estimates (~5-round memory)
COST_EMA = 0.25  # weight of the newest drafting time in its price
# The verify line's filter (``CostModel``), in fractions of the pass's or the step's time: a
# pass's own noise (one standard deviation), the machine's speed a round (a random walk that
# moves every size alike), the row cost's own wander a round (the context grows), and how
# sure a calibrated row cost is.
TIMING_NOISE = 0.1
DRIFT_PER_ROUND = 0.04
ROW_WANDER = 0.005
CALIBRATED_ROW = 0.05
CLIP = 2.0  # a timing counts at most CLIP times, at least 1 / CLIP of its prediction
PRIOR_ACCEPTANCE = 0.5  # acceptance assumed at a position not yet observed in this request
# Draft only when the predicted speed-up clears plain decoding by this factor: the margin
# absorbs estimation noise, and it bounds the rounds an always-wrong drafter gets even when
# verifying extra rows is almost free (see ALWAYS_WRONG_BOUND). Beside a batch it is a margin
# on the request's own share of the batch's tokens (``Governor.batch_floor``).
MIN_GAIN = 1.03
FIRST_BACKOFF = 4  # plain rounds before the first re-probe
# The back-off doubles up to the longer of MAX_BACKOFF and the length that keeps the probes'
# extra cost below PROBE_BUDGET of plain decoding: a probe of PROBE_K drafts costs
# round_steps(PROBE_K) - 1 steps more than a plain step (0.15 on the exact torch backend,
# up to ~0.7 on llama.cpp's quantised kernels), so probing stays cheap on every backend while
# a cheap one re-probes often enough to catch output that starts repeating mid-request.
MAX_BACKOFF = 16
PROBE_BUDGET = 0.01
# The first back-off of a request, and the one after a drafted round, is FIRST_BACKOFF or
# longer where a probe is dear: the first probes cost <= FIRST_PROBE_BUDGET of the plain steps
# before them. A trained head on 2 AVX2 cores probes at ~2.5 plain steps; with a back-off of 4
# its probes alone held `--k auto` at 0.85x of plain (7% of rounds were probes).
FIRST_PROBE_BUDGET = 0.05
# Probes draft two tokens: a probe is also the only time a position beyond the k in use is
# examined again, and with k = 1 probes an early low estimate at position 2 held the governor
# at k <= 1 where a fixed k = 2 paid (math_reasoning: 1.13 tokens per round against 1.57).
PROBE_K = 2
PROBE_EMA = 0.5  # a probe is fresh evidence after a pause: it moves the estimates more
STALE_DRIFT = 0.05  # per round, of the gap to the position before (~20-round memory)
# Shadow drafts cost at most this share of the plain steps they ride on where they keep
# missing: past SHADOW_FREE_MISSES plain rounds in a row whose proposal was empty or wrong, a
# pure drafter whose proposals cost more than this share of a step is asked in only that share
# of its plain rounds (``shadow_rate``) until a shadow is right or a round drafts. Closer to a
# hit every plain round shadows: that is where a bursty drafter resumes (prompt lookup, suffix
# on text that repeats in stretches). Throttled everywhere, suffix on the edit workload drafted
# in 148 fewer rounds (1.42x of plain against 1.47x) to save 0.08 s of proposals in 41 s.
SHADOW_MAX_COST = 0.02
SHADOW_FREE_MISSES = 4
# A pure drafter shadows at all only where the throttled rate is at least every fourth plain
# round (proposals up to 8% of a plain step); a dearer one backs off and probes. All or nothing
# at 2%, suffix on 2 Zen 2 cores (proposals 0.2-0.3 ms, 3-5% of a 5.7 ms step) probed and
# pooled: on the edit workload, shadowing every plain round, it made 1.47x of plain against
# 1.41x (one run each, same session).
SHADOW_MIN_RATE = 0.25
# Drafted rounds per 100 tokens an always-wrong drafter can cost, whatever the costs: the
# estimate at position 1 starts as a running mean with the prior as one observation (0.5,
# 0.25, 0.17, 0.125, 0.1), then falls by a factor 1 - ACCEPT_EMA = 0.8 a round, and stops
# paying below MIN_GAIN - 1 = 0.03: after at most 10 drafted rounds. Then probes come after
# 4, 8, 16, 16, ... plain rounds (later where probes are dear): at most 6 within the first 100
# tokens. 10 + 6 = 16. With shadow drafting there are no probes, and the shadows keep position
# 1's estimate at zero.
# (With an engine's acceptance memory a later request starts known-wrong: no drafted rounds.)
ALWAYS_WRONG_BOUND = 16
# How fast the memory the next request starts from forgets: each round a request examined at
# position 1 counts once, and the rounds behind the memory lose half their weight for every
# MEMORY_HALF_LIFE rounds examined after them, so it rests on ~1.44 MEMORY_HALF_LIFE rounds at
# most, and one lone probe moves it by one round's worth of those. The discount was per
# request before (by half, whatever the request examined): a dear head's plain requests, one
# probe each, then left the memory resting on a few lone probes, and a run of missed ones drove
# it from 0.32 to 0.01 in ten simulated requests that were each right 0.37-0.62 of the time,
# from where no probe could make drafting pay again. A workload that changes is still followed
# within a request: one whose rate is more than MEMORY_SHIFT standard errors from the memory's
# (a binomial test on its rounds; 2 hits in 3 probes against a memory of 0.05) weighs at least
# as much as the memory (``_pool_rate``). `benchmarks/governor_sim.py --learn`, a head's costs
# (k 1 at 1.31 steps), acceptance drawn per request from the bench's 13 categories (0.31-0.62
# at position 1): auto 1.048x -> 1.058x of plain (fixed k 1: 1.085x); a drafter at 0.40 every
# request 1.012x -> 1.024x (1.064x); always-wrong and mixed wrong/right workloads unchanged.
# The test is the normal approximation, and it is quick to call a shift at an extreme
# memory: one miss against 0.98 is 7 standard errors of one round there, though its exact
# chance is 2%. An exact binomial tail (below 0.00135) was tried and dropped: it asks for two
# hits within one request to leave a memory of 0, and a drafter known wrong probes about once
# a request, so one that started to pay was found only tens of requests later
# (``test_a_carried_back_off_still_finds_a_drafter_that_starts_to_pay``). A false shift costs
# the next request a start from a memory halfway off, which its own rounds soon outweigh.
MEMORY_HALF_LIFE = 200.0
MEMORY_SHIFT = 3.0
SHIFT_FLOOR = 0.02  # the memory's rate as the test reads it: never quite 0 or 1
# A probing governor (a dear drafter: a trained head, a draft model) that starts from the
# memory pools it with the request's own rounds at position 1: the memory counts as
# MEMORY_ROUNDS of them, and each older round of the request weighs REQUEST_FORGET times the
# next (~33 rounds remembered; a probe's round counts as one like any other). Such a drafter
# is examined only in the rounds it drafts, and a 5-round moving average of them is too noisy
# to decide on near break-even: at a true 0.45 it wanders by ~0.17 and fell below a k 1
# round's break-even (0.35) every few rounds, each time backing off for tens of rounds
# (`benchmarks/governor_sim.py`: 1.00x of plain where a fixed k 1 made 1.10x; pooled, 1.07x).
# Shadowing governors keep the moving average: fresh evidence every round, and prompt
# lookup's acceptance comes in bursts.
MEMORY_ROUNDS = 10.0
REQUEST_FORGET = 0.97
# Such a pooled governor, once drafting, goes on while the predicted speed-up clears this
# smaller bar (hysteresis): near break-even its estimate still crosses MIN_GAIN now and then,
# and each crossing costs a back-off of tens of plain rounds, ended by a dear probe that moves a
# pooled estimate by one round, too little to clear MIN_GAIN again. Below 1: a drafting round
# goes on until its predicted loss exceeds what MIN_GAIN asks as gain. Near break-even the
# loss either way is small, while an early run of misses in a request where the head is right
# 43% of the time stopped it for the rest of the request. A request started from a memory
# that clears this bar goes on with the engine's stretch from its first round (``__init__``).
# `benchmarks/governor_sim.py --learn`, a head's costs (k 1 at 1.31 steps), acceptance drawn
# per request from the bench's 13 categories: 1.058x at 1.01, 1.069x at 0.97, 1.077x with the
# stretch carried into requests (fixed k 1 1.085x); a drafter at 0.40 every request 1.020x,
# 1.047x, 1.051x (1.064x). Always-wrong and never-paying workloads were unchanged. It still
# bounds what a drafter that misses costs: its estimate falls towards 0 (``test_governor``:
# wrong every round against a memory of 0.45, it stops within 25 rounds, 14 at 1.01).
STAY_GAIN = 0.97


@dataclass(frozen=True)
class Backoff:
    """Where a probing governor's back-off stood when its request ended: ``length``, the
    back-off in force (plain rounds between probes), and ``left``, its plain rounds still to
    go before the next probe (0: the probe is due). An engine's ``AcceptanceMemory`` carries
    it to the next request of a drafter that the memory says does not pay, so that probes
    cost at most PROBE_BUDGET of the plain steps across requests, not FIRST_PROBE_BUDGET of
    each request's first ones: restarted per request, a trained head on 2 AVX2 cores probed
    twice in every 128-token request, and `--k auto` ran at 0.98x of plain
    (`benchmarks/governor_sim.py --learn`)."""

    length: int
    left: int


@dataclass
class CostModel:
    """Verify time as a line in the number of rows, ``r(m) = step + per_row (m - 1)`` seconds,
    and the drafter's seconds per proposed token.

    ``step`` and ``per_row`` are the state of a Kalman filter that every timed pass updates:
    a plain round's time reads the step, a drafted round's of m rows the step plus m - 1 rows.
    Between passes the machine's speed drifts (DRIFT_PER_ROUND: both move in proportion,
    since a machine that slows slows every size alike) and the row cost wanders a little
    (ROW_WANDER: the context grows). So a request that drafts every round (a trained head)
    moves the step with its rounds' times, and the row cost stays; the next plain round reads
    the step alone, and through the two's covariance corrects the row cost too.

    Every drafted round, whatever its size, refines the cost of every size. A table of
    running means per size (the first model) kept the sizes a request stopped choosing at
    whatever they last read: one slow timing of a size, or timings from an earlier and shorter
    context (verify rows grow dearer with context on the exact backend: 0.11 of a step per row
    at 80 tokens, 0.22 at 1,000 here), then steered k for the rest of a run, and a table that
    was not monotone chose sizes in gaps (k = 5 without 3 or 4). A weighted line through the
    table's sizes was tried too (5f43078) and inherited the stale sizes. The second model, a
    running mean of plain steps and a forgetting least-squares slope of the time beyond the
    step, left the step where the last plain round put it: a request that drafted nearly
    every round put the machine's drift into the slope (0 to 1.04 ms a row across the
    requests of one run, against ~0.4 ms measured), and `--k auto` for the head fell to 1.001x
    where exact costs give 1.081x (``governor_sim.py --learn --drift 0.12``, the head at 0.43).

    Each timing counts clipped to [1/CLIP, CLIP] times its prediction: one stalled pass (a
    collection, another process) moves the estimates a bounded step.
    """

    step_seconds: float = 0.0  # r(1); 0 until measured
    row_seconds: float = 0.0  # the filter's row cost (``per_row``), never below 0
    # The filter's covariance of (step, row cost), seconds squared.
    var_step: float = 0.0
    cov_step_row: float = 0.0
    var_row: float = 0.0
    has_slope: bool = False  # whether any evidence on the cost of extra rows is in
    draft_seconds_per_token: float = 0.0
    # A pure drafter's proposal costs the same whatever k it is cut to: its time is per
    # proposal (``draft_seconds_per_token`` then stays 0), paid by every round that asks for one.
    per_proposal: bool = False
    draft_seconds_per_proposal: float = 0.0
    # What a drafter with state of its own adds to a drafted round that follows a plain one
    # (catching up on the positions it missed); never for a pure drafter, which has none.
    catch_up_seconds: float = 0.0

    @classmethod
    def line(
        cls, step: float, per_row: float, draft: float = 0.0, per_proposal: bool = False, catch_up: float = 0.0
    ) -> CostModel:
        """A known line: the step as sure as one timing, the row cost to within CALIBRATED_ROW
        of a step (a standard deviation). ``draft``: seconds per drafted token, or per proposal
        where ``per_proposal``; ``catch_up``: seconds a drafted round after a plain one adds (a
        drafter with state only)."""
        if step <= 0 or per_row < 0 or draft < 0 or catch_up < 0:
            raise ValueError(
                f"costs must be positive (step {step}, per row {per_row}, draft {draft}, catch-up {catch_up})"
            )
        return cls(step, per_row, (TIMING_NOISE * step) ** 2, 0.0, (CALIBRATED_ROW * step) ** 2, True)._drafting(
            draft, per_proposal, catch_up
        )

    @classmethod
    def from_timings(
        cls, verify_seconds: dict[int, float], draft: float = 0.0, per_proposal: bool = False, catch_up: float = 0.0
    ) -> CostModel:
        """From verify times by number of rows (a calibration): r(1) and the least-squares
        slope through the other sizes, never below zero; no slope evidence from one size."""
        if 1 not in verify_seconds:
            raise ValueError("the governor needs at least a plain step's time (calibrate first)")
        step = verify_seconds[1]
        xx = sum((m - 1) ** 2 for m in verify_seconds)
        xy = sum((m - 1) * (seconds - step) for m, seconds in verify_seconds.items())
        if xx == 0:  # the row cost unknown: a step's worth of uncertainty
            return cls(step, 0.0, (TIMING_NOISE * step) ** 2, 0.0, step**2)._drafting(draft, per_proposal, catch_up)
        return cls.line(step, max(0.0, xy / xx), draft, per_proposal, catch_up)

    def _drafting(self, seconds: float, per_proposal: bool, catch_up: float = 0.0) -> CostModel:
        if per_proposal and catch_up:
            raise ValueError("a pure drafter (priced per proposal) has no state to catch up")
        self.catch_up_seconds = catch_up
        self.per_proposal = per_proposal
        if per_proposal:
            self.draft_seconds_per_proposal = seconds
        else:
            self.draft_seconds_per_token = seconds
        return self

    @property
    def known(self) -> bool:
        return self.step_seconds > 0

    @property
    def per_row(self) -> float:
        return self.row_seconds

    def verify(self, rows: int) -> float:
        """r(rows), seconds."""
        if not self.known:
            raise ValueError("no verify time measured yet")
        return self.step_seconds + self.per_row * (rows - 1)

    def verify_rows(self, first: int, count: int) -> list[float]:
        """r(first), r(first + 1), ... : ``count`` sizes, as ``verify`` gives each."""
        if not self.known:
            raise ValueError("no verify time measured yet")
        step, per_row = self.step_seconds, self.per_row
        return [step + per_row * (m - 1) for m in range(first, first + count)]

    def observe_verify(self, rows: int, seconds: float) -> None:
        """A pass of ``rows`` rows took ``seconds``: the filter's step (see the class). The row
        cost is kept at 0 or more (a projection onto what a cost can be), so a prediction is
        never below the step."""
        step, row, x = self.step_seconds, self.row_seconds, rows - 1
        # The machine's speed moved since the last pass: step and rows in proportion.
        drift = DRIFT_PER_ROUND**2
        self.var_step += drift * step * step
        self.cov_step_row += drift * step * row
        self.var_row += drift * row * row + (ROW_WANDER * step) ** 2
        predicted = step + row * x
        error = _clipped(seconds, predicted) - predicted
        # Gains of the observation step + x row; (s_step, s_row) is the covariance times H'.
        s_step = self.var_step + x * self.cov_step_row
        s_row = self.cov_step_row + x * self.var_row
        spread = s_step + x * s_row + (TIMING_NOISE * predicted) ** 2
        gain_step, gain_row = s_step / spread, s_row / spread
        self.step_seconds = max(step + gain_step * error, step / CLIP)
        self.row_seconds = max(0.0, row + gain_row * error)
        self.var_step -= gain_step * s_step
        self.cov_step_row -= gain_step * s_row
        self.var_row -= gain_row * s_row
        self.has_slope = self.has_slope or x > 0

    def draft_seconds(self, k: int, after_plain: bool = False) -> float:
        """d(k): drafting k tokens (0: no proposal asked for); ``after_plain``: in a round
        that follows a plain one, the drafter's catch-up included."""
        if k <= 0:
            return 0.0
        if self.per_proposal:
            return self.draft_seconds_per_proposal
        return k * self.draft_seconds_per_token + (self.catch_up_seconds if after_plain else 0.0)

    def observe_draft(
        self, tokens: int, seconds: float, proposed: bool | None = None, after_plain: bool = False
    ) -> None:
        """A round's drafting time: ``tokens`` offered; ``proposed``: whether the drafter was
        asked at all (default: it offered something), which counts for per-proposal costs;
        ``after_plain``: the round followed a plain one (a drafter with state caught up first:
        what its time says beyond the tokens' price is the catch-up). Each time counts clipped
        to [1/CLIP, CLIP] times its prediction, as verify times do: one drafted round that a
        stall held for 6 ms once tripled a head's price per token (0.63 -> 2.01 ms), which
        then priced drafting out for hundreds of rounds."""
        asked = proposed if proposed is not None else tokens > 0
        if self.per_proposal:
            if asked:
                observed = _clipped(seconds, self.draft_seconds_per_proposal)
                self.draft_seconds_per_proposal += COST_EMA * (observed - self.draft_seconds_per_proposal)
        elif after_plain:
            if asked:
                priced = tokens * self.draft_seconds_per_token
                catch_up = _clipped(max(0.0, seconds - priced), self.catch_up_seconds)
                self.catch_up_seconds += COST_EMA * (catch_up - self.catch_up_seconds)
                if tokens > 0 and seconds < priced:
                    # Faster than its tokens' price alone: the price is too high. Only rounds
                    # after drafted ones teach it otherwise, and a governor that a high price
                    # stopped drafts none of them, only probes, which follow plain rounds.
                    per_token = _clipped(seconds / tokens, self.draft_seconds_per_token)
                    self.draft_seconds_per_token += COST_EMA * (per_token - self.draft_seconds_per_token)
        elif tokens > 0:
            per_token = _clipped(seconds / tokens, self.draft_seconds_per_token)
            self.draft_seconds_per_token += COST_EMA * (per_token - self.draft_seconds_per_token)

    def round_steps(self, k: int, after_plain: bool = False) -> float:
        """Cost of a round of k drafts in plain decode steps (``after_plain``: one that follows
        a plain round, the drafter's catch-up included); never below one step."""
        return max(1.0, (self.draft_seconds(k, after_plain) + self.verify(k + 1)) / self.verify(1))


def _clipped(observed: float, predicted: float) -> float:
    """``observed`` clipped to [1/CLIP, CLIP] times ``predicted``; as observed where nothing
    is predicted yet (0)."""
    return min(max(observed, predicted / CLIP), predicted * CLIP) if predicted > 0 else observed


@dataclass(frozen=True)
class Load:
    """The other requests of the next forward pass: their rows, and the tokens they are
    expected to commit in it (their recent tokens per pass)."""

    rows: int = 0
    tokens: float = 0.0


ALONE = Load()


@dataclass
class Decision:
    k: int
    predicted_speedup: float  # over plain decoding; 1.0 for a plain step
    probe: bool = False


class Estimates:
    """Moving acceptance estimates per draft position, for the proposals of one source."""

    def __init__(self, start: Sequence[float] = (), pooled: bool = False) -> None:
        """``pooled``: position 1's start is a memory of earlier requests, pooled with this
        request's rounds (MEMORY_ROUNDS) instead of moved away from by a moving average."""
        if any(not 0.0 <= a <= 1.0 for a in start):
            raise ValueError(f"start acceptances are probabilities, got {list(start)}")
        self.acceptance: list[float] = list(start)  # moving estimate per draft position
        self.observed: list[int] = [0] * len(start)  # rounds that examined each position
        self.first_hits = 0.0  # summed outcomes at position 1 (shadows included)
        self.memory = start[0] if pooled and start else None
        self.recent = (0.0, 0.0)  # position 1: (hits, rounds) of this request, older ones discounted

    def expected(self, k: int) -> list[float]:
        """Acceptance at positions 1..k; a position never examined takes the one before it."""
        known = self.acceptance[:k]
        return known + [known[-1] if known else PRIOR_ACCEPTANCE] * (k - len(known))

    def update(self, i: int, hit: float, weight: float) -> None:
        """Move the estimate at draft position i toward one round's outcome there."""
        if i == len(self.acceptance):
            self.acceptance.append(PRIOR_ACCEPTANCE)
            self.observed.append(0)
        # At position 1, a running mean (the prior counting as one observation) until the
        # moving average would weigh the newest round less: a drafter that never hits is
        # found out in a few rounds instead of the ~1 / ACCEPT_EMA a moving average needs.
        # Only there: every drafted round examines position 1, while a later position
        # judged too harshly on first sight would stop being drafted, and so re-examined.
        self.observed[i] += 1
        if i == 0:
            self.first_hits += hit
            if self.memory is not None:
                hits, rounds = self.recent
                self.recent = (REQUEST_FORGET * hits + hit, REQUEST_FORGET * rounds + 1.0)
                pooled_hits = MEMORY_ROUNDS * self.memory + self.recent[0]
                self.acceptance[0] = pooled_hits / (MEMORY_ROUNDS + self.recent[1])
                return
        step = max(weight, 1.0 / (self.observed[i] + 1)) if i == 0 else weight
        self.acceptance[i] += step * (hit - self.acceptance[i])

    def drift(self, first: int) -> None:
        """Positions from ``first`` on, which a round did not examine, drift up toward the
        one before them: an early low estimate beyond the k in use would otherwise never be
        examined again, and hold k below the best (a position is examined only when the
        chain reaches it)."""
        for i in range(max(1, first), len(self.acceptance)):
            gap = self.acceptance[i - 1] - self.acceptance[i]
            if gap > 0:
                self.acceptance[i] += STALE_DRIFT * gap


class Governor:
    """Per-request: chooses k before each round, observes what the round did.

    A drafter may say what each proposal is based on (``Draft.source``; prompt lookup: the
    length of the n-gram it matched). The governor keeps acceptance estimates per source and
    decides for the source of the proposal in hand (``next_k(source)``): a shadowing engine
    asks its free, pure drafter for the proposal first, then for k. Costs are shared.
    """

    def __init__(
        self,
        k_max: int,
        costs: CostModel,
        adapt_costs: bool = True,
        shadow: bool = False,
        start: Sequence[float] | Mapping[Source, Sequence[float]] = (),
        branching: BranchCalibration | None = None,
        schedule: Backoff | None = None,
        steady: Collection[Source] = (),
    ) -> None:
        """``shadow``: plain rounds will report a shadow draft's acceptance (``observe_shadow``).
        ``start``: acceptance per draft position to start from, per source or for all
        (``AcceptanceMemory.start``); positions it lacks start at the prior. ``branching``:
        the later-child calibration of trees to start from (copied; default the prior).
        ``schedule``: the back-off the last request of this drafter ended in
        (``AcceptanceMemory.schedule``); a probing governor whose start says that no k pays
        even at STAY_GAIN goes on with it instead of starting a back-off of its own (one whose
        start clears STAY_GAIN drafts from its first round, the engine's stretch going on).
        ``steady``: sources whose
        acceptance is the drafter's own rather than the prompt's (a routed drafter's trained
        head, ``steady_sources``): pooled with the memory as a probing governor's are, even
        where this one shadows (see MEMORY_ROUNDS)."""
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max}")
        if not costs.known:
            raise ValueError("the governor needs at least a plain step's time (calibrate first)")
        self.k_max = k_max
        self.costs = copy.deepcopy(costs)
        self.adapt_costs = adapt_costs
        self.shadow = shadow
        starts = dict(start) if isinstance(start, Mapping) else {None: start}
        self.steady = frozenset(steady)
        self.sources: dict[Source, Estimates] = {
            source: Estimates(values, pooled=self._pooled(source)) for source, values in starts.items()
        }
        # A source not seen yet starts where the memory's pooled estimate (key None) does.
        self._default_start = tuple(starts.get(None, ()))
        self.remembered = any(len(values) > 0 for values in starts.values())  # started from a memory
        self.current: Source = None  # the source of the round being decided
        self.backoff = self.first_backoff()
        self.plain_left = 0  # plain rounds left in the current back-off
        self.probing = False
        self.last_was_probe = False
        self.drafting = False  # the last decision drafted (not a probe): STAY_GAIN may apply
        self.plain_by_governor = 0
        self.probes = 0
        self.load = ALONE  # the batch the next round shares a pass with (set by the planner)
        # Whether the last round asked the drafter for a proposal: if not, the next drafted
        # round pays the drafter's catch-up (a request's first round does).
        self.proposed_last = False
        # Later children of trees: taken over predicted (``tree_sizing.BranchCalibration``).
        self.branching = copy.copy(branching) if branching is not None else BranchCalibration()
        self.decisions = 0  # next_k calls
        self._needed_key: tuple[object, ...] | None = None  # ``first_needed``'s cache
        self._needed = math.inf
        self.carried = schedule
        if not shadow and self.remembered and self.k_max > 0:
            if self.best(STAY_GAIN).k > 0:
                # The memory says drafting clears the bar a drafting stretch goes on by: the
                # request goes on with the engine's stretch (STAY_GAIN from its first round)
                # instead of stopping at MIN_GAIN where its first misses dip the estimate.
                self.drafting = True
            elif schedule is not None:
                # Known not to pay: the engine's probes go on at their spacing (PROBE_BUDGET).
                self.backoff = min(max(schedule.length, self.first_backoff()), self.longest_backoff())
                self.plain_left = min(schedule.left, self.backoff)
                self.probing = self.plain_left == 0

    def estimates(self, source: Source = None) -> Estimates:
        if source not in self.sources:
            self.sources[source] = Estimates(self._default_start, pooled=self._pooled(source))
        return self.sources[source]

    def _pooled(self, source: Source) -> bool:
        """Whether ``source``'s position-1 estimate pools the memory with the request's rounds
        (a probing governor's, and a steady source's) rather than following a moving average."""
        return not self.shadow or source in self.steady

    def predicted(self, source: Source = None) -> Decision:
        """``best`` for a proposal from ``source``, asked before deciding (or making) it: a
        routed drafter's planner asks whether its dear drafter's proposal would be drafted
        where the cheap one would not (``RequestPlanner._routed``). Decides nothing and counts
        nothing."""
        current, self.current = self.current, source
        try:
            return self.best()
        finally:
            self.current = current

    def decided(self, source: Source, decision: Decision) -> Decision:
        """A shadowing governor's decision for ``source`` that ``predicted`` gave (nothing has
        changed since), counted as ``next_k`` counts its own: the planner of a routed drafter
        has already weighed the proposal in hand and need not weigh it again."""
        self.current = source
        self.decisions += 1
        self.plain_by_governor += int(decision.k == 0)
        return decision

    def best(self, floor: float = MIN_GAIN) -> Decision:
        """The k with the most predicted tokens per unit time, by the theory; plain (k 0)
        where its predicted speed-up is below ``floor`` (beside a batch: ``batch_floor``)."""
        floor = self.batch_floor(floor)
        plain_round, estimates = Decision(0, 1.0), self.estimates(self.current)
        # A round of k yields at most 1 + k a_1 tokens (every later acceptance is at most 1)
        # and costs at least one step: below the gain even at k_max, no k pays. This is the
        # plain round of a drafter that keeps missing, the one whose bookkeeping must be free.
        # Beside a batch too (``first_needed``): beside 15 requests most rounds stop here (the
        # loop below read the line k_max times for them).
        first = estimates.acceptance[0] if estimates.acceptance else PRIOR_ACCEPTANCE
        if 1.0 + self.k_max * first < floor or first < self.first_needed(floor):
            return plain_round
        # The k that beats plain by the most, or with a floor below 1 (a drafting governor's
        # STAY_GAIN) the one that loses least above it.
        best = Decision(0, min(1.0, floor))
        load = self.load
        plain = self.costs.verify(load.rows + 1)
        tokens = rounds.expected_tokens_by_k(estimates.expected(self.k_max))
        for k, seconds in enumerate(self._round_seconds_by_k(), start=1):
            cost = max(1.0, seconds / plain)
            speed = (load.tokens + tokens[k]) / (load.tokens + 1.0) / cost
            if speed > best.predicted_speedup:
                best = Decision(k, speed)
        return best if best.k > 0 and best.predicted_speedup >= floor else plain_round

    def load_allows_drafting(self, first: float = 1.0) -> bool:
        """Whether some k could pay beside the load were the acceptance at draft position 1
        ``first`` and every later draft accepted (a round yields at most ``1 + k first``
        tokens, ``(S + 1 + k first) / (S + 1)`` of the batch's plain tokens). With ``first``
        1 (every draft accepted): where no k could pay, what a proposal says cannot make the
        round draft, and a shadowing planner does not ask for it. Beside 15 other requests'
        rows on 2 Zen 2 cores no k paid (a 17th row cost 4.7 ms beside a 31 ms pass of 16),
        and the 16 proposals of each pass were 2-3% of its time. With ``first`` the best
        estimate a proposal of this request could be judged by (``first_ceiling``): where no
        k could pay at it, a proposal can only be evidence (``RequestPlanner._asks_beside_load``)."""
        if self.load.rows == 0 or self.k_max == 0:
            return self.k_max > 0
        return first >= self.first_needed(self.batch_floor(MIN_GAIN))

    def batch_floor(self, floor: float) -> float:
        """The speed-up of the batch's plain pass that a round must clear beside the load for
        the request's own to clear ``floor``: 1 + (floor - 1) / (S + 1), S the others' tokens
        (alone, ``floor``). A margin for the noise in the request's estimates, whose effect on
        the batch's speed-up is 1 / (S + 1) of its effect on the request's own: applied to the
        batch whole, MIN_GAIN asked a request beside 15 others for half a token a round beyond
        what its rows cost, and lookup drafted in 1.7% of rounds at 16 clients, 11% with the
        margin scaled (2 Zen 5 cores; 80% of its drafts accepted)."""
        return 1.0 + (floor - 1.0) / (self.load.tokens + 1.0)

    def first_needed(self, floor: float = MIN_GAIN) -> float:
        """The least acceptance a_1 at draft position 1 with which some k could clear
        ``floor`` beside the load, a round yielding at most 1 + k a_1 tokens (every later
        draft accepted): with S the others' tokens and c_k the round's cost in the batch's
        plain passes (``best``'s prices), k pays at most (S + 1 + k a_1) / ((S + 1) c_k), so
        a_1 >= (S + 1) (floor c_k - 1) / k. The bound is a ratio of two lines in k, monotone,
        so k = 1 or k_max needs the least. Inf where k_max is 0. Kept until the load, the
        floor or the costs change (they are its key): a governed round beside a load may read
        it two or three times (its bound checks took ~2 us each)."""
        costs = self.costs
        key = (
            self.load,
            floor,
            self.proposed_last,
            costs.step_seconds,
            costs.row_seconds,
            costs.draft_seconds_per_token,
            costs.draft_seconds_per_proposal,
            costs.catch_up_seconds,
        )
        if key == self._needed_key:
            return self._needed
        needed = math.inf
        if self.k_max > 0:
            load = self.load
            plain = costs.verify(load.rows + 1)
            for k in (1, self.k_max):
                cost = max(1.0, (self._drafting_seconds(k) + costs.verify(load.rows + 1 + k)) / plain)
                needed = min(needed, (load.tokens + 1.0) * (floor * cost - 1.0) / k)
        self._needed_key, self._needed = key, needed
        return needed

    def first_ceiling(self) -> float:
        """The highest acceptance at draft position 1 that the next proposal could be judged
        by, whatever its source: the best of the sources' estimates, and the start of a source
        not seen yet (``best`` reads the proposal's own)."""
        ceiling = self._default_start[0] if self._default_start else PRIOR_ACCEPTANCE
        for estimates in self.sources.values():
            if estimates.acceptance and estimates.acceptance[0] > ceiling:
                ceiling = estimates.acceptance[0]
        return ceiling

    def _round_seconds_by_k(self) -> list[float]:
        """``_round_seconds(k)`` for k = 1..k_max, the costs' line read once: every round of a
        governed request prices them, and ``best`` took 26 us a decision reading it for each
        k (13 us now, the same floats)."""
        verify = self.costs.verify_rows(self.load.rows + 2, self.k_max)
        return [self._drafting_seconds(k) + v for k, v in enumerate(verify, start=1)]

    def _drafting_seconds(self, k: int) -> float:
        """What drafting k tokens adds to a round (see ``_round_seconds``)."""
        if self.shadow:
            return k * self.costs.draft_seconds_per_token
        return self.costs.draft_seconds(k, after_plain=not (self.proposed_last or self.remembered))

    def _round_seconds(self, k: int, rows: int | None = None) -> float:
        """A round of k drafts in this batch. ``best`` decides after a plain round only at a
        request's start. Started from a memory, it prices the round as a stretch of drafted
        rounds costs it: without the catch-up, which the stretch pays once (priced with it, a
        head's k 1 round cost 1.8 plain steps instead of 1.3, and no drafter short of ~0.86 at
        position 1 drafted before its first probe, tens of rounds in). Started from the prior,
        a stretch may end at its first round, so that round carries the catch-up. A shadowing
        governor decides with the proposal in hand: its time is spent whatever k is. ``rows``:
        the drafted rows verified where they are not the k drafted (a tree: k positions drafted,
        ``rows`` nodes)."""
        return self._drafting_seconds(k) + self.costs.verify(self.load.rows + 1 + (k if rows is None else rows))

    @staticmethod
    def shadow_rate(costs: CostModel) -> float:
        """The share of plain rounds in which a pure drafter's proposal is asked for as a
        shadow: all where a proposal costs at most SHADOW_MAX_COST of a plain step, fewer
        where it costs more, so that shadows cost that share of the plain steps; 0 (probe
        instead) where that would be below SHADOW_MIN_RATE."""
        draft = costs.draft_seconds(1)
        rate = 1.0 if draft <= 0.0 else min(1.0, SHADOW_MAX_COST * costs.verify(1) / draft)
        return rate if rate >= SHADOW_MIN_RATE else 0.0

    @staticmethod
    def can_shadow(costs: CostModel) -> bool:
        """Whether proposals are cheap enough to ask for in plain rounds (``shadow_rate``)."""
        return Governor.shadow_rate(costs) > 0.0

    def next_k(self, source: Source = None) -> Decision:
        """k for the next round, whose proposal comes from ``source``."""
        if self.shadow:  # fresh evidence every round: no back-off, no probes
            self.current = source
            return self.decided(source, self.best())
        self.current = source
        self.decisions += 1
        was_drafting, self.drafting = self.drafting, False
        if self.plain_left > 0:
            self.plain_left -= 1
            self.plain_by_governor += 1
            if self.plain_left == 0:
                self.probing = True
            return Decision(0, 1.0)
        if self.probing:
            self.probing = False
            self.last_was_probe = True
            self.probes += 1
            return Decision(min(PROBE_K, self.k_max), 0.0, probe=True)
        pooled = self.estimates(source).memory is not None
        decision = self.best(STAY_GAIN if was_drafting and pooled else MIN_GAIN)
        self.drafting = decision.k > 0
        if decision.k == 0 and self.k_max > 0:
            # Nothing pays: decode plainly for a while, then probe again.
            self.plain_left = self.backoff - 1
            self.backoff = min(2 * self.backoff, self.longest_backoff())
            self.plain_by_governor += 1
            if self.plain_left == 0:
                self.probing = True
        elif decision.k > 0:
            self.backoff = self.first_backoff()
        return decision

    def plain_for(self, source: Source = None) -> Decision:
        """A plain round whose proposal, from ``source``, is a shadow only: no k could pay at
        the best estimate any proposal could be judged by (``first_ceiling``), so nothing is
        weighed. Counted as ``next_k`` counts a plain decision."""
        self.current = source
        self.decisions += 1
        self.plain_by_governor += 1
        return Decision(0, 1.0)

    def tree(
        self, parents: Sequence[int], frequencies: Sequence[float], source: Source = None, drafted: int | None = None
    ) -> TreeChoice:
        """Which nodes of a proposed tree the next round verifies (``verispec.tree_sizing``):
        the main chain valued by this source's acceptance per position, as ``best`` values a
        chain; the alternatives by the drafter's frequencies and the measured later-child
        scale; the set with the most predicted tokens per second, priced as ``best`` prices
        rows. Empty: a plain round, or for a probing governor the chain it chose.

        A shadowing governor sizes the proposal in hand. A probing one sizes the tree a
        drafter proposed for the k that ``next_k`` chose: ``drafted`` is the positions it
        drafted for it (a trained head: one call each, its alternatives read from the same
        call), their cost the same whichever nodes are verified."""
        self.current = source
        estimates = self.estimates(source)
        chances = node_chances(parents, frequencies, estimates.expected(max(depths(parents))), self.branching.scale)
        plain = self.costs.verify(self.load.rows + 1)

        def steps(n: int) -> float:
            return max(1.0, self._round_seconds(n if drafted is None else drafted, rows=n) / plain)

        choice = best_nodes(chances, steps, len(parents), self.load.tokens, self.batch_floor(MIN_GAIN))
        self.plain_by_governor += int(self.shadow and not choice.nodes)
        return choice

    def observe_tree(
        self,
        parents: Sequence[int],
        frequencies: Sequence[float],
        offered: Sequence[int],
        path: Sequence[int],
        draft_seconds: float,
        verify_seconds: float,
        rows: int | None = None,
        first_chance: float | None = None,
        proposed: bool | None = None,
        drafted: int | None = None,
        timed: bool = True,
    ) -> None:
        """What a round that verified the nodes ``offered`` of the proposed tree ``parents``
        did: ``path`` its accepted nodes, root to leaf (in the tree's numbering). Each position
        the rule examined updates the source's acceptance there (taking the first child is a
        hit, as a chain's draft would be); where the round left position 1's first child out,
        ``first_chance`` (the rule's chance of accepting it there, from the target's own row,
        as a shadow draft's) stands in, and deeper such positions are left to drift. Each
        branching with later children on offer and the first child not taken updates the
        later-child scale. ``drafted``: the positions the drafter ran for the tree, where it
        is priced per drafted token (default: the nodes offered); ``timed``: as for ``observe``."""
        outcome = tree_outcome(parents, frequencies, path, offered)
        estimates = self.estimates(self.current)
        for i, hit in enumerate(outcome.first_hits):
            if hit is None and i == 0:
                hit = first_chance
            if hit is not None:
                estimates.update(i, hit, ACCEPT_EMA)
        estimates.drift(len(outcome.first_hits))
        for share, taken in outcome.later_offers:
            self.branching.observe(share, taken)
        self._observe_costs(len(offered), draft_seconds, verify_seconds, rows, proposed, drafted, timed)

    def _observe_costs(
        self,
        offered: int,
        draft_seconds: float,
        verify_seconds: float,
        rows: int | None,
        proposed: bool | None,
        drafted: int | None = None,
        timed: bool = True,
    ) -> None:
        after_plain = not self.proposed_last
        self.proposed_last = proposed if proposed is not None else offered > 0
        if self.adapt_costs:
            if timed:
                self.costs.observe_verify(offered + 1 if rows is None else rows, verify_seconds)
            self.costs.observe_draft(offered if drafted is None else drafted, draft_seconds, proposed, after_plain)

    def probe_extra_steps(self) -> float:
        """What a probe costs beyond the plain step it replaces, in plain steps (a probe
        follows plain rounds: the drafter's catch-up included)."""
        return self.costs.round_steps(min(PROBE_K, self.k_max), after_plain=True) - 1.0 if self.k_max > 0 else 0.0

    def first_backoff(self) -> int:
        """FIRST_BACKOFF, or longer where a probe is dear: <= FIRST_PROBE_BUDGET of plain."""
        return max(FIRST_BACKOFF, math.ceil(self.probe_extra_steps() / FIRST_PROBE_BUDGET))

    def longest_backoff(self) -> int:
        """MAX_BACKOFF, or longer where a probe is dear: probes cost <= PROBE_BUDGET of plain."""
        return max(MAX_BACKOFF, math.ceil(self.probe_extra_steps() / PROBE_BUDGET))  # >= first_backoff()

    def observe(
        self,
        offered: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        rows: int | None = None,
        proposed: bool | None = None,
        timed: bool = True,
    ) -> None:
        """What the round did: drafts offered (from the source ``next_k`` was given), the
        accepted prefix, and its timings; ``rows``: of the verify pass, where other requests
        shared it (default: the round's own, offered + 1); ``proposed``: whether the drafter
        was asked (default: it offered something; a shadowing plain round asked it too);
        ``timed`` False: the pass's time says nothing of its rows' cost (it also read other
        requests' prompt chunks, rows of another kind), so only the drafting time counts."""
        if self.last_was_probe and offered == 0:
            # The drafter had nothing to offer: a plain step that examined nothing. The
            # probe is still due, and the back-off must not grow on no evidence.
            self.probes -= 1
            self.probing = True
            self.last_was_probe = False
        # A probe's hits reset the back-off only through the next decision: if they make
        # drafting pay, that round drafts (``next_k``). A drafter right half the time that
        # still does not pay hits in most probes; resetting on any hit probed it every 4 rounds.
        weight = PROBE_EMA if self.last_was_probe else ACCEPT_EMA
        self.last_was_probe = False
        # Positions up to the first rejection were examined; later ones never were.
        estimates = self.estimates(self.current)
        for i in range(min(accepted + 1, offered)):
            estimates.update(i, 1.0 if i < accepted else 0.0, weight)
        estimates.drift(min(accepted + 1, offered))
        self._observe_costs(offered, draft_seconds, verify_seconds, rows, proposed, timed=timed)

    def schedule(self) -> Backoff | None:
        """The back-off this request is in (for the next request of the drafter), or None
        where it was drafting or never backed off; the one it started with if it decided no
        round."""
        if self.decisions == 0:
            return self.carried
        if self.shadow or self.drafting:
            return None
        if self.plain_left > 0 or self.probing:
            return Backoff(self.backoff, self.plain_left)
        if self.k_max > 0:  # ended on a probe: the next decision would back off for as long again
            return Backoff(min(2 * self.backoff, self.longest_backoff()), self.backoff)
        return None

    def observe_shadow(self, acceptance: float, source: Source | _Current = CURRENT) -> None:
        """A shadow draft (from the current source, or ``source``): the probability in [0, 1]
        that the rule would have accepted it at position 1 (at greedy, 1 if it is the target's
        token, else 0). A plain round's proposal, or one a routed drafter's round set aside
        for its dear drafter's (``RequestPlanner._routed``)."""
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"a shadow acceptance is a probability, got {acceptance}")
        self.estimates(self.current if isinstance(source, _Current) else source).update(0, acceptance, ACCEPT_EMA)


@dataclass
class AcceptanceMemory:
    """A drafter's acceptance at draft position 1 over recent requests, pooled and per source
    (an engine keeps one per drafter): the next request's governor starts from ``start()``.

    Position 1 only: every drafted or shadowed round examines it, so it is well measured, and
    it is what says whether the drafter is right at all. Later positions are examined only in
    long drafted rounds, and their acceptance belongs to the prompt (how long its repeats
    run): carried over, they held k below the best fixed k on the next prompt (replay of the
    65 dev prompts: auto / best fixed k fell to 0.96 in math_reasoning and summarization with
    every position carried, 0.98 with position 1 only, as without any memory). A source the
    memory has not seen starts from the pooled estimate.
    """

    first: float | None = None  # pooled over sources
    by_source: dict[Source, float] = field(default_factory=dict)  # sources other than None
    requests: int = 0
    schedule: Backoff | None = None  # the back-off the last request ended in (``Backoff``)
    # The position-1 rounds behind ``first`` and each source's estimate, discounted by half per
    # MEMORY_HALF_LIFE rounds examined since (``_pool_rate``); a rate given without them (0) is
    # replaced by the next request's.
    rounds: float = 0.0
    source_rounds: dict[Source, float] = field(default_factory=dict)

    def start(self) -> dict[Source, list[float]]:
        """Per source the position-1 acceptance to start from; key None: the pooled one."""
        if self.first is None:
            return {}
        return {None: [self.first], **{source: [a] for source, a in self.by_source.items()}}

    def learn(self, governor: Governor) -> None:
        """Move toward the acceptance a finished request observed at position 1."""
        self.schedule = governor.schedule()
        examined = {s: e for s, e in governor.sources.items() if e.observed and e.observed[0] > 0}
        if not examined:
            return  # nothing examined: keep what earlier requests said
        hits = sum(e.first_hits for e in examined.values())
        rounds = sum(e.observed[0] for e in examined.values())
        rate = hits / rounds
        if self.first is not None and rate > self.first:
            # Hits above what the memory expected: the drafter may have started to pay, so
            # the next request backs off afresh (from FIRST_BACKOFF's period): a workload that
            # turned from always wrong to right 90% of the time drafted again ~70 rounds sooner.
            self.schedule = None
        self.first, self.rounds = _pool_rate(self.first, self.rounds, hits, rounds)
        for source, e in examined.items():
            if source is not None:  # a drafter without sources: the pooled estimate is its own
                old, behind = self.by_source.get(source), self.source_rounds.get(source, 0.0)
                pooled = _pool_rate(old, behind, e.first_hits, e.observed[0])
                self.by_source[source], self.source_rounds[source] = pooled
        self.requests += 1


def _pool_rate(old: float | None, behind: float, hits: float, rounds: float) -> tuple[float, float]:
    """The memory's rate ``old`` (resting on ``behind`` rounds) pooled with a request's
    ``hits`` in ``rounds``, the memory's rounds discounted by half per MEMORY_HALF_LIFE rounds
    examined since: (the new rate, the rounds it rests on). The memory rests on at most ~1.44
    MEMORY_HALF_LIFE rounds, however thin the requests. A request whose rate is more than
    MEMORY_SHIFT standard errors from the memory's (a binomial test on its rounds) says the
    workload changed: the memory's rounds then weigh at most as much as the request's."""
    if old is None:
        return hits / rounds, rounds
    kept = behind * 0.5 ** (rounds / MEMORY_HALF_LIFE)
    p = min(max(old, SHIFT_FLOOR), 1.0 - SHIFT_FLOOR)
    if abs(hits / rounds - old) > MEMORY_SHIFT * math.sqrt(p * (1.0 - p) / rounds):
        kept = min(kept, rounds)
    return (kept * old + hits) / (kept + rounds), kept + rounds
