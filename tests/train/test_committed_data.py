"""The training data committed in ``data/train`` (grown by ``verispec train-data grow``, kept in
the repository so that later sessions grow it instead of starting over): complete shards of
the embedded model's weights, every prompt free of the Spec-Bench dev prompts' eight-word runs
(the benchmark never enters training data), and answers of the tokens recorded."""

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.train.overlap import shingles, spec_bench_shingles
from verispec.train.shards import DataDir, ShardInfo

DATA = Path(__file__).resolve().parents[2] / "data" / "train"
EMBEDDED_WEIGHTS = "6f4bd9280ccfc81a646d45118db929b7ea839fdb24f8bf72bdc4edcb1c20ef4e"  # smollm2-135m-instruct


def directories() -> list[Path]:
    return sorted(p for p in DATA.iterdir() if (p / "target.json").is_file())


def test_there_is_committed_data():
    # Greedy answers, and answers sampled at T = 1 (for drafters that serve sampled requests).
    assert [p.name for p in directories()] == ["smollm2-t0", "smollm2-t1"]


@pytest.mark.parametrize("root", directories(), ids=lambda p: p.name)
def test_committed_shards_are_whole_and_of_the_embedded_model(root):
    data = DataDir(root, EMBEDDED_WEIGHTS)  # refuses another target's directory
    shards = data.shards()
    assert shards, root
    numbers = [info.number for info in shards]
    assert numbers == list(range(len(shards)))  # none missing
    stems = {p.name.split(".")[0] for p in data.shard_dir.iterdir()}
    assert stems == {f"{n:06d}" for n in numbers}  # no partial shard left behind
    for info in shards:
        corpus = data.load(info)
        assert len(corpus.lengths) == len(info.ids) == len(data.messages(info))
        assert corpus.response_tokens == info.response_tokens
        assert len(set(info.ids)) == len(info.ids)
        assert info.settings["temperature"] == float(root.name.rsplit("-t", 1)[1])  # as the name says


def user_texts(root: Path) -> Iterator[tuple[ShardInfo, str]]:
    """(shard, the user turns of one committed prompt) for every prompt in ``root``."""
    data = DataDir(root)
    for info in data.shards():
        for messages in data.messages(info):
            yield info, "\n".join(m["content"] for m in messages if m["role"] == "user")


@pytest.mark.parametrize("root", directories(), ids=lambda p: p.name)
def test_no_committed_prompt_copies_the_dev_prompts(root):
    bench = spec_bench_shingles()
    checked = 0
    for info, text in user_texts(root):
        shared = shingles(text) & bench
        assert not shared, (info.number, sorted(shared)[:3])
        checked += 1
    assert checked > 1000
    assert json.loads((root / "target.json").read_text())["weights_sha256"] == EMBEDDED_WEIGHTS


@pytest.mark.parametrize("root", directories(), ids=lambda p: p.name)
def test_no_committed_prompt_copies_the_held_out_scoring_prompts(root):
    # The held-out score judges data sets and recipes: a training prompt that copies one of its
    # prompts (the target writes the self-instruct questions itself, so this is not a given)
    # would score memory, not drafting.
    from verispec.train.sources import eval_prompts

    held_out = set().union(*(shingles(m["content"]) for _, messages in eval_prompts() for m in messages))
    assert len(held_out) > 1000
    for info, text in user_texts(root):
        assert not shingles(text) & held_out, (info.number, info.source)


@pytest.mark.parametrize("root", directories(), ids=lambda p: p.name)
def test_committed_translation_prompts_are_rebuilt_from_their_parents_answers(root):
    # The derived sources choose sentence, wording and spacing by the parent's id (prompts.id_number):
    # a rerun of `grow` must build exactly the prompts on record, or it would answer them twice.
    from verispec.models import resolve, tokenizer_for
    from verispec.train.shards import candidates, derived_sources

    decode = functools.partial(tokenizer_for(resolve(None)).decode, skip_special_tokens=True)
    data = DataDir(root)
    checked = 0
    for name in ("german", "de-en"):
        source = derived_sources()[name]
        rebuilt = dict(candidates(source, data, decode))
        for info in data.select([name]):
            for prompt_id, messages in zip(info.ids, data.messages(info), strict=True):
                assert rebuilt[prompt_id] == messages, (name, prompt_id)
                checked += 1
    assert checked > 500
