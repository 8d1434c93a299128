"""The ``head`` drafter on the tiny target: refusals (weights of another target, a target
without hidden states) and the negative control of the q check. The laws it shares with the
block (q is the sampling law, mass under its row) are in test_trained_laws.py."""

import numpy as np
import pytest

from tests import tiny
from tests.drafters import trained
from verispec.drafters import head
from verispec.drafters.base import DrafterContext, DrafterError
from verispec.drafters.registry import create_drafter
from verispec.sampling import SamplingParams
from verispec.targets.torch_target import TorchTarget

PROMPT = "the cat sat on the mat. the cat"


@pytest.fixture(scope="module")
def drafter(tiny_engine, tiny_drafters):
    return tiny_engine.drafter("head", drafter_weights=str(tiny_drafters["head"]))


def test_a_one_token_prompt_drafts_nothing_until_a_feature_exists(tiny_engine, drafter):
    # With one prompt token nothing was prefilled: there is no h_{n-1} to draft from yet.
    context = trained.prepared(tiny_engine, drafter, "H", SamplingParams(temperature=0))
    try:
        assert drafter.propose(context, 3, np.random.default_rng(0)).tokens == []
    finally:
        trained.release(tiny_engine, drafter)


def test_weights_of_another_target_are_refused(tiny_drafters):
    other = TorchTarget(tiny.tiny_model(seed=5), name="other-tiny", exact=False)
    with pytest.raises(DrafterError, match=r"trained for the target .* not for 'other-tiny'.*weights_sha256"):
        head.build(other, tiny_drafters["head"])
    wider = TorchTarget(tiny.tiny_model(seed=0, vocab_size=80), name="wider", exact=False)
    with pytest.raises(DrafterError, match=r"vocab_size 69 \(weights\) vs 80 \(target\)"):
        head.build(wider, tiny_drafters["head"])


def test_the_shipped_default_is_refused_for_another_model(tiny_engine):
    # No --drafter-weights on a model that is not the embedded one: the shipped weights (or
    # their absence) are refused with the command that trains matching ones.
    with pytest.raises(DrafterError, match="verispec train-drafter"):
        create_drafter("head", DrafterContext(tiny_engine.target, tiny_engine.tokenizer))


def test_a_target_without_hidden_states_is_refused(tiny_gguf, tiny_drafters):
    llamacpp = pytest.importorskip("verispec.targets.llamacpp")
    if not llamacpp.available():
        pytest.skip("llama-cpp-python is not installed")
    target = llamacpp.LlamaCppTarget(tiny_gguf)
    context = DrafterContext(target, options={"drafter_weights": str(tiny_drafters["head"])})
    with pytest.raises(DrafterError, match="use the torch backend"):
        create_drafter("head", context)


class MedianDraws:
    """NEGATIVE CONTROL: the real head, but every uniform it draws is 0.5: its tokens are then
    the median of the q it reports, not draws from it (like drafting greedily)."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.hidden_capture = drafter.hidden_capture
        self.pure_proposals = False

    class _Half:
        def random(self):
            return 0.5

    def begin(self, prompt_ids, params):
        self.drafter.begin(prompt_ids, params)

    def propose(self, context, k, rng):
        return self.drafter.propose(context, k, self._Half())

    def observe(self, context, accepted):
        self.drafter.observe(context, accepted)

    def reset(self):
        self.drafter.reset()


def test_the_check_detects_tokens_not_drawn_from_q(tiny_engine, drafter):
    with pytest.raises(AssertionError):
        trained.check_q_is_the_sampling_law(tiny_engine, MedianDraws(drafter), PROMPT, SamplingParams(temperature=1.0))
