"""Per-request statistics of speculative rounds, fed by one ``observe()`` call per round.

The engine is the only writer; the CLI summary, the server's usage block, ``/metrics`` and
the benchmark read these counters and the ratios ``rounds.py`` derives from them.

Terms as in design.md. A *plain round* offers nothing (k = 0): it is one plain decode step,
and its time is the unit of ``cost_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    k_histogram: dict[int, int] = field(default_factory=dict)
    plain_rounds: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    plain_seconds: float = 0.0  # verify time of plain rounds (their draft time is ~0)
    prefill_seconds: float = 0.0
    prompt_tokens: int = 0
    # A plain step's time measured elsewhere (the engine's running estimate), used for
    # ``cost_steps`` when this request ran no plain round of its own.
    reference_step_seconds: float | None = None
    # The economics governor's decisions (empty with a fixed k): k chosen per round, rounds
    # it chose to decode plainly, re-probes after a back-off, and plain rounds that asked the
    # drafter for a shadow draft (scored against the target's row, never verified), and the
    # acceptance at draft position 1 it started from (carried over from the engine's earlier
    # requests with this drafter; None: the prior, as for a first or reproducible request).
    k_chosen_histogram: dict[int, int] = field(default_factory=dict)
    governor_plain_rounds: int = 0
    governor_probes: int = 0
    governor_shadow_drafts: int = 0
    governor_start_acceptance: float | None = None

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
        for i in range(offered):
            self.offered_by_position[i] += 1
            self.accepted_by_position[i] += int(i < accepted)
        if offered == 0:
            self.plain_rounds += 1
            self.plain_seconds += draft_seconds + verify_seconds
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds

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
    def decode_seconds(self) -> float:
        return self.draft_seconds + self.verify_seconds

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over decode time (prefill excluded)."""
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        """Prompt tokens over prefill time (the last prompt token is read by the first round)."""
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def plain_step_seconds(self) -> float | None:
        if self.plain_rounds:
            return self.plain_seconds / self.plain_rounds
        return self.reference_step_seconds

    @property
    def cost_steps(self) -> float | None:
        """Mean time of a drafted round in plain decode steps; None until both are known."""
        drafted = self.rounds - self.plain_rounds
        step = self.plain_step_seconds
        if not drafted or not step:
            return None
        return (self.decode_seconds - self.plain_seconds) / drafted / step

    @property
    def drafted_tokens_per_round(self) -> float:
        """Tokens per drafted round (plain rounds left out), the side of ``pays``."""
        drafted = self.rounds - self.plain_rounds
        # A plain round always commits exactly one token, its bonus.
        return rounds.tokens_per_round(self.accepted, self.bonus - self.plain_rounds, drafted)

    @property
    def pays(self) -> bool | None:
        cost = self.cost_steps
        return None if cost is None else rounds.pays(self.drafted_tokens_per_round, cost)

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
            "offered_by_position": list(self.offered_by_position),
            "accepted_by_position": list(self.accepted_by_position),
            "bonus_shortfall": self.bonus_shortfall,
            "k_histogram": {str(k): n for k, n in sorted(self.k_histogram.items())},
            "plain_rounds": self.plain_rounds,
            "k_chosen_histogram": {str(k): n for k, n in sorted(self.k_chosen_histogram.items())},
            "governor_plain_rounds": self.governor_plain_rounds,
            "governor_probes": self.governor_probes,
            "governor_shadow_drafts": self.governor_shadow_drafts,
            "governor_start_acceptance": self.governor_start_acceptance,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "plain_seconds": self.plain_seconds,
            "prompt_tokens": self.prompt_tokens,
            "prefill_seconds": self.prefill_seconds,
            "prefill_tokens_per_second": self.prefill_tokens_per_second,
            "tokens_per_second": self.tokens_per_second,
            "cost_steps": self.cost_steps,
            "pays": self.pays,
        }
