"""The sampling pipeline: logits plus the token history at a position -> final distribution.

The engine calls the same function for the target's rows (``p``) and a sampling drafter's
rows (``q``), so both see identical temperature, filtering and penalties; the acceptance rule
is exact only when they do. Order of operations, per position::

    penalties (repetition on prompt + output, presence/frequency on output)
    -> temperature 0: one-hot at the argmax (greedy is the rule's degenerate case)
    -> softmax(logits / temperature) -> top-k -> top-p -> min-p -> renormalise

The history of a draft position includes the drafts before it, so penalties at position j
use that position's own history.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verispec.errors import UserError

Probs = NDArray[np.float64]
Ids = NDArray[np.int64]


NUCLEUS_HEAD = 256  # tokens sorted first when applying top-p

# Beyond these a penalty only overflows the logits; inside them it already saturates.
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 100.0


class SamplingError(UserError, ValueError):
    """Base of the errors this module raises."""


class InvalidParameterError(SamplingError):
    """A sampling parameter out of its range; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class NonFiniteLogitsError(SamplingError):
    """The model produced NaN or +inf logits (or no finite logit at all)."""


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler; validated on construction.

    temperature: 0 is greedy; top_k: 0 turns it off; top_p in (0, 1]; min_p in [0, 1]
    (relative to the most likely token); repetition_penalty in [0.01, 100] (1 is off;
    divides positive and multiplies negative logits of every token seen in prompt or output);
    presence_penalty, frequency_penalty in [-2, 2] (subtracted per output token seen, and
    per occurrence); seed: the per-request RNG's seed (None draws one); max_tokens >= 1;
    stop: strings that end the output (not included in it).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 128
    stop: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        _real(self, "temperature", low=0.0)
        _integer(self, "top_k", low=0)
        _real(self, "top_p", low=0.0, low_open=True, high=1.0)
        _real(self, "min_p", low=0.0, high=1.0)
        _real(self, "repetition_penalty", low=MIN_REPETITION_PENALTY, high=MAX_REPETITION_PENALTY)
        _real(self, "presence_penalty", low=-2.0, high=2.0)
        _real(self, "frequency_penalty", low=-2.0, high=2.0)
        if self.seed is not None:
            _integer(self, "seed", low=0)
        _integer(self, "max_tokens", low=1)
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (tuple, list)) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidParameterError("stop", "must be a string or a list of non-empty strings")
        object.__setattr__(self, "stop", tuple(stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def final_distribution(
    logits: ArrayLike,
    params: SamplingParams,
    prompt_tokens: Sequence[int] | Ids = (),
    output_tokens: Sequence[int] | Ids = (),
) -> Probs:
    """The final sampling distribution (V,) for one position with the given history."""
    row = np.asarray(logits)
    if row.ndim != 1:
        raise SamplingError(f"logits must be one row (V,), got shape {row.shape}")
    only: Probs = final_distributions(row[None, :], params, prompt_tokens, output_tokens, ())[0]
    return only


def final_distributions(
    logits: ArrayLike,
    params: SamplingParams,
    prompt_tokens: Sequence[int] | Ids,
    output_tokens: Sequence[int] | Ids,
    draft_tokens: Sequence[int] | Ids,
) -> Probs:
    """Final distributions (n, V) for n consecutive positions of one verify pass.

    logits: (n, V). Row j's history is ``output_tokens + draft_tokens[:j]``, so
    ``draft_tokens`` needs at least n - 1 entries.
    """
    rows = _final_logits(logits, params, prompt_tokens, output_tokens, draft_tokens)
    if params.greedy:
        n = rows.shape[0]
        probs = np.zeros(rows.shape, dtype=np.float64)
        probs[np.arange(n), rows.argmax(axis=1)] = 1.0  # ties go to the lowest id
        return probs
    filtered: Probs = np.stack([_final_row(row, params) for row in rows])
    return filtered


def final_rows(
    logits: ArrayLike,
    params: SamplingParams,
    prompt_tokens: Sequence[int] | Ids,
    output_tokens: Sequence[int] | Ids,
    draft_tokens: Sequence[int] | Ids,
) -> Callable[[int], Probs]:
    """``final_distributions(...)[j]`` row by row, each computed when first asked for: the
    logits' checks and penalties run at once over every row, the softmax of a row (the cost:
    ~0.2 ms at 49k tokens) only when the rule reads it (``accept_chain_rows``)."""
    rows = _final_logits(logits, params, prompt_tokens, output_tokens, draft_tokens)

    @functools.cache
    def row(j: int) -> Probs:
        return _final_row(rows[j], params)

    return row


def _final_row(row: NDArray[np.floating], params: SamplingParams) -> Probs:
    """One row's final distribution (V,) from its checked, penalised logits."""
    if params.greedy:
        one_hot = np.zeros(row.shape[0], dtype=np.float64)
        one_hot[int(row.argmax())] = 1.0  # ties go to the lowest id
        return one_hot
    return _filtered_softmax(row, params)


def final_tokens(
    logits: ArrayLike,
    params: SamplingParams,
    prompt_tokens: Sequence[int] | Ids,
    output_tokens: Sequence[int] | Ids,
    draft_tokens: Sequence[int] | Ids,
) -> Ids:
    """Greedy's final distributions (n,) by their tokens: row j's one-hot token, the very
    ``final_distributions(...)[j].argmax()`` (same checks, penalties and ties), without the
    (n, V) rows, which cost ~1.9 ms for 9 rows of a 49k vocabulary: a quarter of a step."""
    if not params.greedy:
        raise SamplingError("final_tokens is the greedy case (temperature 0); sample with final_distributions")
    rows = np.asarray(logits)
    # ``dtype.kind`` rather than ``np.issubdtype``: the same test for NumPy's float types, in
    # a tenth of the time (this runs every round).
    if params.penalised or rows.ndim != 2 or rows.shape[1] == 0 or rows.dtype.kind != "f":
        tokens: Ids = _final_logits(logits, params, prompt_tokens, output_tokens, draft_tokens).argmax(axis=1)
        return tokens
    # Every round of greedy decoding comes here: one pass over each row instead of
    # ``_final_logits``' two, with the same checks. argmax stops at a row's first NaN, so
    # the value it picks is NaN where the row holds one, +inf where it holds +inf and no NaN,
    # and -inf where every entry is -inf. The picked values are checked as Python floats:
    # right after a forward pass has swept the caches, each further NumPy call on a few
    # values costs 10-30 us (measured in the engine), several times a scalar loop.
    n, drafts = rows.shape[0], len(draft_tokens)
    if drafts < n - 1:
        raise SamplingError(f"{n} rows need at least {n - 1} draft tokens, got {drafts}")
    tokens = rows.argmax(axis=1)
    top = [rows.item(i, token) for i, token in enumerate(tokens.tolist())]
    if not all(math.isfinite(value) for value in top):
        if any(math.isnan(value) or value == math.inf for value in top):
            raise NonFiniteLogitsError("the model produced NaN or +inf logits")
        raise NonFiniteLogitsError("a row of logits has no finite entry")
    return tokens


def _final_logits(
    logits: ArrayLike,
    params: SamplingParams,
    prompt_tokens: Sequence[int] | Ids,
    output_tokens: Sequence[int] | Ids,
    draft_tokens: Sequence[int] | Ids,
) -> NDArray[np.floating]:
    """The logits (n, V) checked (finite maximum per row) and penalised per row's history."""
    rows = np.asarray(logits)
    if rows.ndim != 2 or rows.shape[1] == 0:
        raise SamplingError(f"logits must be (n, V), got shape {rows.shape}")
    if params.penalised or not np.issubdtype(rows.dtype, np.floating):
        rows = np.array(rows, dtype=np.float64)  # a copy: penalties write into it
    # Without penalties the logits are read as given (float32 from most backends): the
    # argmax and the checks are the same in float64, a softmax converts its own row, and a
    # round is spared a fresh (n, V) copy, a few percent of a step on a fast backend.
    n = rows.shape[0]
    drafts = np.asarray(draft_tokens, dtype=np.int64)
    if drafts.shape[0] < n - 1:
        raise SamplingError(f"{n} rows need at least {n - 1} draft tokens, got {drafts.shape[0]}")
    # The rows' maxima checked as Python floats: a few NumPy calls on n values cost more
    # than the scan (final_tokens says why).
    top = rows.max(axis=1).tolist()  # NaN if a row holds NaN, else +inf if it holds +inf
    if any(math.isnan(value) or value == math.inf for value in top):
        raise NonFiniteLogitsError("the model produced NaN or +inf logits")
    if params.penalised:
        _apply_penalties(rows, params, prompt_tokens, output_tokens, drafts[: n - 1])
        top = rows.max(axis=1).tolist()
    if not all(math.isfinite(value) for value in top):
        raise NonFiniteLogitsError("a row of logits has no finite entry")
    return rows


def _apply_penalties(
    rows: Probs,
    params: SamplingParams,
    prompt_tokens: Sequence[int] | Ids,
    output_tokens: Sequence[int] | Ids,
    drafts: Ids,
) -> None:
    vocab = rows.shape[1]
    prompt = _ids(prompt_tokens, vocab, "prompt_tokens")
    counts = np.bincount(_ids(output_tokens, vocab, "output_tokens"), minlength=vocab).astype(np.float64)
    seen_in_prompt = np.bincount(prompt, minlength=vocab) > 0
    _ids(drafts, vocab, "draft_tokens")
    for j in range(rows.shape[0]):
        if j > 0:
            counts[drafts[j - 1]] += 1.0  # position j has seen the drafts before it
        row = rows[j]
        if params.repetition_penalty != 1.0:
            seen = seen_in_prompt | (counts > 0)
            r = params.repetition_penalty
            row[seen] = np.where(row[seen] > 0, row[seen] / r, row[seen] * r)
        if params.presence_penalty or params.frequency_penalty:
            row -= params.presence_penalty * (counts > 0) + params.frequency_penalty * counts


def _filtered_softmax(row: NDArray[np.floating], params: SamplingParams) -> Probs:
    """The filtered softmax (V,) float64 of one row of logits (any float dtype, not changed).

    One fresh array, every later step in place: each V-row a step allocated cost more than the
    step itself (a sampled round's softmax at 49k entries ~0.18 ms in the engine with five of
    them); the values are those of the same steps on fresh arrays."""
    # Shift before dividing: a tiny temperature then sends every non-maximal logit to -inf
    # (probability 0) instead of overflowing to inf - inf = NaN.
    probs: Probs
    if row.dtype == np.float64:
        probs = row - row.max()  # the one fresh array: row itself is the caller's
    else:
        probs = row.astype(np.float64)
        probs -= probs.max()
    if params.temperature != 1.0:
        with np.errstate(over="ignore"):  # overflow to -inf is the intended limit
            probs /= params.temperature
    vocab = probs.shape[0]
    dropped = None
    if 0 < params.top_k < vocab:
        kth = np.partition(probs, vocab - params.top_k)[vocab - params.top_k]
        dropped = probs < kth  # ties with the k-th value stay in; read before exp changes probs
    np.exp(probs, out=probs)  # -inf logits become exactly 0
    if dropped is not None:
        probs[dropped] = 0.0
    if params.top_p < 1.0:
        keep = _nucleus(probs, params.top_p)
        kept = probs[keep]
        probs[:] = 0.0
        probs[keep] = kept
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    probs /= probs.sum()
    return probs


def _nucleus(probs: Probs, top_p: float) -> Ids:
    """Ids of the smallest set of most likely tokens holding ``top_p`` of the mass.

    A token is kept when the mass strictly ahead of it is below top_p, so the most likely
    token always is. Only the head of the distribution is sorted: the top ``m`` are picked
    by partition (m = 256, growing 8-fold until they hold the mass), which on a 50k
    vocabulary is about twenty times cheaper than sorting it all.
    """
    vocab = probs.shape[0]
    target = top_p * probs.sum()
    head = min(vocab, NUCLEUS_HEAD)
    while True:
        candidates = np.argpartition(probs, vocab - head)[vocab - head :] if head < vocab else np.arange(vocab)
        order = candidates[np.argsort(-probs[candidates], kind="stable")]
        cumulative = np.cumsum(probs[order])
        if cumulative[-1] >= target or head == vocab:
            break
        head = min(vocab, head * 8)
    ahead = cumulative - probs[order]  # mass strictly ahead of each candidate
    kept: Ids = order[ahead < target]
    return kept


def _ids(tokens: Sequence[int] | Ids, vocab: int, name: str) -> Ids:
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise SamplingError(f"{name} holds an id outside the vocabulary [0, {vocab})")
    return ids


def _real(
    params: SamplingParams,
    name: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> None:
    value = getattr(params, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParameterError(name, f"must be a finite number, got {value!r}")
    too_low = low is not None and (value < low or (low_open and value == low))
    if too_low or (high is not None and value > high):
        bounds = [f"{'>' if low_open else '>='} {low}"] if low is not None else []
        bounds += [f"<= {high}"] if high is not None else []
        raise InvalidParameterError(name, f"must be {' and '.join(bounds)}, got {value}")
    object.__setattr__(params, name, float(value))


def _integer(params: SamplingParams, name: str, low: int) -> None:
    value = getattr(params, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidParameterError(name, f"must be an integer, got {value!r}")
    if value < low:
        raise InvalidParameterError(name, f"must be >= {low}, got {value}")
    object.__setattr__(params, name, int(value))
