"""A node's ``Observer`` built from its settings: the request log in its data dir (unless
``--request-log-bytes 0`` or ``--no-request-records``) and its Prometheus metrics (unless
``--no-metrics``), which read the node through ``MetricSources`` and count the events its
replica applies (docs/operations.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from exo_p2p.config import NodeConfig
from exo_p2p.metrics.collect import MetricSources, NodeCounts, count_event
from exo_p2p.metrics.observer import Observer
from exo_p2p.metrics.registry import NodeMetrics
from exo_p2p.metrics.request_log import FILE_NAME, RequestLog
from exo_p2p.replica import Replica


def node_observer(cfg: NodeConfig, data_dir: Path, replica: Replica, node_id: str,
                  sources: Callable[[NodeCounts], MetricSources], transfer_bytes: dict[str, int]) -> Observer:
    """The node's observer; either part is None when off. With metrics on, a listener
    counting each applied event (``count_event``) is added to ``replica``; ``sources(counts)``
    gives the node's readers, ``transfer_bytes`` the model bytes it received by source
    (the depot's ``bytes_received``, kept up to date by the depot)."""
    path = data_dir / FILE_NAME if cfg.request_log_bytes > 0 else None
    requests = RequestLog(path, max(1, cfg.request_log_bytes)) if cfg.request_records else None
    if not cfg.metrics:
        return Observer(None, requests, keep_text=cfg.log_request_text)
    counts = NodeCounts(transfer_bytes=transfer_bytes)
    replica.listeners.append(lambda indexed, _s: count_event(counts, indexed.event, node_id))
    metrics = NodeMetrics(known_model=lambda m: m in replica.state.model_cards, sources=sources(counts))
    return Observer(metrics, requests, keep_text=cfg.log_request_text)
