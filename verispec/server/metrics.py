"""Prometheus metrics of one server, in a registry of its own.

The speculative counters carry design.md's terms: a *round* is one draft + one verify pass,
*offered* the drafted tokens, *accepted* those the rule kept, *bonus* the token the verify
pass commits past them. Per-position counters are labelled with the draft position,
1 being the first drafted token of a round; their ratio is per-position acceptance.

The governor's decisions (``--k auto``): rounds by the k it chose (0 = a plain step),
its probes after a plain back-off, its shadow drafts in plain rounds, and each
generation's measured cost of a drafted round in plain decode steps.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from verispec.stats import RequestStats

COST_STEP_BUCKETS = (1.0, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
PREFILL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # process_resident_memory_bytes and friends: memory after long prompts is watched here.
        ProcessCollector(registry=r)
        self.requests = Counter(
            "verispec_requests", "HTTP requests finished, by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "verispec_request_duration_seconds",
            "time from a request's arrival to its last byte, by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Generations count whatever they ran, also those aborted part-way (a client that left).
        self.prompt_tokens = Counter("verispec_prompt_tokens", "prompt tokens of prefilled generations", registry=r)
        self.generated_tokens = Counter(
            "verispec_generated_tokens", "tokens generated, by finished and aborted generations", registry=r
        )
        self.prefill = Histogram(
            "verispec_prefill_seconds",
            "per generation: the time the target took to read the prompt (prefill)",
            buckets=PREFILL_BUCKETS,
            registry=r,
        )
        self.generations = Counter(
            "verispec_generations", "generations, by outcome (finished, aborted, failed)", ["outcome"], registry=r
        )
        self.rounds = Counter("verispec_rounds", "speculative rounds (one draft + one verify pass)", registry=r)
        self.offered = Counter("verispec_offered", "draft tokens offered to the verify pass", registry=r)
        self.accepted = Counter("verispec_accepted", "draft tokens accepted by the rule", registry=r)
        self.bonus = Counter("verispec_bonus", "bonus tokens committed by verify passes", registry=r)
        self.offered_by_position = Counter(
            "verispec_offered_by_position",
            "draft tokens offered at each draft position (1 = first drafted token)",
            ["position"],
            registry=r,
        )
        self.accepted_by_position = Counter(
            "verispec_accepted_by_position",
            "draft tokens accepted at each draft position (1 = first drafted token)",
            ["position"],
            registry=r,
        )
        self.k_chosen = Counter(
            "verispec_governor_k_chosen",
            "rounds by the k the governor chose for them (0 = a plain step; --k auto only)",
            ["k"],
            registry=r,
        )
        self.governor_probes = Counter(
            "verispec_governor_probes", "rounds the governor drafted to re-probe after a plain back-off", registry=r
        )
        self.governor_shadow_drafts = Counter(
            "verispec_governor_shadow_drafts",
            "plain rounds whose drafter's proposal was scored against the target, not verified",
            registry=r,
        )
        self.cost_steps = Histogram(
            "verispec_round_cost_steps",
            "per generation: the mean time of a drafted round over a plain decode step",
            buckets=COST_STEP_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("verispec_queue_depth", "requests admitted and waiting for the engine", registry=r)
        self.running = Gauge("verispec_running_requests", "requests the engine is generating for now", registry=r)

    def observe_generation(self, stats: RequestStats, prompt_tokens: int, completion_tokens: int) -> None:
        if stats.prompt_tokens > 0:  # the prefill ran (a generation stopped early may not have got there)
            self.prefill.observe(stats.prefill_seconds)
        self.prompt_tokens.inc(prompt_tokens)
        self.generated_tokens.inc(completion_tokens)
        self.rounds.inc(stats.rounds)
        self.offered.inc(stats.offered)
        self.accepted.inc(stats.accepted)
        self.bonus.inc(stats.bonus)
        for i, (offered, accepted) in enumerate(
            zip(stats.offered_by_position, stats.accepted_by_position, strict=True)
        ):
            self.offered_by_position.labels(position=str(i + 1)).inc(offered)
            self.accepted_by_position.labels(position=str(i + 1)).inc(accepted)
        for k, count in stats.k_chosen_histogram.items():
            self.k_chosen.labels(k=str(k)).inc(count)
        self.governor_probes.inc(stats.governor_probes)
        self.governor_shadow_drafts.inc(stats.governor_shadow_drafts)
        if stats.cost_steps is not None:
            self.cost_steps.observe(stats.cost_steps)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
