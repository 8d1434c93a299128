"""Exact check, no sampling: integrate the rule over its uniforms and compare with p.

For a draft x the implementation's output is piecewise constant in (u_accept, u_residual):
accept iff u_accept < p(x)/q(x), and an inverse-CDF draw changes only at cumulative sums.
Evaluating the real code at the midpoint of every cell between those breakpoints and
weighting by the cell's area gives the distribution it induces, exactly up to rounding.
"""

import itertools

import numpy as np
import pytest

from tests.conformance import mutants
from verispec.accept import accept_chain

EXACT_TOL = 1e-12


def _breaks(values):
    points = np.unique(np.concatenate([[0.0, 1.0], np.clip(values, 0.0, 1.0)]))
    # Breakpoints that differ only by rounding bound cells of no width: merge them, so every
    # midpoint is a valid uniform in [0, 1).
    return points[np.concatenate([[True], np.diff(points) > 1e-15])]


def induced_distribution(rule, p, q, point_mass=False):
    """P(emitted = y) under the rule, integrating over x ~ q (or each x for point masses)."""
    vocab = p.shape[0]
    rows = np.stack([p, p])
    out = np.zeros(vocab)
    candidates = range(vocab) if point_mass else np.flatnonzero(q)
    for x in candidates:
        q_x = 1.0 if point_mass else q[x]
        q_row = np.eye(vocab)[x] if point_mass else q
        weight_x = q[x]  # the chance the drafter proposes x
        rest = np.maximum(p - q_row, 0.0)
        accept_breaks = _breaks([p[x] / q_x])
        residual_breaks = _breaks(np.concatenate([np.cumsum(rest) / max(rest.sum(), 1e-300), np.cumsum(p)]))
        for a0, a1 in itertools.pairwise(accept_breaks):
            for r0, r1 in itertools.pairwise(residual_breaks):
                u = np.array([(a0 + a1) / 2, (r0 + r1) / 2, 0.5])
                result = rule(rows, np.array([x]), None if point_mass else q[None, :], u)
                token = x if result.accepted else result.token
                out[token] += weight_x * (a1 - a0) * (r1 - r0)
    return out


def _cases(n=120, seed=0):
    rng = np.random.default_rng(seed)
    for i in range(n):
        vocab = int(rng.integers(2, 7))
        p = rng.dirichlet(np.ones(vocab))
        q = rng.dirichlet(np.ones(vocab))
        if i % 3 == 0:  # sparse rows: zeros in p and in q
            p[rng.integers(0, vocab)] = 0.0
            q[rng.integers(0, vocab)] = 0.0
            p, q = p / p.sum(), q / q.sum()
        yield p, q


def test_rule_induces_exactly_p():
    worst = 0.0
    for p, q in _cases():
        worst = max(worst, float(np.max(np.abs(induced_distribution(accept_chain, p, q) - p))))
    print(f"\n  exact integration, 120 random (p, q) on V in [2, 6]: max |induced - p| = {worst:.2e} (tol {EXACT_TOL})")
    assert worst <= EXACT_TOL


def test_point_mass_draft_induces_exactly_p():
    # A deterministic drafter proposing x: integrate for each x separately.
    worst = 0.0
    for p, _ in _cases(n=60, seed=1):
        vocab = p.shape[0]
        for x in range(vocab):
            q = np.eye(vocab)[x]
            worst = max(worst, float(np.max(np.abs(induced_distribution(accept_chain, p, q) - p))))
    print(f"  exact integration, point-mass drafts: max |induced - p| = {worst:.2e}")
    assert worst <= EXACT_TOL


@pytest.mark.parametrize("name", sorted(mutants.SINGLE_POSITION_MUTANTS))
def test_mutants_fail_the_exact_check(name):
    rule = mutants.SINGLE_POSITION_MUTANTS[name]
    worst = max(float(np.max(np.abs(induced_distribution(rule, p, q) - p))) for p, q in _cases(n=30))
    print(f"\n  exact integration, mutant {name}: max |induced - p| = {worst:.3f} -> detected")
    assert worst > 1e-3
