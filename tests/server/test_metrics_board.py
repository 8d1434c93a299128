"""The replicas' metrics summed into one server's (``metrics_board``), without Ray."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from verispec.server.metrics import Metrics
from verispec.server.metrics_board import MetricsBoard, exposition, merge, snapshot
from verispec.stats import RequestStats


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def _replica(requests: int, queued: int, k_chosen: dict[int, int]) -> Metrics:
    metrics = Metrics()
    for _ in range(requests):
        metrics.requests.labels(route="/v1/completions", status="200").inc()
        metrics.latency.labels(route="/v1/completions").observe(0.2)
    metrics.queue_depth.set(queued)
    stats = RequestStats()
    stats.k_chosen_histogram = dict(k_chosen)
    metrics.observe_generation(stats, prompt_tokens=5, completion_tokens=7)
    return metrics


def test_counters_histograms_and_gauges_add_up_over_replicas():
    first, second = _replica(3, 1, {0: 2, 3: 1}), _replica(2, 4, {3: 5})
    samples = _samples(exposition(merge([snapshot(first.registry), snapshot(second.registry)]), 2))
    route = (("route", "/v1/completions"),)
    assert samples[("verispec_requests_total", (*route, ("status", "200")))] == 5
    assert samples[("verispec_request_duration_seconds_count", route)] == 5
    assert samples[("verispec_request_duration_seconds_bucket", (("le", "0.25"), *route))] == 5
    assert samples[("verispec_queue_depth", ())] == 5
    assert samples[("verispec_prompt_tokens_total", ())] == 10
    assert samples[("verispec_governor_k_chosen_total", (("k", "0"),))] == 2  # a label only one replica has
    assert samples[("verispec_governor_k_chosen_total", (("k", "3"),))] == 6
    assert samples[("verispec_replicas", ())] == 2
    # Moments are not amounts: the earliest start and creation time, not their sum.
    one = _samples(exposition(merge([snapshot(first.registry)]), 1))
    assert samples[("process_start_time_seconds", ())] <= one[("process_start_time_seconds", ())]
    created = ("verispec_prompt_tokens_created", ())
    assert samples[created] == min(one[created], _samples(exposition(merge([snapshot(second.registry)]), 1))[created])


def test_the_board_keeps_each_replicas_newest_snapshot_and_forgets_the_silent():
    board = MetricsBoard(stale_seconds=0.2)
    old, new = snapshot(_replica(1, 0, {}).registry), snapshot(_replica(4, 0, {}).registry)
    board.publish("a", 2, new)
    board.publish("a", 1, old)  # arrived late: older than what the board holds
    assert board.exchange("b", 1, old) == [new, old]
    time.sleep(0.3)
    assert board.exchange("b", 2, new) == [new]  # "a" published nothing for too long: gone
    board.leave("b")
    assert board.exchange("c", 1, old) == [old]
