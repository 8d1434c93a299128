"""Statistical arms: the reference rule's output follows p, 200,000 draws per arm.

Tolerances and the chi-square threshold are derived in harness.py from the sample size.
"""

import numpy as np
import pytest

from tests.conformance import mutants
from tests.conformance.harness import (
    N_DRAWS,
    chain_arm,
    first_tokens,
    report,
    single_position_arm,
    tolerance,
)
from verispec.accept import accept_chain
from verispec.sampling import SamplingParams, final_distribution

pytestmark = pytest.mark.slow

POOR_P = np.array([0.45, 0.35, 0.20])
POOR_Q = np.array([0.10, 0.80, 0.10])


def test_temperature_zero_accepts_argmax_rejects_others_and_emits_argmax():
    greedy = SamplingParams(temperature=0)
    target = final_distribution(np.array([0.1, 2.0, -1.0, 1.9]), greedy)  # argmax 1
    rng = np.random.default_rng(11)
    uniforms = rng.random((N_DRAWS, 3))
    rows = np.stack([target, target])
    outcomes = {}
    for draft in (1, 3):
        q = final_distribution(np.eye(4)[draft] * 5.0, greedy)  # one-hot at the draft
        results = [accept_chain(rows, np.array([draft]), q[None, :], u) for u in uniforms]
        accepted = np.array([r.accepted for r in results])
        tokens = np.array([r.token for r in results])
        outcomes[draft] = (accepted.mean(), tokens)
    assert outcomes[1][0] == 1.0  # the argmax draft: accepted on every draw
    assert outcomes[3][0] == 0.0  # any other draft: rejected on every draw...
    assert np.all(outcomes[3][1] == 1)  # ...and the token emitted is the argmax
    print(f"\n  temperature 0: N={N_DRAWS} argmax accepted {outcomes[1][0]:.0%}, other accepted {outcomes[3][0]:.0%}")


def test_poor_drafter_follows_p_and_greedy_rule_does_not():
    result = report(single_position_arm("poor drafter p=[.45,.35,.2] q=[.1,.8,.1]", accept_chain, POOR_P, POOR_Q, 1))
    assert result.expected_acceptance == pytest.approx(0.55)
    assert result.passes, result.line()
    # The same rows under the greedy rule emit the argmax every time: off by 0.55 on token 0.
    greedy = single_position_arm("greedy rule on the same rows", mutants.greedy_rule, POOR_P, POOR_Q, 1)
    report(greedy)
    assert greedy.max_deviation > 0.3


def test_good_drafter():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.55, 0.3, 0.15])
    result = report(single_position_arm("good drafter (acceptance 0.95)", accept_chain, p, q, 2))
    assert result.expected_acceptance == pytest.approx(0.95)
    assert result.passes, result.line()


def test_identical_drafter_is_always_accepted():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    result = report(single_position_arm("identical drafter q = p", accept_chain, p, p.copy(), 3))
    assert result.acceptance == 1.0  # u * p(x) < p(x) for every u in [0, 1)
    assert result.passes, result.line()


def test_disjoint_drafter_is_never_accepted_and_output_still_follows_p():
    p, q = np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.5, 0.5])
    result = report(single_position_arm("disjoint drafter", accept_chain, p, q, 4))
    assert result.acceptance == 0.0
    assert result.passes, result.line()


def test_one_hot_drafter_is_accepted_with_probability_p_of_x():
    p = np.array([0.2, 0.5, 0.3])
    result = report(single_position_arm("one-hot drafter x=1 (point mass)", accept_chain, p, None, 5, fixed_draft=1))
    assert result.expected_acceptance == 0.5
    assert result.passes, result.line()


def test_random_rows_over_257_tokens():
    rng = np.random.default_rng(257)
    p, q = rng.dirichlet(np.full(257, 0.5)), rng.dirichlet(np.full(257, 0.5))
    result = report(single_position_arm("257-token random rows", accept_chain, p, q, 6))
    assert result.passes, result.line()


CHAIN_P = np.array([[0.6, 0.3, 0.1], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8], [0.3, 0.4, 0.3]])
CHAIN_Q = np.array([[0.4, 0.4, 0.2], [0.3, 0.3, 0.4], [0.2, 0.5, 0.3]])


def test_chain_of_three_sampled_positions():
    _, positions, accepted, used = chain_arm("chain k=3", accept_chain, CHAIN_P, CHAIN_Q, 7)
    for result in positions:
        report(result)
        assert result.passes, result.line()
    # Two uniforms per examined position; the bonus after three survivors takes one more.
    k = CHAIN_Q.shape[0]
    np.testing.assert_array_equal(used, np.where(accepted < k, 2 * accepted + 2, 2 * k + 1))
    assert 0 < (accepted == 0).mean() < 1 and (accepted == k).any()


def test_residual_without_mass_falls_back_to_p_never_a_zero_token():
    p = np.array([0.5, 0.5, 0.0, 0.0])
    q = np.array([0.5 + 1e-13, 0.5 - 1e-13, 0.0, 0.0])  # p == q up to rounding
    rng = np.random.default_rng(8)
    rows = np.stack([p, p])
    # Uniforms chosen to force the rejection branch: u_accept * q[0] >= p[0].
    uniforms = np.column_stack([np.full(N_DRAWS, 1 - 1e-15), rng.random(N_DRAWS), rng.random(N_DRAWS)])
    tokens = np.array([accept_chain(rows, np.array([0]), q[None, :], u).token for u in uniforms])
    counts = np.bincount(tokens, minlength=4)
    deviation = float(np.max(np.abs(counts / N_DRAWS - p)))
    print(
        f"\n  residual without mass: N={N_DRAWS} every draw rejected, tokens 2,3 emitted {counts[2:].sum()} times, "
        f"max|f-p|={deviation:.4f} tol={tolerance(N_DRAWS):.4f}"
    )
    assert counts[2:].sum() == 0
    assert deviation <= tolerance(N_DRAWS)


def test_zero_draft_probability_rejects_without_nan():
    p, q = np.array([0.45, 0.35, 0.20]), np.array([0.5, 0.5, 0.0])
    emitted, accepted = first_tokens(accept_chain, p, q, N_DRAWS, seed=9, fixed_draft=2)
    assert not accepted.any()
    # The residual max(0, p - q) = [0, 0, 0.2] puts all its mass on token 2.
    assert np.all(emitted == 2)
    print(f"\n  q(x)=0 draft: N={N_DRAWS} accepted {accepted.mean():.0%}, all emitted from the residual")


def test_batched_rule_arms():
    """The torch rule on the same arms, all draws in one batch."""
    import torch

    from verispec.accept_batched import accept_chain_batched

    rng = np.random.default_rng(12)
    k, vocab = CHAIN_Q.shape
    drafts = np.stack([rng.choice(vocab, size=N_DRAWS, p=CHAIN_Q[i]) for i in range(k)], axis=1)
    result = accept_chain_batched(
        torch.from_numpy(np.broadcast_to(CHAIN_P, (N_DRAWS, k + 1, vocab)).copy()),
        torch.from_numpy(drafts),
        torch.from_numpy(np.broadcast_to(CHAIN_Q, (N_DRAWS, k, vocab)).copy()),
        torch.from_numpy(rng.random((N_DRAWS, 2 * k + 1))),
    )
    accepted, token = result.accepted.numpy(), result.token.numpy()
    first = np.where(accepted > 0, drafts[:, 0], token)
    counts = np.bincount(first, minlength=vocab)
    deviation = float(np.max(np.abs(counts / N_DRAWS - CHAIN_P[0])))
    acceptance = float((accepted > 0).mean())
    print(
        f"\n  batched torch rule, chain k=3 first position: N={N_DRAWS} max|f-p|={deviation:.4f} "
        f"accept={acceptance:.4f} (expect 0.8000) tol={tolerance(N_DRAWS):.4f}"
    )
    assert deviation <= tolerance(N_DRAWS)
    assert abs(acceptance - 0.8) <= tolerance(N_DRAWS)
