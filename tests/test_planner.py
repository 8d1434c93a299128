"""The round planner: one object for fixed k, governed k and shadow drafts (verispec/planner.py)."""

import numpy as np
import pytest

from verispec.drafters.control import WrongDrafter
from verispec.drafters.lookup import LookupDrafter
from verispec.governor import CostModel
from verispec.planner import AUTO, Planner, row_acceptance
from verispec.sampling import SamplingParams
from verispec.stats import RequestStats

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
