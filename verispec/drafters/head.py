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
from typing import Any

import torch
from torch import nn

from verispec.drafters import trained
from verispec.drafters.base import DEFAULT_MIN_CONFIDENCE, DrafterContext, DrafterError
from verispec.drafters.layers import RMSNorm, SharedTarget, window_mask

KIND = "head"
# Where the head's layers run (drafter option ``head_kernels``): auto = the target's native
# kernels where it has them (4-bit matrices), else torch; off = torch; or a kernel format.
KERNELS_AUTO, KERNELS_OFF = "auto", "off"
KERNEL_CHOICES = (KERNELS_AUTO, KERNELS_OFF, "q8_0", "q4", "bf16", "f32")


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
    """The Drafter: keeps the target's features and its own keys for committed positions.

    Where the target runs on the native kernels, the head's layers run there too
    (``target.head_stack``: one call a drafted position, its keys in a ring inside the
    kernels); elsewhere in torch, its keys in ``cache``. Both keep the same positions: those
    the head computed from the target's features and drafted since, less the drafts a round
    did not keep.
    """

    name = KIND
    net_class = HeadNet

    def __init__(
        self,
        net: HeadNet,
        shared: SharedTarget,
        target: Any,
        min_confidence: float = DEFAULT_MIN_CONFIDENCE,
        kernels: str = KERNELS_AUTO,
    ) -> None:
        check_kernels(kernels)
        build = getattr(target, "head_stack", None)
        self.kernels = None
        if kernels != KERNELS_OFF and build is not None:
            self.kernels = build(net, None if kernels == KERNELS_AUTO else kernels)
        if self.kernels is None and kernels not in (KERNELS_AUTO, KERNELS_OFF):
            raise DrafterError(
                f"head_kernels={kernels}: the target {target.name!r} cannot run the head's layers in that "
                "format (its native kernels are off, or the head's widths do not fit it)"
            )
        super().__init__(net, shared, target, min_confidence)

    @classmethod
    def context_options(cls, context: DrafterContext) -> dict[str, Any]:
        kernels = context.option("head_kernels", KERNELS_AUTO)
        check_kernels(kernels)  # before the weights load: a typo fails fast
        return {"kernels": kernels}

    def reset(self) -> None:
        super().reset()
        width = len(self.net.config.layers_read) * self.net.config.hidden
        # Target states of positions [feature_start, feature_start + feature_count): the first
        # rows of a buffer that holds a few windows, so taking in a pass's states is one copy,
        # and the buffer slides when it fills.
        self.feature_buffer = torch.zeros(4 * (self.net.config.window + 1), width)
        self.feature_start = 0
        self.feature_count = 0
        # Per layer (keys, values) of the head at cache_positions, those up to committed_cache from
        # target features; drafted positions are appended during propose and cut at the next.
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.cache_positions = torch.zeros(0, dtype=torch.long)
        self.committed_cache = 0
        # On the kernels: the last position in the ring, and the last one kept when drafts go.
        self.kernel_last: int | None = None
        self.kernel_committed: int | None = None
        if self.kernels is not None:
            self.kernels.clear()

    def _unshare(self) -> None:
        if self.kernels is not None:  # a fork drafts with its own ring
            self.kernels = self.kernels.fresh()

    def _positions(self, context: Sequence[int], n: int, k: int, tokens: list[int]) -> Iterator[torch.Tensor]:
        self._drop_drafts()  # the last round's drafts leave; accepted ones are redone from h
        outputs, logits = self._catch_up(context, n)
        for i in range(k):
            yield logits
            if i + 1 < k:  # the head's own output stands in for the target's feature
                outputs, logits = self._step(outputs, tokens[-1], n + 1 + i)

    def _drop_drafts(self) -> None:
        """Forget the positions the last propose drafted (its own keys of them)."""
        if self.kernels is None:
            self._cut(self.committed_cache)
            return
        self.kernels.truncate(0 if self.kernel_committed is None else self.kernel_committed + 1)
        self.kernel_last = self.kernel_committed

    # --- internals -------------------------------------------------------------------

    def _add(self, rows: torch.Tensor, first_position: int) -> None:
        """Append the target features of positions first_position .. first_position + len - 1."""
        kept = self.net.config.window + 1  # only the last window's features are ever read again
        # After a gap (observe let passes go that no window reaches any more) the old rows are
        # out of reach too: start afresh, so that row i always holds position feature_start + i.
        contiguous = first_position == self.feature_start + self.feature_count
        if rows.shape[0] >= kept or self.feature_count == 0 or not contiguous:
            self.feature_count = 0
            rows, first_position = rows[-kept:], first_position + max(0, rows.shape[0] - kept)
            self.feature_start = first_position
        elif self.feature_count + rows.shape[0] > self.feature_buffer.shape[0]:
            keep = kept - rows.shape[0]  # slide: the rows still read stay, at the front
            end = self.feature_count
            self.feature_buffer[:keep] = self.feature_buffer[end - keep : end].clone()
            self.feature_start += end - keep
            self.feature_count = keep
        self.feature_buffer[self.feature_count : self.feature_count + rows.shape[0]] = rows
        self.feature_count += rows.shape[0]

    def _catch_up(self, context: Sequence[int], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head on committed positions not yet in its cache (from target features),
        up to position n; returns the output at n (1, D) and its draft logits (N,)."""
        if self.kernels is not None:
            last = self.kernel_last
        else:
            last = int(self.cache_positions[-1]) if len(self.cache_positions) else None
        start = max(last + 1 if last is not None else 1, self.feature_start + 1, n - self.net.config.window + 1)
        states = self.feature_buffer[start - 1 - self.feature_start : n - self.feature_start]  # positions start-1..n-1
        ids = list(context[start : n + 1])
        # Position n's entry is redone next round too (its output is what drafting starts from).
        if self.kernels is not None:
            outputs, logits = self.kernels.run(states, ids, start)
            self.kernel_committed = n - 1 if start < n else last
            self.kernel_last = n
            return outputs[-1:], logits
        embeds = self.shared.embed(torch.tensor(ids))
        outputs = self._run(self.net.target_features(states), embeds, torch.arange(start, n + 1))
        self.committed_cache = len(self.cache_positions) - 1
        return outputs[-1:], self._logits(outputs[-1])

    def _step(self, outputs: torch.Tensor, token: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's output (1, D) and draft logits (N,) at a drafted position, fed its
        previous output and token."""
        if self.kernels is not None:
            self.kernel_last = position
            outputs, logits = self.kernels.run(outputs, [token], position)
            return outputs, logits
        outputs = self._run(outputs, self.shared.embed(torch.tensor([token])), torch.tensor([position]))
        return outputs, self._logits(outputs[-1])

    def _logits(self, output: torch.Tensor) -> torch.Tensor:
        """(D,) -> (N,): the draft logits of one output of the net in torch."""
        return self.shared.draft_logits(self.net.logits_input(output)[None])[0]

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


def check_kernels(kernels: object) -> None:
    """A ``head_kernels`` option: one of KERNEL_CHOICES."""
    if kernels not in KERNEL_CHOICES:
        raise DrafterError(f"head_kernels is one of {', '.join(KERNEL_CHOICES)}, got {kernels!r}")


build = HeadDrafter.load  # a head drafter for a target from a weights directory


def _build(context: DrafterContext) -> HeadDrafter:
    return HeadDrafter.from_context(context)
