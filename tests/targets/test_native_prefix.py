"""Prefix reuse on the native target: a prefill keeps the prefix its sequence's cache still
holds from the last request and computes only the rest, and what follows is bit-identical to a
cold prefill's; rollbacks, trees and hidden-state captures keep only what is really cached;
``drop_cache`` and a failed self-test start cold, and the self-test catches a planted fault."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests import tiny
from verispec.targets.base import HiddenCapture, Pass
from verispec.targets.native import NativeTarget

PROMPT = [(7 * i + 3) % tiny.VOCAB for i in range(40)]
CONTINUATION = [5, 9, 14, 14, 17, 29, 25]


@pytest.fixture(scope="module")
def pair(tiny_dir):
    """Two native targets of the tiny model: one that reuses, one that is always cold."""
    warm, cold = NativeTarget("dir", tiny_dir, slots=2), NativeTarget("dir", tiny_dir)
    assert warm.prefix_reuse_exact and cold.prefix_reuse_exact  # the load-time check held
    return warm, cold


def after_cold_prefill(cold, prompt, tokens):
    cold.drop_cache()
    cold.prefill(prompt)
    assert cold.reused_tokens == 0
    return cold.verify(tokens)


def test_a_prefill_keeps_the_cached_prefix_and_gives_a_cold_prefills_logits(pair):
    warm, cold = pair
    warm.drop_cache()
    warm.prefill(PROMPT)
    assert warm.reused_tokens == 0
    warm.verify(CONTINUATION[:4])  # a request decodes: its tokens are cached too
    # The next request carries the first one's prompt and answer, then a new turn.
    follow = PROMPT + CONTINUATION[:4] + [11, 12, 13]
    warm.reset()
    warm.prefill(follow)
    assert warm.reused_tokens == len(PROMPT) + 4 and warm.cached_tokens == len(follow)
    np.testing.assert_array_equal(warm.verify([1, 2, 3]), after_cold_prefill(cold, follow, [1, 2, 3]))
    # A prompt that parts from the cache at position 10 keeps 10 positions, whatever comes after.
    other = PROMPT[:10] + [(t + 1) % tiny.VOCAB for t in PROMPT[10:]]
    warm.reset()
    warm.prefill(other)
    assert warm.reused_tokens == 10
    np.testing.assert_array_equal(warm.verify(CONTINUATION), after_cold_prefill(cold, other, CONTINUATION))
    # The same prompt again keeps all of it.
    warm.reset()
    warm.prefill(other)
    assert warm.reused_tokens == len(other)
    np.testing.assert_array_equal(warm.verify(CONTINUATION), after_cold_prefill(cold, other, CONTINUATION))


def test_rolled_back_drafts_and_unkept_branches_are_not_reused(pair):
    warm, _ = pair
    warm.drop_cache()
    warm.prefill(PROMPT)
    warm.verify(CONTINUATION)  # 7 rows; the round keeps 3 of them
    warm.rollback(len(PROMPT) + 3)
    warm.reset()
    warm.prefill(PROMPT + CONTINUATION)
    assert warm.reused_tokens == len(PROMPT) + 3  # the rejected rows are still in memory, not kept
    # A tree: root 1, children 2 and 3 of the root, 4 under 2; the path kept is [1 (3)].
    warm.reset()
    warm.prefill(PROMPT)
    warm.verify_tree([1, 2, 3, 4], [-1, -1, 0])
    warm.keep_path([1])
    assert warm.cached_tokens == len(PROMPT) + 2
    warm.reset()
    warm.prefill([*PROMPT, 1, 3, 4])
    assert warm.reused_tokens == len(PROMPT) + 2
    warm.reset()
    warm.prefill([*PROMPT, 1, 2, 4])  # the branch not kept: its row sits in memory, not in the sequence
    assert warm.reused_tokens == len(PROMPT) + 1


def test_sequences_keep_their_own_prefixes(pair):
    warm, cold = pair
    warm.drop_cache()
    zero, one = warm.sequence(0), warm.sequence(1)
    other = [(t + 5) % tiny.VOCAB for t in PROMPT]
    zero.prefill(PROMPT)
    one.reset()
    warm.run([Pass(one, other, False)])  # a scheduler's prefill chunk, in a shared pass
    assert (zero.shared_prefix(PROMPT), one.shared_prefix(PROMPT), one.shared_prefix(other)) == (
        len(PROMPT),
        0,
        len(other),
    )
    assert one.reuse([*other, 1, 2]) == len(other) and one.cached_tokens == len(other)
    (logits,) = warm.run([Pass(one, [1, 2], True)])
    np.testing.assert_array_equal(logits, after_cold_prefill(cold, other, [1, 2]))
    one.drop_cache()
    assert one.shared_prefix(other) == 0 and zero.shared_prefix(PROMPT) == len(PROMPT)
    warm.drop_cache()
    assert zero.shared_prefix(PROMPT) == 0


def test_a_capturing_sequence_computes_the_rows_whose_states_it_keeps(pair, tiny_dir):
    warm, cold = pair
    capture = HiddenCapture(layers=(1, 2), prefill_rows=3)
    for target in (warm, cold):
        target.drop_cache()
        target.capture_hidden(capture)
    try:
        warm.prefill(PROMPT)
        warm.reset()
        warm.prefill([*PROMPT, 1, 2])
        assert warm.reused_tokens == len(PROMPT) + 2 - 3
        cold.prefill([*PROMPT, 1, 2])
        torch.testing.assert_close(warm.last_hidden, cold.last_hidden, rtol=0, atol=0)
        np.testing.assert_array_equal(warm.verify([5]), cold.verify([5]))
    finally:
        warm.capture_hidden(None)
        cold.capture_hidden(None)


def test_drop_cache_and_a_failed_self_test_start_cold(pair, monkeypatch):
    warm, _ = pair
    warm.drop_cache()
    warm.prefill(PROMPT)
    warm.drop_cache()
    warm.prefill(PROMPT)
    assert warm.reused_tokens == 0
    monkeypatch.setattr(warm, "prefix_reuse_exact", False)
    warm.reset()
    warm.prefill(PROMPT)
    assert warm.reused_tokens == 0 and warm.shared_prefix(PROMPT) == 0


def test_the_self_test_catches_a_prefix_cached_differently(tiny_dir, monkeypatch):
    # A planted fault: a prefill chunk of several rows caches its last position from another
    # token (as a kernel whose chunk shape changed a row's bits would). Verify rows are still
    # exact, but a prefix cached in other passes is not what one prefill caches.
    target = NativeTarget("dir", tiny_dir)
    forward = target.decoder.forward

    def drifting(ids, start, logits, capture=(), slot=0):
        if not logits and len(ids) > 1:
            ids = [*ids[:-1], (ids[-1] + 1) % tiny.VOCAB]
        return forward(ids, start, logits, capture, slot)

    monkeypatch.setattr(target.decoder, "forward", drifting)
    assert target.self_test() is True  # verify rows are untouched
    assert target.prefix_reuse_exact is False
    target.prefill(PROMPT)
    target.reset()
    target.prefill(PROMPT)
    assert target.reused_tokens == 0
