"""The round planner: one object for fixed k, governed k and shadow drafts (verispec/planner.py)."""

import numpy as np
import pytest

from verispec.accept import accept_chain
from verispec.accept_tree import accept_tree
from verispec.drafters.base import Draft
from verispec.drafters.control import WrongDrafter
from verispec.drafters.lookup import LookupDrafter
from verispec.governor import CostModel, Estimates, Load
from verispec.planner import AUTO, Planner, chain_verdict, row_acceptance, token_acceptance, tree_verdict
from verispec.sampling import SamplingParams, final_distributions
from verispec.stats import RequestStats
from verispec.tree_sizing import BranchCalibration

RNG = np.random.default_rng(0)


class Calibration:
    """Counts the calibrations a planner asks for; rows cost a tenth of a step each."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, k_max: int) -> CostModel:
        self.calls.append(k_max)
        return CostModel.line(0.01, 0.001)


def _begun(planner, drafter, prompt, **options):
    drafter.begin(prompt, SamplingParams())
    calibration = Calibration()
    return planner.begin(drafter, RequestStats(), calibration, **options), calibration


def test_a_fixed_k_drafts_what_fits_in_the_room_left():
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    request, _ = _begun(Planner(), LookupDrafter(), prompt, k=4)
    assert request.governor is None
    assert request.plan(prompt, 10, RNG).draft.tokens == [3, 1, 2]  # all the lookup has
    assert request.plan(prompt, 3, RNG).k == 2  # a round commits drafts + 1
    assert request.plan(prompt, 1, RNG).draft.tokens == []


def test_a_shadowing_governor_verifies_nothing_of_a_wrong_proposal_and_scores_its_shadow():
    planner = Planner()
    request, _ = _begun(planner, WrongDrafter(7), [1, 2, 3])
    assert request.governor is not None and request.governor.shadow
    for _ in range(20):
        plan = request.plan([1, 2, 3], 50, RNG)
        row = np.zeros(8)
        row[0] = 1.0  # the target's token is never the drafter's
        request.observe(len(plan.draft.tokens), 0, 0.0, 0.01 + 0.001 * len(plan.draft.tokens), row_acceptance(row))
    stats = request.stats
    assert stats.governor_shadow_drafts > 10 and plan.k == 0 and plan.shadow.tokens == [7]
    assert stats.governor_plain_rounds == stats.governor_shadow_drafts


def test_a_shadow_round_needs_its_acceptance():
    request, _ = _begun(Planner(), WrongDrafter(7), [1, 2, 3])
    request.governor.sources.clear()
    request.governor._default_start = (0.0,)  # known wrong: the first round is a shadow
    plan = request.plan([1, 2, 3], 50, RNG)
    assert plan.k == 0 and plan.shadow.tokens
    with pytest.raises(ValueError, match="shadow draft"):
        request.observe(0, 0, 0.0, 0.01)


def test_costs_are_calibrated_once_per_drafter_and_learned_after_each_request():
    planner = Planner()
    first, calibration = _begun(planner, WrongDrafter(7), [1, 2, 3], k=AUTO, k_max=5)
    assert calibration.calls == [5]
    for _ in range(3):
        drafts = len(first.plan([1, 2, 3], 50, RNG).draft.tokens)
        first.observe(drafts, 0, 0.0, 0.02 + 0.001 * drafts, row_acceptance(np.eye(8)[0]))
    planner.finish(first)
    assert planner.live["wrong"].step_seconds > 0.01  # slower plain steps were seen
    assert planner.calibrated["wrong"].step_seconds == 0.01
    assert planner.acceptance["wrong"].first == 0.0
    second, calibration = _begun(planner, WrongDrafter(7), [1, 2, 3])
    assert calibration.calls == [] and second.stats.governor_start_acceptance == 0.0


def test_beside_a_load_where_no_k_pays_a_shadowing_planner_asks_no_proposal():
    """Rows at 5 ms beyond a 4.7 ms plain step: beside 15 other requests a pass of 16 rows
    takes 79.7 ms for 16 tokens, ~5 ms a token, so even drafts all accepted (16 + k tokens for
    the batch's 16) do not pay their rows. No proposal is asked for, in the round or in the
    rests after it, and the rounds are counted as plain by load; alone, the same request asks
    the drafter again."""
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    drafter = PricedLookup()
    drafter.begin(prompt, SamplingParams())
    request = Planner().begin(drafter, RequestStats(), lambda k_max: CostModel.line(0.0047, 0.005))
    assert request.governor.shadow
    crowded = Load(rows=15, tokens=15.0)
    for _ in range(5):
        plan = request.plan(prompt, 50, RNG, crowded)
        assert plan.k == 0 and not plan.shadow.tokens
        request.observe(0, 0, 0.0, 0.0047 + 15 * 0.005, verify_rows=16)
    assert drafter.proposals == 0
    assert request.stats.governor_plain_by_load == 5 == request.stats.governor_plain_rounds
    plan = request.plan(prompt, 50, RNG)  # alone the drafter is asked again: a four-token repeat
    assert drafter.proposals == 1 and (plan.draft.tokens or plan.shadow.tokens)[0] == 4
    assert request.stats.governor_plain_by_load == 5


class CountedWrong(WrongDrafter):
    """Always proposes the same token, and counts its proposals."""

    def __init__(self, token: int) -> None:
        super().__init__(token)
        self.proposals = 0

    def propose(self, context, k, rng):
        self.proposals += 1
        return super().propose(context, k, rng)


def test_beside_a_load_a_proposal_that_can_only_be_evidence_is_asked_one_round_in_four():
    """Rows at 2.3 ms beyond a 4.7 ms step, beside 15 requests: drafts all accepted would pay,
    but only from an acceptance of ~0.94 at position 1 on (``Governor.first_needed``). A
    drafter estimated below that cannot draft whatever it proposes: it is asked once every
    1 + LOAD_REST_ROUNDS rounds, its rounds plain without a decision; the rounds between ask
    nothing and count as plain by load. When its shadows start being right it is still asked
    one round in four until its estimate could pay, then every round until it drafts. Alone,
    every round."""
    from verispec.planner import LOAD_REST_ROUNDS

    prompt = [1, 2, 3]
    drafter = CountedWrong(7)
    request = Planner().begin(drafter, RequestStats(), lambda k_max: CostModel.line(0.0047, 0.0023))
    governor = request.governor
    crowded = Load(rows=15, tokens=15.0)
    governor.load = crowded
    assert governor.load_allows_drafting() and 0.9 < governor.first_needed(governor.batch_floor(1.03)) < 1.0
    assert LOAD_REST_ROUNDS == 3
    weighed = []
    best = governor.best
    governor.best = lambda *args: weighed.append(args) or best(*args)  # counts the k weighed
    asked = []
    for _ in range(40):
        before = drafter.proposals
        plan = request.plan(prompt, 50, RNG, crowded)
        asked.append(drafter.proposals - before)
        assert plan.k == 0
        request.observe(0, 0, 0.0, 0.0392, lambda draft: 0.0, verify_rows=16)
    assert asked == [1, 0, 0, 0] * 10
    assert request.stats.governor_plain_by_load == 30
    assert request.stats.governor_shadow_drafts == 10
    assert governor.decisions == 10 and governor.plain_by_governor == 40 and not weighed  # no k weighed
    # Its shadows start being right: still one round in four, each raising the estimate.
    asked = []
    for _ in range(100):
        before = drafter.proposals
        plan = request.plan(prompt, 50, RNG, crowded)
        asked.append(drafter.proposals - before)
        if plan.k > 0:
            break
        request.observe(0, 0, 0.0, 0.0392, lambda draft: 1.0, verify_rows=16)
    assert plan.k > 0 and plan.draft.tokens[0] == 7
    # One round in four until the estimate could pay, then every round until it does.
    resting = (max(i for i, a in enumerate(asked) if a == 0) + 1) // 4 * 4
    assert asked[:resting] == [1, 0, 0, 0] * (resting // 4) and 20 < resting < 80
    assert set(asked[resting:]) == {1} and len(asked) - resting < 8
    # Alone the same request asks every round.
    before = drafter.proposals
    for _ in range(4):
        plan = request.plan(prompt, 50, RNG)
        request.observe(len(plan.draft.tokens), 0, 0.0, 0.0047, lambda draft: 0.0)
    assert drafter.proposals == before + 4


def test_a_reproducible_request_starts_from_the_calibration_and_changes_nothing():
    planner = Planner()
    first, _ = _begun(planner, WrongDrafter(7), [1, 2, 3])
    drafts = len(first.plan([1, 2, 3], 50, RNG).draft.tokens)
    first.observe(drafts, 0, 0.0, 0.05, row_acceptance(np.eye(8)[0]))
    planner.finish(first)
    live, memory = planner.live["wrong"], planner.acceptance["wrong"].first
    seeded, _ = _begun(planner, WrongDrafter(7), [1, 2, 3], reproducible=True)
    assert seeded.governor.costs.step_seconds == 0.01 and seeded.stats.governor_start_acceptance is None
    drafts = len(seeded.plan([1, 2, 3], 50, RNG).draft.tokens)
    seeded.observe(drafts, 0, 0.0, 0.5, row_acceptance(np.eye(8)[0]))
    planner.finish(seeded)
    assert planner.live["wrong"] is live and planner.acceptance["wrong"].first == memory


def test_without_shadows_a_governor_backs_off_and_probes():
    request, _ = _begun(Planner(shadows=False), WrongDrafter(7), [1, 2, 3])
    assert not request.governor.shadow
    ks = []
    for _ in range(40):
        plan = request.plan([1, 2, 3], 50, RNG)
        ks.append(plan.k)
        assert not plan.shadow.tokens
        request.observe(len(plan.draft.tokens), 0, 0.0, 0.01)
    assert request.stats.governor_probes > 0 and ks.count(0) > 30


class TreeDrafter:
    """Always proposes one tree: the root's children 10 (0.6) and 20 (0.3); 10's children 11
    (0.8) and 12 (0.2); 11's child 13 (1.0)."""

    name = "tree"
    hidden_capture = None
    pure_proposals = True

    def begin(self, prompt_ids, params):
        pass

    def propose(self, context, k, rng):
        return Draft([10, 11, 20, 12, 13], parents=[-1, 0, -1, 0, 1], frequencies=[0.6, 0.8, 0.3, 0.2, 1.0])

    def observe(self, context, accepted):
        pass

    def reset(self):
        pass

    def fork(self, target):
        return self


def _tree_request(per_row: float, planner: Planner | None = None):
    """A request of TreeDrafter's whose governor starts with the later-child scale at 1 (as if
    earlier requests had measured alternatives right as often as their shares say)."""
    drafter = TreeDrafter()
    drafter.begin([1, 2, 3], SamplingParams())
    planner = planner or Planner()
    planner.branching.setdefault("tree", BranchCalibration(taken=8.0, predicted=7.0))
    return planner.begin(drafter, RequestStats(), lambda k_max: CostModel.line(0.01, per_row))


def test_a_governor_verifies_the_alternatives_of_a_tree_only_where_their_rows_pay():
    # Rows at a hundredth of a step: the whole tree (its alternatives' chances, ~0.15-0.3, pay).
    cheap = _tree_request(0.0001).plan([1, 2, 3], 50, RNG)
    assert cheap.draft.is_tree and cheap.draft.tokens == [10, 11, 20, 12, 13]
    assert cheap.draft.frequencies == [0.6, 0.8, 0.3, 0.2, 1.0]
    # With the prior's acceptance 0.5 a node's chance is 0.5 (10), 0.375 (20: half the time 10
    # is refused, and 20 has 0.75 of the rest), 0.25 (11, 12), 0.125 (13). Rows at 0.2 of a
    # step: 10 and its alternative 20 (1.875 / 1.4) beat the chain of two (1.75 / 1.4).
    middle = _tree_request(0.002).plan([1, 2, 3], 50, RNG)
    assert middle.draft.is_tree and middle.draft.tokens == [10, 20] and middle.draft.parents == [-1, -1]
    # Rows at 0.4 of a step: one draft (1.5 / 1.4); the alternative's 0.375 does not pay a row.
    dear = _tree_request(0.004).plan([1, 2, 3], 50, RNG)
    assert not dear.draft.is_tree and dear.draft.tokens == [10] and dear.k == 1


def test_a_tree_round_teaches_the_position_estimates_and_the_alternatives_scale():
    planner = Planner()
    request = _tree_request(0.0001, planner)
    governor = request.governor
    assert governor.branching.scale == pytest.approx(1.0)
    target_row = np.zeros(32)
    target_row[20] = 1.0  # the target always takes the alternative 20 at position 1
    trees = 0
    for _ in range(30):
        plan = request.plan([1, 2, 3], 50, RNG)
        trees += plan.draft.is_tree
        taken = plan.draft.tokens.index(20)
        request.observe(1, 1, 0.0, 0.011, row_acceptance(target_row), 6, path=[taken] if plan.draft.is_tree else None)
    estimates = governor.estimates(None)
    assert trees >= 2 and estimates.observed[0] == 30
    assert estimates.acceptance[0] < 0.05  # the first child 10 refused, or scored on the row
    assert governor.branching.scale > 1.2  # taken every time against a predicted share of 0.75
    # 10 now looks hopeless and 20 sure: rounds draft 20 alone (a chain of the alternative).
    assert request.plan([1, 2, 3], 50, RNG).draft.tokens[0] == 20
    # The engine's planner carries the scale to the drafter's next request.
    planner.finish(request)
    again = _tree_request(0.0001, planner)
    assert again.governor.branching.scale == pytest.approx(governor.branching.scale)


def test_a_tree_is_decided_as_its_main_chain_where_passes_take_no_trees():
    request = _tree_request(0.0001)
    request.trees = False
    plan = request.plan([1, 2, 3], 50, RNG)
    assert not plan.draft.is_tree and plan.draft.tokens == [10, 11, 13]


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3)]
)
def test_the_verdict_and_shadow_are_the_ones_of_the_whole_rows(params):
    # The engine's greedy rounds read the rows' tokens alone, and its sampled rounds the rows
    # the rule asks for; verdict and shadow acceptance must be those of accept_chain and
    # row_acceptance on the (k + 1, V) final distributions it no longer builds.
    rng = np.random.default_rng(11)
    for _ in range(200):
        logits = rng.standard_normal((4, 7)).astype(np.float32)
        drafts = [int(t) for t in np.where(rng.random(3) < 0.6, logits[:3].argmax(axis=1), rng.integers(0, 7, 3))]
        probs = None if rng.random() < 0.5 else rng.dirichlet(np.ones(7), size=3)
        u = rng.random(7)
        verdict, shadow = chain_verdict(logits, params, [1], [2], drafts, probs, u)
        rows = final_distributions(logits, params, [1], [2], drafts)
        assert verdict == accept_chain(rows, np.asarray(drafts), probs, u)
        for token in range(7):
            draft = Draft([token], None if probs is None else probs[:1])
            assert shadow(draft) == row_acceptance(rows[0])(draft)
    no_mass = Draft([3], np.eye(7)[[4]])
    assert token_acceptance(3)(no_mass) == row_acceptance(np.eye(7)[3])(no_mass) == 0.0


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0), SamplingParams(temperature=0, repetition_penalty=1.5, presence_penalty=0.5)],
)
def test_the_greedy_tree_verdict_is_the_rules_on_each_rows_own_history(params):
    # Trees at greedy read each row's token (after the penalties of its own path) and follow
    # the argmax: the verdict and shadow of accept_tree on the one-hot rows built per path.
    rng = np.random.default_rng(13)
    parents = [-1, -1, 0, 0, 2, 1]
    paths = [[], [0], [1], [0, 2], [0, 3], [0, 2, 4], [1, 5]]  # the nodes before each row
    for _ in range(100):
        logits = rng.standard_normal((7, 6))
        tokens = [int(t) for t in rng.integers(0, 6, size=6)]
        logits[:, tokens[0]] += 1.5  # drafts often the argmax, so paths go deep
        u = rng.random(13)
        verdict, shadow = tree_verdict(logits, params, [1], [2], tokens, parents, None, u)
        rows = np.stack(
            [
                final_distributions(logits[r : r + 1], params, [1], [2, *(tokens[n] for n in path)], [])[0]
                for r, path in enumerate(paths)
            ]
        )
        assert verdict == accept_tree(rows, parents, tokens, None, u)
        for token in range(6):
            assert shadow(Draft([token])) == row_acceptance(rows[0])(Draft([token]))


class BranchingDrafter(TreeDrafter):
    """A dear drafter (probing governor) offering 3 candidates a drafted position, as a trained
    head with ``branches`` 3 does: position d's chain token 10 + d (frequency 0.5) and the
    alternatives 20 + d (0.3) and 30 + d (0.1), listed position by position."""

    name = "branching"
    pure_proposals = False
    branches = 3

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def propose(self, context, k, rng):
        self.asked.append(("chain", k))
        return Draft([10 + depth for depth in range(k)])

    def propose_tree(self, context, k, rng):
        self.asked.append(("tree", k))
        tokens, parents, frequencies = [], [], []
        for depth in range(k):
            parent = -1 if depth == 0 else (depth - 1) * self.branches
            for token, frequency in ((10 + depth, 0.5), (20 + depth, 0.3), (30 + depth, 0.1)):
                tokens.append(token)
                parents.append(parent)
                frequencies.append(frequency)
        return Draft(tokens, parents=parents, frequencies=frequencies)


def _branching_request(per_row: float):
    """A request of BranchingDrafter's: a drafted position costs 0.2 of a plain step."""
    drafter = BranchingDrafter()
    request = Planner().begin(drafter, RequestStats(), lambda k_max: CostModel.line(0.01, per_row, draft=0.002))
    return request, drafter


def test_a_probing_governor_prices_a_trees_alternatives_as_rows_of_one_drafted_position():
    # From the prior (0.5 a position) k 1 pays best: 1.5 tokens for 1.25 steps. Asked for its
    # tree of one position, the drafter drafts once for its three candidates; the alternative
    # 20 (chance 0.5 x 0.5 x 0.3 / 0.5 = 0.15 at the prior's later-child scale) adds 0.15
    # tokens for a row at 0.05 of a step: 1.65 / 1.30 beats 1.5 / 1.25. Priced as drafted
    # tokens (0.25 of a step each) it would not (1.65 / 1.50), nor does 30 (0.05 for a row).
    cheap, drafter = _branching_request(0.0005)
    plan = cheap.plan([1, 2, 3], 50, RNG)
    assert drafter.asked == [("tree", 1)] and plan.k == 2
    assert plan.draft.tokens == [10, 20] and plan.draft.parents == [-1, -1]
    # Rows at 0.15 of a step: the alternative does not pay its row (1.65 / 1.50 against 1.5 /
    # 1.35), the chain of k is verified.
    dear, _ = _branching_request(0.0015)
    plan = dear.plan([1, 2, 3], 50, RNG)
    assert not plan.draft.is_tree and plan.draft.tokens == [10]
    # A probe measures the chain of its k.
    probing, drafter = _branching_request(0.0005)
    probing.governor.probing = True
    plan = probing.plan([1, 2, 3], 50, RNG)
    assert drafter.asked == [("chain", 2)] and not plan.draft.is_tree and plan.draft.tokens == [10, 11]
    # A fixed k counts nodes: 4 take two drafted positions (10, 20, 30, then 11).
    fixed = Planner().begin(BranchingDrafter(), RequestStats(), lambda k_max: CostModel.line(0.01, 0.001), k=4)
    plan = fixed.plan([1, 2, 3], 50, RNG)
    assert fixed.drafter.asked == [("tree", 2)] and plan.draft.tokens == [10, 20, 30, 11]
    assert plan.draft.parents == [-1, -1, -1, 0]
    # Where passes take no trees (a scheduler's), the chain of k.
    fixed.trees = False
    assert fixed.plan([1, 2, 3], 50, RNG).draft.tokens == [10, 11, 12, 13]


def test_a_tree_round_of_a_probing_governor_learns_the_cost_of_its_drafted_positions():
    # The target takes the chain's 10 and the alternative 20 by turns; every drafted position
    # takes 2 ms, whatever the nodes verified: that is the cost per drafted token to learn.
    request, drafter = _branching_request(0.0005)
    costs = request.governor.costs
    trees = 0
    for round_ in range(40):
        plan = request.plan([1, 2, 3], 50, RNG)
        depth = drafter.asked[-1][1] if plan.draft.tokens else 0
        truth = 10 if round_ % 2 else 20
        target_row = np.zeros(40)
        target_row[truth] = 1.0
        tokens = plan.draft.tokens
        path = (
            [tokens.index(truth)] if truth in tokens and (plan.draft.parents or [-1])[tokens.index(truth)] < 0 else []
        )
        trees += plan.draft.is_tree
        offered = max(1, len(plan.draft.main_chain().tokens)) if tokens else 0
        request.observe(
            offered, len(path), 0.002 * depth, 0.01 + 0.0005 * len(tokens), row_acceptance(target_row),
            path=path if plan.draft.is_tree else None,
        )  # fmt: skip
    assert trees > 10
    assert costs.draft_seconds_per_token == pytest.approx(0.002, rel=0.05)


class PricedLookup(LookupDrafter):
    """Prompt lookup that counts its proposals."""

    def __init__(self) -> None:
        super().__init__()
        self.proposals = 0

    def propose(self, context, k, rng):
        self.proposals += 1
        return super().propose(context, k, rng)


@pytest.mark.parametrize("share, rate", [(0.01, 1.0), (0.04, 0.5), (0.05, 0.4), (0.1, 0.0)])
def test_a_dearer_pure_drafter_shadows_in_fewer_plain_rounds(share, rate):
    # Proposals at ``share`` of a plain step: up to SHADOW_MAX_COST (2%) every plain round is a
    # shadow; dearer, once a few proposals in a row found nothing, a share of them such that
    # shadows cost 2% of the plain steps; past 8% (fewer than one in four) the governor probes.
    from verispec.governor import SHADOW_FREE_MISSES, SHADOW_MAX_COST, Governor

    costs = CostModel.line(0.01, 0.001, 0.01 * share, per_proposal=True)
    assert Governor.shadow_rate(costs) == pytest.approx(rate)
    assert Governor.can_shadow(costs) == (rate > 0)
    planner = Planner()
    planner.calibrated["lookup"] = planner.live["lookup"] = costs
    drafter = PricedLookup()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]  # nothing repeats: lookup offers nothing, rounds are plain
    request, _ = _begun(planner, drafter, prompt)
    assert request.governor.shadow == (rate > 0)
    if rate == 0:
        return  # a probing governor: its back-off and probes have their own tests
    rounds = 200
    for _ in range(rounds):
        asked = drafter.proposals
        plan = request.plan(prompt, 50, RNG)
        assert plan.k == 0
        request.observe(0, 0, 0.01 * share * (drafter.proposals - asked), 0.01)  # as timed
    # The first round asks (it follows no plain one), and so do the next ones up to
    # SHADOW_FREE_MISSES empty proposals in a row; every later one as the credit allows.
    free = SHADOW_FREE_MISSES
    assert drafter.proposals == pytest.approx(free + rate * (rounds - free), abs=1)
    assert drafter.proposals * 0.01 * share <= SHADOW_MAX_COST * 0.01 * rounds + free * 0.01 * share
    # Lookup offered nothing when asked (a round the governor did not decide); the rounds it
    # was not asked were the governor's plain rounds.
    assert request.stats.governor_plain_rounds == rounds - drafter.proposals


def test_a_right_shadow_lifts_the_throttle_on_shadows():
    # Proposals at 5% of a step: throttled to 40% of the plain rounds while they keep missing;
    # one right shadow, and the next rounds ask again (drafting resumes from those).
    from verispec.governor import SHADOW_FREE_MISSES

    planner = Planner()
    planner.calibrated["wrong"] = planner.live["wrong"] = CostModel.line(0.01, 0.001, 0.0005, per_proposal=True)
    drafter = WrongDrafter(7)
    asked = []
    propose = drafter.propose

    def counting(context, k, rng):
        asked.append(len(asked))
        return propose(context, k, rng)

    drafter.propose = counting
    request, _ = _begun(planner, drafter, [1, 2, 3])
    request.governor.sources.clear()
    request.governor._default_start = (0.0,)  # known wrong: every round is plain
    wrong, right = np.zeros(8), np.zeros(8)
    wrong[0], right[7] = 1.0, 1.0

    def rounds(n, row, until_shadow=False):
        before = len(asked)
        for _ in range(n):
            plan = request.plan([1, 2, 3], 50, RNG)
            drafts = len(plan.draft.tokens)
            asked_now = drafts > 0 or bool(plan.shadow.tokens)
            request.observe(drafts, 0, 0.0005 * asked_now, 0.01 + 0.001 * drafts, row_acceptance(row))
            if until_shadow and plan.shadow.tokens:
                break
        return len(asked) - before

    assert rounds(SHADOW_FREE_MISSES, wrong) == SHADOW_FREE_MISSES
    assert rounds(100, wrong) == pytest.approx(40, abs=1)
    assert rounds(10, right, until_shadow=True) == 1  # the next shadow is right
    # The drafter is asked in every round again (a drafted one, or a shadow) ...
    assert rounds(SHADOW_FREE_MISSES, wrong) == SHADOW_FREE_MISSES
    # ... until its proposals have missed SHADOW_FREE_MISSES times in a row.
    assert rounds(100, wrong) == pytest.approx(40, abs=1)


class RoutedWrong(WrongDrafter):
    """An always-wrong drafter that routes: its proposal after a context of even length is
    its cheap one (``cheap_next``, as ``hybrid`` says of suffix's); it counts both kinds."""

    fallback_source = "dear"

    def __init__(self) -> None:
        super().__init__(7)
        self.cheap = self.dear = 0

    def cheap_next(self, context, k):
        return len(context) % 2 == 0

    def propose(self, context, k, rng):
        if self.cheap_next(context, k):
            self.cheap += 1
            return super().propose(context, k, rng)
        return self.propose_fallback(context, k, rng)

    def propose_fallback(self, context, k, rng):
        self.dear += 1
        return super().propose(context, k, rng)


def test_a_routed_drafter_shadows_its_cheap_proposals_always_and_its_dear_ones_as_the_budget_allows():
    # Proposals at 10% of a plain step on average: a drafter that cannot say which are cheap
    # does not shadow at all (the probing governor); a routed one does, and once its shadows
    # keep missing, plain rounds still ask for every cheap proposal and for a quarter
    # (SHADOW_MIN_RATE) of the dear ones.
    from verispec.governor import SHADOW_FREE_MISSES, SHADOW_MIN_RATE, Governor

    costs = CostModel.line(0.01, 0.001, 0.001, per_proposal=True)
    assert not Governor.can_shadow(costs)
    planner = Planner()
    planner.calibrated["wrong"] = planner.live["wrong"] = costs
    drafter = RoutedWrong()
    request, _ = _begun(planner, drafter, [1, 2, 3])
    assert request.governor.shadow
    request.governor.sources.clear()
    request.governor._default_start = (0.0,)  # known wrong: every round is plain
    wrong = np.zeros(8)
    wrong[0] = 1.0
    rounds = 400
    for n in range(rounds):
        context = list(range(3 + n))  # one token longer each round: cheap and dear alternate
        plan = request.plan(context, 50, RNG)
        assert plan.k == 0
        asked = bool(plan.shadow.tokens)
        request.observe(0, 0, 0.001 * asked, 0.01, row_acceptance(wrong))
    assert drafter.cheap == rounds // 2  # every one
    dear_rounds = rounds // 2
    assert drafter.dear == pytest.approx(SHADOW_FREE_MISSES // 2 + SHADOW_MIN_RATE * dear_rounds, abs=3)


class TwoSources:
    """A routed drafter whose routing always picks its cheap proposal (token 5, source
    "cheap"), and whose dear one (token 9, source "dear") comes on demand; it counts the dear
    proposals."""

    name = "two-sources"
    hidden_capture = None
    pure_proposals = True
    fallback_source = "dear"
    steady_sources = ("dear",)

    def __init__(self) -> None:
        self.dear = 0

    def begin(self, prompt_ids, params):
        pass

    def cheap_next(self, context, k):
        return True

    def propose(self, context, k, rng):
        return Draft([5] * k, None, "cheap") if k > 0 else Draft([])

    def propose_fallback(self, context, k, rng):
        self.dear += 1
        return Draft([9], None, "dear")

    def observe(self, context, accepted):
        pass


def _two_sources(cheap: float, dear: float, **options):
    """A request of ``TwoSources`` whose governor starts knowing each source's acceptance at
    position 1 (the dear one's pooled, as a steady source's is)."""
    planner = Planner()
    drafter = TwoSources()
    planner.calibrated[drafter.name] = planner.live[drafter.name] = CostModel.line(0.01, 0.001, 0.00001, True)
    request, _ = _begun(planner, drafter, [1, 2, 3], **options)
    if request.governor is not None:
        request.governor.sources = {"cheap": Estimates([cheap]), "dear": Estimates([dear], pooled=True)}
    return request, drafter


def test_the_governor_overrides_a_routed_drafters_cheap_proposal_where_only_its_dear_one_would_pay():
    # The routing picks the cheap proposal every round; the governor knows it is wrong and the
    # dear one right: the round drafts the dear one, and the cheap one's first token is scored
    # for its own source (here the target's token: its estimate rises; the dear draft, wrong,
    # lowers the dear's).
    request, drafter = _two_sources(cheap=0.0, dear=0.9)
    plan = request.plan([1, 2, 3], 50, RNG)
    assert plan.draft.tokens == [9] and plan.draft.source == "dear" and drafter.dear == 1
    target_is_five = row_acceptance(np.eye(10)[5])
    request.observe(1, 0, 0.0, 0.011, target_is_five)
    governor = request.governor
    assert governor.estimates("cheap").acceptance[0] == pytest.approx(0.5)  # the set-aside shadow: right
    assert governor.estimates("dear").acceptance[0] < 0.9  # the verified draft: wrong

    # Where the cheap source pays, or the dear one does not, the routing stands.
    for cheap, dear, k in ((0.9, 0.9, 3), (0.0, 0.0, 0)):
        request, drafter = _two_sources(cheap=cheap, dear=dear)
        plan = request.plan([1, 2, 3], 4, RNG)
        assert plan.draft.source in ("cheap", None) and len(plan.draft.tokens) == k and drafter.dear == 0
        assert plan.shadow.tokens == ([5] if k == 0 else [])

    # A fixed k never consults a governor: the routing's proposal is the draft.
    request, drafter = _two_sources(cheap=0.0, dear=0.9, k=2)
    assert request.plan([1, 2, 3], 50, RNG).draft.tokens == [5, 5] and drafter.dear == 0


def test_a_routed_drafters_steady_source_pools_its_memory_where_the_others_move_on_a_few_rounds():
    # Six wrong rounds from a memory of 0.5: the steady source's estimate pools the memory
    # (MEMORY_ROUNDS of it) with the request's rounds, the other's is a running mean with the
    # prior as one observation, then a moving average.
    from verispec.governor import MEMORY_ROUNDS, REQUEST_FORGET, AcceptanceMemory

    planner = Planner()
    drafter = TwoSources()
    planner.calibrated[drafter.name] = planner.live[drafter.name] = CostModel.line(0.01, 0.001, 0.00001, True)
    planner.acceptance[drafter.name] = AcceptanceMemory(0.5, {"cheap": 0.5, "dear": 0.5})
    request, _ = _begun(planner, drafter, [1, 2, 3])
    governor = request.governor
    assert governor.shadow and governor.steady == {"dear"}
    for source in ("cheap", "dear"):
        governor.current = source
        for _ in range(6):
            governor.observe(1, 0, 0.0, 0.011)
    rounds = sum(REQUEST_FORGET**i for i in range(6))
    assert governor.estimates("dear").acceptance[0] == pytest.approx(MEMORY_ROUNDS * 0.5 / (MEMORY_ROUNDS + rounds))
    assert governor.estimates("cheap").acceptance[0] == pytest.approx(
        0.5 * (1 / 2) * (2 / 3) * (3 / 4) * (4 / 5) * 0.8 * 0.8
    )
