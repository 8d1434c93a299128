"""``verispec train-drafter`` on the tiny target: training lowers the loss and raises
acceptance, an interrupted run resumes to the same weights, the command line works."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests import tiny
from verispec.cli import main
from verispec.train.loop import TrainError

HELD_OUT = ["the dog ran to the park and", "Once upon a time there", "seven, eight, nine"]  # not training prompts


def acceptance(engine, drafter, prompts=HELD_OUT) -> float:
    offered = accepted = 0
    for prompt in prompts:
        result = engine.generate(prompt, drafter=drafter, k=4, temperature=0, max_tokens=48)
        offered += result.stats.offered
        accepted += result.stats.accepted
    return accepted / offered


@pytest.mark.parametrize("kind", ["head", "block", "fused-head"])
def test_training_lowers_the_loss_and_raises_acceptance(
    kind, tiny_dir, tiny_engine, tiny_drafters, tiny_train_data, tmp_path
):
    # Untrained: the same pipeline, one step at a negligible learning rate (the initial weights).
    name, net = kind.removeprefix("fused-"), ({"feature_layers": 4} if kind.startswith("fused") else None)
    tiny.train_tiny_drafter(name, tiny_dir, tmp_path / "untrained", tiny_train_data, steps=1, lr=1e-12, net=net)
    losses = json.loads((tiny_drafters[kind] / "training.json").read_text())["losses"]
    first, last = float(np.mean(losses[:5])), float(np.mean(losses[-20:]))
    untrained = acceptance(tiny_engine, tiny_engine.drafter(name, drafter_weights=str(tmp_path / "untrained")))
    trained = acceptance(tiny_engine, tiny_engine.drafter(name, drafter_weights=str(tiny_drafters[kind])))
    print(
        f"\n  {kind}: loss {first:.3f} -> {last:.3f} over {len(losses)} steps; greedy acceptance on held-out "
        f"prompts {untrained:.1%} untrained -> {trained:.1%} trained"
    )
    assert last < 0.8 * first
    assert trained > untrained + 0.1


def test_a_head_trained_on_the_targets_distribution_and_state_raises_acceptance(
    tiny_dir, tiny_engine, tiny_train_data, tmp_path
):
    # Soft labels half and half with the tokens, and the regression onto the final state: the
    # recipe still trains (the states it reads are the final ones the LM head reads).
    tiny.train_tiny_drafter("head", tiny_dir, tmp_path / "untrained", tiny_train_data, steps=1, lr=1e-12)
    summary = tiny.train_tiny_drafter(
        "head", tiny_dir, tmp_path / "distilled", tiny_train_data, distill=0.5, feature_loss=1.0
    )
    assert summary["train"]["distill"] == 0.5 and summary["train"]["feature_loss"] == 1.0
    untrained = acceptance(tiny_engine, tiny_engine.drafter("head", drafter_weights=str(tmp_path / "untrained")))
    trained = acceptance(tiny_engine, tiny_engine.drafter("head", drafter_weights=str(tmp_path / "distilled")))
    print(f"\n  distilled head: greedy acceptance {untrained:.1%} untrained -> {trained:.1%} trained")
    assert trained > untrained + 0.1


def test_the_block_drafter_refuses_the_heads_soft_labels(tiny_dir, tmp_path, capsys):
    args = ["train-drafter", "--target", str(tiny_dir), "--kind", "block", "--out", str(tmp_path), "--steps", "2"]
    assert main([*args, "--tokens", "300", "--no-eval", "--distill", "0.5"]) == 2
    assert "block drafter has hard labels only" in capsys.readouterr().err


def test_an_interrupted_run_resumes_to_the_same_weights(tiny_dir, tiny_train_data, tmp_path):
    whole = tiny.train_tiny_drafter("block", tiny_dir, tmp_path / "whole", tiny_train_data, steps=8, checkpoint_every=3)

    def interrupt(done, loss, accuracy):
        if done == 5:  # past the checkpoint at step 3
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tiny.train_tiny_drafter(
            "block", tiny_dir, tmp_path / "cut", tiny_train_data, steps=8, checkpoint_every=3, on_step=interrupt
        )
    assert (tmp_path / "cut" / "checkpoint" / "state.safetensors").is_file()
    assert not (tmp_path / "cut" / "model.safetensors").exists()
    resumed = tiny.train_tiny_drafter("block", tiny_dir, tmp_path / "cut", tiny_train_data, steps=8, checkpoint_every=3)
    assert whole["resumed_from_step"] == 0 and resumed["resumed_from_step"] == 3
    a, b = (
        load_file(str(tmp_path / "whole" / "model.safetensors")),
        load_file(str(tmp_path / "cut" / "model.safetensors")),
    )
    assert a.keys() == b.keys()
    assert all(a[name].equal(b[name]) for name in a)  # the same run, so the same weights bit for bit
    losses = [json.loads((tmp_path / d / "training.json").read_text())["losses"] for d in ("whole", "cut")]
    assert losses[0] == losses[1]
    assert not (tmp_path / "cut" / "checkpoint").exists()  # removed once the weights are written


def test_a_checkpoint_of_another_run_is_refused(tiny_dir, tiny_train_data, tmp_path):
    def interrupt(done, loss, accuracy):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tiny.train_tiny_drafter(
            "head", tiny_dir, tmp_path, tiny_train_data, steps=4, checkpoint_every=1, on_step=interrupt
        )
    with pytest.raises(TrainError, match="checkpoint of a different training run"):
        tiny.train_tiny_drafter("head", tiny_dir, tmp_path, tiny_train_data, steps=4, checkpoint_every=1, lr=5e-4)


def test_the_command_writes_weights_config_and_loss_curve(tiny_dir, tmp_path, capsys):
    out = tmp_path / "head"
    code = main([
        "train-drafter", "--target", str(tiny_dir), "--kind", "head", "--out", str(out), "--dtype", "float32",
        "--tokens", "200", "--max-new-tokens", "24", "--gen-batch", "8", "--data-dir", str(tmp_path / "data"),
        "--steps", "3", "--items", "2", "--span", "8", "--draft-vocab", "40", "--window", "16",
        "--intermediate", "32", "--checkpoint-every", "2", "--eval-tokens", "16",
    ])  # fmt: skip
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["kind"] == "head" and config["net"]["draft_vocab"] == 40
    assert config["target"]["vocab_size"] == tiny.VOCAB and config["target"]["hidden_size"] == 32
    assert len(config["target"]["weights_sha256"]) == 64
    assert config["training"]["data"]["response_tokens"] >= 200
    # --eval by default: both checkpoints (steps 2 and 3) scored at k = 8.
    assert [(s["step"], s["k"]) for s in config["training"]["scores"]] == [(2, 8), (3, 8)]
    weights = load_file(str(out / "model.safetensors"))
    assert weights["vocab_ids"].shape == (40,)
    # The target's embeddings and LM head (V rows) are shared at load time, never stored.
    assert all(tensor.shape[:1] != (tiny.VOCAB,) for tensor in weights.values())
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert "wrote" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, value",
    [
        ("--steps", "0"),
        ("--second-turns", "1.5"),
        ("--second-turns", "-0.1"),
        ("--holdout", "1.5"),
        ("--patience", "-1"),  # (a positive one counts scored checkpoints: --eval is on by default)
        ("--eval-temperature", "-1"),
        ("--distill", "1.5"),
        ("--feature-loss", "-1"),
    ],
)
def test_bad_settings_are_refused_with_a_message(option, value, tiny_dir, tmp_path, capsys):
    code = main(["train-drafter", "--target", str(tiny_dir), "--kind", "block", "--out", str(tmp_path), option, value])
    assert code == 2
    assert option in capsys.readouterr().err


def test_several_data_directories_are_named_and_checked(tiny_dir, tmp_path, capsys):
    args = ["train-drafter", "--target", str(tiny_dir), "--kind", "head", "--out", str(tmp_path / "h")]
    code = main([*args, "--shards", str(tmp_path / "t0"), str(tmp_path / "t1"), "--steps", "2"])
    assert code == 2
    assert f"no data directory at {tmp_path / 't0'}" in capsys.readouterr().err
    assert not (tmp_path / "t0").exists()


def test_generate_uses_trained_weights_and_refuses_foreign_ones(tiny_dir, tiny_drafters, capsys):
    # --drafter-weights takes a directory holding head/ and block/ (or one drafter's directory).
    both = str(tiny_drafters["head"].parent)
    for kind in ("head", "block"):
        args = ["generate", "the cat sat on", "--model", str(tiny_dir), "--dtype", "float32", "--max-tokens", "16"]
        assert main([*args, "--drafter", kind, "--drafter-weights", both, "--compare"]) == 0
        err = capsys.readouterr().err
        assert f"{kind} k=auto" in err and "output identical to plain decoding" in err, err
    # The tiny model is not the embedded one: the shipped weights do not fit it.
    code = main(["generate", "abc", "--model", str(tiny_dir), "--dtype", "float32", "--drafter", "head"])
    assert code == 2
    assert "verispec train-drafter" in capsys.readouterr().err


def contains(sequence: list[int], part: list[int]) -> bool:
    return any(sequence[i : i + len(part)] == part for i in range(len(sequence) - len(part) + 1))


def test_second_turns_are_written_on_the_targets_own_answers(tiny_dir, tmp_path):
    from verispec.train import data
    from verispec.train.pipeline import train_drafter

    settings = data.DataSettings(tokens=400, max_new_tokens=24, batch_size=8, second_turns=0.5)
    summary = train_drafter(
        "head", tmp_path, str(tiny_dir), settings, data_dir=tmp_path, dtype="float32", data_only=True
    )
    assert summary["data"]["response_tokens"] >= 400
    (path,) = tmp_path.glob("sequences-*.safetensors")
    corpus = data.load_corpus(path, path.stem.split("-", 1)[1])
    assert corpus is not None
    sequences = []
    for start, length, prompt in zip(corpus.starts, corpus.lengths, corpus.prompt_lengths, strict=True):
        ids = corpus.tokens[int(start) : int(start) + int(length)].tolist()
        sequences.append((ids[: int(prompt)], ids[int(prompt) :]))
    # A second turn's prompt holds a first answer (its text, end token and edges dropped).
    answers = [response[1:-2] for _, response in sequences if len(response) > 6]
    quoting = [prompt for prompt, _ in sequences if any(contains(prompt, answer) for answer in answers)]
    assert answers and quoting
    second = sum(len(r) for p, r in sequences if any(contains(p, a) for a in answers))
    assert 0.3 < second / summary["data"]["response_tokens"] < 0.7, second


def test_a_held_out_split_is_validated_and_its_best_weights_written(tiny_dir, tiny_train_data, tmp_path):
    from verispec.train import data
    from verispec.train.objectives import _Sampler
    from verispec.train.pipeline import held_out_sequences

    summary = tiny.train_tiny_drafter(
        "head", tiny_dir, tmp_path / "head", tiny_train_data, steps=60, checkpoint_every=20, holdout=0.25
    )
    curves = json.loads((tmp_path / "head" / "training.json").read_text())
    assert [v["step"] for v in curves["validations"]] == [20, 40, 60]
    best = min(curves["validations"], key=lambda v: v["loss"])
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["training"]["validation"] == best == summary["validation"]
    (path,) = tiny_train_data.glob("sequences-*.safetensors")
    corpus = data.load_corpus(path, path.stem.split("-", 1)[1])
    assert corpus is not None
    count = len(corpus.lengths)
    groups = data.quote_groups(corpus)
    held = held_out_sequences(groups, 0.25, seed=0)
    assert held is not None and int(held.sum()) == summary["held_out_sequences"]
    assert round(0.25 * count) <= int(held.sum()) < count
    assert held.equal(held_out_sequences(groups, 0.25, seed=0))  # reproducible from the seed
    # Whole groups: no held-out response is quoted by, or quotes, a trained sequence.
    assert not set(groups[held].tolist()) & set(groups[~held].tolist())
    # Training draws only from the other sequences, validation only from these.
    train_positions = _Sampler(corpus, 24, 0, ~held).labelled
    held_positions = _Sampler(corpus, 24, 1, held).labelled
    sequence = corpus.sequence_of()
    assert not held[sequence[train_positions]].any() and held[sequence[held_positions]].all()
    assert held_out_sequences(groups, 0.0, seed=0) is None
    with pytest.raises(TrainError, match="at least 2 unlinked groups"):
        held_out_sequences(torch.zeros(count, dtype=torch.long), 0.25, seed=0)


def test_runs_without_a_holdout_keep_the_run_key_of_the_shipped_weights():
    from verispec.train.data import DataSettings
    from verispec.train.pipeline import NetSettings, TrainSettings, _run_key

    data_settings = DataSettings(tokens=400000, max_new_tokens=256, batch_size=64, second_turns=0.5)
    shipped = TrainSettings(steps=3000, items=12, span=64, bf16=True)
    # The key this run had before --holdout and --patience existed: a rerun resumes its checkpoint.
    assert _run_key("head", "ab" * 32, data_settings, NetSettings(), shipped) == "4be64721ae4d58a9"
    held = TrainSettings(steps=3000, items=12, span=64, bf16=True, holdout=0.05)
    assert _run_key("head", "ab" * 32, data_settings, NetSettings(), held) != "4be64721ae4d58a9"
