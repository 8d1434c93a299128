"""Building blocks of the trained drafters: rotary positions, attention over key parts, the
shared LM head over a draft vocabulary."""

import numpy as np
import pytest
import torch

from verispec.accept import sample_index
from verispec.drafters.base import DrafterError, check_confidence
from verispec.drafters.layers import Attention, SharedTarget, rotary, window_mask
from verispec.sampling import SamplingError, SamplingParams, final_distribution


def test_rotary_scores_depend_only_on_the_distance():
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(1, 1, 16, generator=generator), torch.randn(1, 1, 16, generator=generator)

    def score(q_position, k_position):
        q = rotary(query, torch.tensor([q_position]), 10000.0)
        k = rotary(key, torch.tensor([k_position]), 10000.0)
        return float((q * k).sum())

    assert abs(score(7, 3) - score(104, 100)) < 1e-4
    assert abs(score(7, 3) - score(7, 5)) > 1e-3


def test_attention_over_parts_equals_attention_over_the_joined_keys():
    torch.manual_seed(0)
    attention = Attention(dim=32, heads=4, kv_heads=2, head_dim=8, theta=10000.0)
    x, context = torch.randn(3, 32), torch.randn(5, 32)
    positions, context_positions = torch.arange(5, 8), torch.arange(5)
    own = attention.keys_values(x, positions)
    ctx = attention.keys_values(context, context_positions)
    mask_ctx = torch.tensor([[True, False, True, True, False]] * 3)
    split = attention(x, positions, [(*ctx, mask_ctx), (*own, None)])
    joined_keys = torch.cat([ctx[0], own[0]]), torch.cat([ctx[1], own[1]])
    joined_mask = torch.cat([mask_ctx, torch.ones(3, 3, dtype=torch.bool)], dim=1)
    joined = attention(x, positions, [(*joined_keys, joined_mask)])
    torch.testing.assert_close(split, joined)


def test_window_mask():
    mask = window_mask(torch.arange(4), torch.arange(4), window=2)
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    assert mask.equal(expected)


def full_row(shared, hidden):
    """What a drafter's row would be over the whole vocabulary: the head's logits in the
    draft vocabulary (bfloat16, as drafting computes them), -inf elsewhere."""
    row = np.full(shared.vocab_size, -np.inf)
    logits = hidden.to(torch.bfloat16) @ shared.head.to(torch.bfloat16).T
    row[shared.vocab_ids.numpy()] = logits.double().numpy()
    return row


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=2, top_p=0.9),
        SamplingParams(temperature=0.8, min_p=0.2),
        SamplingParams(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.5),
    ],
)
def test_a_drafted_row_is_the_pipeline_over_the_draft_vocabulary_and_zero_elsewhere(params):
    torch.manual_seed(0)
    embeddings, head = torch.randn(10, 4), torch.randn(10, 4)
    shared = SharedTarget(embeddings, head, torch.tensor([2, 5, 7, 8]))
    assert shared.label_index[5] == 1 and shared.label_index[3] == -100
    hidden = torch.randn(4)
    prompt, history = [5, 3], [7]  # penalties read ids in and out of the draft vocabulary
    row, confidence = shared.distribution(shared.draft_logits(hidden), params, prompt, history)
    expected = final_distribution(full_row(shared, hidden), params, prompt, history)
    assert row.shape == (10,)
    np.testing.assert_allclose(row, expected, rtol=1e-12, atol=1e-15)
    assert (np.delete(row, [2, 5, 7, 8]) == 0).all() and row.sum() == pytest.approx(1.0)
    # The confidence is the plain softmax's largest probability, whatever the sampling settings.
    plain = final_distribution(full_row(shared, hidden), SamplingParams(temperature=1.0))
    assert confidence == pytest.approx(plain.max(), rel=1e-12)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3)],
)
@pytest.mark.parametrize("vocab", [[1, 2, 5, 7, 8, 9], [8, 2, 9, 5, 1, 7]])  # ascending, and not
def test_a_draw_is_the_inverse_cdf_of_the_whole_row(params, vocab):
    # The draw over the draft vocabulary's entries alone (ascending ids) gives the token the
    # V-row's own running sums give, for every uniform; so does the V-row path (other orders).
    torch.manual_seed(1)
    shared = SharedTarget(torch.randn(10, 4), torch.randn(10, 4), torch.tensor(vocab))
    assert shared.ascending == (vocab == sorted(vocab))
    logits = shared.draft_logits(torch.randn(4))
    row, _ = shared.distribution(logits, params, [], [])
    for u in np.linspace(0.0, 0.999999, 401):
        token, drawn_row = shared.draw(logits, params, [], [], float(u), 0.0)
        assert token == sample_index(row, float(u))
        if params.greedy and shared.ascending:  # a point mass, reported as None (Draft.probs)
            assert drawn_row is None and row[token] == 1.0
        else:
            np.testing.assert_array_equal(drawn_row, row)


@pytest.mark.parametrize("tie", [True, False])
def test_a_greedy_draw_is_the_one_hot_rows_token_ties_and_bad_values_included(tie):
    # The greedy shortcut (no row built) draws the V-row's own one-hot token: the lowest id
    # among tied maxima, and refuses NaN, +inf and rows with no finite entry as the full
    # path does.
    shared = SharedTarget(torch.randn(10, 4), torch.randn(10, 4), torch.tensor([1, 2, 5, 7, 8, 9]))
    greedy = SamplingParams(temperature=0)
    logits = torch.tensor([0.5, 2.0, -1.0, 2.0 if tie else 1.0, 0.0, 1.5])
    token, row = shared.draw(logits, greedy, [], [], 0.3, 0.0)
    full, _ = shared.distribution(logits, greedy, [], [])
    assert row is None and token == int(full.argmax()) == 2
    for bad in ([float("nan")] + [0.0] * 5, [0.0, float("inf")] + [0.0] * 4, [float("-inf")] * 6):
        with pytest.raises(SamplingError):
            shared.draw(torch.tensor(bad), greedy, [], [], 0.3, 0.0)
        with pytest.raises(SamplingError):
            shared.distribution(torch.tensor(bad), greedy, [], [])


@pytest.mark.parametrize("bad", [-0.1, 1.5, "high", None, float("nan")])
def test_a_min_confidence_outside_zero_to_one_is_refused(bad):
    with pytest.raises(DrafterError, match="min_confidence must be a number in \\[0, 1\\]"):
        check_confidence(bad)
    assert check_confidence("0.25") == 0.25
