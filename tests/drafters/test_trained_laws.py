"""Both trained drafters (``head`` and ``block``) on the tiny target: q is the law their tokens
were drawn from, and every draft has mass under its own row (a point mass when greedy)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import tiny
from tests.drafters import trained
from verispec.sampling import SamplingParams

PROMPT = "the cat sat on the mat. the cat"


@pytest.fixture(scope="module", params=["head", "block"])
def drafter(request, tiny_engine, tiny_drafters):
    kind = request.param
    return tiny_engine.drafter(kind, drafter_weights=str(tiny_drafters[kind]))


def most_drafts(drafter, k: int) -> int:
    """A head drafts k tokens; one block pass fills at most its mask slots."""
    config = drafter.net.config
    return min(k, config.block_size - 1) if hasattr(config, "block_size") else k


@pytest.mark.parametrize(
    "params",
    [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 8, "top_p": 0.9, "repetition_penalty": 1.3}],
    ids=["plain", "filtered-penalised"],
)
def test_q_is_the_law_the_drafts_were_drawn_from(tiny_engine, drafter, params):
    report = trained.check_q_is_the_sampling_law(tiny_engine, drafter, PROMPT, SamplingParams(**params))
    print(f"\n  {drafter.name} {params}: {report}")


@settings(max_examples=30, deadline=None)
@given(
    temperature=st.sampled_from([0.0, 0.3, 1.0, 1.8]),
    top_k=st.integers(0, 12),
    top_p=st.floats(0.3, 1.0),
    presence=st.floats(-1.0, 2.0),
    seed=st.integers(0, 2**32 - 1),
    k=st.integers(1, 9),
)
def test_every_draft_has_mass_under_its_row(tiny_engine, drafter, temperature, top_k, top_p, presence, seed, k):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, presence_penalty=presence)
    context = trained.prepared(tiny_engine, drafter, PROMPT, params)
    try:
        draft = drafter.propose(context, k, np.random.default_rng(seed))
    finally:
        trained.release(tiny_engine, drafter)
    assert len(draft.tokens) == most_drafts(drafter, k)
    if draft.probs is None:  # point masses, reported as None: greedy where no penalty reads ids
        assert temperature == 0 and not params.penalised
        return
    assert draft.probs.shape == (len(draft.tokens), tiny.VOCAB)
    np.testing.assert_allclose(draft.probs.sum(axis=1), 1.0, atol=1e-9)
    assert all(draft.probs[i, token] > 0 for i, token in enumerate(draft.tokens))
    if temperature == 0:  # greedy: q is a point mass on the drafted token
        assert all(draft.probs[i, token] == 1.0 for i, token in enumerate(draft.tokens))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_confidence_floor_cuts_the_draft_where_the_drafter_is_unsure(
    tiny_engine, tiny_drafters, drafter, temperature
):
    # The floor reads the drafter's own confidence, never its sample: a gated draft is a
    # prefix of the ungated one from the same generator, with the same rows, ending just
    # before the first position whose confidence is below the floor.
    params = SamplingParams(temperature=temperature)
    seen = []
    shared = drafter.shared
    original = shared.draw

    def recording(logits, *args):
        seen.append(shared.distribution(logits, params, [], [])[1])  # the confidence the floor reads
        return original(logits, *args)

    k = most_drafts(drafter, 6)
    context = trained.prepared(tiny_engine, drafter, PROMPT, params)
    shared.draw = recording
    try:
        full = drafter.propose(context, k, np.random.default_rng(3))
    finally:
        del shared.draw
        trained.release(tiny_engine, drafter)
    assert len(full.tokens) == k and len(seen) == k
    floor = sorted(seen)[len(seen) // 2]  # the median: some positions pass, some do not
    expected = next((i for i, c in enumerate(seen) if c < floor), k)
    gated_drafter = tiny_engine.drafter(
        drafter.name, drafter_weights=str(tiny_drafters[drafter.name]), min_confidence=floor
    )
    context = trained.prepared(tiny_engine, gated_drafter, PROMPT, params)
    try:
        gated = gated_drafter.propose(context, k, np.random.default_rng(3))
    finally:
        trained.release(tiny_engine, gated_drafter)
    print(
        f"\n  {drafter.name} T={temperature}: confidences {np.round(seen, 3)}, "
        f"floor {floor:.3f} -> {len(gated.tokens)} of {k} drafts"
    )
    assert gated.tokens == full.tokens[:expected]
    if expected and full.probs is not None:
        np.testing.assert_array_equal(gated.probs, full.probs[:expected])
    else:  # no draft, or greedy's point masses
        assert gated.probs is None and (expected == 0 or temperature == 0)
