"""The round planner: what the next round drafts, and what the engine learns from each round.

One object decides every round, whatever the request asked for:

- a fixed k: up to k drafts a round (fewer where the room left or the drafter says so);
- ``k="auto"``: the economics governor (``verispec.governor``) picks 0..k_max before each
  round from the measured costs and acceptance;
- shadow drafts: a governed drafter whose proposals are pure and nearly free proposes first,
  the governor decides for the proposal in hand, and a plain round's first proposed token is
  scored against the target's own row instead of verified.

``Planner`` is held by an engine and keeps, per drafter, the round costs as calibrated
(frozen, for reproducible sampled requests), as refined by later requests (live), and the
acceptance memory and trees' later-child calibration the next request's governor starts
from. ``Planner.begin`` gives a request its ``RequestPlanner``: ``plan(context, room, rng)
-> Plan(k, draft, shadow)`` before the verify pass, ``observe(...)`` after it;
``Planner.finish`` folds a finished request back in.
The engine's rounds and the benchmark's replay (``verispec.bench.replay``) run this same
object, so what a replay judges is what the engine does.

The planner only decides how many tokens are drafted: the acceptance rule, and so the output
distribution, is untouched (verifying any prefix of a proposal is lossless: the cut depends
on the drafter's side alone).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from verispec.accept import ChainResult, accept_chain_rows, accept_greedy, acceptance_probability
from verispec.accept_tree import TreeResult, accept_tree, accept_tree_greedy, accept_tree_rows
from verispec.drafters.base import NO_DRAFT, Draft, Drafter
from verispec.drafters.none import NoDrafter
from verispec.governor import (
    ALONE,
    PROBE_K,
    SHADOW_FREE_MISSES,
    SHADOW_MIN_RATE,
    AcceptanceMemory,
    CostModel,
    Decision,
    Governor,
    Load,
)
from verispec.sampling import SamplingParams, final_distributions, final_rows, final_tokens
from verispec.stats import RequestStats
from verispec.targets.base import Target
from verispec.tree_sizing import BranchCalibration

AUTO = "auto"
DEFAULT_K_MAX = 8  # the most drafts per round ``k="auto"`` may choose
CALIBRATION_REPEATS = 5  # timed verify passes per row count (and proposals) when calibrating costs
# Beside a load where a proposal can be evidence only, the plain rounds after one that asked
# the drafter and ask nothing: one proposal in 1 / SHADOW_MIN_RATE rounds, the rate at which a
# dear drafter's shadows go on alone (``RequestPlanner._asks_beside_load``).
LOAD_REST_ROUNDS = round(1 / SHADOW_MIN_RATE) - 1

# Calibrates a drafter's costs for rounds of up to the given number of drafts.
Calibrate = Callable[[int], CostModel]
# The probability that the rule accepts a draft's first token at a round's first position.
ShadowAcceptance = Callable[[Draft], float]


@dataclass(frozen=True)
class Plan:
    """One round's decision. ``k``: the drafts chosen (0: a plain round); ``draft``: what is
    verified (at most k tokens, fewer when the drafter offered fewer); ``shadow``: in a plain
    round of a shadowing governor, the first token the drafter proposed anyway, never verified
    (NO_DRAFT otherwise)."""

    k: int
    draft: Draft
    shadow: Draft = NO_DRAFT


PLAIN = Plan(0, NO_DRAFT)


class RequestPlanner:
    """One request's rounds: a fixed k, or a governor (``governor`` is None for a fixed k).
    Records its decisions in the request's ``stats``."""

    def __init__(self, drafter: Drafter, stats: RequestStats, fixed_k: int = 0, governor: Governor | None = None):
        self.drafter = drafter
        self.stats = stats
        self.fixed_k = fixed_k
        self.governor = governor
        self._routes = routed(drafter)  # decided once: the drafter is the request's for its whole life
        self._shadow = NO_DRAFT  # the last plan's shadow draft
        # A routed drafter's cheap proposal set aside for its dear one (``_routed``): its first
        # token is scored as a shadow for its own source, whatever the round does.
        self._set_aside = NO_DRAFT
        self._proposed = False  # whether the last plan asked the drafter for a proposal
        # A shadowing governor's plain rounds: whether the last plan was one, and the credit
        # for shadow proposals (in proposals; each plain round earns ``Governor.shadow_rate``).
        self._after_plain = False
        self._shadow_credit = 0.0
        self._shadow_misses = 0  # plain rounds in a row whose proposal was empty or wrong
        self._resting = 0  # plain rounds left beside a load that ask nothing (``_asks_beside_load``)
        # The last plan's proposed tree and the nodes it verifies, where a governor sized one.
        # With it, the positions a probing drafter drafted for the tree (None: shadowing).
        self._tree: tuple[Draft, list[int], int | None] | None = None
        # Whether the rounds' verify passes take trees (the engine clears it where they do not:
        # a scheduler's shared passes); without, a proposed tree is decided as its main chain.
        self.trees = True

    def plan(self, context: Sequence[int], room: int, rng: np.random.Generator, load: Load = ALONE) -> Plan:
        """The next round after ``context``, which has room for ``room`` more tokens (a round
        commits up to its drafts + 1); ``load``: the other requests sharing its forward pass
        (ignored by a reproducible request, whose k schedule must not depend on its neighbours)."""
        governor, drafter = self.governor, self.drafter
        self._tree = None
        self._proposed = False
        self._set_aside = NO_DRAFT
        # Beside a load, "evidence": the proposal is asked for its shadow only (``_asks_beside_load``).
        ask: Literal["decide", "evidence", "no"] = "decide"
        if governor is not None and governor.adapt_costs:
            governor.load = load
        width = branches(drafter) if self.trees else 1
        if governor is None:
            k = min(self.fixed_k, room - 1)
            # k counts nodes: a drafter that offers several candidates a position drafts the
            # positions its first k nodes need.
            plan = Plan(k, prefix(drafted(drafter, context, -(-k // width), rng, width > 1), k))
        elif governor.shadow and self._resting and governor.load.rows:
            # Resting beside a load (below): a plain round that neither asks nor decides.
            self._resting -= 1
            plan = self._plain_by_load(governor)
        elif governor.shadow and governor.load.rows and (ask := self._asks_beside_load(governor)) == "no":
            plan = self._plain_by_load(governor)
        elif governor.shadow and not self._shadow_due(governor, context, min(governor.k_max, room - 1)):
            # Plain, and a shadow now would cost more than SHADOW_MAX_COST of the plain steps:
            # a plain round that does not ask the drafter.
            governor.plain_by_governor += 1
            self.stats.observe_choice(0, False, governed=True)
            plan = Plan(0, NO_DRAFT)
        elif governor.shadow:
            # The drafter is pure and cheap: its proposal comes first, so the governor decides
            # knowing what it is based on (``Draft.source``).
            weighed: Decision | None = None  # a routed proposal's decision, made in choosing it
            if ask == "decide" and self._routes:
                offer, weighed = self._routed(governor, context, min(governor.k_max, room - 1), rng)
            else:
                offer = drafter.propose(context, min(governor.k_max, room - 1), rng)
            self._proposed = True
            offer = offer if self.trees else offer.main_chain()
            if offer.is_tree and offer.frequencies is not None:
                assert offer.parents is not None
                nodes = governor.tree(offer.parents, offer.frequencies, offer.source).nodes
                self.stats.observe_choice(len(nodes), False, governed=True)
                plan = Plan(len(nodes), offer.select(nodes), NO_DRAFT if nodes else prefix(offer, 1))
                if nodes:
                    self._tree = (offer, nodes, None)
            else:
                if not offer.tokens:
                    choice = Decision(0, 1.0)
                elif ask == "evidence":  # no k can pay at its estimate: nothing to decide
                    choice = governor.plain_for(offer.source)
                elif weighed is not None:
                    choice = governor.decided(offer.source, weighed)
                else:
                    choice = governor.next_k(offer.source)
                self.stats.observe_choice(choice.k, False, governed=bool(offer.tokens))
                shadow = prefix(offer, 1) if choice.k == 0 else NO_DRAFT
                plan = Plan(choice.k, prefix(offer, choice.k), shadow)
        else:
            choice = governor.next_k()
            k = min(choice.k, room - 1)
            # A drafter that offers several candidates a position (a trained head's
            # ``branches``) is asked for its tree of k positions, which the governor sizes: its
            # alternatives cost verify rows only. A probe measures the chain of k.
            draft = drafted(drafter, context, k, rng, width > 1 and not choice.probe)
            if draft.is_tree and draft.frequencies is not None:
                assert draft.parents is not None
                chain = draft.main_chain()
                nodes = governor.tree(draft.parents, draft.frequencies, draft.source, len(chain.tokens)).nodes
                if nodes:
                    self._tree = (draft, nodes, len(chain.tokens))
                draft = draft.select(nodes) if nodes else chain
            else:
                draft = prefix(draft.main_chain(), k)
            self._proposed = k > 0
            # A probe the drafter left empty examined nothing.
            self.stats.observe_choice(choice.k, choice.probe and bool(draft.tokens))
            plan = Plan(len(draft.tokens) if self._tree is not None else k, draft)
        self._shadow = plan.shadow
        self._after_plain = plan.k == 0
        if plan.k > 0:
            self._shadow_misses = 0
        elif self._proposed and not plan.shadow.tokens:
            self._shadow_misses += 1  # asked, and nothing to offer
        return plan

    def _routed(
        self, governor: Governor, context: Sequence[int], k: int, rng: np.random.Generator
    ) -> tuple[Draft, Decision | None]:
        """A routed drafter's proposal for a governed round, and the governor's decision for it
        where weighing it already made one (``Governor.predicted``; None: not weighed): the one
        its routing makes, or its dear one where that was its cheap one and the governor would
        draft the dear one and not the cheap one.

        The hybrid routes by what a proposal is based on (a strong suffix match); the governor
        knows how often each source was right in this request. A cheap proposal it would not
        draft left the round plain, where the trained head might pay (one pass over 26 dev
        prompts, greedy: 183 governed plain rounds in 1,602, 79 of them on suffix proposals and
        104 on the head's, whose moving average kept dipping below break-even; with this and
        the head's estimate pooled (``steady_sources``), 9 in 1,536). The choice reads estimates of
        earlier rounds only, never this round's draws, so the round's draft is distributed as
        the row it reports and the output stays the target's. The cheap proposal set aside has
        its first token scored as a shadow for its own source."""
        drafter: Any = self.drafter
        offer: Draft = drafter.propose(context, k, rng)
        dear = drafter.fallback_source
        if not offer.tokens or offer.source == dear:
            return offer, None
        kept = governor.predicted(offer.source)
        if kept.k > 0:
            return offer, kept
        instead = governor.predicted(dear)
        if instead.k == 0:
            return offer, kept
        other: Draft = drafter.propose_fallback(context, k, rng)
        if not other.tokens:
            return offer, kept
        self._set_aside = prefix(offer, 1)
        return other, instead

    def _plain_by_load(self, governor: Governor) -> Plan:
        governor.plain_by_governor += 1
        self.stats.observe_choice(0, False, governed=True)
        self.stats.governor_plain_by_load += 1
        return PLAIN

    def _asks_beside_load(self, governor: Governor) -> Literal["decide", "evidence", "no"]:
        """Beside a load, whether a shadowing governor's round asks the drafter: "decide" (for
        a proposal the governor decides on), "evidence" (for its shadow only) or "no".

        - Some k could pay at the best estimate a proposal could be judged by
          (``first_ceiling``): it decides, as alone.
        - None could even with every draft accepted: it does not ask, and neither do the next
          LOAD_REST_ROUNDS rounds (a proposal could not make them draft, and its shadow would
          refine an estimate unused here).
        - In between, a proposal is evidence only: its round stays plain whatever it says,
          and the governor is not consulted. Its round's Python is paid by the whole batch
          (beside 15 requests a proposal with its decision and shadow took ~25 us of a ~14 ms
          pass on 2 Zen 5 cores, 16 of them ~3%). It is asked, and the next LOAD_REST_ROUNDS
          rounds rest (ask and decide nothing), right shadow or not: each right one raises the
          estimate until the governor decides. Ending the rest at every right shadow asked in
          a third of the rounds at 16 clients (lookup 1.010x of plain against 1.027x, 4 pairs;
          at 4 clients 0.997x against 1.020x).
        """
        if governor.load_allows_drafting(governor.first_ceiling()):
            return "decide"
        self._resting = LOAD_REST_ROUNDS
        return "evidence" if governor.load_allows_drafting() else "no"  # the bar is cached

    def _shadow_due(self, governor: Governor, context: Sequence[int], k: int) -> bool:
        """Whether a shadowing governor's round asks the drafter: always after a drafted round
        (the proposal is what it drafts from) and within SHADOW_FREE_MISSES plain rounds of
        one or of a right shadow (where drafting resumes), always where a routed drafter's next
        proposal is its cheap one (``routed``), else as the credit allows."""
        if not self._after_plain or self._shadow_misses < SHADOW_FREE_MISSES:
            return True
        if self._routes and self.drafter.cheap_next(context, k):  # type: ignore[attr-defined]
            return True
        # Chosen at the request's start, shadows go on at least every 1 / SHADOW_MIN_RATE plain
        # rounds: a shadowing governor has no probes, only its shadows can turn drafting on.
        rate = max(Governor.shadow_rate(governor.costs), SHADOW_MIN_RATE)
        self._shadow_credit += rate  # stays below 2: spent at 1
        if self._shadow_credit < 1.0 - 1e-9:
            return False
        self._shadow_credit -= 1.0
        return True

    def observe(
        self,
        offered: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        shadow_acceptance: ShadowAcceptance | None = None,
        verify_rows: int | None = None,
        path: Sequence[int] | None = None,
        timed: bool = True,
    ) -> None:
        """What the planned round did: the drafts verified, the prefix the rule accepted (its
        own verdict, not the committed count: a stop inside the kept prefix says nothing about
        the drafter), the timings, and, needed when the plan had a shadow draft, how likely the
        rule would have accepted a draft's first token at the round's first position;
        ``verify_rows``: the rows of a verify pass shared with other requests; ``path``: where
        the round verified the planned tree, its accepted nodes (``offered`` is then its depth);
        ``timed`` False: the pass's time does not price its rows (it read prompt chunks too)."""
        governor = self.governor
        if governor is None:
            return
        if self._tree is not None:
            tree, nodes, drafted = self._tree
            assert tree.parents is not None and tree.frequencies is not None
            # The verified nodes' path in the tree's numbering (a chain of them: its prefix).
            kept = [nodes[i] for i in path] if path is not None else nodes[:accepted]
            chance = None  # node 0, the root's first child, left out: its chance from the row
            if nodes[0] != 0 and shadow_acceptance is not None:
                chance = shadow_acceptance(tree.select([0]))
            governor.observe_tree(
                tree.parents,
                tree.frequencies,
                nodes,
                kept,
                draft_seconds,
                verify_seconds,
                verify_rows,
                chance,
                self._proposed,
                drafted,
                timed,
            )
        else:
            governor.observe(offered, accepted, draft_seconds, verify_seconds, verify_rows, self._proposed, timed)
        if self._shadow.tokens:
            if shadow_acceptance is None:
                raise ValueError("a round with a shadow draft needs its acceptance at the first position")
            self.stats.governor_shadow_drafts += 1
            chance = shadow_acceptance(self._shadow)
            governor.observe_shadow(chance)
            self._shadow_misses = 0 if chance >= 0.5 else self._shadow_misses + 1
        if self._set_aside.tokens:
            if shadow_acceptance is None:
                raise ValueError("a round that set a proposal aside needs its acceptance at the first position")
            governor.observe_shadow(shadow_acceptance(self._set_aside), self._set_aside.source)


class Planner:
    """Per engine: each drafter's calibrated and live costs and acceptance memory.

    ``shadows`` False keeps every governor to back-off and probes (an ablation for replays)."""

    def __init__(self, shadows: bool = True) -> None:
        self.shadows = shadows
        self.calibrated: dict[str, CostModel] = {}
        self.live: dict[str, CostModel] = {}
        self.acceptance: dict[str, AcceptanceMemory] = {}
        self.branching: dict[str, BranchCalibration] = {}  # trees' later-child scale, carried

    def begin(
        self,
        drafter: Drafter,
        stats: RequestStats,
        calibrate: Calibrate,
        k: int | str = AUTO,
        k_max: int = DEFAULT_K_MAX,
        reproducible: bool = False,
    ) -> RequestPlanner:
        """A request's planner. ``calibrate`` is called when the drafter's costs are not known
        yet (with the most drafts a round may have); ``reproducible``: a seeded sampled request,
        whose k schedule must not depend on timing noise or on earlier requests, so it starts
        from the costs as calibrated and the prior, and changes neither."""
        name = drafter.name
        if isinstance(drafter, NoDrafter):
            k = 0  # plain decoding: nothing to govern (its rounds skip the governor's ~50 us)
        limit = k_max if k == AUTO else int(k)
        calibrated = self.calibrated.get(name)
        # The line through the calibration extrapolates to any k, but needs two sizes.
        if calibrated is None or (limit > 0 and not calibrated.has_slope):
            calibrated = self.calibrated[name] = calibrate(limit)
            self.live[name] = copy.deepcopy(calibrated)
        live = self.live[name]
        stats.reference_step_seconds = live.verify(1)
        if k != AUTO:
            return RequestPlanner(drafter, stats, fixed_k=limit)
        costs = calibrated if reproducible else live
        memory = AcceptanceMemory() if reproducible else self.acceptance.setdefault(name, AcceptanceMemory())
        start = memory.start()
        # Shadow drafts only from a drafter that declares its proposals pure (``propose`` changes
        # nothing the next round sees), and only while they are cheap (``Governor.shadow_rate``).
        # A routed drafter (``hybrid``) shadows whatever its proposals cost on average: its
        # cheap ones are asked every round, its dear ones as the shadow budget allows.
        shadow = self.shadows and drafter.pure_proposals and (Governor.can_shadow(costs) or routed(drafter))
        branching = None if reproducible else self.branching.get(name)
        # A back-off carried over from the last request only for a drafter whose acceptance is
        # its own (a trained head, a draft model); a pure drafter's belongs to the prompt (what
        # repeats, what the cache holds), so each request looks afresh.
        schedule = None if drafter.pure_proposals else memory.schedule
        # A routed drafter's dear sources (a trained head's) have an acceptance of their own.
        steady = getattr(drafter, "steady_sources", ())
        governor = Governor(limit, costs, not reproducible, shadow, start, branching, schedule, steady)
        stats.governor_start_acceptance = start[None][0] if start else None
        return RequestPlanner(drafter, stats, governor=governor)

    def finish(self, request: RequestPlanner) -> None:
        """A finished request refines its drafter's costs and acceptance memory (unless it is
        reproducible, which must leave them as they were)."""
        governor = request.governor
        if governor is not None and governor.adapt_costs:
            self.live[request.drafter.name] = governor.costs
            self.acceptance[request.drafter.name].learn(governor)
            self.branching[request.drafter.name] = governor.branching


def routed(drafter: Drafter) -> bool:
    """Whether ``drafter`` routes each proposal to a cheap or a dear drafter and says which
    comes next (``cheap_next(context, k)``, pure: the ``hybrid`` drafter's), and makes its
    dear one on demand (``propose_fallback(context, k, rng)``, of source ``fallback_source``,
    pure) for a governor that overrides the routing (``RequestPlanner._routed``)."""
    return callable(getattr(drafter, "cheap_next", None)) and callable(getattr(drafter, "propose_fallback", None))


def calibrate(
    target: Target,
    drafter: Drafter,
    context: Sequence[int],
    prompt_tokens: int,
    params: SamplingParams,
    k_max: int,
) -> CostModel:
    """Time verify passes of 1..k_max + 1 rows on the pending token (``context[-1]``, not yet
    in the target's cache), and the drafter's proposals (per token, or per proposal for a
    pure drafter, whose proposal costs the same whatever k; for a drafter that reads the
    target's states, also its catch-up after plain rounds); the cache is left as it was.
    Called right after the request's prefill and ``drafter.begin``.

    Each repeat times every size once, then a proposal, so a slow spell of the machine (another
    process) slows every size alike instead of one: timed size by size, three slow plain steps
    in a row once made a head's round look 1.06 plain steps dear instead of ~1.35. Each cost is
    the fastest of its repeats: interference only ever adds time, and a calibration is frozen
    for reproducible requests, so one slow outlier must not price drafting out for good."""
    scratch = np.random.default_rng(0)  # never the request's RNG
    prompt, generated = context[:prompt_tokens], context[prompt_tokens:]
    k = min(PROBE_K, k_max)
    draft: list[tuple[float, int]] = []  # (seconds, tokens offered) of warm proposals
    # Before any verify pass: the catch-up is timed from the prefill's states.
    catch_up = _catch_up_seconds(drafter, context, prompt, params, k, scratch, draft) if k > 0 else 0.0
    timings: dict[int, float] = {}
    pending = len(context) - 1
    rows_up_to = min(k_max + 1, target.context_length - pending)
    for _ in range(CALIBRATION_REPEATS):
        for rows in range(1, rows_up_to + 1):
            drafts = [context[-1]] * (rows - 1)
            # A whole round's decide path: forward pass, final distributions, the rule.
            start = time.perf_counter()
            logits = target.verify([context[-1], *drafts])
            chain_verdict(logits, params, prompt, generated, drafts, None, scratch.random(2 * rows - 1))
            timings[rows] = min(timings.get(rows, float("inf")), time.perf_counter() - start)
            target.rollback(pending)
        if k > 0:
            draft.append(_timed_proposal(drafter, context, k, scratch))
    if not draft:
        return CostModel.from_timings(timings)
    fastest, offered = min(draft)
    if drafter.pure_proposals:
        return CostModel.from_timings(timings, fastest, True)
    per_token = fastest / offered if offered else 0.0
    return CostModel.from_timings(timings, per_token, False, max(0.0, catch_up - offered * per_token))


def _timed_proposal(
    drafter: Drafter, context: Sequence[int], k: int, scratch: np.random.Generator
) -> tuple[float, int]:
    """(seconds, tokens offered) of one proposal of k drafts, forgotten after."""
    start = time.perf_counter()
    offered = len(drafter.propose(context, k, scratch).tokens)
    seconds = time.perf_counter() - start
    drafter.observe(context, 0)
    return seconds, offered


def _catch_up_seconds(
    drafter: Drafter,
    context: Sequence[int],
    prompt: Sequence[int],
    params: SamplingParams,
    k: int,
    scratch: np.random.Generator,
    warm: list[tuple[float, int]],
) -> float:
    """The fastest of CALIBRATION_REPEATS proposals made the way a drafted round after plain
    rounds makes them, for a drafter that reads the target's states (a trained head: its
    window of states run through its layers first); 0 for any other. Each starts from
    ``begin`` on the prefill's states, so the drafter catches up on a whole window: the most
    plain rounds can leave it, and ``--k auto``'s back-off leaves it that far behind before
    most probes. A warm proposal follows each (appended to ``warm``), timed beside it. (A draft
    model would replay its whole prompt from ``begin``: its catch-up is learned from its
    requests' rounds instead.)"""
    if drafter.pure_proposals or drafter.hidden_capture is None:
        return 0.0
    fastest = float("inf")
    for _ in range(CALIBRATION_REPEATS):
        drafter.begin(prompt, params)
        fastest = min(fastest, _timed_proposal(drafter, context, k, scratch)[0])
        warm.append(_timed_proposal(drafter, context, k, scratch))
    return fastest


def chain_verdict(
    logits: NDArray[np.floating],
    params: SamplingParams,
    prompt: Sequence[int],
    output: Sequence[int],
    drafts: Sequence[int],
    draft_probs: NDArray[np.float64] | None,
    uniforms: NDArray[np.float64],
) -> tuple[ChainResult, ShadowAcceptance]:
    """The rule on a chain's verify rows (``logits`` (k + 1, V)), and the first position's
    acceptance of a shadow draft. Greedy reads the rows' tokens alone (``accept_greedy``,
    the same verdict as ``accept_chain`` on the one-hot rows, ~2 ms less a 9-row round)."""
    if params.greedy:
        # Lists: the rule checks a few Python numbers faster than arrays of them.
        targets = final_tokens(logits, params, prompt, output, drafts).tolist()
        verdict = accept_greedy(targets, list(drafts), draft_probs, uniforms.tolist(), logits.shape[1])
        return verdict, token_acceptance(targets[0])
    tokens = np.asarray(drafts, dtype=np.int64)
    # Sampled: the rule asks for the rows it reads (up to its first rejection), each
    # computed then (``final_rows``): ~1 ms less a 9-row round that rejects early.
    row = final_rows(logits, params, prompt, output, drafts)
    verdict = accept_chain_rows(row, tokens, draft_probs, uniforms, logits.shape[1])
    return verdict, row_acceptance(row(0))


def tree_verdict(
    logits: NDArray[np.floating],
    params: SamplingParams,
    prompt: Sequence[int],
    output: Sequence[int],
    tokens: list[int],
    parents: list[int],
    draft_probs: NDArray[np.float64] | None,
    uniforms: NDArray[np.float64],
) -> tuple[TreeResult, ShadowAcceptance]:
    """``chain_verdict`` for a tree's verify rows (``logits`` (n + 1, V): row 0 the pending
    token's, row j + 1 node j's, each with its own history: the output, then the drafts on its
    path). Greedy with point-mass drafts reads the rows' tokens alone (``accept_tree_greedy``);
    sampled without penalties computes only the rows the walk reaches (``accept_tree_rows``)."""
    if params.greedy and draft_probs is None:
        targets = _tree_rows(final_tokens, logits, params, prompt, output, tokens, parents)
        verdict = accept_tree_greedy(targets, parents, tokens)
        return verdict, token_acceptance(int(targets[0]))
    if not params.penalised:  # no row depends on its history: each computed when the walk reaches it
        row = final_rows(logits, params, prompt, output, tokens)
        verdict = accept_tree_rows(row, parents, tokens, draft_probs, uniforms, logits.shape[1])
        return verdict, row_acceptance(row(0))
    target_probs = _tree_rows(final_distributions, logits, params, prompt, output, tokens, parents)
    return accept_tree(target_probs, parents, tokens, draft_probs, uniforms), row_acceptance(target_probs[0])


def _tree_rows(
    final: Callable[..., NDArray[Any]],
    logits: NDArray[np.floating],
    params: SamplingParams,
    prompt: Sequence[int],
    output: Sequence[int],
    tokens: list[int],
    parents: list[int],
) -> NDArray[Any]:
    """``final`` (final_distributions or final_tokens) of each tree row with its own history."""
    if not params.penalised:  # the history changes nothing: one pass over all rows
        return final(logits, params, prompt, output, tokens)
    paths: list[list[int]] = [[]]  # the drafts before each row
    for node, parent in enumerate(parents):
        paths.append([*paths[parent + 1], tokens[node]])
    rows = [final(logits[row : row + 1], params, prompt, [*output, *path], [])[0] for row, path in enumerate(paths)]
    return np.stack(rows)


def token_acceptance(target_token: int) -> ShadowAcceptance:
    """``row_acceptance`` of the one-hot row at ``target_token`` (greedy): 1 for that token
    where its draft row gives it mass, else 0."""

    def chance(draft: Draft) -> float:
        x = draft.tokens[0]
        return float(x == target_token and (draft.probs is None or draft.probs[0][x] > 0.0))

    return chance


def row_acceptance(target_row: NDArray[np.float64]) -> ShadowAcceptance:
    """A draft's acceptance at a position whose final distribution is ``target_row`` (V,),
    a row the rule has just checked: no second pass over the vocabulary."""

    def chance(draft: Draft) -> float:
        q = None if draft.probs is None else draft.probs[0]
        return acceptance_probability(target_row, draft.tokens[0], q, check_rows=False)

    return chance


def branches(drafter: Drafter) -> int:
    """The candidates a drafted position of ``drafter``'s trees offers (``propose_tree``); 1: chains."""
    return int(getattr(drafter, "branches", 1)) if hasattr(drafter, "propose_tree") else 1


def drafted(drafter: Drafter, context: Sequence[int], k: int, rng: np.random.Generator, tree: bool) -> Draft:
    """The drafter's tree of k drafted positions where ``tree`` (``propose_tree``), else its chain."""
    if k <= 0:
        return NO_DRAFT
    if tree:
        return drafter.propose_tree(context, k, rng)  # type: ignore[attr-defined,no-any-return]
    return drafter.propose(context, k, rng)


def prefix(draft: Draft, k: int) -> Draft:
    """The first k tokens (a tree's first k nodes) of a draft, with their rows and source."""
    return draft.first(k)
