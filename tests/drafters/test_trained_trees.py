"""Trees from the trained drafters (``draft_branches``, ``propose_tree`` in
verispec/drafters/trained.py): each drafted position offers its chain candidate and up to
``branches - 1`` alternatives, listed position by position.

Sampled: each alternative is drawn from its position's row without the candidates before it
(renormalised) and reported with exactly that row, the law ``accept_tree`` assumes of
siblings drawn without replacement; checked here row by row and, over N_DRAWS proposals from
one state, by the chi-square and largest-deviation tests of ``tests/drafters/trained.py``.
Greedy: the next-best draft logits as point masses.
"""

import numpy as np
import pytest

from tests.conformance.harness import CHI2_ALPHA, tolerance
from tests.drafters import trained
from verispec.drafters.base import DrafterError
from verispec.sampling import SamplingParams

PROMPT = "the cat sat on the mat. the cat"
BRANCHES = 3
N_DRAWS = 2000


@pytest.fixture(scope="module", params=["head", "block"])
def branching(request, tiny_engine, tiny_drafters):
    kind = request.param
    return tiny_engine.drafter(kind, drafter_weights=str(tiny_drafters[kind]), draft_branches=BRANCHES)


@pytest.fixture(scope="module")
def chains(tiny_engine, tiny_drafters, branching):
    return tiny_engine.drafter(branching.name, drafter_weights=str(tiny_drafters[branching.name]))


def propose(engine, drafter, params, k, seed=0, tree=True):
    """The drafter's tree (or chain) of k positions from the prompt's state."""
    context = trained.prepared(engine, drafter, PROMPT, params)
    try:
        method = drafter.propose_tree if tree else drafter.propose
        return method(context, k, np.random.default_rng(seed))
    finally:
        trained.release(engine, drafter)


def test_a_greedy_tree_offers_the_next_best_draft_tokens_beside_the_chain(tiny_engine, branching, chains):
    greedy = SamplingParams(temperature=0)
    chain = propose(tiny_engine, chains, greedy, 2, tree=False)
    tree = propose(tiny_engine, branching, greedy, 2)
    assert tree.parents == [-1, -1, -1, 0, 0, 0]  # position 1's three candidates, then position 2's
    assert tree.probs is None  # point masses
    assert tree.main_chain().tokens == chain.tokens  # the chain is the one drafted without branches
    assert propose(tiny_engine, branching, greedy, 2, tree=False).tokens == chain.tokens  # propose: chains
    for siblings in (tree.tokens[0:3], tree.tokens[3:6]):
        assert len(set(siblings)) == BRANCHES
    # The alternatives are the next-best draft logits: their frequencies (the plain softmax)
    # fall from sibling to sibling and sum to at most one.
    for frequencies in (tree.frequencies[0:3], tree.frequencies[3:6]):
        assert frequencies == sorted(frequencies, reverse=True) and sum(frequencies) <= 1.0 + 1e-9


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=8, top_p=0.9, repetition_penalty=1.3)],
    ids=["plain", "filtered-penalised"],
)
def test_sampled_siblings_are_drawn_without_replacement_from_the_rows_they_report(tiny_engine, branching, params):
    context = trained.prepared(tiny_engine, branching, PROMPT, params)
    drafts = []
    try:
        for seed in range(N_DRAWS):
            drafts.append(branching.propose_tree(context, 1, np.random.default_rng(seed)))
            branching.observe(context, 0)
    finally:
        trained.release(tiny_engine, branching)
    for draft in drafts:
        assert draft.parents == [-1, -1, -1] and len(set(draft.tokens)) == BRANCHES
        # Each sibling's row is the first row without the siblings before it, renormalised.
        rest = draft.probs[0].copy()
        for node in range(1, BRANCHES):
            rest[draft.tokens[node - 1]] = 0.0
            rest /= rest.sum()
            np.testing.assert_allclose(draft.probs[node], rest, atol=1e-12)
            assert draft.probs[node][draft.tokens[node]] > 0
        # The frequencies go by a sibling's rank, not by the token it drew: the nodes the
        # governor keeps must not depend on the draws.
        assert draft.frequencies == drafts[0].frequencies
    report = []
    for node in range(BRANCHES):
        tokens = np.array([d.tokens[node] for d in drafts])
        rows = np.array([d.probs[node] for d in drafts])
        pvalue, deviation = trained.goodness_of_fit(tokens, rows)
        report.append(f"sibling {node + 1}: chi2 p={pvalue:.3g}, max|f-q|={deviation:.4f}")
        assert pvalue > CHI2_ALPHA and deviation <= tolerance(N_DRAWS), (node, pvalue, deviation)
    print(f"\n  {branching.name} {params}: N={N_DRAWS}, tol {tolerance(N_DRAWS):.4f}; " + "; ".join(report))


def test_a_sampled_position_offers_no_more_siblings_than_its_row_has_tokens(tiny_engine, branching):
    two = SamplingParams(temperature=1.0, top_k=2)
    for seed in range(20):
        draft = propose(tiny_engine, branching, two, 1, seed)
        assert draft.parents == [-1, -1] and len(set(draft.tokens)) == 2  # the row's whole support
        assert draft.probs[1][draft.tokens[1]] == 1.0  # what is left of it: the other token


@pytest.mark.parametrize("value", [0, -1, 1.5, "3", True])
def test_draft_branches_must_be_a_positive_integer(tiny_engine, tiny_drafters, value):
    with pytest.raises(DrafterError, match="draft_branches is an integer >= 1"):
        tiny_engine.drafter("head", drafter_weights=str(tiny_drafters["head"]), draft_branches=value)
