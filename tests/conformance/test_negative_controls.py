"""Negative controls: each mutant rule must FAIL the checks the real rule passes.

They run N_MUTANT draws, a tenth of the lossless arms': harness.py derives why that still
fails every mutant with overwhelming probability.
"""

import numpy as np
import pytest

from tests.conformance import mutants
from tests.conformance.harness import N_MUTANT, chain_arm, report, single_position_arm
from tests.conformance.test_rule_arms import CHAIN_P, CHAIN_Q, POOR_P, POOR_Q
from verispec.accept import accept_chain

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", sorted(mutants.SINGLE_POSITION_MUTANTS))
def test_single_position_mutant_is_detected(name):
    rule = mutants.SINGLE_POSITION_MUTANTS[name]
    arm = single_position_arm(f"poor drafter, {name}", rule, POOR_P, POOR_Q, 1, n=N_MUTANT)
    result = report(arm, label="mutant: ")
    assert not result.passes, f"{name} passed the poor-drafter arm: the suite cannot tell it from the rule"


def test_chain_that_continues_past_a_rejection_is_detected():
    worst, positions, _, _ = chain_arm(
        "chain k=3, continues past rejection", mutants.chain_continues, CHAIN_P, CHAIN_Q, 7, n=N_MUTANT
    )
    report(worst, label="mutant: ")
    assert not all(result.passes for result in positions)


def test_middle_rejection_tells_break_from_continue():
    # Accept at 0, reject at 1, accept at 2 if examined: only ``break`` reports 1 accepted.
    p = np.array([[0.6, 0.4], [0.1, 0.9], [0.6, 0.4], [0.5, 0.5]])
    drafts, u = np.array([0, 0, 0]), np.full(7, 0.5)
    assert accept_chain(p, drafts, None, u).accepted == 1
    assert mutants.chain_continues(p, drafts, None, u).accepted == 2
