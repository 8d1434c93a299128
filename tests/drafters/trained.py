"""Checks shared by the trained drafters' tests (``head``, ``block``): their q is the law their
tokens were drawn from.

``draws`` puts a drafter in a fixed state (the target prefilled on a prompt, ``begin``) and
proposes N times with N different seeded generators, the way the engine's calibration does
(propose, then ``observe(context, 0)``). The first tokens' counts are compared with the sum
of the q rows each was reported with (the expected counts) by a chi-square test (cells below
5 expected pooled, p-value above CHI2_ALPHA) and by the largest frequency deviation, within
``tolerance(N)`` (Z_MAX sigmas of a frequency from N draws). The second draft is checked the
same way among the draws whose first token was the most frequent one. A drafter that drew
its tokens from anything but the rows it reported (its argmax, an unfiltered softmax) fails.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats

from tests.conformance.harness import CHI2_ALPHA, tolerance
from verispec.sampling import SamplingParams

N_DRAWS = 3000


def prepared(engine, drafter, prompt: str, params: SamplingParams) -> list[int]:
    """Prefill the engine's target on ``prompt`` with capture on, as the engine does; begin."""
    ids = engine.encode(prompt)
    engine.target.capture_hidden(drafter.hidden_capture)
    engine.target.prefill(ids[:-1])
    drafter.begin(ids, params)
    return ids


def release(engine, drafter) -> None:
    engine.target.reset()
    engine.target.capture_hidden(None)
    drafter.reset()


def draws(engine, drafter, prompt: str, params: SamplingParams, k: int, n: int = N_DRAWS):
    """n proposals from one state: (tokens (n, k), first rows (n, V), second rows (n, V))."""
    context = prepared(engine, drafter, prompt, params)
    tokens, first_rows, second_rows = [], [], []
    try:
        for seed in range(n):
            draft = drafter.propose(context, k, np.random.default_rng(seed))
            drafter.observe(context, 0)
            assert draft.probs is not None and len(draft.tokens) == k
            tokens.append(draft.tokens)
            first_rows.append(draft.probs[0])
            second_rows.append(draft.probs[1])
    finally:
        release(engine, drafter)
    return np.array(tokens), np.array(first_rows), np.array(second_rows)


def goodness_of_fit(observed_tokens: np.ndarray, rows: np.ndarray) -> tuple[float, float]:
    """(chi-square p-value, max |frequency - expected frequency|) of n tokens, token j drawn
    from row j of ``rows`` (n, V): the expected count of token i is the sum of rows[:, i]."""
    n = len(observed_tokens)
    counts = np.bincount(observed_tokens, minlength=rows.shape[1]).astype(float)
    expected = rows.sum(axis=0)
    if counts[expected == 0].sum():
        return 0.0, 1.0  # a token no row gave mass was drawn
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    pvalue = 1.0  # one cell: nothing to test beyond the zero-mass check above
    if keep.sum() >= 2:
        pvalue = float(scipy_stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)
    return pvalue, float(np.max(np.abs(counts - expected)) / n)


def check_q_is_the_sampling_law(engine, drafter, prompt: str, params: SamplingParams) -> str:
    tokens, first_rows, second_rows = draws(engine, drafter, prompt, params, k=2)
    # The state is the same on every call, so the rows agree up to float rounding (the first
    # call computes the prompt's positions in one batch, later ones one position).
    np.testing.assert_allclose(first_rows, np.broadcast_to(first_rows[0], first_rows.shape), atol=1e-6)
    pvalue, deviation = goodness_of_fit(tokens[:, 0], first_rows)
    assert pvalue > CHI2_ALPHA and deviation <= tolerance(len(tokens)), (pvalue, deviation)
    # The second draft, among the draws whose first token was the most frequent one.
    common = np.bincount(tokens[:, 0]).argmax()
    chosen = tokens[:, 0] == common
    pvalue2, deviation2 = goodness_of_fit(tokens[chosen, 1], second_rows[chosen])
    assert pvalue2 > CHI2_ALPHA and deviation2 <= tolerance(int(chosen.sum())), (pvalue2, deviation2)
    support = int((first_rows[0] > 0).sum())
    return (
        f"first draft: N={len(tokens)} over {support} tokens, chi2 p={pvalue:.3g}, max|f-q|={deviation:.4f} "
        f"(tol {tolerance(len(tokens)):.4f}); second draft given the first: N={int(chosen.sum())}, "
        f"chi2 p={pvalue2:.3g}, max|f-q|={deviation2:.4f} (tol {tolerance(int(chosen.sum())):.4f})"
    )
