"""Building blocks of the trained drafters: rotary positions, attention over key parts, the
shared LM head over a draft vocabulary."""

import numpy as np
import torch

from verispec.drafters.layers import Attention, SharedTarget, rotary, window_mask


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


def test_the_draft_vocabulary_rows_are_the_targets_and_the_rest_is_impossible():
    torch.manual_seed(0)
    embeddings, head = torch.randn(10, 4), torch.randn(10, 4)
    shared = SharedTarget(embeddings, head, torch.tensor([2, 5, 7]))
    hidden = torch.randn(2, 4)
    rows = shared.full_rows(hidden)
    assert rows.shape == (2, 10)
    np.testing.assert_allclose(rows[:, [2, 5, 7]], (hidden @ head.T)[:, [2, 5, 7]].double().numpy(), rtol=1e-6)
    assert np.isneginf(np.delete(rows, [2, 5, 7], axis=1)).all()
    assert shared.label_index[5] == 1 and shared.label_index[3] == -100
