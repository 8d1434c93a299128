"""The ``head`` drafter on the tiny target: refusals (weights of another target, a target
without hidden states) and the negative control of the q check. The laws it shares with the
block (q is the sampling law, mass under its row) are in test_trained_laws.py."""

import numpy as np
import pytest
import torch

from tests import tiny
from tests.drafters import trained
from verispec.drafters import head
from verispec.drafters.base import DrafterContext, DrafterError
from verispec.drafters.registry import create_drafter
from verispec.planner import CALIBRATION_REPEATS, calibrate
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


def drafts_of(engine, drafter, prompts, k):
    """Every proposal the drafter made (token lists) over greedy requests at a fixed k."""
    proposals = []
    propose = drafter.propose

    def recording(context, k, rng):
        draft = propose(context, k, rng)
        proposals.append(list(draft.tokens))
        return draft

    drafter.propose = recording
    try:
        for prompt in prompts:
            engine.generate(prompt, drafter=drafter, k=k, temperature=0, max_tokens=40)
    finally:
        del drafter.propose
    return proposals


@pytest.mark.parametrize("kind", ["head", "fused-head"])
def test_the_head_on_the_kernels_drafts_what_it_drafts_in_torch(native_engine, tiny_drafters, kind):
    # With f32 matrices the kernels' head is torch's to float rounding, so through real
    # requests (catch-ups after each verify, drafted rows, rejected drafts forgotten) every
    # proposal is the same: the kernels keep the same positions as torch's cache does.
    weights = str(tiny_drafters[kind])
    on_kernels = native_engine.drafter("head", drafter_weights=weights, head_kernels="f32", fresh=True)
    in_torch = native_engine.drafter("head", drafter_weights=weights, head_kernels="off", fresh=True)
    assert on_kernels.kernels is not None and in_torch.kernels is None
    prompts = [PROMPT, "one two three four five six seven eight nine ten eleven", "a b a b a b a"]
    for drafter in (on_kernels, in_torch):  # the engine's first use of a drafter name calibrates its cost
        native_engine.generate(PROMPT, drafter=drafter, k=3, temperature=0, max_tokens=4)
    got = drafts_of(native_engine, on_kernels, prompts, k=3)
    assert got == drafts_of(native_engine, in_torch, prompts, k=3)
    assert sum(len(tokens) for tokens in got) > 30


def test_head_kernels_refuses_what_it_cannot_run(tiny_engine, native_engine, tiny_drafters):
    weights = str(tiny_drafters["head"])
    with pytest.raises(DrafterError, match="head_kernels is one of auto, off, q8_0, q4, bf16, f32, got 'fast'"):
        native_engine.drafter("head", drafter_weights=weights, head_kernels="fast", fresh=True)
    with pytest.raises(DrafterError, match="cannot run the head's layers in that format"):
        tiny_engine.drafter("head", drafter_weights=weights, head_kernels="q8_0", fresh=True)
    assert tiny_engine.drafter("head", drafter_weights=weights, fresh=True).kernels is None  # auto: torch there


@pytest.mark.parametrize("kind", ["head", "fused-head"])
def test_states_after_rounds_without_drafts_sit_at_their_positions(native_engine, tiny_drafters, kind):
    # Under the governor many rounds pass without a propose: observe keeps each verify pass's
    # states and the next propose takes in what a window still reaches. Every feature row must
    # then hold the state of the position it stands for, also after more than a window of
    # such rounds (passes no window reaches are let go).
    drafter = native_engine.drafter("head", drafter_weights=str(tiny_drafters[kind]), fresh=True)
    window = drafter.net.config.window
    context = trained.prepared(native_engine, drafter, PROMPT, SamplingParams(temperature=0))
    states = {}
    try:
        for step in range(2 * window + 5):
            native_engine.target.verify([context[-1]])  # a plain round: the pending token's pass
            states[len(context) - 1] = native_engine.target.last_hidden[0].clone()
            context = [*context, 3 + step % 40]
            drafter.observe(context, 0)
        assert len(drafter.propose(context, 2, np.random.default_rng(0)).tokens) == 2
        first, count = drafter.feature_start, drafter.feature_count
        assert first + count == len(context) - 1 and count >= window  # the catch-up's reach, contiguous
        for i in range(count):
            assert torch.equal(drafter.feature_buffer[i], states[first + i]), first + i
    finally:
        trained.release(native_engine, drafter)


def test_the_calibration_times_the_catch_up_of_a_whole_window(native_engine, tiny_drafters):
    # A drafted round after plain rounds first runs the head over the positions it missed;
    # the calibration must time that (from the prefill's states: a whole window), apart from
    # the warm proposals that follow it, and leave the drafter where a request's first round
    # expects it: its next proposal is the one a drafter that was never calibrated makes.
    weights = str(tiny_drafters["head"])
    drafter = native_engine.drafter("head", drafter_weights=weights, head_kernels="f32", fresh=True)
    twin = native_engine.drafter("head", drafter_weights=weights, head_kernels="f32", fresh=True)
    params = SamplingParams(temperature=0)
    prompt = PROMPT + " on the mat" * 4  # longer than the head's window
    window = drafter.net.config.window
    caught_up = []  # positions each proposal ran the head over before drafting
    propose = drafter.propose

    def recording(context, k, rng):
        last = drafter.kernel_committed  # the last position kept once the last drafts go
        caught_up.append(min(window, len(context) - 1 - (last if last is not None else 0)))
        return propose(context, k, rng)

    drafter.propose = recording
    try:
        context = trained.prepared(native_engine, drafter, prompt, params)
        assert len(context) > window + 2
        costs = calibrate(native_engine.target, drafter, context, len(context), params, 4)
        drafter.observe(context, 0)
        after = propose(context, 3, np.random.default_rng(1)).tokens
    finally:
        del drafter.propose
        trained.release(native_engine, drafter)
    # A catch-up over the window from ``begin`` per repeat, each with a warm proposal (one
    # position) beside it, then one more warm one per repeat between the verify passes.
    n = CALIBRATION_REPEATS
    assert caught_up == [window, 1] * n + [1] * n, caught_up
    assert not costs.per_proposal  # (the seconds are timings: the governor's tests price them)
    context = trained.prepared(native_engine, twin, prompt, params)
    try:
        assert after == twin.propose(context, 3, np.random.default_rng(1)).tokens
        lookup = native_engine.drafter("lookup")
        lookup.begin(context, params)
        costs = calibrate(native_engine.target, lookup, context, len(context), params, 4)
        assert costs.catch_up_seconds == 0.0 and costs.per_proposal  # a pure drafter has nothing to catch up
    finally:
        trained.release(native_engine, twin)
