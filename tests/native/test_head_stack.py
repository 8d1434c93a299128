"""A trained head's layers on the kernels (``native/head_stack.py``, ``HeadStack`` in
decoder.cpp) against the head net in torch, on the tiny target's briefly trained heads.

With its matrices in f32 the kernels compute what torch computes, to float rounding: every
output row of a pass equals the net's own forward over the whole history with its window
mask, however the positions are cut into passes (catch-ups of many rows, single drafted
rows), past the window and past the ring's capacity (the ring's slots are reused), and after
``truncate`` forgot drafted positions and other inputs took their places. Planted faults (a
truncate that forgets nothing, a pass written at the wrong position) fail the same check.
"""

import pytest
import torch

from verispec.drafters.head import HeadDrafter
from verispec.native import head_stack

TOLERANCE = 1e-4  # relative to the rows' largest entry; float32 sums in another order differ ~1e-6


@pytest.fixture(scope="module", params=["head", "fused-head"])
def head(request, native_engine, tiny_drafters):
    """(drafter, net) of the tiny target's head; "fused-head" reads several layers (reduce)."""
    drafter = native_engine.drafter("head", drafter_weights=str(tiny_drafters[request.param]), fresh=True)
    assert isinstance(drafter, HeadDrafter)
    return drafter, drafter.net


def inputs(net, length, seed):
    """Features (target states of the layers read) and token ids of positions 1..length."""
    generator = torch.Generator().manual_seed(seed)
    width = len(net.config.layers_read) * net.config.hidden
    features = torch.randn(length, width, generator=generator)
    ids = torch.randint(0, int(net.vocab_ids.max()) + 1, (length,), generator=generator).tolist()
    return features, ids


@torch.inference_mode()
def reference(drafter, features, ids, first=1):
    """The torch net's outputs at positions first.., all in one pass (window mask), and each
    row's draft logits."""
    net = drafter.net
    positions = torch.arange(first, first + len(features))
    out, _ = net(net.target_features(features), drafter.shared.embed(torch.tensor(ids)), positions)
    return out, drafter.shared.draft_logits(net.logits_input(out))


def close(got, want):
    return float((got - want).abs().max() / want.abs().max()) < TOLERANCE


def outputs(stack, features, ids, start):
    return stack.run(features, ids, start)[0]


def run_in_passes(stack, features, ids, cuts, first=1):
    """Outputs of the stack over positions first.., in passes that end at ``cuts``, and the
    draft logits of each pass's last row."""
    outs, logits, start = [], [], 0
    for end in [*cuts, len(features)]:
        if end > start:
            out, last = stack.run(features[start:end], ids[start:end], first + start)
            outs.append(out)
            logits.append(last)
            start = end
    return torch.cat(outs), torch.stack(logits)


def test_the_kernels_compute_the_nets_outputs_in_any_passes(head):
    drafter, net = head
    stack = drafter.target.head_stack(net, "f32")
    window = net.config.window
    length = 2 * window + 64 + 3 * window  # past the ring's capacity (2 window + 64)
    features, ids = inputs(net, length, seed=1)
    want, want_logits = reference(drafter, features, ids)
    # one long catch-up, then single rows, then passes of a few rows, as drafting runs
    cuts = [window + 5, *range(window + 6, window + 20), *range(window + 23, length, 7)]
    got, logits = run_in_passes(stack, features, ids, cuts)
    assert close(got, want)
    last_rows = [end - 1 for end in [*cuts, length]]
    assert close(logits, want_logits[last_rows])  # the out norm and the LM head's rows, in the same call


def test_truncate_forgets_drafts_that_other_tokens_replace(head):
    drafter, net = head
    stack = drafter.target.head_stack(net, "f32")
    features, ids = inputs(net, 40, seed=2)
    junk_features, junk_ids = inputs(net, 5, seed=3)
    want, _ = reference(drafter, features, ids)
    stack.run(features[:30], ids[:30], 1)  # positions 1..30
    stack.run(junk_features, junk_ids, 31)  # drafts at 31..35, rejected
    stack.truncate(31)
    assert close(outputs(stack, features[30:], ids[30:], 31), want[30:])
    # a planted fault: a truncate that forgets too little leaves rejected drafts' keys to be read
    faulty = drafter.target.head_stack(net, "f32")
    faulty.run(features[:30], ids[:30], 1)
    faulty.run(torch.cat([junk_features, junk_features]), junk_ids + junk_ids, 31)  # 31..40
    faulty.truncate(36)  # forgets only 36.. : 31..35 remain the drafts'
    assert not close(outputs(faulty, features[35:], ids[35:], 36), want[35:])


def test_a_pass_at_the_wrong_position_fails_the_check(head):
    drafter, net = head
    stack = drafter.target.head_stack(net, "f32")
    features, ids = inputs(net, 12, seed=4)
    want, _ = reference(drafter, features, ids)
    stack.run(features[:6], ids[:6], 1)
    # rotary angles are relative: the second pass one position late sees its keys one further back
    assert not close(outputs(stack, features[6:], ids[6:], 8), want[6:])
    stack.clear()
    assert close(outputs(stack, features, ids, 1), want)  # cleared: the earlier keys are gone


def test_8_bit_4_bit_and_bf16_matrices_stay_near_the_nets_outputs(head):
    drafter, net = head
    features, ids = inputs(net, 20, seed=5)
    want, want_logits = reference(drafter, features, ids)
    errors = {}
    for weight_format, bound in (("bf16", 0.02), ("q8_0", 0.05), ("q4", 0.25)):
        got, logits = drafter.target.head_stack(net, weight_format).run(features, ids, 1)
        error = float((got - want).abs().max() / want.abs().max())
        errors[weight_format] = float((logits - want_logits[-1]).abs().max() / want_logits[-1].abs().max())
        assert 0 < error < bound, (weight_format, error)
        assert errors[weight_format] < bound, (weight_format, errors[weight_format])
    # The 4-bit head reads its LM head rows in 4 bits too: further from the net than 8 bits.
    assert errors["q4"] > errors["q8_0"], errors


def test_forks_keep_their_own_rings(head):
    drafter, net = head
    stack = drafter.target.head_stack(net, "f32")
    twin = stack.fresh()
    features, ids = inputs(net, 10, seed=6)
    want, _ = reference(drafter, features, ids)
    stack.run(*inputs(net, 10, seed=7), 1)  # other keys at the same positions, in the first ring
    assert close(outputs(twin, features, ids, 1), want)


def test_the_default_format_is_4_bit_where_the_widths_fit(head):
    _, net = head
    assert head_stack.kernel_format_for(net) == "q4"  # the tiny head's widths are multiples of 32
    assert head_stack.kernel_format_for(net, "q8_0") == "q8_0"
    assert head_stack.kernel_format_for(net, "bf16") == "bf16"
