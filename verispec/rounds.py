"""Round arithmetic and the theory of speculative rounds, as pure functions.

Terms (design.md): a *round* is one draft plus one verify pass; it *offers* k draft tokens,
*accepts* a prefix of them and commits one *bonus* token past that prefix, unless the
sequence ended inside the accepted prefix. *Tokens* = accepted + bonus. *Cost steps* is what
a round costs in plain decode steps of the same target; a configuration *pays* when tokens
per round exceed its cost steps.

Every ratio here treats an empty denominator (no rounds, no offers) as an answer of 0, never
as a division by zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def tokens_per_round(accepted: int, bonus: int, rounds: int) -> float:
    """(accepted + bonus) / rounds: the "mean acceptance length" peers report."""
    return _ratio(accepted + bonus, rounds)


def ideal_tokens_per_round(accepted: int, rounds: int) -> float:
    """1 + accepted / rounds: tokens per round had every round committed its bonus."""
    return 1.0 + _ratio(accepted, rounds) if rounds else 0.0


def bonus_shortfall(rounds: int, bonus: int) -> int:
    """Rounds that ended their sequence inside the accepted prefix and committed no bonus."""
    return rounds - bonus


def acceptance_rate(accepted: int, offered: int) -> float:
    """Share of offered draft tokens that the rule kept."""
    return _ratio(accepted, offered)


def per_position_acceptance(accepted: Sequence[float], offered: Sequence[int]) -> list[float]:
    """accepted at draft position i / offered at position i, for each position i (accepted may
    be an expected count: a sum of acceptance probabilities).

    A draft at position i is kept only when every draft before it was, so this is the
    chance that a round offering position i keeps at least i + 1 drafts; it falls with i.
    (The acceptance at i *given* the chain reached i is the ratio of consecutive values.)
    """
    if len(accepted) != len(offered):
        raise ValueError(f"{len(accepted)} accepted counts for {len(offered)} offered counts")
    return [_ratio(a, o) for a, o in zip(accepted, offered, strict=True)]


def pays(tokens_per_round_: float, cost_steps: float) -> bool:
    """A round pays when it yields more tokens than it costs in plain steps (breaking even does not)."""
    return tokens_per_round_ > cost_steps


# --- theory -------------------------------------------------------------------------------


def expected_tokens_per_round(acceptance: float, k: int) -> float:
    """E[tokens per round] for i.i.d. per-draft acceptance ``a``: (1 - a^(k+1)) / (1 - a).

    The geometric sum 1 + a + ... + a^k; equal to k + 1 at a = 1.
    """
    _check_probability(acceptance)
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if acceptance == 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def expected_tokens_positional(acceptance_by_position: Sequence[float]) -> float:
    """E[tokens per round] when draft i survives with probability a_i given the ones before it.

    1 + a_1 + a_1 a_2 + ... + a_1 ... a_k; equals ``expected_tokens_per_round`` for equal a_i.
    """
    total, reach = 1.0, 1.0
    for a in acceptance_by_position:
        _check_probability(a)
        reach *= a
        total += reach
    return total


def expected_tokens_by_k(acceptance_by_position: Sequence[float]) -> list[float]:
    """``expected_tokens_positional`` of every prefix: E for k = 0, 1, ..., len (same sums)."""
    total, reach, by_k = 1.0, 1.0, [1.0]
    for a in acceptance_by_position:
        _check_probability(a)
        reach *= a
        total += reach
        by_k.append(total)
    return by_k


def round_cost_steps(k: int, draft_cost: float, verify_cost: float) -> float:
    """Cost of one round in plain target steps: k drafts at ``draft_cost`` plus one verify."""
    return k * draft_cost + verify_cost


def predicted_speedup(acceptance: float, k: int, draft_cost: float, verify_cost: float) -> float:
    """E / (k c + r): predicted tokens per plain-step time, relative to plain decoding."""
    return expected_tokens_per_round(acceptance, k) / round_cost_steps(k, draft_cost, verify_cost)


def best_k(acceptance: float, draft_cost: float, verify_cost: float, k_max: int) -> int:
    """The k in [0, k_max] with the highest predicted speed-up (k = 0 is plain decoding).

    ``verify_cost`` is the cost of verifying k+1 rows in plain steps, taken as constant in k.
    """
    if k_max < 0:
        raise ValueError(f"k_max must be >= 0, got {k_max}")
    # k = 0 costs exactly one plain step and yields one token.
    best, best_speed = 0, 1.0
    for k in range(1, k_max + 1):
        speed = predicted_speedup(acceptance, k, draft_cost, verify_cost)
        if speed > best_speed:
            best, best_speed = k, speed
    return best


def _check_probability(value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"an acceptance probability must lie in [0, 1], got {value}")


def expected_tokens_for_rounds(k_histogram: Mapping[int, int], per_position: Sequence[float]) -> float:
    """Tokens expected from rounds of the given sizes (``{offered: rounds}``) with the given
    per-position acceptance (``per_position_acceptance``: position i kept in that share of
    the rounds offering it).

    A round offering k drafts keeps on average the sum of the first k shares, plus its bonus:
    ``1 + per_position[0] + ... + per_position[k - 1]``; a plain round yields 1.
    """
    total = 0.0
    for k, count in k_histogram.items():
        if k > len(per_position):
            raise ValueError(f"rounds of {k} drafts but acceptance known for {len(per_position)} positions")
        for share in per_position[:k]:
            _check_probability(share)
        total += count * (1.0 + sum(per_position[:k]))
    return total


def predicted_speedup_for_rounds(
    k_histogram: Mapping[int, int], per_position: Sequence[float], cost_steps: float
) -> float:
    """Predicted speed-up over plain decoding for a measured mix of rounds.

    Plain rounds cost one step and yield one token; drafted rounds cost ``cost_steps`` each
    and yield what ``expected_tokens_for_rounds`` expects. The ratio of tokens to steps is
    the speed-up, since plain decoding yields exactly one token per step.
    """
    plain = k_histogram.get(0, 0)
    drafted = sum(count for k, count in k_histogram.items() if k > 0)
    steps = plain + drafted * cost_steps
    return _ratio(expected_tokens_for_rounds(k_histogram, per_position), steps)
