"""``head``: an MTP/EAGLE-style draft head on the target's last hidden state.

Terms: position t holds token x_t; the target's feature h_t (its final normed hidden state
there, the one its LM head reads) predicts x_{t+1}. With ``low_layers`` (EAGLE-3's fused
features) h_t is instead ``reduce([s_a ; s_b ; ... ; final])``, a learnt projection of the
states of a few layers side by side, so the head sees what the lower layers knew, not only
what the last one kept for the next token. The head at position t reads
``fuse([norm(f_{t-1}) ; norm(embed(x_t))])`` through one small decoder layer (causal
attention over its own last ``window`` positions) and predicts x_{t+1} with the target's
LM head. With f = h it drafts the token after the bonus (the bonus x_n is known, h_{n-1}
came from the last verify); for the next drafts it feeds back its own output g as f, one
position at a time. Training unrolls that feedback (``unroll`` steps), so the head learns
to read its own outputs.

Drafting SAMPLES each token from the head's final distribution (the request's sampling
pipeline, position's own history) and reports exactly that row as q; one-hot at T = 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from verispec.drafters import trained
from verispec.drafters.base import DrafterContext
from verispec.drafters.layers import RMSNorm, window_mask

KIND = "head"


@dataclass(frozen=True)
class HeadConfig(trained.NetConfig):
    """Shape of a head. hidden: the target's hidden size; feature_layer: the target
    hidden-state index read (its number of layers = the final normed state); low_layers:
    earlier hidden-state indices read beside it and fused into one feature (EAGLE-3), none
    by default."""

    kind = KIND
    hidden: int
    feature_layer: int
    draft_vocab: int
    layers: int = 1
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1024
    window: int = 64
    rope_theta: float = 10000.0
    low_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:  # config.json holds a list
        object.__setattr__(self, "low_layers", tuple(int(i) for i in self.low_layers))

    @property
    def layers_read(self) -> tuple[int, ...]:
        return (*self.low_layers, self.feature_layer)


class HeadNet(trained.TrainedNet[HeadConfig]):
    """The trainable part. Shapes: features, embeds (..., T, D) -> outputs g (..., T, D);
    the target's states (..., T, F) of the layers read -> features via ``target_features``."""

    config_class = HeadConfig

    def _add_inputs(self) -> None:
        dim = self.config.hidden
        self.feature_norm = RMSNorm(dim)
        self.embed_norm = RMSNorm(dim)
        self.fuse = nn.Linear(2 * dim, dim, bias=False)
        if self.config.low_layers:  # created only here, so a one-layer head's seeded init is unchanged
            self.reduce = nn.Linear(len(self.config.layers_read) * dim, dim, bias=False)

    def target_features(self, states: torch.Tensor) -> torch.Tensor:
        """The feature (..., D) that the target's states (..., F) of the layers read give."""
        return self.reduce(states) if self.config.low_layers else states

    def forward(
        self,
        features: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
        valid: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """features, embeds: (..., T, D); positions (..., T). past: per layer (keys, values,
        key positions) of earlier positions, drafting only. valid (..., T): padding mask for
        training. Returns outputs g (..., T, D) and per layer the new keys, values."""
        x = self.fuse(torch.cat([self.feature_norm(features), self.embed_norm(embeds)], dim=-1))
        own_mask = window_mask(positions, positions, self.config.window)
        if valid is not None:  # padding is no key, but every row keeps itself (no empty softmax)
            itself = torch.eye(positions.shape[-1], dtype=torch.bool)
            own_mask = own_mask & (valid.unsqueeze(-2) | itself)
        new = []
        for index, layer in enumerate(self.layers):
            context = []
            if past is not None:
                keys, values, key_positions = past[index]
                context.append((keys, values, window_mask(positions, key_positions, self.config.window)))
            x, keys, values = layer(x, positions, context, own_mask)
            new.append((keys, values))
        return x, new


class HeadDrafter(trained.TrainedDrafter[HeadNet]):
    """The Drafter: keeps the target's features and its own keys for committed positions."""

    name = KIND
    net_class = HeadNet

    def reset(self) -> None:
        super().reset()
        width = len(self.net.config.layers_read) * self.net.config.hidden
        self.features = torch.zeros(0, width)  # target states, positions [feature_start, known)
        self.feature_start = 0
        # Per layer (keys, values) of the head at cache_positions, those up to committed_cache from
        # target features; drafted positions are appended during propose and cut in observe.
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.cache_positions = torch.zeros(0, dtype=torch.long)
        self.committed_cache = 0

    def _positions(self, context: Sequence[int], n: int, k: int, tokens: list[int]) -> Iterator[torch.Tensor]:
        self._cut(self.committed_cache)  # a propose without observe in between drafts afresh
        outputs = self._catch_up(context, n)
        for i in range(k):
            yield self.net.logits_input(outputs)[0]
            if i + 1 < k:  # the head's own output stands in for the target's feature
                outputs = self._run(outputs, self.shared.embed(torch.tensor([tokens[-1]])), torch.tensor([n + 1 + i]))

    def _drop_drafts(self) -> None:
        self._cut(self.committed_cache)  # drafted positions leave; accepted ones are redone from h

    # --- internals -------------------------------------------------------------------

    def _add(self, rows: torch.Tensor, first_position: int) -> None:
        """Append the target features of positions first_position .. first_position + len - 1."""
        if self.features.shape[0] == 0:
            self.feature_start = first_position
        self.features = torch.cat([self.features, rows])
        extra = self.features.shape[0] - (self.net.config.window + 1)
        if extra > 0:  # only the last window's features are ever read again
            self.features = self.features[extra:]
            self.feature_start += extra

    def _catch_up(self, context: Sequence[int], n: int) -> torch.Tensor:
        """Run the head on committed positions not yet in its cache (from target features),
        up to position n; returns the output at n (1, D)."""
        start = max(int(self.cache_positions[-1]) + 1 if len(self.cache_positions) else 1, self.feature_start + 1)
        start = max(start, n - self.net.config.window + 1)
        positions = torch.arange(start, n + 1)
        features = self.net.target_features(self.features[positions - 1 - self.feature_start])
        embeds = self.shared.embed(torch.tensor([context[t] for t in positions.tolist()]))
        outputs = self._run(features, embeds, positions)
        # Position n's entry is redone next round too (its output is what drafting starts from).
        self.committed_cache = len(self.cache_positions) - 1
        return outputs[-1:]

    def _run(self, features: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        past = None
        if self.cache:
            past = [(keys, values, self.cache_positions) for keys, values in self.cache]
        outputs, new = self.net(features, embeds, positions, past)
        if self.cache:
            self.cache = [
                (torch.cat([keys, k_new]), torch.cat([values, v_new]))
                for (keys, values), (k_new, v_new) in zip(self.cache, new, strict=True)
            ]
        else:
            self.cache = list(new)
        self.cache_positions = torch.cat([self.cache_positions, positions])
        window = self.net.config.window
        if len(self.cache_positions) > 2 * window:  # keep the cache bounded on long outputs
            self._drop_front(len(self.cache_positions) - window)
        return outputs

    def _drop_front(self, count: int) -> None:
        self.cache = [(keys[count:], values[count:]) for keys, values in self.cache]
        self.cache_positions = self.cache_positions[count:]
        self.committed_cache = max(0, self.committed_cache - count)

    def _cut(self, length: int) -> None:
        self.cache = [(keys[:length], values[:length]) for keys, values in self.cache]
        self.cache_positions = self.cache_positions[:length]


build = HeadDrafter.load  # a head drafter for a target from a weights directory


def _build(context: DrafterContext) -> HeadDrafter:
    return HeadDrafter.from_context(context)
