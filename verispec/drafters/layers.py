"""Building blocks of the trained drafters (``head``, ``block``), for training and drafting alike.

Terms and shapes (``...`` is any leading batch shape, the same code serving a training batch
of many anchors and a drafting call on one):

- hidden: the drafter's width D, equal to the target's hidden size, so that the target's
  token embeddings (V, D) and LM head (V, D) can be shared, frozen and never stored;
- heads H, kv heads G (grouped-query attention: H a multiple of G), head width d;
- keys, values: (..., K, G, d) with rotary positions applied to keys; a mask (..., Q, K) is
  True where query q may attend to key k;
- draft vocabulary: the N token ids (N <= V) the drafter may propose, the most frequent in
  its training data; its LM head is those rows of the target's. Logits outside it are -inf,
  so the drafter's q gives them probability 0 and the rule never accepts them by mistake.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from verispec.accept import sample_index
from verispec.sampling import SamplingParams, final_distribution


class RMSNorm(nn.Module):
    """x / rms(x) * weight, over the last dimension."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * scale * self.weight


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding. x: (..., T, heads, d), positions: (..., T) absolute."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # (..., T, d/2)
    cos, sin = angles.cos().unsqueeze(-2).to(x.dtype), angles.sin().unsqueeze(-2).to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


KeyParts = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]


class Attention(nn.Module):
    """Multi-head attention whose keys may come from several sources (context, own tokens)."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, theta: float) -> None:
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, head_dim, theta
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (..., T, D) -> keys, values (..., T, G, d), keys rotated to their positions."""
        shape = (*x.shape[:-1], self.kv_heads, self.head_dim)
        keys = rotary(self.k_proj(x).view(shape), positions, self.theta)
        return keys, self.v_proj(x).view(shape)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, parts: KeyParts) -> torch.Tensor:
        """x: (..., Q, D) queries; parts: (keys, values, mask or None) whose leading shapes
        broadcast against x's. Scores of all parts share one softmax. Returns (..., Q, D)."""
        shape = (*x.shape[:-1], self.heads, self.head_dim)
        query = rotary(self.q_proj(x).view(shape), positions, self.theta).transpose(-2, -3)  # (..., H, Q, d)
        groups = self.heads // self.kv_heads
        scores, values = [], []
        for keys, vals, mask in parts:
            keys = keys.repeat_interleave(groups, dim=-2).transpose(-2, -3)  # (..., H, K, d)
            part = torch.matmul(query, keys.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (..., H, Q, K)
            if mask is not None:
                part = part.masked_fill(~mask.unsqueeze(-3), float("-inf"))
            scores.append(part)
            values.append(vals.repeat_interleave(groups, dim=-2).transpose(-2, -3))
        weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
        # Each part's values weighted separately: broadcasting, a context shared by many
        # anchors is never copied once per anchor.
        pieces = torch.split(weights, [part.shape[-1] for part in scores], dim=-1)
        out = sum(torch.matmul(piece, vals) for piece, vals in zip(pieces, values, strict=True))
        assert isinstance(out, torch.Tensor)
        return self.o_proj(out.transpose(-2, -3).reshape(*x.shape[:-1], self.heads * self.head_dim))


class MLP(nn.Module):
    """The gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, intermediate: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, intermediate, bias=False)
        self.up = nn.Linear(dim, intermediate, bias=False)
        self.down = nn.Linear(intermediate, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP. Its own tokens' keys join any context keys passed in."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, theta: float):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, head_dim, theta)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = MLP(dim, intermediate)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, context: KeyParts, own_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: (..., T, D). Returns the output (..., T, D) and the own keys, values (..., T, G, d)."""
        normed = self.attn_norm(x)
        keys, values = self.attn.keys_values(normed, positions)
        x = x + self.attn(normed, positions, [*context, (keys, values, own_mask)])
        return x + self.mlp(self.mlp_norm(x)), keys, values


def window_mask(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """(..., Q, K): key at or before the query and fewer than ``window`` positions back."""
    back = query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)
    return (back >= 0) & (back < window)


IGNORED = -100  # the training label of a prediction no loss counts (cross_entropy's ignore_index)


class SharedTarget:
    """The target's frozen token embeddings and the draft vocabulary's rows of its LM head.

    embeddings: (V, D) as the target holds them (any dtype; rows are cast when read);
    head: (N, D) float32, the rows of ``vocab_ids`` (N,) of the target's LM head.
    draft_head: where the target has one (the native kernels), its own product with those
    rows as it stores them, (M, D) float32 -> (M, N) float32, which drafting reads instead of
    the bfloat16 copy: a row's result does not depend on M, and on the embedded model it reads
    the Q8_0 rows (4.7 MB for 8,192 rows, not 9.4 in bfloat16) on the decoder's threads.
    """

    def __init__(
        self,
        embeddings: torch.Tensor,
        lm_head: torch.Tensor,
        vocab_ids: torch.Tensor,
        draft_head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        # Drafters run on the CPU beside the engine's sampling; a CPU target's tensors are not copied.
        self.embeddings = embeddings.detach().cpu()
        self.vocab_ids = vocab_ids.to(torch.long).cpu()
        self.vocab_np = self.vocab_ids.numpy()
        self.ascending = bool((self.vocab_np[1:] > self.vocab_np[:-1]).all())
        self.vocab_size = int(lm_head.shape[0])
        self.head = lm_head.detach().cpu()[self.vocab_ids].to(torch.float32)
        self.draft_head = draft_head
        # drafting's copy (``distribution``) where the target has no draft_head
        self.head_bf16 = self.head.to(torch.bfloat16) if draft_head is None else None
        # For training: the draft-vocabulary index of each token id, IGNORED outside it.
        self.label_index = torch.full((self.vocab_size,), IGNORED, dtype=torch.long)
        self.label_index[self.vocab_ids] = torch.arange(len(self.vocab_ids))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(...,) ids -> (..., D) float32."""
        return self.embeddings[token_ids].to(torch.float32)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., N) logits over the draft vocabulary."""
        return torch.matmul(hidden.to(torch.float32), self.head.T)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., N): the logits drafting reads (``distribution``), the target's
        ``draft_head`` (a bfloat16 copy of the head rows where it has none: 3.5x faster than
        float32 here); a greedy draft is their argmax, ties to the lowest id, also where they
        are scored offline."""
        if self.draft_head is not None:
            rows = self.draft_head(hidden.reshape(-1, hidden.shape[-1]).to(torch.float32))
            return rows.reshape(*hidden.shape[:-1], rows.shape[-1])
        assert self.head_bf16 is not None
        return torch.matmul(hidden.to(torch.bfloat16), self.head_bf16.T)

    def distribution(
        self, logits: torch.Tensor, params: SamplingParams, prompt: Sequence[int], history: Sequence[int]
    ) -> tuple[NDArray[np.float64], float]:
        """(N,) draft logits (``draft_logits``) -> (V,), confidence: the final sampling
        distribution of one drafted position over the whole vocabulary (zero outside the
        draft vocabulary), ``history`` the output before it; and the drafter's confidence
        there, the largest probability of its plain softmax (T = 1, no filters) over the draft
        vocabulary. The confidence depends on the drafter's state alone, never on a sampled
        token or the target, so a drafter may stop drafting on it and the rule stays exact.

        Drafting's hot path, so it stays on the draft vocabulary: the pipeline over N entries
        instead of V (at T = 1, 1.4 ms -> 0.1 ms a row), then scattered into a V-row.
        Penalties read token ids, so with penalties the pipeline runs on the full row (-inf
        outside). Either way the row returned is the one the drafter samples from, which is
        all the acceptance rule asks of q.
        """
        row_logits = logits.double().numpy()
        confidence = _confidence(row_logits)
        if params.penalised:
            full = np.full(self.vocab_size, -np.inf)
            full[self.vocab_np] = row_logits
            return final_distribution(full, params, prompt, history), confidence
        row = np.zeros(self.vocab_size)
        row[self.vocab_np] = final_distribution(row_logits, params)
        return row, confidence

    def draw(
        self,
        logits: torch.Tensor,
        params: SamplingParams,
        prompt: Sequence[int],
        history: Sequence[int],
        uniform: float,
        min_confidence: float,
    ) -> tuple[int, NDArray[np.float64] | None] | None:
        """One drafted position from its draft logits (N,): the token drawn by ``uniform``
        from ``distribution``'s row, and that row (q), or None for a point mass at the token
        (greedy); None where the confidence is below ``min_confidence`` (the drafter stops
        there: this draft and the ones after it would rarely be kept).

        Where no penalty reads ids and the draft vocabulary is in ascending id order, the
        draw runs on the draft vocabulary's entries: their running sums are the V-row's (its
        other entries are exact zeros), so the token is the one the V-row would give. Greedy
        there is the entries' argmax (ties to the lowest id, as the V-row's one-hot), with no
        row built: a V-row of float64 zeroed, filled and stacked every round cost ~0.15 ms, 4%
        of a plain step, and the rule reads a point mass as None (``Draft.probs``)."""
        row_logits = logits.double().numpy()
        if min_confidence > 0 and _confidence(row_logits) < min_confidence:
            return None
        if params.greedy and not params.penalised and self.ascending:
            index = int(row_logits.argmax())  # argmax stops at a NaN: the value checked below is then NaN
            if math.isfinite(row_logits.item(index)):
                return int(self.vocab_np[index]), None
            # NaN, +inf or no finite entry: the full path raises the sampler's own error
        if params.penalised or not self.ascending:
            row, _ = self.distribution(logits, params, prompt, history)
            return sample_index(row, uniform), row
        compact = final_distribution(row_logits, params)
        row = np.zeros(self.vocab_size)
        row[self.vocab_np] = compact
        return int(self.vocab_np[sample_index(compact, uniform)]), row


def _confidence(logits: NDArray[np.float64]) -> float:
    """The largest probability of the plain softmax of ``logits``."""
    return float(1.0 / np.exp(logits - logits.max()).sum())
