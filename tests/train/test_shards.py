"""The growing data directory: batched answers equal lone ones, runs resume without losing or
repeating a prompt, shards say what they hold, and a directory keeps to its target."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from verispec.train.data import encode_conversation
from verispec.train.shards import (
    REPORT_EXTRACTIONS,
    REPORT_QUESTIONS,
    REPORT_SUMMARIES,
    DataDir,
    Derived,
    GenerationSettings,
    ShardError,
    follow_up,
    grow,
    report_task,
    summary,
)

WORDS = ("red", "blue", "green", "cold", "warm", "fast", "slow", "tall", "small", "bright", "dark", "soft")


@dataclass(frozen=True)
class WordSource:
    """Twelve short prompts written here; prompt 5 is too long for the tiny model's context."""

    name: str = "words"
    licence: str = "written in this test"
    size: int | None = len(WORDS)

    def prompt(self, index: int) -> list[dict[str, str]]:
        if not 0 <= index < len(WORDS):
            raise IndexError(index)
        text = f"Say something {WORDS[index]} about the sea."
        if index == 5:
            text = " ".join([text] * 400)
        return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def engine(tiny_dir):
    from verispec.api import load_engine

    return load_engine(str(tiny_dir), backend="native", slots=4)


def by_id(data: DataDir, settings: GenerationSettings) -> dict[str, tuple[list[int], list[int]]]:
    """(prompt ids, response ids) per prompt id, of the shards made with ``settings``."""
    sequences = {}
    for info in data.shards():
        if info.settings_key != settings.key():
            continue
        part = data.load(info)
        for prompt_id, start, length, prompt in zip(
            info.ids, part.starts, part.lengths, part.prompt_lengths, strict=True
        ):
            ids = part.tokens[int(start) : int(start) + int(length)].tolist()
            assert prompt_id not in sequences, f"{prompt_id} answered twice"
            sequences[prompt_id] = (ids[: int(prompt)], ids[int(prompt) :])
    return sequences


SAMPLED = GenerationSettings(temperature=1.0, max_new_tokens=12, seed=3)


def test_batched_answers_equal_lone_ones_and_shards_record_them(engine, tmp_path):
    data = DataDir(tmp_path / "d", engine.target.weights_fingerprint())
    report = grow(data, engine, WordSource(), SAMPLED, tokens=10_000, shard_sequences=5)
    assert report.exhausted and report.sequences == len(WORDS) - 1
    infos = data.shards()
    assert [len(i.ids) for i in infos] == [5, 5, 1]
    skipped = {k: v for info in infos for k, v in info.skipped.items()}  # recorded, so never retried
    assert list(skipped) == ["words:5"] and "context" in skipped["words:5"]
    assert all(i.source == "words" and i.licence == "written in this test" for i in infos)
    assert sum(i.response_tokens for i in infos) == report.held
    sequences = by_id(data, SAMPLED)
    assert set(sequences) == {f"words:{i}" for i in range(len(WORDS)) if i != 5}
    for prompt_id in ("words:0", "words:7", "words:11"):
        index = int(prompt_id.split(":")[1])
        prompt, response = sequences[prompt_id]
        assert prompt == encode_conversation(engine.tokenizer, WordSource().prompt(index))
        alone = engine.generate(
            prompt,
            drafter="none",
            k=0,
            max_tokens=SAMPLED.max_new_tokens,
            temperature=1.0,
            seed=SAMPLED.request_seed(prompt_id),
        )
        assert response == alone.token_ids, prompt_id
    # The prompts' messages are kept beside the tokens, line by line in the shard's order.
    lines = (data.shard_dir / "000000.prompts.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == infos[0].ids
    assert json.loads(lines[0])["messages"] == WordSource().prompt(int(infos[0].ids[0].split(":")[1]))


def test_interrupted_and_resumed_runs_hold_every_answer_once_and_the_same_answers(engine, tmp_path):
    whole = DataDir(tmp_path / "whole", engine.target.weights_fingerprint())
    grow(whole, engine, WordSource(), SAMPLED, tokens=10_000, shard_sequences=100)
    expected = by_id(whole, SAMPLED)

    parts = DataDir(tmp_path / "parts", engine.target.weights_fingerprint())
    first = grow(parts, engine, WordSource(), SAMPLED, tokens=30, shard_sequences=100)
    assert not first.exhausted and 0 < first.sequences < len(WORDS) - 1
    assert first.held >= 30

    answered = [0]

    def interrupt(held: int, wanted: int, seconds: float) -> None:
        answered[0] += 1
        if answered[0] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        grow(parts, engine, WordSource(), SAMPLED, tokens=10_000, shard_sequences=100, progress=interrupt)
    assert len(parts.shards()) == 2  # what finished before Ctrl+C is a shard
    again = grow(parts, engine, WordSource(), SAMPLED, tokens=10_000, shard_sequences=100)
    assert again.exhausted
    assert by_id(parts, SAMPLED) == expected
    # Once the directory holds what was asked, a rerun answers nothing.
    assert grow(parts, engine, WordSource(), SAMPLED, tokens=10_000).sequences == 0


def test_settings_grow_separately_and_the_summary_adds_up(engine, tmp_path):
    data = DataDir(tmp_path / "d", engine.target.weights_fingerprint())
    greedy = GenerationSettings(temperature=0.0, max_new_tokens=8)
    grow(data, engine, WordSource(), greedy, tokens=10_000)
    grow(data, engine, WordSource(), SAMPLED, tokens=10_000)
    assert data.covered("words", greedy) == data.covered("words", SAMPLED)
    rows = {row["temperature"]: row for row in summary(data)}
    assert set(rows) == {0.0, 1.0}
    assert rows[0.0]["sequences"] == rows[1.0]["sequences"] == len(WORDS) - 1
    assert max(len(response) for _, response in by_id(data, greedy).values()) <= 8
    assert max(len(response) for _, response in by_id(data, SAMPLED).values()) <= 12
    corpus, key = data.corpus(data.select(["words"]))
    assert corpus.response_tokens == sum(row["tokens"] for row in rows.values())
    assert key == data.corpus(data.select(["words"]))[1]  # the same shards, the same key
    grow(data, engine, WordSource(), GenerationSettings(max_new_tokens=4), tokens=10)
    assert data.corpus()[1] != key  # a new shard, a new key
    with pytest.raises(ShardError, match="no shards of nothing"):
        data.select(["nothing"])


def test_a_derived_source_builds_on_the_answers_it_finds(engine, tmp_path):
    data = DataDir(tmp_path / "d", engine.target.weights_fingerprint())
    grow(data, engine, WordSource(), GenerationSettings(max_new_tokens=40), tokens=10_000)
    seen = []

    def quote(parent_id, messages, answer):
        seen.append(parent_id)
        return [{"role": "user", "content": f"Repeat: {answer[:200]}"}]

    derived = Derived("quotes", "built on the words' answers", ("words",), quote)
    report = grow(data, engine, derived, GenerationSettings(max_new_tokens=8), tokens=10_000)
    assert report.exhausted and report.sequences == len(WORDS) - 1
    assert sorted(data.covered("quotes", GenerationSettings(max_new_tokens=8))) == sorted(
        f"quotes<words:{i}" for i in range(len(WORDS)) if i != 5
    )
    assert sorted(seen) == sorted(f"words:{i}" for i in range(len(WORDS)) if i != 5)


def test_follow_ups_are_chosen_by_the_parent_and_skip_short_answers():
    messages = [{"role": "user", "content": "Tell me about tides."}]
    answer = "Tides are the rise and fall of sea levels caused by the moon and the sun pulling on the oceans."
    made = follow_up("templates:3", messages, answer)
    assert made == follow_up("templates:3", messages, answer)
    assert made is not None and made[-1]["role"] == "user"
    assert answer in json.dumps(made)
    kinds = {len(follow_up(f"templates:{i}", messages, answer) or []) for i in range(40)}
    assert kinds == {1, 3}  # both a quoted passage and a follow-up in the conversation occur
    assert follow_up("templates:3", messages, "Yes.") is None


def test_report_tasks_quote_the_report_in_every_shape_and_skip_short_ones():
    report = (
        "Millbrook opened its new bridge on Monday, two years after the old one closed. Ana Ruiz, who led the "
        "forty workers on the site, said the steel arrived late but the crew made up the time in spring. The "
        "council paid 12 million for it. Residents lined the river to watch the first bus cross, and the mayor "
        "promised a cycle lane next year."
    )
    made = [report_task(f"reports:{i}", [], report) for i in range(60)]
    assert made[7] == report_task("reports:7", [], report)  # chosen by the parent's id
    texts = [m[0]["content"] for m in made if m is not None]
    assert len(texts) == 60 and all(report in t and len(m) == 1 for t, m in zip(texts, made, strict=True))
    summaries = sum(any(t == w.format(report=report) for w in REPORT_SUMMARIES) for t in texts)
    questions = sum(any(t == f"{report}\n{q}" for q in REPORT_QUESTIONS) for t in texts)
    extractions = sum(any(t == w.format(report=report) for w in REPORT_EXTRACTIONS) for t in texts)
    assert summaries + questions + extractions == 60 and min(summaries, questions, extractions) > 0
    assert report_task("reports:1", [], "A short reply of a few words.") is None
    assert report_task("reports:1", [], "The headline is: " + "a shortage of nurses has hit the news. " * 12) is None


def test_report_task_wordings_share_no_phrase_with_spec_bench():
    from tests.train.overlap import shingles, spec_bench_shingles

    bench = spec_bench_shingles()
    for wording in (*REPORT_SUMMARIES, *REPORT_QUESTIONS, *REPORT_EXTRACTIONS):
        assert not shingles(wording.format(report="REPORT")) & bench, wording


def test_a_directory_keeps_to_its_target_and_settings_are_checked(tmp_path):
    DataDir(tmp_path / "d", "a" * 64)
    with pytest.raises(ShardError, match="another target"):
        DataDir(tmp_path / "d", "b" * 64)
    assert DataDir(tmp_path / "d").fingerprint == "a" * 64
    with pytest.raises(ShardError, match="temperature"):
        GenerationSettings(temperature=-1.0)
    with pytest.raises(ShardError, match="no shards"):
        DataDir(tmp_path / "d").select()


def test_a_drafter_trains_on_the_grown_shards(engine, tiny_dir, tmp_path):
    from verispec.train.loop import TrainError
    from verispec.train.pipeline import NetSettings, TrainSettings, train_drafter

    data = DataDir(tmp_path / "d", engine.target.weights_fingerprint())
    grow(data, engine, WordSource(), GenerationSettings(max_new_tokens=24), tokens=10_000)
    net = NetSettings(draft_vocab=64, intermediate=64, heads=2, kv_heads=1, head_dim=16)
    train = TrainSettings(steps=4, items=4, span=8, checkpoint_every=2)
    summary_ = train_drafter("head", tmp_path / "head", str(tiny_dir), None, net, train, shards=data.root)
    corpus, key = data.corpus()
    assert summary_["data"]["sequences"] == len(WORDS) - 1
    assert summary_["data"]["response_tokens"] == corpus.response_tokens
    assert summary_["data"]["key"] == key and summary_["data"]["sources"][0]["source"] == "words"
    assert summary_["data"]["states"] == "native"  # auto: the tiny model loads on the native backend
    assert (tmp_path / "head" / "model.safetensors").is_file()
    # The states are cached per shard beside the shards and read from there: no assembled copy.
    assert len(list((data.root / "hidden").glob("0*-native-*.npy"))) == len(data.shards())
    assert not list((data.root / "hidden").glob("corpus-*.npy"))
    with pytest.raises(TrainError, match="no shards of nothing"):
        train_drafter(
            "head", tmp_path / "other", str(tiny_dir), None, net, train, shards=data.root, sources=("nothing",)
        )
    with pytest.raises(TrainError, match="unknown hidden-state source 'nativ'"):
        train_drafter("head", tmp_path / "other", str(tiny_dir), None, net, train, shards=data.root, states="nativ")


def three_word_shards(engine, tiny_dir, tmp_path):
    """(the tiny transformers model, a directory of 3 shards of WordSource answers, its shards, their corpus)."""
    from verispec import models

    model = models.load(str(tiny_dir), dtype=None, device="cpu").model
    data = DataDir(tmp_path / "d", engine.target.weights_fingerprint())
    grow(data, engine, WordSource(), GenerationSettings(max_new_tokens=10), tokens=10_000, shard_sequences=4)
    chosen = data.select()
    return model, data, chosen, data.corpus(chosen)[0]


def test_hidden_states_are_computed_once_per_shard_and_equal_the_corpus_pass(engine, tiny_dir, tmp_path):
    from verispec.train.data import hidden_states
    from verispec.train.shards import corpus_hidden_states

    model, data, chosen, corpus = three_word_shards(engine, tiny_dir, tmp_path)
    stale = data.root / "hidden" / "corpus-0123456789abcdef.npy"  # a copy an earlier version assembled
    stale.parent.mkdir(parents=True, exist_ok=True)
    np.save(stale, np.zeros((2, 2), np.int16))
    both = corpus_hidden_states([(data, chosen)], model, (1, 2)).to_tensor()
    assert not stale.exists()
    assert both.dtype == torch.bfloat16 and both.shape[0] == len(corpus.tokens)
    assert torch.equal(both, hidden_states(model, corpus, (1, 2)))  # shard by shard = the whole corpus at once
    files = sorted((data.root / "hidden").glob("0*.npy"))
    assert len(files) == len(chosen) == 3
    last = corpus_hidden_states([(data, chosen)], model, (2,)).to_tensor()  # served by the files of layers 1 and 2
    assert sorted((data.root / "hidden").glob("0*.npy")) == files
    assert torch.equal(last, both[:, both.shape[1] // 2 :])


def test_native_states_are_the_native_targets_own_and_cached_apart_from_the_models(engine, tiny_dir, tmp_path):
    from verispec.targets.base import HiddenCapture
    from verispec.train.shards import corpus_hidden_states

    model, data, chosen, corpus = three_word_shards(engine, tiny_dir, tmp_path)
    native = corpus_hidden_states([(data, chosen)], model, (1, 2), native=engine.target).to_tensor()
    assert native.dtype == torch.bfloat16 and native.shape == (len(corpus.tokens), 2 * model.config.hidden_size)
    target = engine.target
    for index in (0, len(corpus.lengths) // 2, len(corpus.lengths) - 1):  # each sequence prefilled alone
        start, length = int(corpus.starts[index]), int(corpus.lengths[index])
        target.capture_hidden(HiddenCapture((1, 2), prefill_rows=length))
        target.prefill(corpus.tokens[start : start + length].tolist())
        assert torch.equal(native[start : start + length], target.last_hidden.to(torch.bfloat16)), index
    target.capture_hidden(None)
    target.reset()
    hidden = data.root / "hidden"
    assert len(list(hidden.glob("0*-native-1-2.npy"))) == len(chosen)
    model_states = corpus_hidden_states([(data, chosen)], model, (1, 2)).to_tensor()  # not served by the native files
    assert len(list(hidden.glob("0*.npy"))) == 2 * len(chosen)
    gap = (native.float() - model_states.float()).norm() / model_states.float().norm()
    assert 0 < gap < 0.05  # the same weights, the native kernels' own rounding
    again = corpus_hidden_states([(data, chosen)], model, (2,), native=engine.target).to_tensor()  # from the files
    assert len(list(hidden.glob("0*.npy"))) == 2 * len(chosen)
    assert torch.equal(again, native[:, native.shape[1] // 2 :])


def test_a_greedy_and_a_sampled_directory_train_together(engine, tiny_dir, tmp_path):
    from verispec import models
    from verispec.train.data import hidden_states
    from verispec.train.loop import TrainError
    from verispec.train.pipeline import NetSettings, TrainSettings, train_drafter
    from verispec.train.shards import corpus_hidden_states, select_across, selection_corpus

    fingerprint = engine.target.weights_fingerprint()
    greedy, sampled = DataDir(tmp_path / "t0", fingerprint), DataDir(tmp_path / "t1", fingerprint)
    grow(greedy, engine, WordSource(), GenerationSettings(max_new_tokens=10), tokens=10_000, shard_sequences=4)
    grow(sampled, engine, WordSource(), GenerationSettings(1.0, max_new_tokens=10), tokens=10_000)
    # Both number their shards from 0 with the same prompts: only the settings tell them apart.
    assert greedy.key(greedy.select()) != sampled.key(sampled.select())
    chosen = select_across([greedy.root, sampled.root], fingerprint)
    corpus, key = selection_corpus(chosen)
    assert corpus.tokens.tolist() == torch.cat([greedy.corpus()[0].tokens, sampled.corpus()[0].tokens]).tolist()
    assert selection_corpus(select_across([greedy.root], fingerprint))[1] == greedy.corpus()[1] != key
    model = models.load(str(tiny_dir), dtype=None, device="cpu").model
    states = corpus_hidden_states(chosen, model, (1, 2)).to_tensor()
    assert torch.equal(states, hidden_states(model, corpus, (1, 2)))
    assert len(list((sampled.root / "hidden").glob("0*.npy"))) == len(sampled.shards())  # each in its own folder

    net = NetSettings(draft_vocab=64, intermediate=64, heads=2, kv_heads=1, head_dim=16)
    train = TrainSettings(steps=2, items=4, span=8, checkpoint_every=2)
    summary_ = train_drafter(
        "head", tmp_path / "h", str(tiny_dir), None, net, train, shards=[greedy.root, sampled.root]
    )
    assert summary_["data"]["key"] == key and summary_["data"]["sequences"] == 2 * (len(WORDS) - 1)
    assert {row["directory"] for row in summary_["data"]["sources"]} == {str(greedy.root), str(sampled.root)}
    assert sorted(row["temperature"] for row in summary_["data"]["sources"]) == [0.0, 1.0]

    with pytest.raises(ShardError, match="named twice"):
        select_across([greedy.root, tmp_path / "t0"], fingerprint)
    with pytest.raises(ShardError, match="no data directory at"):
        select_across([greedy.root, tmp_path / "nowhere"], fingerprint)
    assert not (tmp_path / "nowhere").exists()  # a mistyped path is not made
    with pytest.raises(ShardError, match="has shards of nothing"):
        select_across([greedy.root, sampled.root], fingerprint, ["words", "nothing"])
    with pytest.raises(TrainError, match="another target"):
        train_drafter(
            "head",
            tmp_path / "x",
            str(tiny_dir),
            None,
            net,
            train,
            shards=[greedy.root, DataDir(tmp_path / "o", "c" * 64).root],
        )


@pytest.mark.slow
def test_the_command_stops_on_a_term_signal_keeping_what_finished_and_carries_on(tiny_dir, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "d"
    command = [sys.executable, "-m", "verispec.cli", "train-data", "grow", str(out), "--source", "math"]
    command += ["--target", str(tiny_dir), "--running", "4", "--max-new-tokens", "8", "--shard-sequences", "100000"]
    process = subprocess.Popen([*command, "--tokens", "10000000"], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "target.json").is_file() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(3.0)  # answers finish meanwhile (a few milliseconds each on the tiny model)
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=120)
    assert process.returncode == 130, errors
    assert "interrupted" in errors
    kept = DataDir(out).shards()
    assert len(kept) == 1 and len(kept[0].ids) > 0  # what finished before the signal is a shard
    held = kept[0].response_tokens
    done = subprocess.run([*command, "--tokens", str(held + 40)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ids = [i for info in DataDir(out).shards() for i in info.ids]
    assert len(ids) == len(set(ids)) > len(kept[0].ids)  # carried on, no prompt twice
    shown = subprocess.run(
        [sys.executable, "-m", "verispec.cli", "train-data", "show", str(out)], capture_output=True, text=True
    )
    assert "math" in shown.stdout and f"{len(ids):,}" in shown.stdout
    bad = subprocess.run([*command[:7], "nothing", "--tokens", "10"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown source 'nothing'" in bad.stderr and "passages" in bad.stderr
