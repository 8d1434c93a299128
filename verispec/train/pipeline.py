"""``train_drafter``: from a target to drafter weights, the steps in order.

1. load the target (torch) and hash its weights;
2. the corpus: the target answers ``training_prompts`` (cached per target and settings);
3. its hidden states at the layers the drafter reads (cached likewise);
4. the draft vocabulary: the ``draft_vocab`` most frequent response tokens;
5. the network, initialised from the seed; training (resumable);
6. export: ``config.json`` + ``model.safetensors`` (+ ``loss.png``, ``training.json``).

With ``score_k`` set, the target also answers the eval prompts (cached likewise) and every
checkpoint is scored on them (``verispec.train.score``): the held-out score, which then
chooses the weights written.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verispec.drafters import weights
from verispec.drafters.block import BlockConfig, BlockNet, evenly_spaced_layers
from verispec.drafters.head import HeadConfig, HeadNet
from verispec.drafters.layers import SharedTarget
from verispec.train import data, loop, objectives, score
from verispec.train.prompts import second_turns, training_prompts

KINDS = ("head", "block")
STATES = ("auto", "native", "transformers")  # whose hidden states a grown data set trains on
Stage = Callable[[str, int], Callable[[int, str], None]]  # (description, total) -> update(done, note)


@dataclass(frozen=True)
class NetSettings:
    """The drafter's shape; None = the kind's default (head: 1 layer, block: 2 layers)."""

    layers: int | None = None
    block_size: int = 8
    target_layers: int = 4  # block: how many evenly spaced target layers it reads
    feature_layers: int = 1  # head: evenly spaced target layers fused into its feature (1: the final state)
    draft_vocab: int = 8192
    window: int | None = None
    intermediate: int | None = None
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 1000
    items: int = 16  # items per step (chunks for head, anchor runs for block)
    span: int = 48  # positions per item
    unroll: int = 2  # head: steps of feeding its own output back
    lr: float = 1e-3
    warmup: int = 50
    checkpoint_every: int = 100
    seed: int = 0
    bf16: bool = False
    holdout: float = 0.0  # share of the sequences held out for validation and early stopping
    patience: int = 0  # validations without improvement before stopping (needs holdout)
    score_k: int = 0  # draft positions of the held-out score at every checkpoint; 0: no score
    score_tokens: int = score.EVAL_TOKENS  # the longest answer per eval prompt
    # 0: the greedy score (chains along greedy answers); > 0: the sampled arm at that temperature
    score_temperature: float = 0.0
    # head: weight of the target's whole distribution as soft labels (0: its token alone, 1: the
    # distribution alone) and of the regression onto its final state (objectives.HeadObjective)
    distill: float = 0.0
    feature_loss: float = 0.0


# Settings added after weights were shipped: left out of the run key at their defaults, so
# the runs that made those weights keep their key (and resume as they did).
_LATER_SETTINGS = {
    "feature_layers": 1,
    "holdout": 0.0,
    "patience": 0,
    "score_k": 0,
    "score_tokens": score.EVAL_TOKENS,
    "score_temperature": 0.0,
    "distill": 0.0,
    "feature_loss": 0.0,
}
VALIDATION_BATCHES = 16  # batches of held-out items scored at every checkpoint


def _quiet_stage(description: str, total: int) -> Callable[[int, str], None]:
    return lambda done, note: None


def train_drafter(
    kind: str,
    out: Path,
    target_spec: str | None = None,
    data_settings: data.DataSettings | None = None,
    net_settings: NetSettings | None = None,
    train_settings: TrainSettings | None = None,
    data_dir: Path | None = None,
    dtype: str | None = None,
    stage: Stage = _quiet_stage,
    on_step: loop.StepCallback | None = None,
    data_only: bool = False,
    shards: Path | Sequence[Path] | None = None,
    sources: tuple[str, ...] | None = None,
    eval_prompts: list[score.EvalPrompt] | None = None,
    states: str = "auto",
) -> dict[str, Any]:
    """Train a ``kind`` drafter for the target ``target_spec`` into ``out``; returns a summary.
    ``data_only``: stop once the training set and its hidden states are cached. ``shards``: a
    data directory grown by ``verispec train-data``, or several (a greedy and a sampled one),
    whose ``sources`` (None: all) are the training set instead of responses generated here
    (``data_settings`` then sets nothing); ``states`` (``STATES``): whose hidden states those
    shards train on: the native target's, the transformers model's, or auto (native where the
    target loads there).
    ``eval_prompts``: what the held-out score answers (with ``score_k``; default the project's
    eval prompts)."""
    from verispec import models
    from verispec.cache import cache_root
    from verispec.targets.torch_target import TorchTarget, parse_dtype

    if kind not in KINDS:
        raise loop.TrainError(f"unknown drafter kind {kind!r}; train one of {', '.join(KINDS)}")
    if states not in STATES:
        raise loop.TrainError(f"unknown hidden-state source {states!r}; one of {', '.join(STATES)}")
    data_settings = data_settings or data.DataSettings(tokens=40_000)
    net_settings = net_settings or NetSettings()
    train_settings = train_settings or TrainSettings()
    _validate(kind, data_settings, net_settings, train_settings)
    torch.manual_seed(train_settings.seed)
    started = time.perf_counter()

    device = "cpu"  # drafters train on the CPU; the target runs beside them
    loaded = models.load(target_spec, dtype=parse_dtype(dtype, device), device=device)
    model, tokenizer = loaded.model, loaded.tokenizer
    target = TorchTarget(model, name=loaded.source.name, eos_token_ids=loaded.eos_ids, exact=False)
    identity = weights.target_identity(target)
    fingerprint = identity["weights_sha256"]
    data_dir = data_dir or cache_root() / "train-data" / fingerprint[:16]

    if shards is None:
        corpus, data_seconds = _corpus(model, tokenizer, target, data_settings, data_dir, fingerprint, stage)
        key = data_settings.key(fingerprint)
        grown: dict[str, Any] | None = None
    else:
        roots = [shards] if isinstance(shards, Path) else list(shards)
        corpus, key, grown = _shard_corpus(roots, sources, fingerprint)
        data_seconds = 0.0
    layers = _feature_layers(kind, net_settings, target.num_layers)
    if grown is not None:
        from verispec.train.shards import corpus_hidden_states

        start = time.perf_counter()
        native = _native_target(target_spec, states)
        grown["states"] = "transformers" if native is None else "native"
        update = stage(
            f"target hidden states (shards, {grown['states']})", sum(len(infos) for _, infos in grown["chosen"])
        )
        corpus.hidden = corpus_hidden_states(grown["chosen"], model, layers, lambda d, t: update(d, ""), native)
        data_seconds += time.perf_counter() - start
    else:
        corpus.hidden = data.load_hidden_layers(data_dir, key, layers, target.hidden_size)
    if corpus.hidden is None:
        start = time.perf_counter()
        update = stage("target hidden states", len(corpus.lengths))
        corpus.hidden = data.hidden_states(model, corpus, layers, progress=lambda d, t: update(d, ""))
        data.save_hidden(corpus.hidden, data.hidden_path(data_dir, key, layers), key)
        data_seconds += time.perf_counter() - start

    vocab_ids, coverage = draft_vocabulary(corpus, net_settings.draft_vocab, target.vocab_size)
    described = asdict(data_settings) if grown is None else {k: v for k, v in grown.items() if k != "chosen"}
    data_summary = {**described, "sequences": len(corpus.lengths)}
    data_summary["response_tokens"] = corpus.response_tokens
    if data_only:
        return {"data": data_summary, "data_seconds": round(data_seconds, 1), "draft_vocab_coverage": coverage}
    net, net_config = build_net(kind, net_settings, target.hidden_size, layers, vocab_ids)
    shared = SharedTarget(target.token_embeddings(), target.lm_head_weight(), vocab_ids)
    scorer, eval_digest = None, None
    if train_settings.score_k:
        prompts = score.default_eval_prompts() if eval_prompts is None else eval_prompts
        temperature = train_settings.score_temperature
        eval_corpus, seconds = score.eval_corpus(
            model, tokenizer, sorted(target.eos_token_ids), prompts, layers, data_dir, fingerprint,
            train_settings.score_tokens, stage, _native_answers(target_spec, len(prompts), temperature),
            temperature,
        )  # fmt: skip
        data_seconds += seconds
        k = train_settings.score_k
        probs = score.target_distributions(model, temperature) if temperature > 0 else None

        def scorer() -> dict[str, Any]:
            if probs is not None:  # the sampled arm: the drafter as a request at that temperature samples
                return {
                    **score.sampled_acceptance(net, shared, eval_corpus, k, probs, temperature).as_dict(),
                    "temperature": temperature,
                }
            return score.chain_acceptance(net, shared, eval_corpus, k).as_dict()

        eval_digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]
    held_out = None
    if train_settings.holdout:
        held_out = held_out_sequences(data.quote_groups(corpus), train_settings.holdout, train_settings.seed)
    objective = _objective(
        kind, net, shared, corpus, train_settings, train_settings.seed, None if held_out is None else ~held_out
    )
    validation = None
    if held_out is not None:
        # Another seed than training's, so its batches are not the training batches' twins.
        validation = _objective(kind, net, shared, corpus, train_settings, train_settings.seed + 1, held_out)
    schedule = loop.Schedule(
        train_settings.steps,
        train_settings.lr,
        train_settings.warmup,
        checkpoint_every=train_settings.checkpoint_every,
        bf16=train_settings.bf16,
        patience=train_settings.patience,
    )
    extra = [] if eval_digest is None else [{"eval_prompts": eval_digest}]  # other prompts, another run
    trained_on = data_settings if grown is None else {"shards": key}
    run_key = _run_key(kind, fingerprint, trained_on, net_settings, train_settings, *extra)
    net.train()
    history = loop.run(net, objective, schedule, out, run_key, on_step, validation, VALIDATION_BATCHES, scorer)
    net.eval()

    training = {
        "data": data_summary,
        "draft_vocab_coverage": coverage,
        "train": asdict(train_settings),
        "final_loss": _mean_tail(history.losses),
        "final_first_draft_accuracy": _mean_tail(history.accuracies),
        "train_seconds": round(history.seconds, 1),
        "steps_run": history.step,
        "data_seconds": round(data_seconds, 1),
        "parameters": sum(p.numel() for p in net.parameters()),
        "prompts": _prompts_note(data_settings, grown),
    }
    if held_out is not None:
        training["held_out_sequences"] = int(held_out.sum())
    if history.validations:
        training["validation"] = history.best  # the step whose weights these are
    if scorer is not None:
        training["scores"] = [{"step": v["step"], **v["score"]} for v in history.validations]
    weights.save(out, kind, net_config, net.state_dict(), identity, training)
    loop.plot_loss(history, out / "loss.png")
    curves: dict[str, Any] = {"losses": history.losses, "accuracies": history.accuracies}
    if history.validations:
        curves["validations"] = history.validations
    (out / "training.json").write_text(json.dumps(curves) + "\n")
    loop.remove_checkpoint(out)
    training["total_seconds"] = round(time.perf_counter() - started, 1)
    training["resumed_from_step"] = history.resumed_from
    return training


def _native_answers(
    target_spec: str | None, count: int, temperature: float = 0.0
) -> Callable[[list[list[int]], int], list[list[int]]] | None:
    """Answers on the native target, many a pass, greedy or sampled at ``temperature``; None
    where it does not load the model (another architecture): greedy eval answers then come
    from transformers' ``generate``."""
    from verispec.api import load_engine
    from verispec.errors import UserError
    from verispec.train.shards import answer_prompts

    try:
        engine = load_engine(target_spec, backend="native", slots=max(1, min(16, count)))
    except UserError:
        return None
    return lambda prompts, tokens: answer_prompts(engine, prompts, tokens, temperature)


def _native_target(target_spec: str | None, states: str) -> Any:
    """The native target whose states a grown data set trains on (``states`` native, or auto
    where it loads); None for the transformers model's."""
    from verispec.api import load_engine
    from verispec.errors import UserError

    if states == "transformers":
        return None
    try:
        return load_engine(target_spec, backend="native").target
    except UserError as error:
        if states == "native":
            raise loop.TrainError(
                f"--states native: the target does not load on the native backend: {error}"
            ) from error
        return None


def _shard_corpus(
    roots: Sequence[Path], sources: tuple[str, ...] | None, fingerprint: str
) -> tuple[data.Corpus, str, dict[str, Any]]:
    """The corpus of grown data directories' shards, its key, and what they hold per source
    (each row names its directory where there are several)."""
    from verispec.train.shards import ShardError, select_across, selection_corpus, summary

    try:
        chosen = select_across(roots, fingerprint, sources)
    except ShardError as error:
        raise loop.TrainError(str(error)) from error
    corpus, key = selection_corpus(chosen)
    rows = []
    for grown, _ in chosen:
        mark = {"directory": str(grown.root)} if len(chosen) > 1 else {}
        rows += [{**row, **mark} for row in summary(grown) if sources is None or row["source"] in sources]
    where = str(roots[0]) if len(roots) == 1 else [str(root) for root in roots]
    return corpus, key, {"shards": where, "key": key, "sources": rows, "chosen": chosen}


def _prompts_note(settings: data.DataSettings, grown: dict[str, Any] | None) -> str:
    if grown is not None:
        return "verispec.train.sources via verispec train-data (per source: data.sources)"
    return "verispec.train.prompts (templates x topic words written in the code" + (
        ", then second turns on the target's own answers)" if settings.second_turns else ")"
    )


def _validate(kind: str, data_settings: data.DataSettings, net: NetSettings, train: TrainSettings) -> None:
    """Refuse bad settings before the target loads and the states are computed (up to an hour)."""
    problems = []
    if data_settings.tokens < 1 or data_settings.max_new_tokens < 1 or data_settings.batch_size < 1:
        problems.append("--tokens, --max-new-tokens and --gen-batch must be >= 1")
    if not 0.0 <= data_settings.second_turns < 1.0:
        problems.append(f"--second-turns is a share in [0, 1), got {data_settings.second_turns}")
    if train.steps < 1 or train.items < 1 or train.span < 1 or train.checkpoint_every < 1:
        problems.append("--steps, --items, --span and --checkpoint-every must be >= 1")
    if net.block_size < 2:
        problems.append("--block-size must be >= 2 (the anchor and at least one mask)")
    if min(net.draft_vocab, net.target_layers, net.feature_layers) < 1 or (net.layers is not None and net.layers < 1):
        problems.append("--draft-vocab, --target-layers, --feature-layers and --layers must be >= 1")
    if net.heads % net.kv_heads:
        problems.append(f"heads ({net.heads}) must be a multiple of kv heads ({net.kv_heads})")
    if not train.lr > 0:
        problems.append("--lr must be > 0")
    if not 0.0 <= train.holdout < 1.0:
        problems.append(f"--holdout is a share in [0, 1), got {train.holdout}")
    if train.patience < 0 or (train.patience > 0 and not train.holdout and not train.score_k):
        problems.append("--patience must be >= 0 and needs --holdout > 0 or --eval (it counts validations)")
    if not train.score_temperature >= 0:
        problems.append(f"--eval-temperature must be >= 0, got {train.score_temperature}")
    if train.score_k < 0 or train.score_tokens < 1:
        problems.append("--eval-k must be >= 0 and --eval-tokens >= 1")
    if not 0.0 <= train.distill <= 1.0 or not train.feature_loss >= 0.0:
        got = f"{train.distill}, {train.feature_loss}"
        problems.append(f"--distill is a share in [0, 1] and --feature-loss >= 0, got {got}")
    if kind != "head" and (train.distill or train.feature_loss):
        problems.append("--distill and --feature-loss train a head; the block drafter has hard labels only")
    if problems:
        raise loop.TrainError("; ".join(problems))


def _corpus(
    model: Any,
    tokenizer: Any,
    target: Any,
    settings: data.DataSettings,
    data_dir: Path,
    fingerprint: str,
    stage: Stage,
) -> tuple[data.Corpus, float]:
    key = settings.key(fingerprint)
    path = data_dir / f"sequences-{key}.safetensors"
    corpus = data.load_corpus(path, key)
    if corpus is not None:
        return corpus, 0.0
    start = time.perf_counter()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(target.eos_token_ids)
    eos = sorted(target.eos_token_ids)
    second = round(settings.tokens * settings.second_turns)
    first_settings = replace(settings, tokens=settings.tokens - second)
    # Prompts enough for the tokens even if answers average 8 tokens; generation stops as
    # soon as enough are written, so unused prompts cost nothing.
    count = max(2 * settings.batch_size, math.ceil(first_settings.tokens / 8))
    requests = training_prompts(count, settings.seed)
    prompts = [data.encode_prompt(tokenizer, text) for text in requests]
    update = stage("target writes responses (tokens)", settings.tokens)
    pairs = data.generate_responses(model, prompts, first_settings, eos, int(pad), lambda d, t: update(d, ""))
    if second > 0:
        texts = {tuple(ids): text for ids, text in zip(prompts, requests, strict=True)}
        first = [(texts[tuple(p)], tokenizer.decode(r, skip_special_tokens=True)) for p, r in pairs]
        done = sum(len(r) for _, r in pairs)
        # Conversations enough if answers average 32 tokens; in a random order, sorted by
        # length only within groups of 8 batches, so that a batch pads little while stopping
        # early keeps a random sample of the passages rather than the shortest ones.
        turns = second_turns(first, max(2 * settings.batch_size, math.ceil(second / 32)), settings.seed)
        encoded = [data.encode_conversation(tokenizer, c) for c in turns]
        group = 8 * settings.batch_size
        encoded = [ids for g in range(0, len(encoded), group) for ids in sorted(encoded[g : g + group], key=len)]
        pairs += data.generate_responses(
            model, encoded, replace(settings, tokens=second), eos, int(pad), lambda d, t: update(done + d, "")
        )
    corpus = data.Corpus.from_sequences(pairs)
    data.save_corpus(corpus, path, key)
    return corpus, time.perf_counter() - start


def held_out_sequences(groups: torch.Tensor, share: float, seed: int) -> torch.Tensor | None:
    """(S,) bool: the sequences held out for validation, about ``share`` of them, as whole
    groups (``groups``: (S,) ids from ``data.quote_groups``, so no held-out response is
    quoted by, or quotes, a trained one) drawn in an order from the seed until the share is
    reached; None when ``share`` is 0."""
    if not share:
        return None
    count = len(groups)
    ids = torch.unique(groups)
    if len(ids) < 2:
        raise loop.TrainError(f"--holdout needs at least 2 unlinked groups of responses, the corpus has {len(ids)}")
    want = max(1, round(share * count))
    mask = torch.zeros(count, dtype=torch.bool)
    for index in np.random.default_rng([seed, 1]).permutation(len(ids))[:-1]:  # never every group
        mask |= groups == ids[int(index)]
        if int(mask.sum()) >= want:
            break
    return mask


def _objective(
    kind: str,
    net: torch.nn.Module,
    shared: SharedTarget,
    corpus: data.Corpus,
    settings: TrainSettings,
    seed: int,
    use: torch.Tensor | None,
) -> loop.Objective:
    if kind == "head":
        assert isinstance(net, HeadNet)
        return objectives.HeadObjective(
            net, shared, corpus, settings.items, settings.span, settings.unroll, seed, use,
            settings.distill, settings.feature_loss,
        )  # fmt: skip
    assert isinstance(net, BlockNet)
    return objectives.BlockObjective(net, shared, corpus, settings.items, settings.span, seed, use)


def _feature_layers(kind: str, net: NetSettings, num_layers: int) -> tuple[int, ...]:
    if kind == "head":
        return evenly_spaced_layers(num_layers, min(net.feature_layers, num_layers))
    return evenly_spaced_layers(num_layers, min(net.target_layers, num_layers))


def draft_vocabulary(corpus: data.Corpus, size: int, vocab_size: int) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent response tokens (ties: lower id first), as sorted ids, and
    the share of response tokens they cover."""
    sequence = corpus.sequence_of()
    local = torch.arange(len(corpus.tokens)) - corpus.starts[sequence]
    response = corpus.tokens[local >= corpus.prompt_lengths[sequence]]
    counts = torch.bincount(response, minlength=vocab_size).to(torch.float64).numpy()
    # Ties in frequency go to the lower id: lexsort's last key is the primary one.
    order = np.lexsort((np.arange(vocab_size), -counts))[: min(size, vocab_size)]
    ids = torch.from_numpy(np.sort(order)).to(torch.long)
    coverage = float(counts[order].sum() / max(counts.sum(), 1.0))
    return ids, round(coverage, 4)


def build_net(
    kind: str, settings: NetSettings, hidden: int, layers: tuple[int, ...], vocab_ids: torch.Tensor
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A freshly initialised network and its config as stored in ``config.json``."""
    common = {
        "hidden": hidden,
        "draft_vocab": len(vocab_ids),
        "heads": settings.heads,
        "kv_heads": settings.kv_heads,
        "head_dim": settings.head_dim,
    }
    if settings.intermediate is not None:
        common["intermediate"] = settings.intermediate
    if settings.window is not None:
        common["window"] = settings.window
    if settings.layers is not None:
        common["layers"] = settings.layers
    if kind == "head":
        head_config = HeadConfig(feature_layer=layers[-1], low_layers=layers[:-1], **common)
        config = asdict(head_config)
        config["low_layers"] = list(head_config.low_layers)
        return HeadNet(head_config, vocab_ids), config
    block_config = BlockConfig(target_layers=layers, block_size=settings.block_size, **common)
    config = asdict(block_config)
    config["target_layers"] = list(block_config.target_layers)
    return BlockNet(block_config, vocab_ids), config


def _run_key(kind: str, fingerprint: str, *settings: Any) -> str:
    fields = [s if isinstance(s, dict) else asdict(s) for s in settings]
    for values in fields:
        for name, default in _LATER_SETTINGS.items():
            if name in values and values[name] == default:
                del values[name]
    text = json.dumps([kind, fingerprint, *fields], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _mean_tail(values: list[float], count: int = 50) -> float:
    tail = values[-count:]
    return round(sum(tail) / len(tail), 4) if tail else float("nan")
