"""The ``block`` drafter on the tiny target: q is its sampling law, one pass fills the block,
refusals (weights of another target or kind)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import tiny
from tests.drafters import trained
from verispec.drafters import block
from verispec.drafters.base import DrafterError
from verispec.sampling import SamplingParams
from verispec.targets.torch_target import TorchTarget

PROMPT = "the cat sat on the mat. the cat"


@pytest.fixture(scope="module")
def drafter(tiny_engine, tiny_drafters):
    return tiny_engine.drafter("block", drafter_weights=str(tiny_drafters["block"]))


@pytest.mark.parametrize(
    "params",
    [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 8, "top_p": 0.9, "repetition_penalty": 1.3}],
    ids=["plain", "filtered-penalised"],
)
def test_q_is_the_law_the_drafts_were_drawn_from(tiny_engine, drafter, params):
    report = trained.check_q_is_the_sampling_law(tiny_engine, drafter, PROMPT, SamplingParams(**params))
    print(f"\n  block {params}: {report}")


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
    slots = drafter.net.config.block_size - 1
    assert len(draft.tokens) == min(k, slots)  # one pass fills at most the block's mask slots
    assert draft.probs is not None and draft.probs.shape == (len(draft.tokens), tiny.VOCAB)
    np.testing.assert_allclose(draft.probs.sum(axis=1), 1.0, atol=1e-9)
    assert all(draft.probs[i, token] > 0 for i, token in enumerate(draft.tokens))
    if temperature == 0:
        assert all(draft.probs[i, token] == 1.0 for i, token in enumerate(draft.tokens))


def test_penalties_see_the_earlier_drafts(tiny_engine, drafter):
    # Slots come from one pass, but each slot's q is computed with the drafts before it in
    # its history: with a presence penalty, the token drafted at slot 1 loses mass at slot 2.
    def propose(params):
        context = trained.prepared(tiny_engine, drafter, PROMPT, params)
        try:
            return drafter.propose(context, 2, np.random.default_rng(0))
        finally:
            trained.release(tiny_engine, drafter)

    penalised = propose(SamplingParams(temperature=1.0, presence_penalty=2.0))
    plain = propose(SamplingParams(temperature=1.0))
    assert penalised.probs is not None and plain.probs is not None
    first = plain.tokens[0]
    assert penalised.tokens[0] == first  # slot 1 has no output history: same row, same draw
    np.testing.assert_array_equal(penalised.probs[0], plain.probs[0])
    assert 0 < penalised.probs[1, first] < plain.probs[1, first] < 1


def test_weights_of_another_target_or_kind_are_refused(tiny_drafters):
    other = TorchTarget(tiny.tiny_model(seed=5), name="other-tiny", exact=False)
    with pytest.raises(DrafterError, match=r"trained for the target .* not for 'other-tiny'.*weights_sha256"):
        block.build(other, tiny_drafters["block"])
    same = TorchTarget(tiny.tiny_model(seed=0), name="same", exact=False)
    with pytest.raises(DrafterError, match="holds a 'head' drafter, not a 'block' one"):
        block.build(same, tiny_drafters["head"])


def test_evenly_spaced_layers():
    assert block.evenly_spaced_layers(30, 4) == (1, 11, 20, 30)
    assert block.evenly_spaced_layers(2, 4) == (1, 2)
    assert block.evenly_spaced_layers(30, 1) == (30,)
