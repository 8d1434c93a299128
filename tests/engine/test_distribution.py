"""Whole-engine distribution at T > 0, with top-k and top-p on.

On the tiny target, the first three generated tokens are enumerated exactly: a fresh
forward pass without any cache gives each prefix's logits, the sampling pipeline gives its
final distribution, and the product over positions is the exact joint law. The engine is
then run with N_RUNS different seeds and the empirical joint is compared with it by a
chi-square test (cells with an expected count below 5 pooled into one), p-value threshold
CHI2_ALPHA, and by the largest deviation of a cell's frequency, bounded by Z_MAX sigmas of
a frequency estimated from N_RUNS draws (harness.tolerance).

The negative control, a model drafter that drafts greedily but reports its softmax as q,
must fail the same test.
"""

import itertools

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from tests.conformance.harness import CHI2_ALPHA, tolerance
from tests.engine.scripted import GreedyButReportsSoftmax
from verispec.sampling import SamplingParams, final_distribution

pytestmark = pytest.mark.slow

N_RUNS = 2500
N_RUNS_CONTROL = 1000  # the control misses by ~0.4 on one outcome: far beyond any tolerance here
TOKENS = 3
# The tiny target's own greedy loop "U8bysS" once, so lookup drafts what the target often
# samples (about a third of its drafts are kept at these settings).
PROMPT = "the cat satG1qLT?U8bysSU8"
PARAMS = {"temperature": 1.0, "top_k": 5, "top_p": 0.9}


def enumerate_law(row):
    """{(t1, t2, t3): probability}: the product of ``row(prefix)`` (the final distribution of
    the next token after the output prefix) over the support of each position."""
    law = {}
    first = row(())
    for t1 in np.flatnonzero(first):
        second = row((t1,))
        for t2 in np.flatnonzero(second):
            third = row((t1, t2))
            for t3 in np.flatnonzero(third):
                law[(int(t1), int(t2), int(t3))] = first[t1] * second[t2] * third[t3]
    assert abs(sum(law.values()) - 1) < 1e-9
    return law


_laws: dict[int, dict[tuple[int, ...], float]] = {}


def law_of(engine):
    """{(t1, t2, t3): probability} by enumeration over the support of each position; each
    prefix's logits from the engine's own target, in a fresh pass over the whole prefix."""
    if id(engine) not in _laws:
        target = engine.target
        prompt = engine.encode(PROMPT)
        params = SamplingParams(**PARAMS)

        def row(output):
            ids = prompt + [int(t) for t in output]
            target.prefill(ids[:-1])
            logits = target.verify(ids[-1:])[0]
            target.reset()
            return final_distribution(logits, params, prompt, list(output))

        _laws[id(engine)] = enumerate_law(row)
    return _laws[id(engine)]


@pytest.fixture(scope="module")
def exact_law(tiny_engine):
    return law_of(tiny_engine)


def test_the_enumeration_agrees_with_a_plain_transformers_forward(tiny_engine, exact_law):
    model = tiny_engine.target.model
    prompt = tiny_engine.encode(PROMPT)
    params = SamplingParams(**PARAMS)
    first = sorted(exact_law.items(), key=lambda item: -item[1])[0][0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(first[:2])])).logits[0, -1].float().numpy()
    np.testing.assert_allclose(
        final_distribution(logits, params, prompt, list(first[:2]))[first[2]],
        exact_law[first] / sum(p for o, p in exact_law.items() if o[:2] == first[:2]),
        rtol=1e-5,
    )


def run_engine(engine, drafter, k, runs=N_RUNS, prompt=PROMPT):
    counts: dict[tuple[int, ...], int] = {}
    offered = accepted = 0
    for seed in range(runs):
        result = engine.generate(prompt, drafter=drafter, k=k, seed=seed, max_tokens=TOKENS, **PARAMS)
        key = tuple(result.token_ids)
        counts[key] = counts.get(key, 0) + 1
        offered += result.stats.offered
        accepted += result.stats.accepted
    return counts, offered, accepted


def compare(counts, law, runs=N_RUNS):
    outcomes = sorted(set(law) | set(counts), key=lambda o: -law.get(o, 0.0))
    observed = np.array([counts.get(o, 0) for o in outcomes], dtype=float)
    expected = np.array([law.get(o, 0.0) for o in outcomes]) * runs
    impossible = observed[expected == 0].sum()
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    pvalue = 0.0 if impossible else float(scipy_stats.chisquare(obs[keep], exp[keep]).pvalue)
    deviation = float(np.max(np.abs(observed - expected) / runs))
    return pvalue, deviation, int(big.sum())


# ("lookup", "auto") runs the same test with the economics governor choosing k; "head" and
# "block" are the trained drafters (trained briefly on the tiny target, tiny_drafters).
@pytest.mark.parametrize(
    ("drafter", "k"), [("lookup", 3), ("model", 3), ("none", 0), ("lookup", "auto"), ("head", 3), ("block", 3)]
)
def test_engine_output_follows_the_target(tiny_engine, exact_law, drafter, k, request):
    check_follows(tiny_engine, exact_law, drafter, k, request)


# The same on the native backend (its own kernels, fp16 KV cache: its own law).
@pytest.mark.parametrize(("drafter", "k"), [("none", 0), ("lookup", 3), ("lookup", "auto"), ("model", 3), ("head", 3)])
def test_native_engine_output_follows_its_target(native_engine, drafter, k, request):
    check_follows(native_engine, law_of(native_engine), drafter, k, request)


def check_follows(engine, law, drafter, k, request):
    chosen = drafter
    if drafter in ("head", "block"):
        weights = request.getfixturevalue("tiny_drafters")[drafter]
        chosen = engine.drafter(drafter, drafter_weights=str(weights))
    counts, offered, accepted = run_engine(engine, chosen, k)
    pvalue, deviation, cells = compare(counts, law)
    tol = tolerance(N_RUNS)
    print(
        f"\n  whole engine ({engine.target.description}), {drafter} k={k}: N={N_RUNS} runs, "
        f"{len(law)} outcomes ({cells} cells >= 5 expected), "
        f"chi2 p={pvalue:.3g} (> {CHI2_ALPHA}), max|f-p|={deviation:.4f} (tol {tol:.4f}), "
        f"acceptance {accepted}/{offered}"
    )
    if drafter != "none":
        assert offered > 0 and 0 < accepted < offered  # drafts were offered, kept and rejected
    assert pvalue > CHI2_ALPHA
    assert deviation <= tol


@pytest.mark.parametrize("engine_name", ["tiny_engine", "native_engine"])
def test_greedy_drafting_reported_as_softmax_fails(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    options = engine.drafter_options
    broken = GreedyButReportsSoftmax(options["draft_target"], engine.target)
    counts, _, _ = run_engine(engine, broken, 3, runs=N_RUNS_CONTROL)
    pvalue, deviation, _ = compare(counts, law_of(engine), runs=N_RUNS_CONTROL)
    print(
        f"\n  NEGATIVE CONTROL greedy drafts reported as softmax: N={N_RUNS_CONTROL} chi2 p={pvalue:.3g}, "
        f"max|f-p|={deviation:.4f} -> detected"
    )
    assert pvalue < CHI2_ALPHA


def test_enumeration_matches_the_engines_own_view(tiny_engine, exact_law):
    # The exact law's support is what top-k 5 and top-p 0.9 leave: at most 5 per position.
    assert len(exact_law) <= 5**TOKENS
    assert all(len(o) == TOKENS for o in itertools.islice(exact_law, 10))
