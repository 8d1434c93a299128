"""The held-out score (verispec.train.score): counts known by hand on drafters that always
draft one token, the run-time drafters' own chains and acceptance through a real engine,
and the score at every checkpoint choosing the weights written."""

import json

import pytest
import torch

from tests import tiny
from verispec.drafters.block import BlockConfig, BlockNet
from verispec.drafters.head import HeadConfig, HeadNet
from verispec.drafters.layers import SharedTarget
from verispec.train import data, loop, score

VOCAB, DIM = 10, 16
ALWAYS = 3  # what the constant drafters below draft: the first id of their draft vocabulary


def constant(kind: str) -> tuple[torch.nn.Module, SharedTarget]:
    """A real net whose output norm is zeroed: every logit is 0, so its greedy draft is always
    the lowest id of its draft vocabulary (ties go to the lowest), whatever it reads."""
    torch.manual_seed(0)
    vocab_ids = torch.tensor([ALWAYS, 5, 7])
    common = {"hidden": DIM, "draft_vocab": 3, "heads": 2, "kv_heads": 1, "head_dim": 8, "intermediate": 16}
    if kind == "head":
        net: torch.nn.Module = HeadNet(HeadConfig(feature_layer=2, window=4, **common), vocab_ids)
    else:
        net = BlockNet(BlockConfig(target_layers=(1, 2), block_size=3, window=4, **common), vocab_ids)
    with torch.no_grad():
        net.out_norm.weight.zero_()
    return net, SharedTarget(torch.randn(VOCAB, DIM), torch.randn(VOCAB, DIM), vocab_ids)


def corpus_of(sequences, kind: str) -> data.Corpus:
    corpus = data.Corpus.from_sequences(sequences)
    width = DIM if kind == "head" else 2 * DIM
    corpus.hidden = torch.randn(len(corpus.tokens), width)
    return corpus


@pytest.mark.parametrize("kind", ["head", "block"])
def test_counts_of_a_drafter_that_always_drafts_one_token(kind):
    net, shared = constant(kind)
    # Prompt [9, 9]; anchors 1..4 see, after them: [3 3] [3 4] [4 3] [3]. Runs at k = 2:
    # 2, 1, 0, 1 (the last anchor has one token left, so its position 1 is not offered).
    mixed = ([9, 9], [ALWAYS, ALWAYS, 4, ALWAYS])
    counts = score.chain_acceptance(net, shared, corpus_of([mixed], kind), k=2)
    assert (counts.offered, counts.accepted) == ((4, 2), (3, 1))
    assert counts.per_position == [0.75, 0.5]
    assert counts.expected_tokens == pytest.approx(1 + 0.75 + 0.75 * 0.5)
    assert counts.as_dict()["anchors"] == 4 and counts.as_dict()["first_acceptance"] == 0.75
    # Always right: every anchor runs to k or to the sequence's end (5 anchors, 5 .. 1 tokens left).
    right = ([8, 8], [ALWAYS] * 5)
    # Never right: only position 0 is offered, at each of the 5 anchors.
    wrong = ([8, 8], [4] * 5)
    assert score.chain_acceptance(net, shared, corpus_of([right], kind), k=2).accepted == (5, 4)
    assert score.chain_acceptance(net, shared, corpus_of([wrong], kind), k=2).offered == (5, 0)
    both = score.chain_acceptance(net, shared, corpus_of([mixed, right, wrong], kind), k=2)
    assert (both.offered, both.accepted) == ((14, 6), (8, 5))
    # A block drafts one block at most: k is cut to block_size - 1.
    longest = score.chain_acceptance(net, shared, corpus_of([right], kind), k=4)
    assert len(longest.offered) == (4 if kind == "head" else 2)
    # Anchors only where rounds start: a prompt position is none.
    with pytest.raises(ValueError, match="no anchors"):
        score.chain_acceptance(net, shared, corpus_of([mixed], kind), k=2, anchors=[0])
    assert score.chain_acceptance(net, shared, corpus_of([wrong], kind), k=2).expected_tokens == 1.0


@pytest.mark.parametrize("kind", ["head", "block"])
def test_the_sampled_arm_by_hand(kind):
    """q is uniform over the draft vocabulary {3, 5, 7} (every logit 0, at any temperature).
    Against a fixed p the expected acceptance is sum min(p, q) at every position; against p
    one-hot on the answer's next token it is q of that token: 1/3 where it is 3, 5 or 7."""
    net, shared = constant(kind)
    mixed = ([9, 9], [ALWAYS, ALWAYS, 4, ALWAYS])  # anchors 1..4; position 2 exists after 1..3
    fixed = torch.tensor([0.1, 0.1, 0.1, 0.5, 0.05, 0.1, 0.0, 0.0, 0.05, 0.0])

    def constant_p(tokens):
        return fixed.expand(len(tokens), VOCAB)

    chance = 1 / 3 + 0.1  # min(0.5, 1/3) + min(0.1, 1/3) + min(0, 1/3)
    counts = score.sampled_acceptance(net, shared, corpus_of([mixed], kind), 2, constant_p, temperature=1.0)
    assert counts.offered == (4, 3)
    assert counts.accepted == pytest.approx((4 * chance, 3 * chance))
    assert counts.per_position == pytest.approx([chance, chance])
    assert counts.expected_tokens == pytest.approx(1 + chance + chance**2)

    def next_token(tokens):  # row j: the distribution of token j + 1, all on the answer's token
        return torch.nn.functional.one_hot(torch.cat([tokens[1:], tokens[:1]]), VOCAB).float()

    # Position 1 is drafted for tokens 3 3 4 3 (after anchors 1..4), position 2 for 3 4 3.
    counts = score.sampled_acceptance(net, shared, corpus_of([mixed], kind), 2, next_token, temperature=0.7)
    assert counts.accepted == pytest.approx((3 / 3, 2 / 3))
    assert counts.as_dict()["accepted"] == [1.0, 0.67] and counts.as_dict()["first_acceptance"] == 0.25
    with pytest.raises(ValueError, match="temperature > 0"):
        score.sampled_acceptance(net, shared, corpus_of([mixed], kind), 2, next_token, temperature=0.0)


def test_the_best_checkpoint_is_the_one_of_the_most_expected_tokens(tmp_path):
    """No validation loss, only a score: training pulls w from 0 towards 5, the score peaks
    at w = 2, so the weights kept are the checkpoint's nearest 2."""

    class Scalar(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

    class Pull:
        def step(self, step):
            loss = (net.w - 5.0) ** 2
            return loop.StepResult(loss, 0.0)

    net, seen = Scalar(), {}
    schedule = loop.Schedule(24, lr=0.2, warmup=1, weight_decay=0.0, checkpoint_every=4)
    history = loop.run(
        net, Pull(), schedule, tmp_path, "key", lambda done, *_: seen.update({done: net.w.item()}),
        scorer=lambda: {"expected_tokens": 5 - (net.w.item() - 2) ** 2},
    )  # fmt: skip
    nearest = min(range(4, 25, 4), key=lambda s: abs(seen[s] - 2.0))
    assert history.best is not None and history.best["step"] == nearest < 24
    assert net.w.item() == seen[nearest]


def test_a_run_with_the_score_has_its_own_run_key():
    from verispec.train.pipeline import NetSettings, TrainSettings, _run_key

    settings = data.DataSettings(tokens=1000)
    plain = _run_key("head", "ab" * 32, settings, NetSettings(), TrainSettings())
    assert _run_key("head", "ab" * 32, settings, NetSettings(), TrainSettings(score_tokens=128)) == plain
    scored = _run_key("head", "ab" * 32, settings, NetSettings(), TrainSettings(score_k=8), {"eval_prompts": "x"})
    other = _run_key("head", "ab" * 32, settings, NetSettings(), TrainSettings(score_k=8), {"eval_prompts": "y"})
    assert len({plain, scored, other}) == 3


PROMPTS = ["the dog ran to the park and", "Once upon a time there", "seven, eight, nine", "a b c d e f"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["head", "block", "fused-head"])
def test_the_chains_are_the_run_time_drafters_own(kind, tiny_engine, tiny_drafters):
    """A real engine drafts greedily at k = 4; every proposal it got is the chain ``chains``
    computes offline from the same anchor, and the accepted counts per position are the
    engine's. The corpus is the engine's own output, cut one token short of what it was
    allowed, so that every round's k (k, or the room left but one) is what the corpus
    leaves after its anchor, and the target's states come from a separate whole-sequence pass."""
    k, tokens = 4, 40
    # A drafter of its own (fresh): its propose is wrapped for good below.
    drafter = tiny_engine.drafter(kind.removeprefix("fused-"), drafter_weights=str(tiny_drafters[kind]), fresh=True)
    tiny_engine.generate("warm", drafter=drafter, k=k, temperature=0, max_tokens=4)  # calibration's proposals
    proposals: list[list[tuple[int, list[int]]]] = []
    propose = drafter.propose

    def recording(context, size, rng):
        draft = propose(context, size, rng)
        proposals[-1].append((len(context) - 1, list(draft.tokens)))
        return draft

    drafter.propose = recording
    sequences, engine_accepted = [], [0] * k
    for prompt in PROMPTS:
        ids = tiny_engine.tokenizer(prompt)["input_ids"]
        proposals.append([])
        result = tiny_engine.generate(ids, drafter=drafter, k=k, temperature=0, max_tokens=tokens + 1)
        sequences.append((list(ids), list(result.token_ids)[:tokens]))
        for position, count in enumerate(result.stats.accepted_by_position):
            engine_accepted[position] += count
    corpus = data.Corpus.from_sequences(sequences)
    corpus.hidden = data.hidden_states(
        tiny_engine.target.model, corpus, drafter.net.config.layers_read, dtype=torch.float32
    )
    anchors = [int(corpus.starts[i]) + n for i, calls in enumerate(proposals) for n, _ in calls]
    drafted = [tokens for calls in proposals for _, tokens in calls]
    _, chains = score.chains(drafter.net, drafter.shared, corpus, k, anchors, whole=True)
    assert len(drafted) > 20 and all(len(d) > 0 for d in drafted)
    assert [chains[i, : len(d)].tolist() for i, d in enumerate(drafted)] == drafted
    counts = score.chain_acceptance(drafter.net, drafter.shared, corpus, k, anchors)
    assert list(counts.accepted) == engine_accepted
    assert engine_accepted[0] > 0  # a trained drafter: something to agree on


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["head", "block"])
def test_the_sampled_arm_is_the_rules_acceptance_along_the_answer(kind, tiny_engine, tiny_drafters):
    """A real engine samples at T = 0.7 with k = 2. For every round it drafted, the rule's
    chance of accepting the first draft, sum min(p, q) with q the row the drafter reported and
    p the target's softmax there, is the sampled arm's expected acceptance at position 1 from
    that anchor; where the first draft was the answer's token (accepted), the second draft's
    row was drawn after that same token, and its chance is the arm's at position 2."""
    # A drafter of its own: its propose is wrapped for good, which must not reach the engine's
    # cached drafter that other tests draw from.
    drafter = tiny_engine.drafter(kind, drafter_weights=str(tiny_drafters[kind]), fresh=True)
    rounds: list[list[tuple[int, list[int], torch.Tensor]]] = []
    propose = drafter.propose

    def recording(context, size, rng):
        draft = propose(context, size, rng)
        if draft.tokens:
            rounds[-1].append((len(context) - 1, list(draft.tokens), torch.as_tensor(draft.probs)))
        return draft

    drafter.propose = recording
    sequences = []
    # Position 2 is checked only where the sampled first draft was the answer's token: a weak
    # tiny drafter (its training's floats differ by CPU) gets few, so the prompts are run again
    # with new seeds until at least 3 such rounds are in (at most 12 passes).
    second = 0
    for seed in range(12 * len(PROMPTS)):
        ids = tiny_engine.tokenizer(PROMPTS[seed % len(PROMPTS)])["input_ids"]
        rounds.append([])
        result = tiny_engine.generate(ids, drafter=drafter, k=2, temperature=0.7, seed=seed, max_tokens=30)
        sequences.append((list(ids), list(result.token_ids)))
        answer = list(ids) + list(result.token_ids)
        second += sum(len(d) == 2 and n + 2 < len(answer) and d[0] == answer[n + 1] for n, d, _ in rounds[-1])
        if seed + 1 >= len(PROMPTS) and second >= 3:
            break
    corpus = data.Corpus.from_sequences(sequences)
    model = tiny_engine.target.model
    corpus.hidden = data.hidden_states(model, corpus, drafter.net.config.layers_read, dtype=torch.float32)
    probs = score.target_distributions(model, 0.7)
    valid = set(score.all_anchors(corpus).tolist())
    checked = [0, 0]
    for index, calls in enumerate(rounds):
        start, length = int(corpus.starts[index]), int(corpus.lengths[index])
        tokens = corpus.tokens[start : start + length].tolist()
        p = probs(corpus.tokens[start : start + length]).double()
        for n, drafted, q in calls:
            if start + n not in valid:
                continue
            got = score.sampled_acceptance(drafter.net, drafter.shared, corpus, 2, probs, 0.7, [start + n])
            assert got.accepted[0] == pytest.approx(float(torch.minimum(p[n], q[0].double()).sum()), abs=1e-5)
            checked[0] += 1
            if len(drafted) == 2 and n + 2 < length and drafted[0] == tokens[n + 1]:
                assert got.accepted[1] == pytest.approx(float(torch.minimum(p[n + 1], q[1].double()).sum()), abs=1e-5)
                checked[1] += 1
    assert checked[0] > 40 and checked[1] >= 3


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_every_checkpoint_is_scored_and_the_best_score_written(
    temperature, tiny_dir, tiny_engine, native_engine, tiny_train_data, tmp_path
):
    from verispec.drafters import weights
    from verispec.train.shards import answer_prompts

    prompts = [("story", [{"role": "user", "content": p}]) for p in PROMPTS[:3]]
    summary = tiny.train_tiny_drafter(
        "head", tiny_dir, tmp_path / "head", tiny_train_data, steps=45, checkpoint_every=15, lr=1e-2, score_k=4,
        score_tokens=32, eval_prompts=prompts, score_temperature=temperature,
    )  # fmt: skip
    curves = json.loads((tmp_path / "head" / "training.json").read_text())
    assert [v["step"] for v in curves["validations"]] == [15, 30, 45]
    scores = [v["score"] for v in curves["validations"]]
    assert all(s["k"] == 4 and s["anchors"] > 60 for s in scores)
    assert all(s.get("temperature", 0.0) == temperature for s in scores)
    best = max(curves["validations"], key=lambda v: v["score"]["expected_tokens"])
    assert summary["validation"] == best
    assert [s["step"] for s in summary["scores"]] == [15, 30, 45]
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["training"]["validation"] == best
    # The weights written are the best checkpoint's: scored again, they give its score.
    target = tiny_engine.target
    eval_corpus, seconds = score.eval_corpus(
        target.model, tiny_engine.tokenizer, sorted(target.eos_token_ids), prompts, (target.num_layers,),
        tiny_train_data, weights.target_identity(target)["weights_sha256"], max_new_tokens=32,
        answer=lambda ids, tokens: answer_prompts(native_engine, ids, tokens, temperature), temperature=temperature,
    )  # fmt: skip
    assert seconds == 0.0  # from the cache the run made (its answers came from the native target)
    drafter = tiny_engine.drafter("head", drafter_weights=str(tmp_path / "head"))
    if temperature == 0:
        assert score.chain_acceptance(drafter.net, drafter.shared, eval_corpus, 4).as_dict() == best["score"]
    else:
        probs = score.target_distributions(target.model, temperature)
        again = score.sampled_acceptance(drafter.net, drafter.shared, eval_corpus, 4, probs, temperature).as_dict()
        # Weights are stored in 16 bits: a greedy chain keeps its argmaxes, sum min(p, q) moves
        # in the fourth digit. The weights written score nearest the best checkpoint, and near it.
        gaps = [max(abs(a - b) for a, b in zip(again["per_position"], s["per_position"], strict=True)) for s in scores]
        assert scores[gaps.index(min(gaps))] == best["score"] and min(gaps) < 2e-3
        # Sampled answers are not the greedy ones, and come back the same (seeded) whatever the batch.
        greedy, _ = score.eval_corpus(
            target.model, tiny_engine.tokenizer, sorted(target.eos_token_ids), prompts, (target.num_layers,),
            tiny_train_data, weights.target_identity(target)["weights_sha256"], max_new_tokens=32,
            answer=lambda ids, tokens: answer_prompts(native_engine, ids, tokens),
        )  # fmt: skip
        assert not torch.equal(greedy.tokens, eval_corpus.tokens)
        ids = [
            eval_corpus.tokens[int(s) : int(s) + int(n)].tolist()
            for s, n in zip(eval_corpus.starts, eval_corpus.prompt_lengths, strict=True)
        ]
        first = answer_prompts(native_engine, ids[:1], 32, temperature)
        assert first == answer_prompts(native_engine, ids, 32, temperature)[:1]
