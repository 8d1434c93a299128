"""The acceptance rule of ``accept.py`` for a batch of rounds as torch tensors, on any device.

Same terms, same uniform layout and the same tokens as ``accept.accept_chain`` on the same
uniforms (tests/core/test_accept_batched.py holds it to that). The rows it reads to decide
(drafted entries, one residual row, the bonus row) are taken to float64, so the comparisons
and inverse-CDF draws see the same numbers as the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verispec.accept import RESIDUAL_FLOOR, ROW_SUM_TOL, RuleInputError


@dataclass(frozen=True)
class BatchedChainResult:
    """Per sequence of the batch: drafts kept (B,), the bonus token (B,), uniforms used (B,)."""

    accepted: torch.Tensor
    token: torch.Tensor
    uniforms_used: torch.Tensor


def accept_chain_batched(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
) -> BatchedChainResult:
    """Decide B rounds of k drafts at once.

    target_probs: (B, k + 1, V) final target rows, any float dtype.
    draft_tokens: (B, k) int64 drafted ids.
    draft_probs:  (B, k, V) rows the drafts were sampled from, or ``None`` for point masses.
    uniforms:     (B, 2k + 1) in [0, 1); position i uses columns 2i and 2i + 1, the bonus 2k.
    """
    batch, rows, _ = _check(target_probs, draft_tokens, draft_probs, uniforms)
    k = rows - 1
    u = uniforms.to(torch.float64)
    tokens = draft_tokens.long()
    arange_b = torch.arange(batch, device=target_probs.device)

    # Only the drafted entries, one residual row and the bonus row are read in float64.
    p_draft = target_probs[:, :k].gather(2, tokens.unsqueeze(-1)).squeeze(-1).double()  # (B, k)
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.gather(2, tokens.unsqueeze(-1)).squeeze(-1).double()
    accept = (q_draft > 0) & (u[:, 0 : 2 * k : 2] * q_draft < p_draft)  # (B, k)
    accepted = accept.long().cumprod(dim=1).sum(dim=1)  # length of the surviving prefix
    all_kept = accepted == k

    # One row per sequence to draw the committed token from: the residual at the first
    # rejection, or the last target row when every draft survived.
    bonus_row = target_probs[:, k].double()
    if k > 0:
        at = accepted.clamp(max=k - 1)
        p_at = target_probs[arange_b, at].double()  # (B, V)
        if draft_probs is None:
            rest = p_at.scatter(1, tokens[arange_b, at].unsqueeze(-1), 0.0)  # max(0, p - onehot)
        else:
            rest = (p_at - draft_probs[arange_b, at].double()).clamp(min=0.0)
        rest = torch.where(rest.sum(-1, keepdim=True) > RESIDUAL_FLOOR, rest, p_at)
        weights = torch.where(all_kept.unsqueeze(-1), bonus_row, rest)
        u_residual = u.gather(1, (2 * at + 1).unsqueeze(-1)).squeeze(-1)
        u_draw = torch.where(all_kept, u[:, 2 * k], u_residual)
    else:
        weights, u_draw = bonus_row, u[:, 0]
    token = _sample_index(weights, u_draw)
    used = torch.where(all_kept, torch.full_like(accepted, 2 * k + 1), 2 * accepted + 2)
    return BatchedChainResult(accepted=accepted, token=token, uniforms_used=used)


def _sample_index(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row of (B, V) non-negative weights with uniforms (B,)."""
    cdf = weights.cumsum(dim=-1)
    index = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    vocab = weights.shape[-1]
    off_end = index >= vocab  # u * total rounded up to total
    if bool(off_end.any()):  # fall back to the last index with mass, as the reference does
        positions = torch.arange(vocab, device=weights.device).expand_as(weights)
        last_with_mass = torch.where(weights > 0, positions, -1).amax(dim=-1)
        index = torch.where(off_end, last_with_mass, index)
    return index


def _check(p: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor | None, u: torch.Tensor) -> tuple[int, int, int]:
    if p.ndim != 3 or p.shape[1] < 1 or p.shape[2] < 1:
        raise RuleInputError(f"target_probs must be (B, k + 1, V), got {tuple(p.shape)}")
    batch, rows, vocab = p.shape
    k = rows - 1
    if tuple(tokens.shape) != (batch, k) or tokens.is_floating_point():
        raise RuleInputError(f"draft_tokens must be integer (B, k) = {(batch, k)}, got {tuple(tokens.shape)}")
    if tuple(u.shape) != (batch, 2 * k + 1):
        raise RuleInputError(f"uniforms must be (B, 2k + 1) = {(batch, 2 * k + 1)}, got {tuple(u.shape)}")
    if not bool(((u >= 0) & (u < 1)).all()):
        raise RuleInputError("uniforms must lie in [0, 1)")
    if k and not bool(((tokens >= 0) & (tokens < vocab)).all()):
        raise RuleInputError(f"a draft token is outside the vocabulary [0, {vocab})")
    named = [("target_probs", p)]
    if q is not None:
        if tuple(q.shape) != (batch, k, vocab):
            raise RuleInputError(f"draft_probs must be (B, k, V) = {(batch, k, vocab)}, got {tuple(q.shape)}")
        named.append(("draft_probs", q))
    for name, probs in named:
        if probs.numel() == 0:
            continue
        # Two passes over the rows: the row sums (NaN and inf propagate into them) and the
        # minimum (negative entries; NaN compares false).
        sums = probs.sum(-1).double()
        if not bool(torch.isfinite(sums).all()):
            raise RuleInputError(f"{name} holds NaN or inf")
        if not bool(probs.amin() >= 0):
            raise RuleInputError(f"{name} holds negative probabilities")
        if bool((sums == 0).any()):
            raise RuleInputError(f"{name} has a row with no mass")
        if float((sums - 1).abs().max()) > ROW_SUM_TOL:
            raise RuleInputError(f"{name} rows must sum to 1 (within {ROW_SUM_TOL})")
    return batch, rows, vocab
