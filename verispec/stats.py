"""Per-request statistics of speculative rounds, fed by one ``observe()`` call per round.

The engine is the only writer; the CLI summary, the server's usage block, ``/metrics`` and
the benchmark read these counters and the ratios ``rounds.py`` derives from them.

Terms as in design.md. A *plain round* offers nothing (k = 0): it is one plain decode step,
and its time is the unit of ``cost_steps``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from verispec import rounds


@dataclass
class RequestStats:
    """Counters of one request. Per-position lists grow to the longest chain offered."""

    rounds: int = 0
    offered: int = 0
    accepted: int = 0
    bonus: int = 0
    offered_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    # Rounds whose chain reached position i: it drafted i and kept every draft before it (the
    # denominator of the acceptance at i *given* i was reached, as the held-out score counts).
    reached_by_position: list[int] = field(default_factory=list)
    k_histogram: dict[int, int] = field(default_factory=dict)
    plain_rounds: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    plain_seconds: float = 0.0  # verify time of plain rounds (their draft time is ~0)
    prefill_seconds: float = 0.0
    prompt_tokens: int = 0
    # Prompt tokens the prefill did not compute: the target's cache still held them from an
    # earlier request (prefix reuse).
    cached_prompt_tokens: int = 0
    # A plain step's time measured elsewhere (the engine's running estimate), used for
    # ``cost_steps`` when this request ran no plain round of its own.
    reference_step_seconds: float | None = None
    # The economics governor's decisions (empty with a fixed k): k chosen per round, rounds
    # it chose to decode plainly, re-probes after a back-off, and plain rounds that asked the
    # drafter for a shadow draft (scored against the target's row, never verified), and the
    # acceptance at draft position 1 it started from (carried over from the engine's earlier
    # requests with this drafter; None: the prior, as for a first or reproducible request).
    # ``governor_plain_by_load``: plain rounds that did not ask the drafter because beside the
    # other requests of the pass no k could pay even if every draft were accepted.
    k_chosen_histogram: dict[int, int] = field(default_factory=dict)
    governor_plain_rounds: int = 0
    governor_plain_by_load: int = 0
    governor_probes: int = 0
    governor_shadow_drafts: int = 0
    governor_start_acceptance: float | None = None
    # The verify passes it shared with other requests (a scheduler's batch): summed over its
    # rounds, the requests in each pass (itself included) and the pass's rows.
    pass_requests: int = 0
    pass_rows: int = 0
    # Rounds that verified a tree of drafts (``offered`` counts a tree's depth), and the tree
    # nodes they verified: a tree's other candidates are extra rows, not extra positions.
    tree_rounds: int = 0
    tree_nodes: int = 0

    def observe_pass(self, requests: int, rows: int) -> None:
        """The round's verify pass held ``requests`` requests (>= 1) and ``rows`` rows."""
        if requests < 1 or rows < requests:
            raise ValueError(f"impossible pass: {requests} requests, {rows} rows")
        self.pass_requests += requests
        self.pass_rows += rows

    @property
    def mean_batch_size(self) -> float:
        """Requests per verify pass, over the rounds that recorded their pass."""
        return self.pass_requests / self.rounds if self.rounds else 0.0

    @property
    def mean_rows_per_pass(self) -> float:
        return self.pass_rows / self.rounds if self.rounds else 0.0

    def observe_choice(self, k: int, probe: bool, governed: bool = True) -> None:
        """Count the k chosen for the coming round (0: decode plainly); ``governed`` False:
        the drafter had nothing to offer, so the governor was not asked."""
        self.k_chosen_histogram[k] = self.k_chosen_histogram.get(k, 0) + 1
        self.governor_plain_rounds += int(k == 0 and governed)
        self.governor_probes += int(probe)

    def observe(self, offered: int, accepted: int, bonus: int, draft_seconds: float, verify_seconds: float) -> None:
        """Count one round: ``offered`` drafts, the ``accepted`` prefix kept, ``bonus`` 0 or 1."""
        if not 0 <= accepted <= offered or bonus not in (0, 1):
            raise ValueError(f"impossible round: offered {offered}, accepted {accepted}, bonus {bonus}")
        self.rounds += 1
        self.offered += offered
        self.accepted += accepted
        self.bonus += bonus
        self.k_histogram[offered] = self.k_histogram.get(offered, 0) + 1
        while len(self.offered_by_position) < offered:
            self.offered_by_position.append(0)
            self.accepted_by_position.append(0)
            self.reached_by_position.append(0)
        for i in range(offered):
            self.offered_by_position[i] += 1
            self.accepted_by_position[i] += int(i < accepted)
            self.reached_by_position[i] += int(i <= accepted)
        if offered == 0:
            self.plain_rounds += 1
            self.plain_seconds += draft_seconds + verify_seconds
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds

    def merge(self, other: RequestStats) -> None:
        """Add another's counts and times to these (a category's total, say). The values of
        one request (``reference_step_seconds``, ``governor_start_acceptance``) stay these."""
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("offered_by_position", "accepted_by_position", "reached_by_position"):
            mine, theirs = getattr(self, name), getattr(other, name)
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, count in enumerate(theirs):
                mine[i] += count
        for name in ("k_histogram", "k_chosen_histogram"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for k, count in theirs.items():
                mine[k] = mine.get(k, 0) + count

    @classmethod
    def total(cls, many: Iterable[RequestStats]) -> RequestStats:
        """The sum of many requests' statistics; every ratio is then derived from the sums."""
        total = cls()
        for stats in many:
            total.merge(stats)
        return total

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> RequestStats:
        """The statistics ``as_dict`` wrote (derived values are derived again; counters a record
        from an older version lacks are zero)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in record:
                continue
            value = record[f.name]
            if f.name in ("k_histogram", "k_chosen_histogram"):
                value = {int(k): int(n) for k, n in value.items()}
            elif f.name in ("offered_by_position", "accepted_by_position", "reached_by_position"):
                value = [int(n) for n in value]
            values[f.name] = value
        return cls(**values)

    @property
    def tokens(self) -> int:
        return self.accepted + self.bonus

    @property
    def tokens_per_round(self) -> float:
        return rounds.tokens_per_round(self.accepted, self.bonus, self.rounds)

    @property
    def ideal_tokens_per_round(self) -> float:
        return rounds.ideal_tokens_per_round(self.accepted, self.rounds)

    @property
    def bonus_shortfall(self) -> int:
        return rounds.bonus_shortfall(self.rounds, self.bonus)

    @property
    def acceptance_rate(self) -> float:
        return rounds.acceptance_rate(self.accepted, self.offered)

    @property
    def per_position_acceptance(self) -> list[float]:
        return rounds.per_position_acceptance(self.accepted_by_position, self.offered_by_position)

    @property
    def acceptance_given_reached(self) -> list[float]:
        """The acceptance at each draft position among the rounds whose chain reached it (the
        held-out score's per-position figures); empty for records written before it was
        counted. With mixed k it is not the ratio of consecutive ``per_position_acceptance``
        values: a round that drafted fewer positions counts at i - 1 and never at i."""
        if len(self.reached_by_position) != len(self.accepted_by_position):
            return []
        return rounds.per_position_acceptance(self.accepted_by_position, self.reached_by_position)

    @property
    def decode_seconds(self) -> float:
        return self.draft_seconds + self.verify_seconds

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over decode time (prefill excluded)."""
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        """Prompt tokens computed over prefill time (the last prompt token is read by the first
        round; tokens kept from the cache were not computed)."""
        computed = self.prompt_tokens - self.cached_prompt_tokens
        return computed / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def plain_step_seconds(self) -> float | None:
        if self.plain_rounds:
            return self.plain_seconds / self.plain_rounds
        return self.reference_step_seconds

    @property
    def drafted_rounds(self) -> int:
        return self.rounds - self.plain_rounds

    @property
    def cost_steps(self) -> float | None:
        """Mean time of a drafted round in plain decode steps; None until both are known."""
        return self.cost_steps_at(self.plain_step_seconds)

    def cost_steps_at(self, step_seconds: float | None) -> float | None:
        """Mean time of a drafted round in units of ``step_seconds`` (a plain step measured
        elsewhere: the bench's own plain run of the same prompts)."""
        if not self.drafted_rounds or not step_seconds:
            return None
        return (self.decode_seconds - self.plain_seconds) / self.drafted_rounds / step_seconds

    @property
    def drafted_tokens_per_round(self) -> float:
        """Tokens per drafted round (plain rounds left out), the side of ``pays``."""
        # A plain round always commits exactly one token, its bonus.
        return rounds.tokens_per_round(self.accepted, self.bonus - self.plain_rounds, self.drafted_rounds)

    @property
    def pays(self) -> bool | None:
        return self.pays_at(self.plain_step_seconds)

    def pays_at(self, step_seconds: float | None) -> bool | None:
        """Tokens per drafted round > its cost in steps of ``step_seconds``; None: not known."""
        cost = self.cost_steps_at(step_seconds)
        return None if cost is None else rounds.pays(self.drafted_tokens_per_round, cost)

    def predicted_speedup_at(self, step_seconds: float | None) -> float | None:
        """What the theory predicts over plain decoding for these rounds: the measured mix of
        round sizes, per-position acceptance and cost (``rounds.predicted_speedup_for_rounds``)."""
        cost = self.cost_steps_at(step_seconds)
        if cost is None:
            return None
        return rounds.predicted_speedup_for_rounds(self.k_histogram, self.per_position_acceptance, cost)

    def as_dict(self) -> dict[str, Any]:
        """The counters and ratios as plain JSON-able values."""
        return {
            "rounds": self.rounds,
            "offered": self.offered,
            "accepted": self.accepted,
            "bonus": self.bonus,
            "tokens": self.tokens,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_round": self.tokens_per_round,
            "ideal_tokens_per_round": self.ideal_tokens_per_round,
            "per_position_acceptance": self.per_position_acceptance,
            "acceptance_given_reached": self.acceptance_given_reached,
            "offered_by_position": list(self.offered_by_position),
            "accepted_by_position": list(self.accepted_by_position),
            "reached_by_position": list(self.reached_by_position),
            "bonus_shortfall": self.bonus_shortfall,
            "k_histogram": {str(k): n for k, n in sorted(self.k_histogram.items())},
            "plain_rounds": self.plain_rounds,
            "k_chosen_histogram": {str(k): n for k, n in sorted(self.k_chosen_histogram.items())},
            "governor_plain_rounds": self.governor_plain_rounds,
            "governor_plain_by_load": self.governor_plain_by_load,
            "governor_probes": self.governor_probes,
            "governor_shadow_drafts": self.governor_shadow_drafts,
            "governor_start_acceptance": self.governor_start_acceptance,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "plain_seconds": self.plain_seconds,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "prefill_seconds": self.prefill_seconds,
            "prefill_tokens_per_second": self.prefill_tokens_per_second,
            "reference_step_seconds": self.reference_step_seconds,
            "tokens_per_second": self.tokens_per_second,
            "cost_steps": self.cost_steps,
            "pays": self.pays,
            "pass_requests": self.pass_requests,
            "pass_rows": self.pass_rows,
            "tree_rounds": self.tree_rounds,
            "tree_nodes": self.tree_nodes,
            "mean_batch_size": self.mean_batch_size,
            "mean_rows_per_pass": self.mean_rows_per_pass,
        }


# The counters and times ``merge`` adds up (the per-position lists and histograms apart).
_SUMMED = (
    "rounds",
    "offered",
    "accepted",
    "bonus",
    "plain_rounds",
    "draft_seconds",
    "verify_seconds",
    "plain_seconds",
    "prefill_seconds",
    "prompt_tokens",
    "cached_prompt_tokens",
    "governor_plain_rounds",
    "governor_plain_by_load",
    "governor_probes",
    "governor_shadow_drafts",
    "pass_requests",
    "pass_rows",
    "tree_rounds",
    "tree_nodes",
)
