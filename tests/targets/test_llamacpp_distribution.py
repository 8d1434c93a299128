"""Whole-engine distribution at T > 0 on the llama.cpp backend (tiny GGUF, top-k and top-p on).

As tests/engine/test_distribution.py: the exact joint law of the first three tokens is
enumerated (here from llama.cpp single steps on a fresh cache), and N_RUNS seeded runs of
the engine are compared with it by chi-square (threshold CHI2_ALPHA) and the largest cell
deviation (harness.tolerance of N_RUNS).
"""

import contextlib

import pytest

from tests.conformance.harness import CHI2_ALPHA, tolerance
from tests.engine.prices import drafter_prices
from tests.engine.test_distribution import N_RUNS, PARAMS, compare, enumerate_law, run_engine
from verispec.sampling import SamplingParams, final_distribution
from verispec.targets.llamacpp import LlamaCppTarget

pytestmark = pytest.mark.slow
PROMPT = "the cat sat on the matkqlo6Gqlo"  # the tiny GGUF's own greedy loop, so lookup drafts well


@pytest.fixture(scope="module")
def exact_law(llama_engine, tiny_gguf):
    target = LlamaCppTarget(tiny_gguf)
    prompt = llama_engine.encode(PROMPT)
    params = SamplingParams(**PARAMS)

    def row(output):
        context = prompt + list(output)
        target.prefill(context[:-1])
        return final_distribution(target.verify(context[-1:])[0], params, prompt, list(output))

    return enumerate_law(row)


@pytest.mark.parametrize(("drafter", "k"), [("lookup", 3), ("model", 3), ("lookup", "auto")])
def test_llamacpp_engine_output_follows_the_target(llama_engine, exact_law, drafter, k):
    # Under --k auto the governor prices rounds from the tiny GGUF's timings, which on a busy
    # machine can say drafting never pays (once: no draft in 2,500 runs); priced by hand, as a
    # verify row of a real target, it drafts, so the arm tests the law with drafts in it.
    prices = drafter_prices(llama_engine, drafter) if k == "auto" else contextlib.nullcontext()
    with prices as set_costs:
        if set_costs is not None:
            set_costs(0.2)
        counts, offered, accepted = run_engine(llama_engine, drafter, k, prompt=PROMPT)
    pvalue, deviation, cells = compare(counts, exact_law)
    print(
        f"\n  llama.cpp whole engine, {drafter} k={k}: N={N_RUNS}, {len(exact_law)} outcomes ({cells} cells), "
        f"chi2 p={pvalue:.3g} (> {CHI2_ALPHA}), max|f-p|={deviation:.4f} (tol {tolerance(N_RUNS):.4f}), "
        f"acceptance {accepted}/{offered}"
    )
    assert offered > 0 and 0 < accepted < offered
    assert pvalue > CHI2_ALPHA
    assert deviation <= tolerance(N_RUNS)
