"""``block``: a DFlash-style block drafter that fills a whole block in ONE forward pass.

Terms: the anchor is the last committed token x_n (the bonus, whose target hidden state is
not computed yet); the block is [x_n, MASK, ..., MASK] at positions n .. n + B - 1
(B = ``block_size``); mask slot i (1 <= i < B) predicts x_{n+i}, so one pass gives up to
B - 1 drafts. The context is the target's hidden states at committed positions
n - window .. n - 1, taken from ``target_layers`` (a few evenly spaced layers), side by side
(..., C, len(target_layers) * D), projected to the drafter's width D and injected as extra
keys and values into every drafter layer. Attention inside the block is non-causal: every
slot sees every other slot and the whole context. The target's embeddings and LM head are
shared and frozen.

Drafting SAMPLES each slot's token from its final distribution (the request's sampling
pipeline, penalties from that position's own history, previous drafts included) and
reports exactly that row as q; one-hot at T = 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from verispec.drafters import trained
from verispec.drafters.base import DrafterContext, DrafterError
from verispec.drafters.layers import DecoderLayer, RMSNorm

KIND = "block"


@dataclass(frozen=True)
class BlockConfig(trained.NetConfig):
    """Shape of a block drafter. hidden: the target's hidden size; target_layers: the target
    hidden-state indices read (0 = embeddings, the number of layers = the final state)."""

    kind = KIND
    hidden: int
    target_layers: tuple[int, ...]
    draft_vocab: int
    layers: int = 2
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 576  # with 2 layers: ~4.8M parameters, ~9.6 MB in bf16
    block_size: int = 8
    window: int = 64
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layers", tuple(int(i) for i in self.target_layers))
        if self.block_size < 2:
            raise DrafterError(f"block_size must be >= 2 (the anchor and one mask), got {self.block_size}")

    @property
    def layers_read(self) -> tuple[int, ...]:
        return self.target_layers


def _layer(module: nn.Module) -> DecoderLayer:
    assert isinstance(module, DecoderLayer)
    return module


def evenly_spaced_layers(num_layers: int, count: int) -> tuple[int, ...]:
    """``count`` hidden-state indices from the first layer's output to the last (final) one."""
    if count < 1:
        raise ValueError(f"need at least one target layer, got {count}")
    if count == 1:
        return (num_layers,)
    return tuple(sorted({round(1 + i * (num_layers - 1) / (count - 1)) for i in range(count)}))


class BlockNet(trained.TrainedNet[BlockConfig]):
    """The trainable part; see the module docstring for the shapes."""

    config_class = BlockConfig

    def _add_inputs(self) -> None:
        dim = self.config.hidden
        self.ctx_proj = nn.Linear(len(self.config.target_layers) * dim, dim, bias=False)
        self.ctx_norm = RMSNorm(dim)
        self.mask_embedding = nn.Parameter(torch.randn(dim) * 0.02)

    def context_keys(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """features (..., C, F) target states -> per layer (keys, values) (..., C, G, d)."""
        context = self.ctx_norm(self.ctx_proj(features))
        return [_layer(module).attn.keys_values(context, positions) for module in self.layers]

    def forward(
        self,
        anchor_embeds: torch.Tensor,
        anchor_positions: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]],
        context_positions: torch.Tensor,
        context_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """anchor_embeds (..., A, D), anchor_positions (..., A); context per layer (keys,
        values) (..., C, G, d) at context_positions (..., C), valid (..., C). Each anchor sees
        the context positions in [anchor - window, anchor). Returns (..., A, B - 1, D): the
        mask slots' outputs, before the output norm."""
        config = self.config
        size = config.block_size
        masks = self.mask_embedding.expand(*anchor_embeds.shape[:-1], size - 1, config.hidden)
        x = torch.cat([anchor_embeds.unsqueeze(-2), masks], dim=-2)  # (..., A, B, D)
        positions = anchor_positions.unsqueeze(-1) + torch.arange(size)  # (..., A, B)
        back = anchor_positions.unsqueeze(-1) - context_positions.unsqueeze(-2)  # (..., A, C)
        visible = (back > 0) & (back <= config.window)
        if context_valid is not None:
            visible = visible & context_valid.unsqueeze(-2)
        visible = visible.unsqueeze(-2)  # (..., A, 1, C): the same for every slot
        for layer, (keys, values) in zip(self.layers, context, strict=True):
            # unsqueeze(-4): the context is shared by the anchors (broadcast, not copied).
            x, _, _ = layer(x, positions, [(keys.unsqueeze(-4), values.unsqueeze(-4), visible)], None)
        return x[..., 1:, :]


class BlockDrafter(trained.TrainedDrafter[BlockNet]):
    """The Drafter: keeps per-layer context keys of the last ``window`` committed positions."""

    name = KIND
    net_class = BlockNet

    def reset(self) -> None:
        super().reset()
        self.context: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.context_positions = torch.zeros(0, dtype=torch.long)

    def _positions(self, context: Sequence[int], n: int, k: int, tokens: list[int]) -> Iterator[torch.Tensor]:
        # n is the anchor's position; one pass fills every slot at once, at most block_size - 1.
        outputs = self.net(
            self.shared.embed(torch.tensor([context[n]])),
            torch.tensor([n]),
            self.context,
            self.context_positions,
        )[0, :k]  # (k, D)
        yield from self.shared.draft_logits(self.net.logits_input(outputs))  # one product for the k rows

    def _add(self, features: torch.Tensor, first_position: int) -> None:
        if features.shape[0] == 0:
            return
        if len(self.context_positions) and first_position != int(self.context_positions[-1]) + 1:
            # a gap (observe let passes go that no window reaches any more): the old keys too
            self.context, self.context_positions = [], self.context_positions[:0]
        positions = torch.arange(first_position, first_position + features.shape[0])
        fresh = self.net.context_keys(features, positions)
        if self.context:
            fresh = [
                (torch.cat([keys, k_new]), torch.cat([values, v_new]))
                for (keys, values), (k_new, v_new) in zip(self.context, fresh, strict=True)
            ]
        positions = torch.cat([self.context_positions, positions])
        window = self.net.config.window
        self.context = [(keys[-window:], values[-window:]) for keys, values in fresh]
        self.context_positions = positions[-window:]


build = BlockDrafter.load  # a block drafter for a target from a weights directory


def _build(context: DrafterContext) -> BlockDrafter:
    return BlockDrafter.from_context(context)
