"""The metrics of several replicas of the server, answered as one server's.

Each replica counts in its own ``Metrics`` registry. A *snapshot* is what one registry holds
at one moment (its metric families, as ``prometheus_client`` collects them). The
``MetricsBoard`` keeps each replica's latest snapshot; ``/metrics`` on any replica answers
their *sum*: counters, histograms and gauges add up across replicas (requests, tokens,
rounds, queue depth, resident memory), except the few samples that are moments or limits
rather than amounts (a series' ``_created`` time, the process start time: the earliest;
the file descriptor limit: the smallest). ``verispec_replicas`` says how many replicas the
answer sums. This module knows nothing of Ray: ``replicas`` runs the board as a Ray actor.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

Snapshot = list[Metric]

STALE_SECONDS = 30.0  # a replica that published nothing for this long has gone (replicas publish every 2 s)
# Samples that are moments or limits, not amounts: combined by min, not summed.
EARLIEST = ("process_start_time_seconds", "process_max_fds")


def snapshot(registry: CollectorRegistry) -> Snapshot:
    return list(registry.collect())


def merge(snapshots: Sequence[Snapshot]) -> Snapshot:
    """One snapshot whose samples are the replicas' summed (``EARLIEST`` and ``_created``
    samples: their minimum), families and samples in the order first seen."""
    families: dict[str, Metric] = {}
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    labels_of: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, str]] = {}
    samples_of: dict[str, list[tuple[str, tuple[tuple[str, str], ...]]]] = {}
    for families_of_one in snapshots:
        for family in families_of_one:
            if family.name not in families:
                families[family.name] = family
                samples_of[family.name] = []
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in values:
                    values[key] = sample.value
                    labels_of[key] = dict(sample.labels)
                    samples_of[family.name].append(key)
                elif sample.name in EARLIEST or sample.name.endswith("_created"):
                    values[key] = min(values[key], sample.value)
                else:
                    values[key] += sample.value
    merged = []
    for name, first in families.items():
        family = Metric(first.name, first.documentation, first.type, first.unit)
        for key in samples_of[name]:
            family.add_sample(key[0], labels_of[key], values[key])
        merged.append(family)
    return merged


def exposition(families: Iterable[Metric], replicas: int) -> bytes:
    """The Prometheus text of ``families``, with the ``verispec_replicas`` gauge."""
    count = GaugeMetricFamily("verispec_replicas", "replicas whose metrics this answer sums", value=replicas)
    collected = [*families, count]

    class Fixed:
        def collect(self) -> list[Metric]:
            return collected

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())  # type: ignore[arg-type]  # a collector is anything with collect()
    return generate_latest(registry)


class MetricsBoard:
    """The latest snapshot of each replica. A snapshot carries its replica's sequence number,
    so one that arrives late never replaces a newer one."""

    def __init__(self, stale_seconds: float = STALE_SECONDS) -> None:
        self.stale_seconds = stale_seconds
        self._latest: dict[str, tuple[int, float, Snapshot]] = {}

    def publish(self, replica: str, sequence: int, families: Snapshot) -> None:
        held = self._latest.get(replica)
        if held is None or sequence > held[0]:
            self._latest[replica] = (sequence, time.monotonic(), families)

    def leave(self, replica: str) -> None:
        """A replica that stops: its counts leave the sum."""
        self._latest.pop(replica, None)

    def exchange(self, replica: str, sequence: int, families: Snapshot) -> list[Snapshot]:
        """Publish one replica's snapshot; every live replica's latest, that one's included."""
        self.publish(replica, sequence, families)
        now = time.monotonic()
        for name, (_, seen, _) in list(self._latest.items()):
            if now - seen > self.stale_seconds:
                del self._latest[name]
        return [families for _, _, families in self._latest.values()]
