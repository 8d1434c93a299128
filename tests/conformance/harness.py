"""Statistical arms for the acceptance rule: draws, checks with stated tolerances, reports.

A *rule* here is any function with ``accept_chain``'s signature, so the same checks run
against verispec's rule and against the mutants that must fail them.

Tolerances come from the sample size. One draw's indicator of "token y was emitted" has
variance p(1 - p) <= 1/4, so one sigma of an empirical frequency over N draws is at most
sqrt(0.25 / N). An arm passes when

- every emitted frequency lies within Z_MAX sigmas of its target probability: Z_MAX = 5.4
  gives 0.0060 at N = 200,000; a correct rule exceeds it for one token with probability
  below 7e-8, so below 2e-5 over 257 tokens;
- the acceptance rate lies within the same bound of sum(min(p, q));
- a chi-square goodness-of-fit test of the emitted counts against N p has p-value above
  CHI2_ALPHA = 1e-3 (the checks run on fixed seeds, so a pass is reproducible, not lucky).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as scipy_stats

from verispec.accept import ChainResult

Rule = Callable[[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray], ChainResult]

N_DRAWS = 200_000
Z_MAX = 5.4
CHI2_ALPHA = 1e-3
# Negative controls (mutant rules that must FAIL an arm) run a tenth of the draws. Their
# mutants miss by 0.18 and more at N_DRAWS (each run reports its max|f-p|), against
# tolerance(20_000) = 0.019 on a position every draw reaches: to pass, a mutant's empirical frequency would have to land
# at least 0.18 - 0.006 - 0.019 > 0.15 from its own expectation, which Hoeffding's
# inequality bounds by 2 exp(-2 * 20_000 * 0.15**2) < 1e-390 (and the chi-square test
# fails it too). The lossless arms keep N_DRAWS: their tolerances are what the rule passes.
N_MUTANT = N_DRAWS // 10


def tolerance(n: int) -> float:
    """Z_MAX sigmas of a frequency estimated from n draws (worst case p = 1/2)."""
    return Z_MAX * math.sqrt(0.25 / n) if n else math.inf


@dataclass
class ArmResult:
    """What one arm measured, and whether it is within its stated tolerances."""

    name: str
    n: int
    tol: float
    max_deviation: float
    acceptance: float | None = None
    expected_acceptance: float | None = None
    chi2_pvalue: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def acceptance_deviation(self) -> float:
        if self.acceptance is None or self.expected_acceptance is None:
            return 0.0
        return abs(self.acceptance - self.expected_acceptance)

    @property
    def passes(self) -> bool:
        chi2_ok = self.chi2_pvalue is None or self.chi2_pvalue > CHI2_ALPHA
        return self.max_deviation <= self.tol and self.acceptance_deviation <= self.tol and chi2_ok

    def line(self) -> str:
        parts = [f"{self.name:<44}", f"N={self.n:>7}", f"tol={self.tol:.4f}", f"max|f-p|={self.max_deviation:.4f}"]
        if self.acceptance is not None:
            parts.append(f"accept={self.acceptance:.4f} (expect {self.expected_acceptance:.4f})")
        if self.chi2_pvalue is not None:
            parts.append(f"chi2 p={self.chi2_pvalue:.3g} (> {CHI2_ALPHA:g})")
        parts.append("PASS" if self.passes else "FAIL")
        return "  ".join(parts + self.notes)


REPORTS: list[str] = []


def report(result: ArmResult, label: str = "") -> ArmResult:
    """Print an arm's numbers (visible with -s) and keep them for the session summary."""
    text = f"{label}{result.line()}"
    print(f"\n  {text}")
    REPORTS.append(text)
    return result


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit of counts to probs; tokens of probability 0 must have no counts."""
    support = probs > 0
    if counts[~support].sum():
        return 0.0  # a token the target gives no mass was emitted
    expected = probs[support] / probs[support].sum() * counts.sum()
    if support.sum() < 2:
        return 1.0
    return float(scipy_stats.chisquare(counts[support], expected).pvalue)


def first_tokens(
    rule: Rule,
    target: np.ndarray,
    draft: np.ndarray | None,
    n: int,
    seed: int,
    fixed_draft: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """n one-position rounds: x ~ draft (or ``fixed_draft``), the rule decides; returns the
    emitted token and whether the draft was accepted, per draw."""
    rng = np.random.default_rng(seed)
    vocab = target.shape[0]
    drafts = np.full(n, fixed_draft) if fixed_draft is not None else rng.choice(vocab, size=n, p=draft)
    uniforms = rng.random((n, 3))
    rows = np.stack([target, target])
    draft_rows = None if draft is None else draft[None, :]
    emitted = np.empty(n, dtype=np.int64)
    accepted = np.empty(n, dtype=bool)
    for i in range(n):
        result = rule(rows, drafts[i : i + 1], draft_rows, uniforms[i])
        accepted[i] = result.accepted == 1
        emitted[i] = drafts[i] if accepted[i] else result.token
    return emitted, accepted


def single_position_arm(
    name: str,
    rule: Rule,
    target: np.ndarray,
    draft: np.ndarray | None,
    seed: int,
    n: int = N_DRAWS,
    fixed_draft: int | None = None,
) -> ArmResult:
    """Emitted frequencies against p, acceptance against its exact value, chi-square."""
    emitted, accepted = first_tokens(rule, target, draft, n, seed, fixed_draft)
    counts = np.bincount(emitted, minlength=target.shape[0])
    if draft is None:
        assert fixed_draft is not None
        expected_acceptance = float(target[fixed_draft])  # point mass: accepted w.p. p(x)
    else:
        expected_acceptance = float(np.minimum(target, draft).sum())
    return ArmResult(
        name=name,
        n=n,
        tol=tolerance(n),
        max_deviation=float(np.max(np.abs(counts / n - target))),
        acceptance=float(accepted.mean()),
        expected_acceptance=expected_acceptance,
        chi2_pvalue=chi2_pvalue(counts, target),
    )


def chain_arm(
    name: str, rule: Rule, targets: np.ndarray, drafts_q: np.ndarray, seed: int, n: int = N_DRAWS
) -> tuple[ArmResult, list[ArmResult], np.ndarray, np.ndarray]:
    """Rounds of k = len(drafts_q) sampled drafts, x_i ~ q_i, rows independent of history.

    A lossless chain emits, at every position j it reaches, a token distributed as p_j,
    whatever happened before. Returns the worst position as one result, the per-position
    results, and per draw the accepted count and the uniforms used.
    """
    rng = np.random.default_rng(seed)
    k, vocab = drafts_q.shape
    drafts = np.stack([rng.choice(vocab, size=n, p=drafts_q[i]) for i in range(k)], axis=1)
    uniforms = rng.random((n, 2 * k + 1))
    accepted = np.empty(n, dtype=np.int64)
    used = np.empty(n, dtype=np.int64)
    emitted = np.full((n, k + 1), -1, dtype=np.int64)
    for i in range(n):
        result = rule(targets, drafts[i], drafts_q, uniforms[i])
        accepted[i], used[i] = result.accepted, result.uniforms_used
        emitted[i, : result.accepted] = drafts[i, : result.accepted]
        emitted[i, result.accepted] = result.token
    positions = []
    for j in range(k + 1):
        reached = emitted[:, j] >= 0
        n_j = int(reached.sum())
        counts = np.bincount(emitted[reached, j], minlength=vocab)
        acceptance = expected = None
        if j < k:
            examined = accepted >= j
            acceptance = float((accepted[examined] > j).mean())
            expected = float(np.minimum(targets[j], drafts_q[j]).sum())
        positions.append(
            ArmResult(
                name=f"{name} position {j}",
                n=n_j,
                tol=tolerance(n_j),
                max_deviation=float(np.max(np.abs(counts / max(n_j, 1) - targets[j]))),
                acceptance=acceptance,
                expected_acceptance=expected,
                chi2_pvalue=chi2_pvalue(counts, targets[j]),
            )
        )
    worst = max(positions, key=lambda r: (not r.passes, r.max_deviation / r.tol))
    return worst, positions, accepted, used
