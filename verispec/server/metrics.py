"""Prometheus metrics of one server, in a registry of its own.

The speculative counters carry design.md's terms: a *round* is one draft + one verify pass,
*offered* the drafted tokens, *accepted* those the rule kept, *bonus* the token the verify
pass commits past them. Per-position counters are labelled with the draft position,
1 being the first drafted token of a round; their ratio is per-position acceptance.

The governor's decisions (``--k auto``): rounds by the k it chose (0 = a plain step),
its probes after a plain back-off, its shadow drafts in plain rounds, and each
generation's measured cost of a drafted round in plain decode steps.

Latency as a client sees it, timed on the event loop as a job's events arrive there
(``StreamTimer``): *time to first token* from a request's submission to its first piece of
text, *inter-piece latency* between consecutive pieces of one request (a *piece* is the text
one round committed, one token or several, sent as one streamed chunk), and *queue time*
from submission to the worker starting the job. The batch scheduler reports each forward
pass through ``observe_step``: how many requests it stepped together and how many rows
(pending tokens plus drafts) the pass verified.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from verispec.stats import RequestStats

COST_STEP_BUCKETS = (1.0, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Per-piece latencies of a request: 1 ms (a piece already waiting) to 60 s (a long queue).
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_SIZE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
ROWS_PER_STEP_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
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
        self.cached_prompt_tokens = Counter(
            "verispec_cached_prompt_tokens",
            "prompt tokens a prefill kept from the cache an earlier request left (prefix reuse; not computed)",
            registry=r,
        )
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
        self.reached_by_position = Counter(
            "verispec_reached_by_position",
            "rounds whose chain reached each draft position (drafted it, kept every draft before it): "
            "accepted / reached is the acceptance there given it was reached",
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
        self.governor_plain_by_load = Counter(
            "verispec_governor_plain_by_load",
            "plain rounds decided without a proposal: beside the batch's other rows no k could pay",
            registry=r,
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
        self.time_to_first_token = self._histogram(
            "verispec_time_to_first_token_seconds",
            "per request that produced text: time from its submission to its first piece of text",
            TOKEN_LATENCY_BUCKETS,
        )
        self.inter_piece_latency = self._histogram(
            "verispec_inter_piece_latency_seconds",
            "per streamed piece after a request's first: the gap since its previous piece "
            "(a piece is one round's text, one or more tokens: the wait a streaming client sees between chunks)",
            TOKEN_LATENCY_BUCKETS,
        )
        self.queue_time = self._histogram(
            "verispec_queue_seconds",
            "per started request: time from its submission to the engine starting it",
            TOKEN_LATENCY_BUCKETS,
        )
        self.batch_size = self._histogram(
            "verispec_batch_size",
            "per forward pass of the batch scheduler: the requests stepped together in it",
            BATCH_SIZE_BUCKETS,
        )
        self.rows_per_step = self._histogram(
            "verispec_rows_per_step",
            "per forward pass of the batch scheduler: its rows "
            "(every request's pending token, drafts and prefill chunk)",
            ROWS_PER_STEP_BUCKETS,
        )

    def _histogram(self, name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, documentation, buckets=buckets, registry=self.registry)

    def observe_step(self, requests: int, rows: int) -> None:
        """One forward pass of the batch scheduler: ``requests`` stepped together in ``rows`` rows."""
        if requests < 1 or rows < requests:
            raise ValueError(f"a step has at least one request and a row per request, got {requests} and {rows}")
        self.batch_size.observe(requests)
        self.rows_per_step.observe(rows)

    def observe_generation(self, stats: RequestStats, prompt_tokens: int, completion_tokens: int) -> None:
        if stats.prompt_tokens > 0:  # the prefill ran (a generation stopped early may not have got there)
            self.prefill.observe(stats.prefill_seconds)
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_prompt_tokens.inc(stats.cached_prompt_tokens)
        self.generated_tokens.inc(completion_tokens)
        self.rounds.inc(stats.rounds)
        self.offered.inc(stats.offered)
        self.accepted.inc(stats.accepted)
        self.bonus.inc(stats.bonus)
        for i, (offered, accepted, reached) in enumerate(
            zip(stats.offered_by_position, stats.accepted_by_position, stats.reached_by_position, strict=True)
        ):
            self.offered_by_position.labels(position=str(i + 1)).inc(offered)
            self.accepted_by_position.labels(position=str(i + 1)).inc(accepted)
            self.reached_by_position.labels(position=str(i + 1)).inc(reached)
        for k, count in stats.k_chosen_histogram.items():
            self.k_chosen.labels(k=str(k)).inc(count)
        self.governor_probes.inc(stats.governor_probes)
        self.governor_shadow_drafts.inc(stats.governor_shadow_drafts)
        self.governor_plain_by_load.inc(stats.governor_plain_by_load)
        if stats.cost_steps is not None:
            self.cost_steps.observe(stats.cost_steps)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class StreamTimer:
    """Times one job's events as the event loop receives them (the latency its client sees).

    Created when the job is submitted; ``saw`` is called with every event taken from the
    job's queue. A job that ends without text (an empty completion, a failure, an abort)
    observes no time to first token: there was no first token to wait for.
    """

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.submitted = time.perf_counter()
        self.last_piece: float | None = None

    def saw(self, kind: str, value: object) -> None:
        now = time.perf_counter()
        if kind == "started":
            self.metrics.queue_time.observe(now - self.submitted)
        elif kind == "piece" and value:
            if self.last_piece is None:
                self.metrics.time_to_first_token.observe(now - self.submitted)
            else:
                self.metrics.inter_piece_latency.observe(now - self.last_piece)
            self.last_piece = now
