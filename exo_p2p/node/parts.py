"""The parts a node builds once its libp2p host is open (``Running``: one frozen record, made by
``exo_p2p.node.node.Node.run``), and the node's own counters as ``GET /state`` shows them."""

from __future__ import annotations

from dataclasses import dataclass

from exo_p2p.chunks.router import ChunkRouter
from exo_p2p.chunks.routes import ChunkRoutes
from exo_p2p.cluster.member import ClusterMember
from exo_p2p.links.probe_server import ProbeServer
from exo_p2p.links.prober import Prober
from exo_p2p.models.depot.pulls import PullManager
from exo_p2p.net import Network
from exo_p2p.node.backend import NodeBackend
from exo_p2p.node.loop_watch import LoopWatch
from exo_p2p.node.orphans import OrphanSweeper


@dataclass(frozen=True)
class Running:
    """What a running node holds beyond what its constructor built: the open host (``net``),
    the cluster member on it, model pulls, the links' probe server and prober (docs/links.md),
    the API's backend (``api``) and the sweeper of orphaned tasks. Made once, all parts at
    once, before any of them starts."""

    net: Network
    member: ClusterMember
    pulls: PullManager
    probes: ProbeServer
    prober: Prober
    api: NodeBackend
    orphans: OrphanSweeper


def own_counters(router: ChunkRouter, routes: ChunkRoutes, orphans: OrphanSweeper, loop_watch: LoopWatch,
                 probes: ProbeServer, prober: Prober) -> dict[str, int]:
    """The node's own ``GET /state`` counters (docs/operations.md): chunks (undeliverable,
    refused, duplicate, gaps), lost tasks, orphans cancelled, the loop's lag
    (``exo_p2p.node.loop_watch``) and the links measured (docs/links.md)."""
    return {"chunks_undeliverable": router.undeliverable, "chunk_not_from_rank0": routes.refused,
            "chunks_duplicate": router.duplicates, "chunk_stream_gaps": router.gaps, "tasks_lost": router.lost,
            "orphaned_tasks_cancelled": orphans.cancelled,
            "loop_lag_worst_ms": int(loop_watch.worst_lag * 1000), "loop_lag_late_wakes": loop_watch.late,
            "link_rounds": prober.rounds, "link_events": prober.events,
            "link_probes_served": probes.served, "link_probes_refused": probes.refused}
