"""The proxy's Prometheus metrics (``GET /metrics``, admin key): requests by status,
failed upstream attempts by model, whole-request latency, the model that answered, and
feedback by kind and status; for models with replicas, picks and fallbacks per replica,
the replica index's size, the KV events' lag, the event messages dropped, how the
index's prediction of a request's cached tokens compared with what the engine reported, and
the trade-off a learning replica policy plays in each region.
One registry per app, so several proxies in one process (tests,
``serve_in_thread``) never share counters; with ``--workers N`` each worker reports its own
(scrape each, or sum them). Per-request counts reach the registry in batches
(:meth:`ProxyMetrics.flush`: every :data:`FLUSH_EVERY` chats and at every scrape)."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE_LATEST", "ProxyMetrics"]

FLUSH_EVERY = 256
"""Chats whose counts wait in the proxy before they are put in the registry (each chat
would otherwise take a lock and walk a label table per metric)."""
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ProxyMetrics:
    """Counters and the latency histogram of one proxy."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("canopy_requests", "Chat requests by HTTP status",
                                ["status"], registry=self.registry)
        self.failovers = Counter("canopy_failovers", "Upstream attempts that failed (the "
                                 "request moved on to the next model)", ["model"],
                                 registry=self.registry)
        self.latency = Histogram("canopy_request_seconds", "Whole chat-request latency",
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.choices = Counter("canopy_choices", "Requests answered, by model", ["model"],
                               registry=self.registry)
        self.feedback = Counter("canopy_feedback", "Feedback requests by kind and HTTP status",
                                ["kind", "status"], registry=self.registry)
        self.replica_picks = Counter("canopy_replica_picks", "Requests sent, by replica",
                                     ["model", "replica"], registry=self.registry)
        self.replica_fallbacks = Counter(
            "canopy_replica_fallbacks", "Requests a replica failed or could not take (the "
            "next replica was tried)", ["model", "replica"], registry=self.registry)
        self.index_blocks = Gauge("canopy_index_blocks", "Blocks in the replica index",
                                  ["model"], registry=self.registry)
        self.event_lag = Gauge("canopy_event_lag_seconds", "Age of the newest KV-event batch "
                               "applied", ["model", "replica"], registry=self.registry)
        self.events_dropped = Counter("canopy_events_dropped", "KV-event messages dropped, by "
                                      "reason", ["model", "reason"], registry=self.registry)
        self.replica_tradeoff = Gauge(
            "canopy_replica_tradeoff", "The trade-off theta a learning replica policy plays "
            "now, by model and region of the prefix tree", ["model", "region"],
            registry=self.registry)
        self.cache_predictions = Counter(
            "canopy_cache_predictions", "Answers whose engine reported its cached prompt "
            "tokens, by how the index's prediction compared (exact, over, under)",
            ["model", "outcome"], registry=self.registry)

        self._children: dict[tuple[Any, ...], Any] = {}
        self._counts: dict[tuple[Any, ...], int] = {}  # counts not yet in the registry
        self._latencies: list[float] = []

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept: looking a child up by its labels costs more than
        counting (the labels a proxy uses are its statuses, models and replicas: few)."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def count(self, metric: Any, *labels: str) -> None:
        """One more on the counter ``metric`` with ``labels``, in the registry by the next
        :meth:`flush`."""
        key = (metric, *labels)
        self._counts[key] = self._counts.get(key, 0) + 1

    def chat(self, status: int, model: str | None, seconds: float) -> None:
        """A chat answered with ``status`` by ``model`` (``None``: none) in ``seconds``."""
        self.count(self.requests, str(status))
        if model:
            self.count(self.choices, model)
        self._latencies.append(seconds)
        if len(self._latencies) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Put the counts and latencies gathered since the last flush into the registry."""
        counts, self._counts = self._counts, {}
        latencies, self._latencies = self._latencies, []
        for (metric, *labels), n in counts.items():
            self.child(metric, *labels).inc(n)
        for seconds in latencies:
            self.latency.observe(seconds)

    def rated(self, kind: str, status: int) -> None:
        """A rating of ``kind`` (``request``, ``episode``) answered with ``status``."""
        self.count(self.feedback, kind, str(status))

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format (every count so far)."""
        self.flush()
        return generate_latest(self.registry)
