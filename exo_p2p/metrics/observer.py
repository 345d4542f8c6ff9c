"""``Observer``: where an API hands each finished request's record (metrics and the request
log), built by the node, or by ``create_app`` with no file when none is given. Either part
may be off (``--no-metrics``, ``--no-request-records``): then it is None and costs nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from exo_p2p.metrics.registry import NodeMetrics
from exo_p2p.metrics.request_log import RequestLog
from exo_p2p.types.observe import RequestRecord

log = structlog.get_logger("exo_p2p.requests")


@dataclass
class Observer:
    """``metrics``: the node's registry (None: metrics off); ``requests``: its request log
    (None: records off); ``keep_text``: records carry the prompt and output
    (``--log-request-text``)."""

    metrics: NodeMetrics | None = field(default_factory=NodeMetrics)
    requests: RequestLog | None = field(default_factory=RequestLog)
    keep_text: bool = False

    @property
    def active(self) -> bool:
        """Whether a finished request's record goes anywhere (metrics or records on)."""
        return self.metrics is not None or self.requests is not None

    def attach_api(self, in_flight: Callable[[], int], moves: Callable[[], tuple[int, int]],
                   placements: Callable[[], dict[str, int]] = lambda: {}) -> None:
        """The API's readers of its generations in flight, its moves (moved, failed) and its
        placements on demand by outcome."""
        if self.metrics is not None and self.metrics.collector is not None:
            self.metrics.collector.sources.in_flight = in_flight
            self.metrics.collector.sources.moves = moves
            self.metrics.collector.sources.placements = placements

    def finished(self, record: RequestRecord) -> None:
        """Count and log one finished request; a failure here is logged, never raised into
        the request."""
        try:
            if self.metrics is not None:
                self.metrics.observe(record)
            if self.requests is not None:
                self.requests.write(record)
        except Exception:  # noqa: BLE001 - observing must never fail a request
            log.exception("request record failed", request_id=record.request_id)
