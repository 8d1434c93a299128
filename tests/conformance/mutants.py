"""Wrong acceptance rules that the conformance checks must tell apart from the real one.

Each has ``accept_chain``'s signature and is a bug seen in the wild or one line away from
the real rule. They exist only to be caught: a suite that passes them proves nothing.
"""

from __future__ import annotations

import numpy as np

from verispec.accept import ChainResult, accept_step, sample_index


def always_accept(p, drafts, q, u) -> ChainResult:
    """Keeps every draft: the output follows q, not p."""
    k = len(drafts)
    return ChainResult(accepted=k, token=sample_index(p[k], u[2 * k]), uniforms_used=2 * k + 1)


def greedy_rule(p, drafts, q, u) -> ChainResult:
    """Accept iff the draft is the target's argmax, else emit the argmax, at any temperature."""
    for i, x in enumerate(drafts):
        if x != int(np.argmax(p[i])):
            return ChainResult(accepted=i, token=int(np.argmax(p[i])), uniforms_used=2 * i + 2)
    return ChainResult(accepted=len(drafts), token=int(np.argmax(p[-1])), uniforms_used=2 * len(drafts) + 1)


def _with_residual(residual_draw):
    """The real chain, but drawing a rejected position's token with ``residual_draw``."""

    def rule(p, drafts, q, u) -> ChainResult:
        for i, x in enumerate(drafts):
            q_row = np.eye(p.shape[1])[x] if q is None else q[i]
            if accept_step(p[i], int(x), q_row, u[2 * i], 0.0).accepted:
                continue
            return ChainResult(accepted=i, token=residual_draw(p[i], q_row, u[2 * i + 1]), uniforms_used=2 * i + 2)
        k = len(drafts)
        return ChainResult(accepted=k, token=sample_index(p[k], u[2 * k]), uniforms_used=2 * k + 1)

    return rule


def _draw_unnormalised(p_row, q_row, u):
    # max(0, p - q) used as if it summed to 1: u beyond its mass falls off the end.
    cdf = np.cumsum(np.maximum(p_row - q_row, 0.0))
    return min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)


def _draw_unclamped(p_row, q_row, u):
    # |p - q| instead of max(0, p - q): tokens the draft over-weights come back.
    return sample_index(np.abs(p_row - q_row), u)


residual_unnormalised = _with_residual(_draw_unnormalised)
residual_unclamped = _with_residual(_draw_unclamped)


def chain_continues(p, drafts, q, u) -> ChainResult:
    """``continue`` instead of ``break``: later drafts are still examined after a rejection,
    and every accepted one is kept."""
    kept, last_rejection_token = 0, None
    for i, x in enumerate(drafts):
        step = accept_step(p[i], int(x), None if q is None else q[i], u[2 * i], u[2 * i + 1])
        if step.accepted:
            kept += 1
        else:
            last_rejection_token = step.token
    k = len(drafts)
    token = sample_index(p[k], u[2 * k]) if last_rejection_token is None else last_rejection_token
    return ChainResult(accepted=kept, token=token, uniforms_used=2 * k + 1)


SINGLE_POSITION_MUTANTS = {
    "always-accept": always_accept,
    "greedy-rule": greedy_rule,
    "residual-unnormalised": residual_unnormalised,
    "residual-unclamped": residual_unclamped,
}
