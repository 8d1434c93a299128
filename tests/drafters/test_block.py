"""The ``block`` drafter on the tiny target: penalties across the slots of one pass, refusals
(weights of another target or kind), layer choice. The laws it shares with the head (q is the
sampling law, mass under its row) are in test_trained_laws.py."""

import numpy as np
import pytest

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
