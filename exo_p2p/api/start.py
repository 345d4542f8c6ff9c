"""Start a node's HTTP API: its access policy from the node's settings (keys, CORS origins,
allowed hosts: docs/api.md), a warning when it listens beyond loopback without a key, the
app on the node's backend, served in the node's nursery."""

from __future__ import annotations

import sys
from pathlib import Path

import structlog
import trio

from exo_p2p.api.access import AccessPolicy, is_loopback_host
from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.demand.placer import DemandPlacer
from exo_p2p.api.generation.job import GenerationSettings
from exo_p2p.api.families.openai.sealed_reasoning import reasoning_key
from exo_p2p.config import NodeConfig

log = structlog.get_logger("exo_p2p.node")


def access_policy(cfg: NodeConfig) -> AccessPolicy:
    """The API's access policy from ``cfg``: its keys, CORS origins, and the hosts it
    answers (``--allowed-host`` and the names of the address it binds)."""
    from exo_p2p.api.hosts import bind_names

    return AccessPolicy.of(cfg.api_keys, cfg.cors_origins, [*cfg.allowed_hosts, *bind_names(cfg.api_host)],
                           metrics_loopback_open=cfg.metrics_loopback_open)


def demand_placer(cfg: NodeConfig) -> DemandPlacer | None:
    """The API's placements on demand (``--keep-alive`` their default), None with
    ``--no-place-on-demand``."""
    return DemandPlacer(keep_alive=cfg.keep_alive) if cfg.place_on_demand else None


async def start_api(nursery: trio.Nursery, backend: ApiBackend, cfg: NodeConfig, observer) -> int:  # type: ignore[no-untyped-def]
    """Serve the HTTP API on ``cfg.api_host:cfg.api_port`` in ``nursery`` with ``backend``
    and ``observer`` (``exo_p2p.metrics.observer.Observer``); returns the port it bound.
    Warns, in the log and on stderr, when anyone on the network can use it. Its reasoning
    sealing key comes from the cluster secret, else the data dir's ``reasoning.key``
    (``exo_p2p.api.families.openai.sealed_reasoning``). Raises ``OSError`` when the port cannot be bound or
    the key cannot be written."""
    from exo_p2p.api.app import create_app
    from exo_p2p.api.server import serve
    from exo_p2p.vision.fetch import ImageUrlPolicy

    access = access_policy(cfg)
    if not access.api_keys and not is_loopback_host(cfg.api_host):
        warning = (
            f"the API listens on {cfg.api_host} without an API key: anyone who reaches "
            f"port {cfg.api_port} can use it; start with --api-key KEY to require one"
        )
        log.warning("api open to the network", api_host=cfg.api_host)
        print(f"warning: {warning}", file=sys.stderr)
    secret = cfg.cluster_secret_file.read_bytes().strip() if cfg.cluster_secret_file else None
    key = await trio.to_thread.run_sync(reasoning_key, secret, Path(cfg.data_dir))
    app = create_app(backend, queue_limit=cfg.queue_limit, access=access,
                     generation=GenerationSettings(max_moves=cfg.max_moves, demand=demand_placer(cfg)), observer=observer,
                     reasoning_key=key,
                     image_urls=ImageUrlPolicy(allow=cfg.allow_image_urls, allow_private=cfg.allow_private_image_urls))
    return await nursery.start(serve, app, cfg.api_host, cfg.api_port)
