"""Per drafter kind: the batches drawn from a corpus and the loss a training step minimises.

Both objectives are teacher-forced cross-entropy over the draft vocabulary against the
target's own continuation (the corpus), counted only where the predicted token belongs to a
response (prompt tokens are not the target's writing). The head can also learn from the
target's whole next-token distribution at each position (``distill``: soft labels, the
dark knowledge a token alone does not carry: DistillSpec, EAGLE's classification loss) and
regress its output onto the target's final state there (``feature_loss``: EAGLE-1's
regression), both read from the corpus's stored final states, so they cost no extra data.
A step's batch is drawn from a generator seeded by (seed, step), so a run is reproducible
and a resumed run draws exactly the batches the uninterrupted one would have.

Shapes: N items per step; head items are chunks of max(``span``, window) consecutive
positions of one sequence; block items are ``span`` consecutive anchors with the ``window`` positions of
context before the first of them (C = window + span - 1 context positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch import nn

from verispec.drafters.block import BlockNet
from verispec.drafters.head import HeadNet
from verispec.drafters.layers import IGNORED, SharedTarget
from verispec.drafters.trained import TrainedNet
from verispec.train.data import Corpus
from verispec.train.states import ShardStates

HEAD_STEP_DECAY = 0.7  # weight of unrolled step u is HEAD_STEP_DECAY ** (u - 1)
BLOCK_SLOT_DECAY = 0.85  # weight of mask slot i is BLOCK_SLOT_DECAY ** (i - 1): early drafts matter most


@dataclass
class StepResult:
    loss: torch.Tensor
    accuracy: float  # of the first draft position: how often the drafter's argmax is the target's token


class _Sampler:
    """Draws item start positions: uniform over positions whose next token is a response
    token, in the sequences ``use`` marks ((S,) bool; None: all of them)."""

    def __init__(self, corpus: Corpus, span: int, seed: int, use: torch.Tensor | None = None) -> None:
        self.corpus, self.span, self.seed = corpus, span, seed
        sequence = corpus.sequence_of()
        position = torch.arange(len(corpus.tokens))
        local = position - corpus.starts[sequence]
        # t predicts t + 1: t + 1 inside the response, and t >= 1 (a feature at t - 1 exists).
        labelled = (local + 1 >= corpus.prompt_lengths[sequence]) & (local + 1 < corpus.lengths[sequence])
        if use is not None:
            labelled &= use[sequence]
        self.labelled = torch.nonzero(labelled & (local >= 1)).flatten()
        if len(self.labelled) == 0:
            raise ValueError("the corpus has no response positions to train on")
        self.sequence = sequence

    def starts(self, step: int, items: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(items,) global first positions of the items and (items,) their sequences."""
        rng = np.random.default_rng([self.seed, step])
        picks = self.labelled[torch.from_numpy(rng.integers(len(self.labelled), size=items))]
        offsets = torch.from_numpy(rng.integers(self.span, size=items))
        sequence = self.sequence[picks]
        first = torch.maximum(picks - offsets, self.corpus.starts[sequence] + 1)
        return first, sequence


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean CE; labels IGNORED are ignored. logits (..., N), labels and weights (...)."""
    losses = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORED, reduction="none"
    )
    return _masked_mean(losses, (labels.reshape(-1) != IGNORED).to(losses.dtype) * weights.reshape(-1))


def _masked_mean(losses: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The mean of ``losses`` weighted by ``weights`` (same shape; a bool mask counts as 0/1)."""
    weights = weights.to(losses.dtype)
    return (losses * weights).sum() / weights.sum().clamp_min(1e-6)


Net = TypeVar("Net", bound=TrainedNet[Any])


class _Objective(Generic[Net]):
    """What both objectives share: the net, the target's shared parts, a corpus with hidden
    states, and ``items`` items of ``span`` positions a step drawn by a ``_Sampler``."""

    def __init__(
        self,
        net: Net,
        shared: SharedTarget,
        corpus: Corpus,
        items: int,
        span: int,
        seed: int,
        use: torch.Tensor | None,
    ) -> None:
        if corpus.hidden is None:
            raise ValueError("the corpus has no hidden states")
        self.net, self.shared, self.corpus = net, shared, corpus
        self.items, self.span = items, span
        self.sampler = _Sampler(corpus, span, seed, use)

    def _hidden(self) -> torch.Tensor | ShardStates:
        """The corpus's hidden states (P, F), one row a position (gathered by index)."""
        assert self.corpus.hidden is not None
        return self.corpus.hidden

    def _labels(self, positions: torch.Tensor, usable: torch.Tensor) -> torch.Tensor:
        """The draft-vocabulary labels of the tokens at ``positions``, IGNORED where not ``usable``."""
        labels = self.shared.label_index[self.corpus.tokens[positions]]
        return torch.where(usable, labels, torch.full_like(labels, IGNORED))


def _soft_cross_entropy(logits: torch.Tensor, probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over ``mask`` (...) of -sum p log q: logits (..., N) of q, probs (..., N) of p."""
    return _masked_mean(-(probs * torch.log_softmax(logits, dim=-1)).sum(-1), mask)


def _feature_error(outputs: torch.Tensor, final: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over ``mask`` (...) of the smooth-L1 distance per element of (..., D) rows."""
    return _masked_mean(nn.functional.smooth_l1_loss(outputs, final, reduction="none").mean(-1), mask)


class HeadObjective(_Objective[HeadNet]):
    """Teacher-forced head with ``unroll`` steps of feeding its own outputs back.

    Each unrolled step's loss is (1 - distill) x CE against the target's token + distill x CE
    against the target's distribution over the draft vocabulary at T = 1 (the softmax of its
    LM head rows on its final state h_t, renormalised there), + feature_loss x the smooth-L1
    error of the head's normed output against h_t. The target's final state is the last
    ``hidden`` columns of the corpus's states (the feature layer, which the pipeline always
    makes the target's final normed state: ``pipeline._feature_layers``).
    """

    def __init__(
        self,
        net: HeadNet,
        shared: SharedTarget,
        corpus: Corpus,
        items: int,
        span: int,
        unroll: int,
        seed: int,
        use: torch.Tensor | None = None,
        distill: float = 0.0,
        feature_loss: float = 0.0,
    ) -> None:
        # Chunks at least as long as the attention window: drafting attends that far back,
        # so training must have shown the head such distances.
        super().__init__(net, shared, corpus, items, max(span, net.config.window), seed, use)
        if not 0.0 <= distill <= 1.0 or not feature_loss >= 0.0:
            raise ValueError(f"distill is a share in [0, 1] and feature_loss >= 0, got {distill}, {feature_loss}")
        self.unroll = max(1, unroll)
        self.distill, self.feature_loss = distill, feature_loss

    def step(self, step: int) -> StepResult:
        corpus = self.corpus
        first, sequence = self.sampler.starts(step, self.items)
        end = corpus.starts[sequence] + corpus.lengths[sequence]  # (N,) one past the last position
        positions = first.unsqueeze(1) + torch.arange(self.span)  # (N, T) global
        valid = positions <= (end - 2).unsqueeze(1)  # a label x_{t+1} exists
        safe = torch.where(valid, positions, first.unsqueeze(1))
        features = self.net.target_features(self._hidden()[safe - 1].to(torch.float32))  # h_{t-1}
        embeds = self.shared.embed(corpus.tokens[safe])
        local = safe - corpus.starts[sequence].unsqueeze(1)
        in_response = local + 1 >= corpus.prompt_lengths[sequence].unsqueeze(1)
        labels = self._labels(safe + 1, valid & in_response)
        final = probs = None
        if self.distill or self.feature_loss:
            final = self._hidden()[safe][..., -self.net.config.hidden :].to(torch.float32)  # h_t (N, T, D)
            if self.distill:
                with torch.no_grad():
                    probs = torch.softmax(self.shared.logits(final), dim=-1)  # (N, T, N_draft)
        total = torch.zeros(())
        weight_sum = 0.0
        accuracy = 0.0
        for unrolled in range(self.unroll):
            outputs, _ = self.net(features, embeds, local, valid=valid)
            normed = self.net.logits_input(outputs)
            logits = self.shared.logits(normed)
            step_labels = labels[:, unrolled:]
            step_logits = logits[:, unrolled:]
            counted = step_labels != IGNORED
            loss = _cross_entropy(step_logits, step_labels, torch.ones_like(step_labels))
            if probs is not None:
                soft = _soft_cross_entropy(step_logits, probs[:, unrolled:], counted)
                loss = (1.0 - self.distill) * loss + self.distill * soft
            if final is not None and self.feature_loss:
                loss = loss + self.feature_loss * _feature_error(normed[:, unrolled:], final[:, unrolled:], counted)
            weight = HEAD_STEP_DECAY**unrolled
            total = total + weight * loss
            weight_sum += weight
            if unrolled == 0:
                accuracy = _accuracy(logits, labels)
            # Position t next reads the head's own output at t - 1, as drafting does.
            features = torch.cat([features[:, :1], outputs[:, :-1]], dim=1)
        return StepResult(total / weight_sum, accuracy)


class BlockObjective(_Objective[BlockNet]):
    """Each anchor's block of mask slots predicts the tokens after it, in one pass."""

    def __init__(
        self,
        net: BlockNet,
        shared: SharedTarget,
        corpus: Corpus,
        items: int,
        span: int,
        seed: int,
        use: torch.Tensor | None = None,
    ) -> None:
        super().__init__(net, shared, corpus, items, span, seed, use)
        slots = net.config.block_size - 1
        self.slot_weights = BLOCK_SLOT_DECAY ** torch.arange(slots, dtype=torch.float32)

    def step(self, step: int) -> StepResult:
        corpus = self.corpus
        window, size = self.net.config.window, self.net.config.block_size
        first, sequence = self.sampler.starts(step, self.items)
        start = corpus.starts[sequence].unsqueeze(1)
        end = start + corpus.lengths[sequence].unsqueeze(1)
        # Context positions [first - window, first + span - 1); anchors [first, first + span).
        context_positions = first.unsqueeze(1) - window + torch.arange(window + self.span - 1)
        context_valid = (context_positions >= start) & (context_positions < end)
        context_features = self._hidden()[context_positions.clamp(0, len(corpus.tokens) - 1)].to(torch.float32)
        anchors = first.unsqueeze(1) + torch.arange(self.span)  # (N, A)
        anchor_valid = anchors <= end - 2
        safe_anchors = torch.where(anchor_valid, anchors, first.unsqueeze(1))
        context = self.net.context_keys(context_features, context_positions - start)
        outputs = self.net(
            self.shared.embed(corpus.tokens[safe_anchors]),
            safe_anchors - start,
            context,
            context_positions - start,
            context_valid,
        )  # (N, A, B - 1, D)
        targets = safe_anchors.unsqueeze(-1) + torch.arange(1, size)  # (N, A, B - 1) positions predicted
        prompt_end = (start + corpus.prompt_lengths[sequence].unsqueeze(1)).unsqueeze(-1)
        usable = (targets < end.unsqueeze(-1)) & (targets >= prompt_end) & anchor_valid.unsqueeze(-1)
        labels = self._labels(targets.clamp_max(len(corpus.tokens) - 1), usable)
        logits = self.shared.logits(self.net.logits_input(outputs))
        loss = _cross_entropy(logits, labels, self.slot_weights.expand_as(labels))
        return StepResult(loss, _accuracy(logits[..., 0, :], labels[..., 0]))


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    counted = labels != IGNORED
    if not bool(counted.any()):
        return 0.0
    return float((logits.argmax(-1)[counted] == labels[counted]).float().mean())
