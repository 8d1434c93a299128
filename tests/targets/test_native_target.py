"""The native backend: exact verify rows in every weight format, rollback, prefill in
chunks, hidden states and fingerprints shared with the torch backend, bad input."""

import warnings

import numpy as np
import pytest
import torch

from tests import tiny
from tests.tiny_gguf import write_tiny_gguf
from verispec.native import decoder as native_decoder
from verispec.targets import native
from verispec.targets.base import HiddenCapture, TargetError
from verispec.targets.native import NativeTarget
from verispec.targets.torch_target import TorchTarget

PROMPT = [5, 9, 14, 14, 17, 29, 25, 17, 20, 14, 6, 31]
CONTINUATION = [29, 3, 4, 5, 29, 3, 4, 5, 29]
GGUF_TYPES = ["F32", "F16", "Q4_0", "Q4_1", "Q8_0"]


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("native-gguf")
    return {t: write_tiny_gguf(root / f"tiny-{t}.gguf", matrix_type=t) for t in GGUF_TYPES}


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory):
    return tiny.save(tiny.tiny_model(seed=0, context=2048), tmp_path_factory.mktemp("tiny-long"))


def sequential_rows(target, prompt, tokens):
    target.prefill(prompt)
    return np.stack([target.verify([t])[0] for t in tokens])


@pytest.mark.parametrize("weights", ["auto", "bf16", "int8", "int4"])
@pytest.mark.parametrize("kind", [*GGUF_TYPES, "dir"])
def test_verify_rows_equal_single_steps_in_every_format(gguf_files, tiny_dir, kind, weights):
    location = tiny_dir if kind == "dir" else gguf_files[kind]
    target = NativeTarget("dir" if kind == "dir" else "gguf", location, weights=weights)
    assert target.path == "kernels" and target.batched_verify_exact  # the load-time self-test held
    single = sequential_rows(target, PROMPT, CONTINUATION)
    for rows in (2, 5, 9):
        target.prefill(PROMPT)
        np.testing.assert_array_equal(target.verify(CONTINUATION[:rows]), single[:rows])


def test_verify_rows_are_exact_past_1024_keys(long_dir):
    target = NativeTarget("dir", long_dir, weights="int8")
    assert target.batched_verify_exact  # the self-test held: verify runs one pass, not rows
    prompt = [(31 * i + 7) % tiny.VOCAB for i in range(1019)]
    single = sequential_rows(target, prompt, CONTINUATION)
    target.prefill(prompt)  # the block's rows reach keys 1020 .. 1028
    passes = count_passes(target)
    np.testing.assert_array_equal(target.verify(CONTINUATION), single)
    assert passes == [len(CONTINUATION)]  # compared as one batched pass, not on the fallback


def count_passes(target):
    """A list that receives the row count of every forward pass ``target`` runs from now."""
    passes: list[int] = []
    forward = target.decoder.forward
    target.decoder.forward = lambda ids, *rest: passes.append(len(ids)) or forward(ids, *rest)
    return passes


def test_a_failed_self_test_warns_and_verifies_row_by_row(tiny_dir, monkeypatch):
    # Kernels whose blocks of rows drift from single steps, from the load on: the real
    # self-test must notice, warn, and leave verify on the row-by-row path, which is exact.
    reference = sequential_rows(NativeTarget("dir", tiny_dir), PROMPT, CONTINUATION)
    forward = native_decoder.KernelDecoder.forward

    def drifting(self, ids, start, logits, capture=(), slot=0):
        out, hidden = forward(self, ids, start, logits, capture, slot)
        return (out + 1e-3 if out is not None and len(ids) > 1 else out), hidden

    monkeypatch.setattr(native_decoder.KernelDecoder, "forward", drifting)
    with pytest.warns(UserWarning, match="verify rows differ from single steps .* verifying row by row"):
        target = NativeTarget("dir", tiny_dir)
    assert not target.batched_verify_exact
    target.prefill(PROMPT)
    passes = count_passes(target)
    np.testing.assert_array_equal(target.verify(CONTINUATION), reference)  # a block would drift
    assert passes == [1] * len(CONTINUATION)  # one row per pass


def test_the_self_test_catches_rows_that_differ(tiny_dir, monkeypatch):
    target = NativeTarget("dir", tiny_dir)
    forward = target.decoder.forward

    def drifting(ids, start, logits, capture=(), slot=0):  # a kernel whose rows change with the block
        out, hidden = forward(ids, start, logits, capture, slot)
        return (out + 1e-3 * len(ids) if out is not None else None), hidden

    monkeypatch.setattr(target.decoder, "forward", drifting)
    assert target.self_test() is False


def test_rollback_and_regenerate_gives_the_same_logits(tiny_dir):
    target = NativeTarget("dir", tiny_dir, weights="int4")
    target.prefill(PROMPT)
    first = target.verify(CONTINUATION[:4])
    target.verify([7, 8])
    target.rollback(len(PROMPT))
    assert target.cached_tokens == len(PROMPT)
    np.testing.assert_array_equal(target.verify(CONTINUATION[:4]), first)
    with pytest.raises(TargetError, match="cannot roll back"):
        target.rollback(target.cached_tokens + 1)


def test_prefill_in_chunks_equals_one_pass(tiny_dir, monkeypatch):
    whole = NativeTarget("dir", tiny_dir)
    whole.prefill(PROMPT)
    expected = whole.verify(CONTINUATION)
    monkeypatch.setattr(native, "PREFILL_CHUNK", 5)
    whole.prefill(PROMPT)
    np.testing.assert_array_equal(whole.verify(CONTINUATION), expected)


def test_the_kernels_and_the_torch_path_agree_with_transformers(tiny_dir):
    model = tiny.tiny_model(seed=0)
    ids = PROMPT + CONTINUATION
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    target = NativeTarget("dir", tiny_dir)
    target.prefill([])
    kernels_logits = target.verify(ids)
    torch_path = native_decoder.TorchDecoder(target.checkpoint, 64)
    torch_logits, _ = torch_path.forward(ids, 0, True)
    scale = np.abs(expected).max()
    # the kernels keep keys and values in fp16 (2^-11 relative each); the torch path in fp32
    assert np.abs(kernels_logits - expected).max() < 1e-3 * scale
    assert np.abs(torch_logits.numpy() - expected).max() < 1e-5 * scale


@pytest.mark.parametrize("architecture", ["qwen2", "mistral"])
def test_other_covered_architectures_agree_with_transformers(tmp_path, architecture):
    # Qwen2 adds biases to q, k and v and ties its embeddings; Mistral has a sliding window.
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        architecture,
        vocab_size=tiny.VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=architecture == "qwen2",
        sliding_window=128,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.5)  # from_config leaves them zero: make them count
    directory = tiny.save(model, tmp_path / architecture)
    target = NativeTarget("dir", directory)
    assert target.batched_verify_exact
    assert target.context_length == (128 if architecture == "mistral" else 256)  # the window caps Mistral's
    ids = PROMPT + CONTINUATION
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    target.prefill([])
    assert np.abs(target.verify(ids) - expected).max() < 1e-3 * np.abs(expected).max()


def test_the_torch_path_runs_when_the_kernels_are_disabled(tiny_dir, monkeypatch):
    monkeypatch.setenv("VERISPEC_NATIVE_KERNELS", "0")
    target = NativeTarget("dir", tiny_dir)
    assert target.path == "torch"
    single = sequential_rows(target, PROMPT, CONTINUATION)
    target.prefill(PROMPT)
    np.testing.assert_allclose(target.verify(CONTINUATION), single, atol=1e-4)


def test_hidden_states_match_the_torch_backend(tiny_dir):
    capture = HiddenCapture(layers=(0, 1, 2), prefill_rows=3)
    reference = TorchTarget(tiny.tiny_model(seed=0), exact=True)
    target = NativeTarget("dir", tiny_dir)
    for t in (reference, target):
        t.capture_hidden(capture)
        t.prefill(PROMPT)
    prefill_states = [reference.last_hidden, target.last_hidden]
    assert prefill_states[1].shape == (3, 3 * 32)
    # the same states up to the native cache's fp16 keys and values (values of order 1 here)
    np.testing.assert_allclose(prefill_states[1].numpy(), prefill_states[0].float().numpy(), atol=1e-3)
    for t in (reference, target):
        t.verify(CONTINUATION[:4])
    np.testing.assert_allclose(target.last_hidden.numpy(), reference.last_hidden.float().numpy(), atol=1e-3)
    with pytest.raises(TargetError, match="hidden states 0..2"):
        target.capture_hidden(HiddenCapture(layers=(3,)))


def test_fingerprint_equals_the_torch_backends(tiny_dir, gguf_files):
    assert (
        NativeTarget("dir", tiny_dir).weights_fingerprint()
        == TorchTarget(tiny.tiny_model(seed=0)).weights_fingerprint()
    )
    from verispec.api import load_engine

    torch_engine = load_engine(str(gguf_files["Q4_1"]), backend="torch", dtype="float32")
    gguf_target = NativeTarget("gguf", gguf_files["Q4_1"])
    assert gguf_target.weights_fingerprint() == torch_engine.target.weights_fingerprint()
    # and the embeddings a drafter shares are the file's, dequantised
    np.testing.assert_array_equal(
        gguf_target.token_embeddings().numpy(), torch_engine.target.token_embeddings().float().numpy()
    )


def test_context_limits(tiny_dir):
    target = NativeTarget("dir", tiny_dir, context=40)
    assert target.context_length == 40
    with pytest.raises(TargetError, match="exceed the context"):
        target.prefill(list(range(41)))
    target.prefill(list(range(38)))
    with pytest.raises(TargetError, match="exceed the context"):
        target.verify([1, 2, 3])
    with pytest.raises(TargetError, match="at least one token"):
        target.verify([])


def test_uncovered_architectures_and_bad_modes_are_refused(tmp_path, tiny_dir):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = tiny.save(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=69)), tmp_path / "gpt2")
    with pytest.raises(TargetError, match="'gpt2' is not covered"):
        NativeTarget("dir", gpt2)
    with pytest.raises(TargetError, match="unknown weights mode"):
        NativeTarget("dir", tiny_dir, weights="int3")


def test_no_warning_on_a_normal_load(tiny_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NativeTarget("dir", tiny_dir)


@pytest.mark.parametrize("path", ["kernels, rows not exact", "torch"])
def test_sequences_in_one_pass_on_the_fallback_paths_equal_each_alone(tiny_dir, path):
    # Where rows may not be stacked (a failed self-test) run() takes each sequence alone, row
    # by row; the torch path runs each segment as its own forward. Either way: the rows of
    # every sequence equal what it gets alone.
    target = NativeTarget("dir", tiny_dir, slots=3, torch_path=path == "torch")
    if path != "torch":
        target.batched_verify_exact = False
    reference = NativeTarget("dir", tiny_dir)
    prompts = [PROMPT, PROMPT[::-1], PROMPT[3:]]
    more = [CONTINUATION[:4], CONTINUATION[:1], CONTINUATION[2:5]]
    expected = []
    for prompt, tokens in zip(prompts, more, strict=True):
        reference.prefill(prompt)
        expected.append(reference.verify(tokens))
    sequences = [target.sequence(i) for i in range(3)]
    for sequence, prompt in zip(sequences[:2], prompts[:2], strict=True):
        sequence.prefill(prompt)
    passes = count_passes(target)
    from verispec.targets.base import Pass

    out = target.run(
        [Pass(sequences[0], more[0], True), Pass(sequences[2], prompts[2], False), Pass(sequences[1], more[1], True)]
    )
    assert out[1] is None
    tolerance = 0 if path != "torch" else 1e-4  # the torch path keeps fp32 keys: its own rounding
    np.testing.assert_allclose(out[0], expected[0], rtol=0, atol=tolerance * np.abs(expected[0]).max())
    np.testing.assert_allclose(out[2], expected[1], rtol=0, atol=tolerance * np.abs(expected[1]).max())
    if path != "torch":
        assert passes == [1, 1, 1, 1, len(prompts[2]), 1]  # row by row for verifies, the prefill whole
    np.testing.assert_allclose(
        sequences[2].verify(more[2]), expected[2], rtol=0, atol=tolerance * np.abs(expected[2]).max()
    )


def test_torch_runs_alone_between_passes_and_the_passes_keep_their_threads(native_engine):
    """On the kernels, a request's work between passes (drafting here) runs with torch on one
    thread, its passes on the threads the decoder loaded with, and torch's count is restored
    after the request; the driving thread's count elsewhere is its own."""
    from verispec.native import kernels

    module = kernels.load()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        passes = module.pass_threads()
        seen: list[tuple[int, int]] = []
        drafter = native_engine.drafter("lookup", fresh=True)  # its propose is wrapped for good
        propose = drafter.propose

        def recording(context, k, rng):
            seen.append((torch.get_num_threads(), module.pass_threads()))
            return propose(context, k, rng)

        drafter.propose = recording
        native_engine.generate("ab ab ab ab ab", drafter=drafter, k=3, temperature=0, max_tokens=12)
        assert seen and all(threads == (1, passes) for threads in seen), seen
        assert torch.get_num_threads() == 2
        with native_decoder.torch_alone_between_passes():
            assert torch.get_num_threads() == 1
            with native_decoder.torch_alone_between_passes():  # nested: still one, restored once
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_targets_own_torch_work_on_captured_states_runs_on_one_thread(long_dir, monkeypatch):
    """Joining a long prompt's captured states, chunk by chunk (``prefill``) and out of a
    shared pass (``run``), is torch work between the kernels' passes: on torch's own pool its
    OpenMP worker went on spinning after it, on a core the next passes needed (the three
    1-row steps after a 200-token prefill took 21 ms instead of 14.5 on 2 cores)."""
    from verispec.targets.base import Pass

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    threads: list[int] = []
    cat = torch.cat

    def recording(*args, **kwargs):
        threads.append(torch.get_num_threads())
        return cat(*args, **kwargs)

    try:
        target = NativeTarget("dir", long_dir, slots=2)
        capture = HiddenCapture((1, target.num_layers), prefill_rows=280)  # from both chunks
        prompt = [int(t) for t in np.random.default_rng(5).integers(3, 60, size=native.PREFILL_CHUNK + 40)]
        monkeypatch.setattr(torch, "cat", recording)
        target.capture_hidden(capture)
        target.prefill(prompt)
        alone = target.last_hidden.clone()
        second = target.sequence(1)
        target._capture_hidden(1, capture)
        target.run([Pass(second, prompt[: native.PREFILL_CHUNK], False)])
        target.run([Pass(second, prompt[native.PREFILL_CHUNK :], False)])
        monkeypatch.setattr(torch, "cat", cat)
        assert threads and set(threads) == {1}, threads  # a chunk's states joined the ones before
        assert torch.get_num_threads() == 2
        assert alone.shape == (280, 2 * target.hidden_size)
        assert torch.equal(second.last_hidden, alone)  # the same states, whichever way they came
    finally:
        torch.set_num_threads(before)


def test_the_draft_head_is_the_lm_heads_own_rows(tiny_dir):
    """A trained drafter's logits on the kernels (``draft_head``): the LM head's rows of its
    draft vocabulary as stored, so on the target's own final state they are, bit for bit,
    those entries of the target's logits; and a row's result does not depend on its batch."""
    target = NativeTarget("dir", tiny_dir)
    vocab_ids = torch.tensor([3, 7, 8, 20, 41])
    head = target.draft_head(vocab_ids)
    target.capture_hidden(HiddenCapture((target.num_layers,), prefill_rows=4))
    target.prefill(PROMPT)
    logits = target.verify(CONTINUATION[:3])
    states = target.last_hidden.to(torch.float32)  # (3, D): the final normed states of the 3 rows
    drafted = head(states)
    assert torch.equal(drafted, torch.from_numpy(np.asarray(logits, dtype=np.float32))[:, vocab_ids])
    assert all(torch.equal(head(states[i : i + 1])[0], drafted[i]) for i in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torch path's rows differ here: it says so
        assert NativeTarget("dir", tiny_dir, torch_path=True).draft_head(vocab_ids) is None
