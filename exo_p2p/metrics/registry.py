"""``NodeMetrics``: one node's Prometheus registry and what finished requests add to it.

A registry of its own per node (never the process-wide default: tests run several APIs in
one process). Request figures come from ``RequestRecord``s (``observe``); the rest is read
at scrape time by ``collect.NodeCollector`` from the sources it is given. Label values are
bounded: a model not in the cluster's State, or a family or status outside the known sets,
is counted under ``other`` (a client cannot grow the label set with made-up names).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from exo_p2p.metrics.collect import MetricSources, NodeCollector
from exo_p2p.types.observe import RequestRecord

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The media type of ``GET /metrics`` (Prometheus text format 0.0.4)."""

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds from a request's arrival to its first token."""
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""Seconds per output token after the first."""
DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Seconds from a request's arrival to its end."""
FAMILIES = frozenset({"openai", "anthropic", "ollama"})
KINDS = frozenset({"generate", "embed", "rerank"})
"""Label values of a request's kind of work (``RequestRecord.kind``)."""
OTHER = "other"


class NodeMetrics:
    """The metrics of one node. ``known_model(name) -> bool`` says whether a model name may
    be a label value (a model of the cluster); ``sources``: what the scrape-time gauges read
    (None: request figures only)."""

    def __init__(self, known_model: Callable[[str], bool] = lambda _m: True,
                 sources: MetricSources | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._known_model = known_model
        r = self.registry
        self.requests = Counter("exo_requests", "Requests answered by this node's API, by family, kind of work, model "
                                "and HTTP status (499: the client went away)", ["family", "kind", "model", "status"],
                                registry=r)
        self.prompt_tokens = Counter("exo_prompt_tokens", "Prompt tokens of finished requests",
                                     ["model", "instance"], registry=r)
        self.cached_tokens = Counter("exo_cached_prompt_tokens", "Prompt tokens reused from a prompt cache",
                                     ["model", "instance"], registry=r)
        self.completion_tokens = Counter("exo_completion_tokens", "Completion tokens of finished requests",
                                         ["model", "instance"], registry=r)
        self.ttft = Histogram("exo_time_to_first_token_seconds", "Seconds from a request's arrival to its first token",
                              ["model"], buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("exo_time_per_output_token_seconds", "Seconds per output token after the first",
                              ["model"], buckets=TPOT_BUCKETS, registry=r)
        self.duration = Histogram("exo_request_duration_seconds", "Seconds from a request's arrival to its end",
                                  ["model"], buckets=DURATION_BUCKETS, registry=r)
        self.routes = Counter("exo_routed_requests", "Requests by why the master chose their instance (prefix: "
                              "it held the longest prefix; load: least loaded)", ["model", "reason"], registry=r)
        self.collector = NodeCollector(sources) if sources is not None else None
        if self.collector is not None:
            r.register(self.collector)

    def model_label(self, model: str) -> str:
        return model if self._known_model(model) else OTHER

    def observe(self, record: RequestRecord) -> None:
        """Count one finished request (its status, tokens and times)."""
        model = self.model_label(record.model)
        family = record.family if record.family in FAMILIES else OTHER
        status = str(record.status) if 100 <= record.status <= 599 else OTHER
        kind = record.kind if record.kind in KINDS else OTHER
        self.requests.labels(family, kind, model, status).inc()
        self.duration.labels(model).observe(max(0.0, record.duration))
        if record.route:
            self.routes.labels(model, record.route.split(":", 1)[0]).inc()
        if record.finish_reason is None:
            return
        instance = record.instance or OTHER
        self.prompt_tokens.labels(model, instance).inc(record.prompt_tokens)
        self.cached_tokens.labels(model, instance).inc(record.cached_tokens)
        self.completion_tokens.labels(model, instance).inc(record.completion_tokens)
        if record.ttft is not None:
            self.ttft.labels(model).observe(record.ttft)
        if record.decode_tps:
            self.tpot.labels(model).observe(1.0 / record.decode_tps)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (what ``GET /metrics`` answers)."""
        return generate_latest(self.registry)
