"""The composition root: one ``exo-p2p node`` process (design.md §2).

Wires the libp2p host, the replica of the event log, the master role, the worker and the
HTTP API in one trio process. This is the only module that imports both ``master`` and
``worker``. Today a node is its own master (the lone-node cluster of issue 2); cluster
formation and election plug in here.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path

import msgspec
import structlog
import trio

from exo_p2p.api.backend import NodeHealth, NodeSummary
from exo_p2p.chunk_router import ChunkRouter
from exo_p2p.config import NO_PEERS_WARNING_AFTER, NodeConfig
from exo_p2p.replica import Replica
from exo_p2p.types import (
    Chunk,
    Command,
    CommandResult,
    ErrorInfo,
    Event,
    IndexedEvent,
    LocalEvent,
    MasterElected,
    ModelCard,
    NetworkAddress,
    NodeModelsUpdated,
    NodeProfileUpdated,
    State,
)

log = structlog.get_logger(__name__)

GLOBAL_EVENTS_TOPIC = "exo-p2p/global-events/1"


def interface_type(ip: str) -> str:
    """Interface kind for an IPv4 address as far as the address alone tells."""
    return "loopback" if ip.startswith("127.") else "other"


def _address_of(multiaddr: str) -> NetworkAddress:
    parts = multiaddr.split("/")
    ip = parts[2] if len(parts) > 2 else ""
    return NetworkAddress(multiaddr=multiaddr, ip=ip, interface="", interface_type=interface_type(ip))  # type: ignore[arg-type]


class Node:
    """One node process. ``await Node(config).run()`` serves until cancelled or signalled."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.router = ChunkRouter()
        self.started = trio.Event()
        self._local_seq = 0
        self._outbox_send, self._outbox_recv = trio.open_memory_channel[LocalEvent](math.inf)
        self._start_time = time.monotonic()
        self._local_cards: list[ModelCard] = []
        self.api_port: int | None = None

    # --- events -------------------------------------------------------------------------
    def emit_local(self, event: Event) -> None:
        """Queue a local event for the master with this boot's next sequence number."""
        self._local_seq += 1
        self._outbox_send.send_nowait(LocalEvent(self.node_id, self.boot_id, self._local_seq, event))  # type: ignore[arg-type]

    async def _outbox_loop(self) -> None:
        async for local in self._outbox_recv:
            await self.master.accept_local(local)

    async def _publish(self, indexed: IndexedEvent) -> None:
        await self.net.publish(GLOBAL_EVENTS_TOPIC, msgspec.msgpack.encode(indexed))

    # --- backend for the API ---------------------------------------------------------------
    def state(self) -> State:
        return self.replica.state

    def health(self) -> NodeHealth:
        warnings: list[str] = []
        alone_for = time.monotonic() - self._start_time
        if not self.net.connected_peers() and alone_for >= NO_PEERS_WARNING_AFTER:
            warnings.append(f"no peers found for {alone_for:.0f} s: this node is a cluster of one")
        counters = dict(self.net.counters)
        counters.update(self.master.counters)
        counters["chunks_undeliverable"] = self.router.undeliverable
        return NodeHealth(node_id=self.node_id, master=self.replica.state.master, warnings=warnings, counters=counters)  # type: ignore[arg-type]

    def nodes(self) -> list[NodeSummary]:
        state = self.replica.state
        out = []
        for node_id, profile in sorted(state.nodes.items()):
            out.append(
                NodeSummary(
                    node_id=node_id,
                    friendly_name=profile.friendly_name,
                    is_self=node_id == self.node_id,
                    is_master=node_id == state.master,
                    memory_total=profile.memory_total,
                    memory_available=profile.memory_available,
                    addrs=[a.multiaddr for a in profile.addrs],
                    last_seen=0.0,
                )
            )
        return out

    def local_models(self) -> list[ModelCard]:
        return list(self._local_cards)

    async def command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        with trio.move_on_after(timeout):
            return await self.master.command(command)
        return CommandResult(command.command_id, error=ErrorInfo(503, f"the master did not answer within {timeout:.0f} s", "server_error"))

    def open_chunks(self, task_id: str) -> trio.MemoryReceiveChannel[Chunk]:
        return self.router.open(task_id)

    def close_chunks(self, task_id: str) -> None:
        self.router.close(task_id)

    def previews(self, model_id: str, nodes: tuple[str, ...]) -> list[dict]:
        from master.placement import placement_previews, resolve_nodes

        state = self.replica.state
        card = state.model_cards.get(model_id)  # type: ignore[call-overload]
        if card is None:
            raise KeyError(model_id)
        required = resolve_nodes(state, nodes) if nodes else None
        return [msgspec.to_builtins(p) for p in placement_previews(state, card, nodes=required)]

    # --- loops ----------------------------------------------------------------------------
    async def _profile_loop(self) -> None:
        from worker.profile import measure_profile, profile_changed

        last = None
        while True:
            addrs = tuple(_address_of(a) for a in self.net.listen_addrs())
            profile = measure_profile(
                self.node_id,
                self.boot_id,
                self.config.friendly_name or _default_name(),
                memory_limit=self.config.memory_limit,
                hosted_bytes=self.worker.hosted_bytes(),
                addrs=addrs,
                models=tuple(sorted(c.model_id for c in self._local_cards)),
                priority=self.config.priority,
            )
            if profile_changed(last, profile):
                self.emit_local(NodeProfileUpdated(profile))
                last = profile
            await trio.sleep(2.0)

    async def _load_models(self) -> None:
        self._local_cards = await trio.to_thread.run_sync(self.store.list_cards)
        self.emit_local(NodeModelsUpdated(self.node_id, tuple(self._local_cards)))  # type: ignore[arg-type]

    # --- main -----------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from exo_p2p.api.app import create_app
        from exo_p2p.api.server import serve
        from exo_p2p.models.store import ModelStore
        from exo_p2p.net import NetConfig, load_or_create_identity, new_boot_id, open_host
        from master.role import MasterRole
        from worker.worker import Worker

        cfg = self.config
        identity = load_or_create_identity(self.data_dir, new=cfg.new_identity)
        self.node_id = identity.node_id
        self.boot_id = new_boot_id()
        self.replica = Replica(self.data_dir / "events.log")
        self.store = ModelStore(self.data_dir, [Path(p) for p in cfg.models_dirs])
        secret = cfg.cluster_secret_file.read_bytes().strip() if cfg.cluster_secret_file else None
        net_config = NetConfig(
            identity=identity,
            listen_host=cfg.listen_host,
            listen_port=cfg.listen_port,
            cluster=cfg.cluster,
            cluster_secret=secret,
            bootstrap=tuple(cfg.bootstrap),
            mdns=False,
        )
        self.worker = Worker(
            self.node_id,
            self.boot_id,
            self.state,
            self.emit_local,
            self.router.deliver,
            lambda model_id: self.store.resolve(model_id),
            prefill_chunk_size=cfg.prefill_chunk_size,
            fault_hooks=cfg.fault_hooks,
        )
        self.replica.listeners.append(self.router.on_event)
        self.replica.listeners.append(lambda _e, _s: self.worker.wake())
        async with open_host(net_config) as net:
            self.net = net
            term = self.replica.state.term + 1
            self.master = MasterRole(self.node_id, term, self.replica, self._publish, queue_limit=cfg.queue_limit)  # type: ignore[arg-type]
            await self.master.emit([MasterElected(self.node_id, term)])  # type: ignore[arg-type]
            async with trio.open_nursery() as nursery:
                self.router.bind(nursery)
                nursery.start_soon(self._outbox_loop)
                await self._load_models()
                nursery.start_soon(self._profile_loop)
                nursery.start_soon(self.worker.run)
                app = create_app(self, queue_limit=cfg.queue_limit)
                self.api_port = await nursery.start(serve, app, cfg.api_host, cfg.api_port)
                log.info(
                    "node ready",
                    node_id=self.node_id,
                    api=f"http://{cfg.api_host}:{self.api_port}",
                    addrs=net.listen_addrs(),
                    data_dir=str(self.data_dir),
                )
                print(f"exo-p2p node {self.node_id} ready", file=sys.stderr)
                print(f"  api: http://{cfg.api_host}:{self.api_port}", file=sys.stderr)
                for addr in net.listen_addrs():
                    print(f"  addr: {addr}", file=sys.stderr)
                self.started.set()
                task_status.started()
                await trio.sleep_forever()

    def close(self) -> None:
        if hasattr(self, "replica"):
            self.replica.close()


def _default_name() -> str:
    import socket

    return socket.gethostname()


async def _run_until_signal(node: Node) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node.run)

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("stopping", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)


def run_node(config: NodeConfig) -> int:
    """Run a node until SIGINT/SIGTERM; runners are shut down on the way out. Returns the
    process exit code (0 on a clean stop, 1 when the node could not start)."""
    from exo_p2p.logging import configure_logging

    configure_logging(config.log_format, config.log_level)
    node = Node(config)
    try:
        trio.run(_run_until_signal, node)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        node.close()
    return 0
