"""The torch backend: verify rows against single steps, rollback, capability checks."""

import numpy as np
import pytest
import torch

from tests import tiny
from verispec.targets import batch_invariant
from verispec.targets.base import TargetError, check_can_run
from verispec.targets.torch_target import TorchTarget, default_dtype, parse_dtype

PROMPT = [5, 9, 14, 14, 17, 29, 25, 17, 20, 14, 6, 31]
CONTINUATION = [29, 3, 4, 5, 29, 3, 4, 5, 29]


def sequential_rows(target, prompt, tokens):
    target.prefill(prompt)
    return np.stack([target.verify([t])[0] for t in tokens])


def torch_target(dtype, **options):
    """bf16 prepacking needs AVX-512 or AVX-NE-CONVERT: elsewhere the exact target warns
    and verifies row by row (the property the tests below still check)."""
    if dtype == torch.bfloat16 and options.get("exact", True) and not batch_invariant.available(dtype):
        with pytest.warns(UserWarning, match="cannot prepack bfloat16"):
            return TorchTarget(tiny.tiny_model(seed=0, **options.pop("model", {})).to(dtype), **options)
    return TorchTarget(tiny.tiny_model(seed=0, **options.pop("model", {})).to(dtype), **options)


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 5, 9])
def test_batched_verify_matches_single_steps(dtype, rows, exact):
    target = torch_target(dtype, exact=exact)
    single = sequential_rows(target, PROMPT, CONTINUATION[:rows])
    target.prefill(PROMPT)
    batched = target.verify(CONTINUATION[:rows])
    difference = float(np.max(np.abs(batched - single)))
    mode = "exact" if exact else "stock"
    print(
        f"\n  {dtype} {mode}: verify of {rows} rows vs {rows} single steps: max |logit difference| = {difference:.2e}"
    )
    if exact:  # the default on the CPU: bit for bit
        np.testing.assert_array_equal(batched, single)
    else:
        np.testing.assert_array_equal(batched.argmax(-1), single.argmax(-1))
        assert difference < (1e-4 if dtype == torch.float32 else 0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_at_long_context(dtype):
    # Verify blocks that straddle 1024 keys: there a reduction over the block's full key
    # count is blocked differently from a single step's (found on the embedded model, bf16).
    target = torch_target(dtype, model={"context": 2048})
    # one batched pass wherever oneDNN prepacks the dtype (else the exact row-by-row fallback)
    assert target.batched_verify_exact == batch_invariant.available(dtype)
    prompt = [(31 * i + 7) % tiny.VOCAB for i in range(1019)]
    single = sequential_rows(target, prompt, CONTINUATION)
    target.prefill(prompt)
    np.testing.assert_array_equal(target.verify(CONTINUATION), single)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_self_test_passes_and_the_row_by_row_fallback_is_exact(dtype):
    target = torch_target(dtype)
    # the load-time self-test held wherever oneDNN prepacks the dtype (else it was not tried)
    assert target.exact and target.batched_verify_exact == batch_invariant.available(dtype)
    assert target.cached_tokens == 0  # and left nothing behind
    target.batched_verify_exact = False  # as if it had failed: verify row by row
    single = sequential_rows(target, PROMPT, CONTINUATION)
    target.prefill(PROMPT)
    np.testing.assert_array_equal(target.verify(CONTINUATION), single)


def test_rollback_then_continue_equals_fresh_run():
    target = TorchTarget(tiny.tiny_model(seed=0))
    target.prefill(PROMPT)
    target.verify(CONTINUATION[:6])  # pending token + 5 drafts
    target.rollback(len(PROMPT) + 2)  # keep two of them
    assert target.cached_tokens == len(PROMPT) + 2
    after_rollback = target.verify([40, 41])
    target.prefill(PROMPT + CONTINUATION[:2])
    fresh = target.verify([40, 41])
    np.testing.assert_allclose(after_rollback, fresh, atol=1e-5)
    np.testing.assert_array_equal(after_rollback.argmax(-1), fresh.argmax(-1))


def test_rollback_refuses_impossible_lengths():
    target = TorchTarget(tiny.tiny_model(seed=0))
    target.prefill(PROMPT)
    with pytest.raises(TargetError, match="cannot roll back"):
        target.rollback(len(PROMPT) + 1)
    with pytest.raises(TargetError, match="cannot roll back"):
        target.rollback(-1)


def test_reports_vocab_context_and_eos():
    target = TorchTarget(tiny.tiny_model(seed=0, context=64))
    assert target.vocab_size == tiny.VOCAB
    assert target.context_length == 64
    assert target.eos_token_ids == frozenset({tiny.EOS})
    assert target.supports_rollback
    check_can_run(target, 63)
    with pytest.raises(TargetError, match="prompt has 64 tokens"):
        check_can_run(target, 64)
    target.prefill(list(range(60)))
    with pytest.raises(TargetError, match="exceed the context"):
        target.verify([1, 2, 3, 4, 5])


def test_dtype_choice():
    assert parse_dtype("float32", "cpu") is torch.float32
    assert parse_dtype("bf16", "cpu") is torch.bfloat16
    assert parse_dtype("auto", "cpu") is default_dtype("cpu")
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("int3", "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("queries", [1, 4])
def test_patched_attention_is_attention(dtype, queries):
    """The batch-invariant attention against the textbook formula in float64."""
    from verispec.targets.batch_invariant import _attend

    torch.manual_seed(0)
    batch, kv_heads, groups, keys, dim = 1, 3, 3, 40, 16
    query = torch.randn(batch, kv_heads * groups, queries, dim)
    key, value = torch.randn(batch, kv_heads, keys, dim), torch.randn(batch, kv_heads, keys, dim)
    got = _attend(query.to(dtype), key.to(dtype), value.to(dtype), scale=dim**-0.5).double()
    k64 = key.double().repeat_interleave(groups, dim=1)
    v64 = value.double().repeat_interleave(groups, dim=1)
    scores = query.double() @ k64.transpose(2, 3) * dim**-0.5
    positions = torch.arange(keys - queries, keys).unsqueeze(-1)
    scores = scores.masked_fill(torch.arange(keys) > positions, float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v64
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    assert float((got - expected).abs().max()) < tolerance


def test_exact_model_agrees_with_the_stock_model():
    model = tiny.tiny_model(seed=0)
    stock = TorchTarget(tiny.tiny_model(seed=0), exact=False)
    exact = TorchTarget(model, exact=True)
    for target in (stock, exact):
        target.prefill(PROMPT)
    np.testing.assert_allclose(exact.verify(CONTINUATION), stock.verify(CONTINUATION), atol=1e-4)


def full_forward_hidden(model, ids, layers):
    with torch.no_grad():
        states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.cat([states[layer][0] for layer in layers], dim=-1)


@pytest.mark.parametrize("row_by_row", [False, True])
def test_captured_hidden_states_are_the_models_own(row_by_row):
    from verispec.targets.base import HiddenCapture

    model = tiny.tiny_model(seed=0)
    target = TorchTarget(model)
    target.batched_verify_exact = not row_by_row  # True: the exact fallback, one forward per row
    layers = (0, 1, 2)
    target.capture_hidden(HiddenCapture(layers, prefill_rows=4))
    expected = full_forward_hidden(model, PROMPT + CONTINUATION[:5], layers)
    target.prefill(PROMPT)
    assert target.last_hidden.shape == (4, 3 * 32)  # the prompt's last 4 positions
    torch.testing.assert_close(target.last_hidden, expected[len(PROMPT) - 4 : len(PROMPT)], rtol=1e-4, atol=1e-4)
    target.verify(CONTINUATION[:5])
    assert target.last_hidden.shape == (5, 3 * 32)  # one row per verified token
    torch.testing.assert_close(target.last_hidden, expected[len(PROMPT) :], rtol=1e-4, atol=1e-4)
    target.capture_hidden(None)
    target.verify(CONTINUATION[5:6])
    assert target.last_hidden is None


def test_capture_of_a_layer_the_model_lacks_is_refused():
    from verispec.targets.base import HiddenCapture

    target = TorchTarget(tiny.tiny_model(seed=0, layers=2))
    with pytest.raises(TargetError, match="hidden states 0..2"):
        target.capture_hidden(HiddenCapture((3,)))


def test_weights_fingerprint_is_the_same_in_fp32_and_bf16_and_differs_between_models():
    from verispec.targets.torch_target import weights_fingerprint

    model = tiny.tiny_model(seed=0)
    bf16 = tiny.tiny_model(seed=0).to(torch.bfloat16)
    assert weights_fingerprint(model) == weights_fingerprint(bf16)
    assert weights_fingerprint(model) != weights_fingerprint(tiny.tiny_model(seed=1))
