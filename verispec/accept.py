"""The acceptance rule of speculative sampling, as pure functions on NumPy rows.

Terms (see design.md):

- target row ``p``: the target's final sampling distribution at one position, shape (V,).
- draft row ``q``: exactly the distribution the drafter sampled its token from, shape (V,).
  ``None`` stands for a point mass on the drafted token (n-gram lookup, argmax heads).
- uniforms: numbers in [0, 1) supplied by the caller, so every branch is reproducible and
  testable. Draft position ``i`` of a chain owns the pair ``uniforms[2i]`` (accept) and
  ``uniforms[2i + 1]`` (residual); the bonus after ``k`` surviving drafts uses
  ``uniforms[2k]``. A chain of ``k`` drafts therefore takes ``2k + 1`` uniforms.

The rule for one drafted token ``x ~ q``::

    accept x      iff  u_accept * q[x] < p[x]        # probability min(1, p[x] / q[x])
                  (q[x] == 0 contradicts x ~ q: such a draft is rejected, never divided by)
    else emit     y ~ normalise(max(0, p - q))        # the residual, drawn with u_residual
                  y ~ p   when the residual has no mass (p == q up to rounding)

A chain stops at its first rejection; when all ``k`` drafts survive, the verify pass's last
row supplies one more token. Either way the round commits ``accepted + 1`` tokens, and the
output is distributed exactly as ``p`` (Leviathan et al. 2023; Chen et al. 2023).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verispec.errors import UserError

Row = NDArray[np.float64]

# A row must sum to 1 within this much; float32 softmax rows over 50k tokens land within 1e-6.
ROW_SUM_TOL = 1e-5
# A residual with less total mass than this is rounding noise of p == q: draw from p instead.
# Rejection happens with probability equal to that mass, so the substitution moves the output
# distribution by at most this much.
RESIDUAL_FLOOR = 1e-9
UNIFORMS_PER_POSITION = 2
SPARSE_SHARE = 8  # a row with mass on under 1/8 of the vocabulary is searched over its support
TORCH_SCAN_FROM = 1024  # rows at least this long take torch's cumsum (``_running_sums``)


class RuleInputError(UserError, ValueError):
    """Inputs the rule refuses rather than turn into a silently wrong token."""


@dataclass(frozen=True)
class StepResult:
    """One drafted position: whether the draft survived and the token committed there."""

    accepted: bool
    token: int


@dataclass(frozen=True)
class ChainResult:
    """One round: ``accepted`` drafts kept (a prefix), then ``token`` (the bonus)."""

    accepted: int
    token: int
    uniforms_used: int


def accept_step(
    target_probs: ArrayLike,
    draft_token: int,
    draft_probs: ArrayLike | None,
    u_accept: float,
    u_residual: float,
) -> StepResult:
    """Decide one drafted position. ``target_probs``, ``draft_probs``: (V,); ``None`` = point mass."""
    p = checked_rows(target_probs, "target_probs", ndim=1)
    q = None if draft_probs is None else checked_rows(draft_probs, "draft_probs", ndim=1)
    if q is not None and q.shape != p.shape:
        raise RuleInputError(f"draft_probs has shape {q.shape}, target_probs {p.shape}")
    check_token(draft_token, p.shape[0])
    check_uniforms(np.array([u_accept, u_residual], dtype=np.float64))
    return _step(p, draft_token, q, float(u_accept), float(u_residual))


def accept_chain(
    target_probs: ArrayLike,
    draft_tokens: ArrayLike,
    draft_probs: ArrayLike | None,
    uniforms: ArrayLike,
) -> ChainResult:
    """Decide one round of ``k`` drafts behind one verify pass.

    target_probs: (k + 1, V) final target rows; row i scores draft i, row k gives the bonus.
    draft_tokens: (k,) drafted ids.
    draft_probs:  (k, V) rows the drafts were sampled from, or ``None`` for point masses.
    uniforms:     (2k + 1,) in [0, 1), laid out as in the module docstring.
    """
    p, tokens, q, u = checked_round(target_probs, draft_tokens, draft_probs, uniforms)
    return _chain(p.__getitem__, tokens, q, u)


def accept_chain_rows(
    target_row: Callable[[int], ArrayLike],
    draft_tokens: ArrayLike,
    draft_probs: ArrayLike | None,
    uniforms: ArrayLike,
    vocab: int,
) -> ChainResult:
    """``accept_chain`` with the target rows asked for one at a time: ``target_row(i)`` is
    row i (V,) of its ``target_probs`` (V = ``vocab``), the other arguments as there.

    Rows are asked for in order and only while the chain survives: a round that rejects at
    position j reads rows 0..j, and rows it never reads are never checked. The verdict and
    the uniforms used are ``accept_chain``'s (tested against it); a sampled round is spared
    the rows a rejection makes moot (each a softmax over the vocabulary, ~0.2 ms at 49k)."""
    tokens, q, u = checked_drafts(draft_tokens, draft_probs, uniforms, vocab)

    def row(i: int) -> Row:
        p = checked_rows(target_row(i), "target_probs", ndim=1)
        if p.shape[0] != vocab:
            raise RuleInputError(f"target row {i} has {p.shape[0]} entries, the vocabulary {vocab}")
        return p

    return _chain(row, tokens, q, u)


def _chain(p: Callable[[int], Row], tokens: NDArray[np.int64], q: Row | None, u: Row) -> ChainResult:
    """The chain's verdict on checked inputs, row i of the target read as ``p(i)``."""
    k = tokens.shape[0]
    for i in range(k):
        step = _step(p(i), int(tokens[i]), None if q is None else q[i], u[2 * i], u[2 * i + 1])
        if not step.accepted:
            return ChainResult(accepted=i, token=step.token, uniforms_used=2 * i + 2)
    return ChainResult(accepted=k, token=sample_index(p(k), u[2 * k]), uniforms_used=2 * k + 1)


def accept_greedy(
    target_tokens: ArrayLike,
    draft_tokens: ArrayLike,
    draft_probs: ArrayLike | None,
    uniforms: ArrayLike,
    vocab: int,
) -> ChainResult:
    """``accept_chain`` where every target row is one-hot (temperature 0), from the rows'
    tokens alone: target_tokens (k + 1,), ``vocab`` the rows' length V, the other arguments
    as there.

    With ``p`` one-hot at ``t`` the rule accepts ``x`` iff ``x == t``, ``q[x] > 0`` and
    ``u * q[x] < 1``, and every other outcome commits ``t``: the residual
    ``max(0, p - q)`` keeps mass at ``t`` alone, or has none and falls back to ``p``. So the
    verdict is ``accept_chain``'s on the one-hot rows, uniforms used included (tested
    against it), without building and checking (k + 1, V) rows (~2 ms of a 9-row round)."""
    # Every greedy round comes here with a few values, right after a forward pass has swept
    # the caches, where each NumPy call costs 5-30 us: lists of Python numbers are checked
    # as they are (the same checks and messages as ``checked_drafts``).
    t = _id_list(target_tokens, "target_tokens")
    tokens = _id_list(draft_tokens, "draft_tokens")
    k = len(tokens)
    q = None if draft_probs is None else checked_rows(draft_probs, "draft_probs", ndim=2)
    if q is not None and q.shape != (k, vocab):
        raise RuleInputError(f"draft_probs has shape {q.shape}, expected {(k, vocab)}")
    u = _uniform_list(uniforms, k)
    for token in tokens:
        check_token(token, vocab)
    if len(t) != k + 1:
        raise RuleInputError(f"target_tokens needs k + 1 = {k + 1} entries for {k} drafts, has {len(t)}")
    for token in t:
        check_token(token, vocab)
    for i in range(k):
        x, target = tokens[i], t[i]
        q_x = 1.0 if q is None else float(q[i, x])
        if not (x == target and q_x > 0.0 and u[2 * i] * q_x < 1.0):
            return ChainResult(accepted=i, token=target, uniforms_used=2 * i + 2)
    return ChainResult(accepted=k, token=t[k], uniforms_used=2 * k + 1)


def _id_list(values: ArrayLike, name: str) -> list[int]:
    """``checked_ids(values, name)`` as a list: a list of Python ints passes as it is."""
    if isinstance(values, list) and all(type(v) is int for v in values):
        return values
    return [int(v) for v in checked_ids(values, name).tolist()]


def _uniform_list(values: ArrayLike, k: int) -> list[float]:
    """A round's uniforms for ``k`` drafts as a list, checked as ``checked_drafts`` does."""
    if isinstance(values, list) and all(type(v) is float for v in values):
        u: list[float] = values
    else:
        array = np.asarray(values, dtype=np.float64)
        if array.ndim != 1:
            raise RuleInputError(f"{k} drafts take {2 * k + 1} uniforms, got shape {array.shape}")
        u = [float(v) for v in array.tolist()]
    if len(u) != UNIFORMS_PER_POSITION * k + 1:
        raise RuleInputError(f"{k} drafts take {2 * k + 1} uniforms, got shape {(len(u),)}")
    if not all(0.0 <= v < 1.0 for v in u):  # NaN fails both comparisons
        raise RuleInputError(f"uniforms must lie in [0, 1), got {[v for v in u if not 0.0 <= v < 1.0][:3]}")
    return u


def checked_round(
    target_probs: ArrayLike, draft_tokens: ArrayLike, draft_probs: ArrayLike | None, uniforms: ArrayLike
) -> tuple[Row, NDArray[np.int64], Row | None, Row]:
    """The inputs of one round of ``k`` drafts (shapes as in ``accept_chain``), checked and as arrays."""
    p = checked_rows(target_probs, "target_probs", ndim=2)
    tokens, q, u = checked_drafts(draft_tokens, draft_probs, uniforms, p.shape[1])
    k = tokens.shape[0]
    if p.shape[0] != k + 1:
        raise RuleInputError(f"target_probs needs k + 1 = {k + 1} rows for {k} drafts, has {p.shape[0]}")
    return p, tokens, q, u


def checked_drafts(
    draft_tokens: ArrayLike, draft_probs: ArrayLike | None, uniforms: ArrayLike, vocab: int
) -> tuple[NDArray[np.int64], Row | None, Row]:
    """A round's drafts, their rows and its uniforms (shapes as in ``accept_chain``), checked."""
    tokens = checked_ids(draft_tokens, "draft_tokens")
    k = tokens.shape[0]
    q = None if draft_probs is None else checked_rows(draft_probs, "draft_probs", ndim=2)
    if q is not None and q.shape != (k, vocab):
        raise RuleInputError(f"draft_probs has shape {q.shape}, expected {(k, vocab)}")
    u = np.asarray(uniforms, dtype=np.float64)
    if u.shape != (UNIFORMS_PER_POSITION * k + 1,):
        raise RuleInputError(f"{k} drafts take {2 * k + 1} uniforms, got shape {u.shape}")
    check_uniforms(u)
    for token in tokens.tolist():
        check_token(token, vocab)
    return tokens, q, u


def acceptance_probability(
    target_probs: ArrayLike, draft_token: int, draft_probs: ArrayLike | None, *, check_rows: bool = True
) -> float:
    """The probability that the rule accepts ``draft_token``: min(1, p(x) / q(x)), 0 where q(x) = 0.

    Rows (V,) as in ``accept_step``. The governor scores drafts it never verified with it.
    ``check_rows=False`` skips the checks of whole rows (finite, non-negative, summing to 1)
    for a caller that ran them already (the engine, on the row ``accept_chain`` checked):
    over a large vocabulary they cost more than the rest of a plain round's bookkeeping.
    """
    p = checked_rows(target_probs, "target_probs", ndim=1) if check_rows else np.asarray(target_probs)
    check_token(draft_token, p.shape[0])
    q_x = 1.0
    if draft_probs is not None:
        q = checked_rows(draft_probs, "draft_probs", ndim=1) if check_rows else np.asarray(draft_probs)
        q_x = float(q[draft_token])
    return min(1.0, float(p[draft_token]) / q_x) if q_x > 0.0 else 0.0


def _step(p: Row, x: int, q: Row | None, u_accept: float, u_residual: float) -> StepResult:
    q_x = 1.0 if q is None else float(q[x])
    # min(1, p/q) without a division; a draft its own q gave no mass is never accepted.
    if q_x > 0.0 and u_accept * q_x < p[x]:
        return StepResult(accepted=True, token=x)
    return StepResult(accepted=False, token=sample_index(residual(p, x, q), u_residual))


def residual(p: Row, x: int, q: Row | None) -> Row:
    """normalise(max(0, p - q)) up to its normaliser; ``p`` itself when that has no mass."""
    if q is None:
        rest = p.copy()
        rest[x] = 0.0  # max(0, p - onehot(x))
    else:
        rest = np.subtract(p, q)
        np.maximum(rest, 0.0, out=rest)  # in place: one fresh V-row, not two
    return rest if rest.sum() > RESIDUAL_FLOOR else p


def sample_index(weights: Row, u: float) -> int:
    """Inverse-CDF draw from non-negative ``weights`` (any positive total) with uniform ``u``.

    Never returns an index of zero weight: ``cdf[i] > u * total >= cdf[i - 1]`` forces
    ``weights[i] > 0``.
    """
    support = int(np.count_nonzero(weights))
    if support == 1:  # a point mass (greedy): its token, whatever u
        return int(np.argmax(weights))
    if support * SPARSE_SHARE < weights.shape[0]:
        # A sparse row (top-k, a residual of one): the draw over its support alone. The
        # running sums there are the dense ones (adding an exact 0.0 changes no float),
        # without the pass over the zeros.
        ids = np.flatnonzero(weights)
        return int(ids[_inverse_cdf(weights[ids], u)])
    return _inverse_cdf(weights, u)


def _inverse_cdf(weights: Row, u: float) -> int:
    cdf = _running_sums(weights)
    index = int(cdf.searchsorted(u * cdf[-1], side="right"))
    if index >= cdf.shape[0]:  # u * total rounded up to total: take the last token with mass
        index = int(np.flatnonzero(weights)[-1])
    return index


def _running_sums(weights: Row) -> Row:
    """``weights.cumsum()``, the same sums in the same order (left to right in float64; checked
    against NumPy's in the tests). Long rows go through torch's scan where torch is loaded
    already (the native and torch backends; the rule never loads it, so a llama.cpp process
    stays without it): NumPy's accumulate took ~160 us over a 49k-token row here, torch's
    ~45 us, and a sampled round draws from one or two such rows."""
    torch = sys.modules.get("torch")
    if torch is None or weights.shape[0] < TORCH_SCAN_FROM or weights.dtype != np.float64:
        return weights.cumsum()  # the method: np.cumsum only dispatches to it
    # A read-only row (torch warns on those) is copied; the rule's rows are the caller's own.
    row = np.ascontiguousarray(weights) if weights.flags.writeable else weights.copy()
    sums: Row = torch.cumsum(torch.from_numpy(row), 0).numpy()
    return sums


def checked_rows(values: ArrayLike, name: str, ndim: int) -> Row:
    """``values`` as float64 rows, refused unless finite, non-negative and each summing to 1."""
    rows = np.asarray(values, dtype=np.float64)
    if rows.ndim != ndim or rows.shape[-1] == 0:
        raise RuleInputError(f"{name} must be {ndim}-D with a non-empty vocabulary, got shape {rows.shape}")
    if rows.size == 0:  # no drafts: nothing to check
        return rows
    # Valid rows pass on one sum per row and one minimum: the rule runs once a round, where
    # the separate checks below cost more than the rule on a small vocabulary. They accept
    # exactly the same rows: a minimum >= 0 rules out NaN and -inf, and every sum within
    # ROW_SUM_TOL of 1 rules out +inf and a row without mass.
    sums = rows.sum(axis=-1)
    if rows.min() >= 0.0 and float(np.abs(sums - 1.0).max()) <= ROW_SUM_TOL:
        return rows
    if not np.all(np.isfinite(rows)):
        raise RuleInputError(f"{name} holds NaN or inf")
    if np.any(rows < 0.0):
        raise RuleInputError(f"{name} holds negative probabilities")
    if np.any(sums == 0.0):
        raise RuleInputError(f"{name} has a row with no mass")
    worst = float(np.max(np.abs(sums - 1.0)))
    if worst > ROW_SUM_TOL:
        raise RuleInputError(f"{name} rows must sum to 1 (within {ROW_SUM_TOL}); one is off by {worst:.3g}")
    return rows


def checked_ids(values: ArrayLike, name: str) -> NDArray[np.int64]:
    """``values`` as a 1-D array of integer ids (an empty one of any dtype passes)."""
    ids = np.asarray(values)
    # issubclass on the scalar type is np.issubdtype's answer without its dispatch overhead
    if ids.ndim != 1 or (ids.size and not issubclass(ids.dtype.type, np.integer)):
        raise RuleInputError(f"{name} must be a 1-D array of ids, got {ids.dtype}{ids.shape}")
    return ids.astype(np.int64)


def check_token(token: int, vocab: int) -> None:
    """Refuse a drafted id outside [0, vocab)."""
    if not 0 <= token < vocab:
        raise RuleInputError(f"draft token {token} is outside the vocabulary [0, {vocab})")


def check_uniforms(u: NDArray[np.float64]) -> None:
    """Refuse uniforms outside [0, 1), NaN included."""
    # min and max propagate NaN, which fails both comparisons
    if u.size and not (u.min() >= 0.0 and u.max() < 1.0):
        raise RuleInputError(f"uniforms must lie in [0, 1), got {u[~((u >= 0.0) & (u < 1.0))][:3]}")
