"""Tree verification on the native backend: every row of a tree pass equals, bit for bit,
the single step plain decoding runs along that row's path; keeping the accepted path leaves
the cache as plain decoding of the path would; bad trees are refused and leave the sequence
usable; the fallback (a failed self-test, or the torch path) stays exact."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import tiny
from verispec.native import decoder as native_decoder
from verispec.targets.base import HiddenCapture, TargetError
from verispec.targets.native import NativeTarget
from verispec.targets.native_tree import node_path, path_ids

PROMPT = [5, 9, 14, 14, 17, 29, 25, 17, 20, 14, 6, 31]
LONG_PROMPT = [(13 * i + 4) % tiny.VOCAB for i in range(37)]  # the tree straddles key blocks of 8
SHAPES = {
    "root only": [],
    "chain": [-1, 0, 1, 2, 3],
    "star": [-1, -1, -1, -1, -1],
    "deep and wide": [-1, -1, 0, 0, 1, 2, 2, 5, 7, 3, -1, 10],
}


def tree_ids(parents, seed=0):
    """The root and one token per node, spread over the vocabulary."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, tiny.VOCAB, size=len(parents) + 1)]


def plain_rows(target, prompt, ids, parents):
    """Row r of the tree as plain decoding gets it: a fresh sequence, then the tokens of
    r's path one at a time; the logits of the last step."""
    par = np.array(parents, dtype=np.int64)
    rows = []
    for node in range(-1, len(parents)):
        target.prefill(prompt)
        for token in path_ids(ids, node_path(par, node)):
            last = target.verify([token])[0]
        rows.append(last)
    return np.stack(rows)


@pytest.fixture(scope="module", params=["kernels", "torch"])
def target(request, tiny_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torch path on the CPU warns that it verifies row by row
        target = NativeTarget("dir", tiny_dir, torch_path=request.param == "torch")
    assert target.path == request.param
    if target.path == "kernels":
        assert target.batched_verify_exact and target.tree_verify_exact  # one pass per tree, checked at load
    return target


@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["12", "37"])
@pytest.mark.parametrize("shape", SHAPES)
def test_tree_rows_equal_single_steps_along_their_paths(target, shape, prompt):
    parents = SHAPES[shape]
    ids = tree_ids(parents)
    expected = plain_rows(target, prompt, ids, parents)
    target.prefill(prompt)
    passes = count_tree_passes(target)
    got = target.verify_tree(ids, parents)
    assert got.shape == (len(ids), tiny.VOCAB) and got.dtype == np.float32
    assert torch.equal(torch.from_numpy(got), torch.from_numpy(expected))
    assert target.cached_tokens == len(prompt) + 1  # the root is cached; the nodes wait for keep_path
    if target.path == "kernels":
        assert passes == [len(ids)]  # one tree pass, not the fallback


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_random_trees_equal_single_steps(target, data):
    n = data.draw(st.integers(0, 9))
    parents = [data.draw(st.integers(-1, j - 1)) for j in range(n)]
    ids = tree_ids(parents, seed=data.draw(st.integers(0, 1000)))
    expected = plain_rows(target, PROMPT, ids, parents)
    target.prefill(PROMPT)
    np.testing.assert_array_equal(target.verify_tree(ids, parents), expected)


def count_tree_passes(target):
    """A list that receives the row count of every tree pass ``target``'s decoder runs."""
    passes: list[int] = []
    forward_tree = target.decoder.forward_tree
    target.decoder.forward_tree = lambda ids, *rest: passes.append(len(ids)) or forward_tree(ids, *rest)
    return passes


@pytest.mark.parametrize("shape", ["chain", "deep and wide"])
def test_keeping_a_path_continues_as_plain_decoding_of_it(target, shape):
    parents = SHAPES[shape]
    par = np.array(parents, dtype=np.int64)
    ids, after = tree_ids(parents, seed=3), [7, 40, 12]
    for node in range(-1, len(parents)):  # every path from the root, the empty one too
        path = node_path(par, node)
        target.prefill(LONG_PROMPT)
        for token in path_ids(ids, path):
            target.verify([token])
        expected = np.stack([target.verify([token])[0] for token in after])
        target.prefill(LONG_PROMPT)
        target.verify_tree(ids, parents)
        target.keep_path(path)
        assert target.cached_tokens == len(LONG_PROMPT) + 1 + len(path)
        np.testing.assert_array_equal(target.verify(after), expected, err_msg=f"path {path}")


def test_captured_states_follow_the_tree_and_the_kept_path(target):
    # A trained drafter reads last_hidden: one row per tree row after verify_tree (each the
    # state plain decoding reaches along its path), the root's and the path's after keep_path.
    parents = SHAPES["deep and wide"]
    par = np.array(parents, dtype=np.int64)
    ids = tree_ids(parents, seed=8)
    target.capture_hidden(HiddenCapture(layers=(1, 2)))
    try:
        single = []
        for node in range(-1, len(parents)):
            target.prefill(PROMPT)
            for token in path_ids(ids, node_path(par, node)):
                target.verify([token])
            single.append(target.last_hidden[-1])
        target.prefill(PROMPT)
        target.verify_tree(ids, parents)
        assert torch.equal(target.last_hidden, torch.stack(single))
        target.keep_path([0, 2, 6])
        assert torch.equal(target.last_hidden, torch.stack([single[0], single[1], single[3], single[7]]))
    finally:
        target.capture_hidden(None)


def test_a_chain_equals_a_plain_verify(tiny_dir):
    target = NativeTarget("dir", tiny_dir)
    ids = tree_ids(SHAPES["chain"])
    target.prefill(LONG_PROMPT)
    plain = target.verify(ids)
    target.prefill(LONG_PROMPT)
    assert torch.equal(torch.from_numpy(target.verify_tree(ids, SHAPES["chain"])), torch.from_numpy(plain))


def test_trees_past_1024_keys_are_exact(tiny_dir, tmp_path):
    long_dir = tiny.save(tiny.tiny_model(seed=0, context=2048), tmp_path / "long")
    target = NativeTarget("dir", long_dir, weights="int8")
    assert target.tree_verify_exact
    prompt = [(31 * i + 7) % tiny.VOCAB for i in range(1019)]  # the tree's slots reach 1019 .. 1031
    parents = SHAPES["deep and wide"]
    ids = tree_ids(parents, seed=5)
    expected = plain_rows(target, prompt, ids, parents)
    target.prefill(prompt)
    np.testing.assert_array_equal(target.verify_tree(ids, parents), expected)


def test_a_sequence_verifies_trees_beside_another(tiny_dir):
    target = NativeTarget("dir", tiny_dir, slots=2)
    parents = SHAPES["deep and wide"]
    ids = tree_ids(parents, seed=2)
    expected = plain_rows(target, PROMPT, ids, parents)
    other = target.sequence(1)
    other_expected = plain_rows(other, [*LONG_PROMPT, 3, 4], ids, parents)
    other.prefill(LONG_PROMPT)
    target.sequence(0).prefill(PROMPT)
    other.verify([3, 4])
    np.testing.assert_array_equal(target.sequence(0).verify_tree(ids, parents), expected)
    np.testing.assert_array_equal(other.verify_tree(ids, parents), other_expected)  # sequence 0's tree untouched
    target.sequence(0).keep_path([1, 4])
    other.keep_path([0])
    assert (target.cached_tokens, other.cached_tokens) == (len(PROMPT) + 3, len(LONG_PROMPT) + 2 + 2)
    target.rollback(len(PROMPT))
    np.testing.assert_array_equal(target.verify_tree(ids, parents), expected)  # sequence 1's keep_path left it


def test_bad_trees_are_refused_and_leave_the_sequence_usable(tiny_dir):
    target = NativeTarget("dir", tiny_dir)
    target.prefill(PROMPT)
    reference = target.verify([3, 4, 5])
    bad = [
        ([1, 2, 3], [1, -1], "parent must come before its child"),  # not topological
        ([1, 2], [0], "parent must come before"),  # a self-loop
        ([1, 2], [-2], "outside"),
        ([1, 2, 3], [-1, 5], "outside"),
        ([1, 2, 3], [-1], "takes 2 token ids"),
        ([1], [-1], "takes 2 token ids"),
        ([1, tiny.VOCAB], [-1], r"token ids must lie in \[0, 69\)"),
        ([1, -3], [-1], "token ids must lie"),
    ]
    for ids, parents, message in bad:
        target.rollback(len(PROMPT))
        with pytest.raises(TargetError, match=message):
            target.verify_tree(ids, parents)
        assert target.cached_tokens == len(PROMPT)
        np.testing.assert_array_equal(target.verify([3, 4, 5]), reference)
    target.prefill([2] * (target.context_length - 3))
    with pytest.raises(TargetError, match="exceed the context"):
        target.verify_tree([1, 2, 3, 4], [-1, 0, 0])  # 4 slots, 3 left
    target.verify_tree([1, 2, 3], [-1, 0])  # 3 fit


def test_bad_paths_are_refused(tiny_dir):
    target = NativeTarget("dir", tiny_dir)
    parents = SHAPES["deep and wide"]
    ids = tree_ids(parents)
    target.prefill(PROMPT)
    with pytest.raises(TargetError, match="keep_path follows verify_tree"):
        target.keep_path([])
    target.verify_tree(ids, parents)
    for path in ([2], [0, 4], [1, 0], [12], [-1]):  # not descending from the root
        with pytest.raises(TargetError, match="does not descend from the root"):
            target.keep_path(path)
    target.keep_path([0, 2, 5])  # still possible after the refusals
    with pytest.raises(TargetError, match="keep_path follows verify_tree"):
        target.keep_path([0])  # once per tree
    target.rollback(len(PROMPT))
    target.verify_tree(ids, parents)
    target.rollback(len(PROMPT))  # drops the tree
    with pytest.raises(TargetError, match="keep_path follows verify_tree"):
        target.keep_path([0])
    target.verify_tree(ids, parents)
    with pytest.raises(TargetError, match="cannot roll back"):
        target.rollback(len(PROMPT) + 2)  # only the root is cached until a path is kept


def test_a_failed_tree_self_test_warns_and_verifies_path_by_path(tiny_dir, monkeypatch):
    # Tree passes that drift from single steps: the self-test must notice and warn, and
    # verify_tree must run whole paths instead, exact rows and exact kept paths.
    forward_tree = native_decoder.KernelDecoder.forward_tree

    def drifting(self, ids, *rest):
        out, hidden = forward_tree(self, ids, *rest)
        return (out + 1e-3 if out is not None else out), hidden

    monkeypatch.setattr(native_decoder.KernelDecoder, "forward_tree", drifting)
    with pytest.warns(UserWarning, match="tree verify rows differ from single steps .* each root-to-leaf path"):
        target = NativeTarget("dir", tiny_dir)
    assert target.batched_verify_exact and not target.tree_verify_exact
    parents = SHAPES["deep and wide"]
    ids = tree_ids(parents, seed=1)
    expected = plain_rows(target, PROMPT, ids, parents)
    target.prefill(PROMPT)
    passes = count_tree_passes(target)
    np.testing.assert_array_equal(target.verify_tree(ids, parents), expected)
    assert passes == []
    for path in ([1, 4], [0, 2, 6]):  # another leaf's path than the last verified, and a prefix of it
        target.prefill(LONG_PROMPT)
        for token in path_ids(ids, path):
            target.verify([token])
        after = target.verify([7, 8])
        target.prefill(LONG_PROMPT)
        target.verify_tree(ids, parents)
        target.keep_path(path)
        np.testing.assert_array_equal(target.verify([7, 8]), after)


def test_the_torch_tree_pass_agrees_with_single_steps(tiny_dir):
    # The torch path's own tree pass (a mask of ancestors), which the CPU's self-test sends
    # to the fallback: close to single steps, and its kept path continues as plain decoding.
    target = NativeTarget("dir", tiny_dir)
    decoder = native_decoder.TorchDecoder(target.checkpoint, 256)
    parents = SHAPES["deep and wide"]
    par = np.array(parents)
    ids = tree_ids(parents, seed=4)
    decoder.forward(PROMPT, 0, False)
    tree, _ = decoder.forward_tree(ids, len(PROMPT), parents, True)
    for node in range(-1, len(parents)):
        path = path_ids(ids, node_path(par, node))
        decoder.forward(PROMPT, 0, False)
        single = [decoder.forward([token], len(PROMPT) + i, True)[0] for i, token in enumerate(path)]
        torch.testing.assert_close(tree[node + 1], single[-1][0], rtol=1e-5, atol=1e-4)
    decoder.forward(PROMPT, 0, False)
    decoder.forward_tree(ids, len(PROMPT), parents, True)
    decoder.keep_path(len(PROMPT), [0, 2, 6])
    kept, _ = decoder.forward([7], len(PROMPT) + 4, True)
    decoder.forward(PROMPT + path_ids(ids, [0, 2, 6]), 0, False)
    plain, _ = decoder.forward([7], len(PROMPT) + 4, True)
    torch.testing.assert_close(kept, plain, rtol=1e-5, atol=1e-4)


def test_trees_are_exact_with_a_head_dim_off_the_vector_width(tmp_path):
    # head_dim 12 (not a multiple of 8): attention runs the kernels' scalar path.
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tiny.VOCAB,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    target = NativeTarget("dir", tiny.save(LlamaForCausalLM(config).eval(), tmp_path / "d12"))
    assert target.checkpoint.head_dim == 12 and target.tree_verify_exact
    parents = SHAPES["deep and wide"]
    ids = tree_ids(parents, seed=6)
    expected = plain_rows(target, LONG_PROMPT, ids, parents)
    target.prefill(LONG_PROMPT)
    np.testing.assert_array_equal(target.verify_tree(ids, parents), expected)


@pytest.mark.slow
def test_embedded_trees_equal_single_steps_and_time_one_pass():
    # The embedded model (30 layers, Q4_1 and Q8_0, head_dim 64) at ~300 tokens of context.
    # The plain rows roll back to the prompt instead of prefilling it again (rollback is exact).
    import time

    from verispec.api import load_engine
    from verispec.prompts import load_prompts, select

    engine = load_engine(None)
    target = engine.target
    assert target.path == "kernels" and target.tree_verify_exact
    text = select(load_prompts(), categories=["summarization"], per_category=1)[0].text
    prompt = list(engine.encode(text))[:300]
    assert len(prompt) == 300
    parents = SHAPES["deep and wide"]
    par = np.array(parents)
    ids = [prompt[(37 * j) % len(prompt)] for j in range(len(parents) + 1)]  # tokens of the text itself
    target.prefill(prompt)
    expected = []
    for node in range(-1, len(parents)):
        target.rollback(len(prompt))
        for token in path_ids(ids, node_path(par, node)):
            last = target.verify([token])[0]
        expected.append(last)
    target.rollback(len(prompt))
    np.testing.assert_array_equal(target.verify_tree(ids, parents), np.stack(expected))
    for path in ([1, 4], [0, 3, 9]):
        target.rollback(len(prompt))
        for token in path_ids(ids, path):
            target.verify([token])
        after = target.verify([ids[5], ids[7]])
        target.rollback(len(prompt))
        target.verify_tree(ids, parents)
        target.keep_path(path)
        np.testing.assert_array_equal(target.verify([ids[5], ids[7]]), after)

    def best_of_ten(step):
        times = []
        for _ in range(10):
            target.rollback(len(prompt))
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
        return min(times)

    tree_parents = [-1, -1, 0, 0, 1, 2, 2, 5]  # 8 nodes: 9 rows, as a chain of 9 tokens
    tree = best_of_ten(lambda: target.verify_tree(ids[:9], tree_parents))
    chain = best_of_ten(lambda: target.verify(ids[:9]))
    print(f"\n  at {len(prompt)} tokens, best of 10: verify_tree of 8 nodes {tree * 1e3:.1f} ms,", end="")
    print(f" verify of 9 tokens {chain * 1e3:.1f} ms")
