"""An ``ApiBackend`` holding a synthetic State (any number of nodes and instances), served by
the real API app on a real port in a background thread, for page tests that need no cluster.

Commands: ``PlaceInstance`` of ``REFUSED_MODEL`` is refused with ``REFUSAL`` (400); other
models are placed on the first node and enter State loading; ``DeleteInstance`` removes the
instance; ``SubmitTask`` streams ``TOKENS`` one every ``token_delay`` seconds.
"""

from __future__ import annotations

import threading

import trio

from exo_p2p.api import NodeHealth, NodeSummary, create_app, serve
from exo_p2p.state import apply
from exo_p2p.types import (
    CancelGeneration,
    Chunk,
    Command,
    CommandResult,
    DeleteInstance,
    ErrorInfo,
    FinishChunk,
    IndexedEvent,
    Instance,
    InstanceCreated,
    InstanceDeleted,
    ModelCard,
    NodeId,
    PlaceInstance,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerRecord,
    ShardMetadata,
    State,
    SubmitTask,
    TaskId,
    TokenChunk,
    new_id,
)
from exo_p2p.types.topology import NetworkAddress, NodeProfile, TopologyEdge

GiB = 2**30
REFUSED_MODEL = "model-that-does-not-fit"
REFUSAL = "insufficient memory: requires 512.0 GiB, largest cycle has 96.0 GiB"
FAILURE = "runner r-x (rank 0 on node-3) failed: out of memory while loading layer 7"
TOKENS = ["The", " sky", " scatters", " blue", " light", "."]


def card(model_id: str, storage: int, n_layers: int) -> ModelCard:
    per_layer = storage // (n_layers + 1)
    return ModelCard(
        model_id=model_id, n_layers=n_layers, hidden_size=2048, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=32000, context_length=8192,
        storage_size=per_layer * (n_layers + 1), layer_bytes=(per_layer,) * n_layers,
        embedding_bytes=per_layer, head_bytes=0, norm_bytes=0, tie_word_embeddings=True,
    )


def synthetic_state(n_nodes: int = 8) -> State:
    """``n_nodes`` (>= 7) nodes in a full mesh (node-0 master), 4 instances: a ready 2-rank, a ready
    4-rank, one loading (3 of 8 layers), one failed with ``FAILURE``; one task in flight."""
    ids = [NodeId(f"node-{i}") for i in range(n_nodes)]
    models = [card("llama-8b", 8 * GiB, 32), card("qwen-14b", 14 * GiB, 40), card("phi-3", 3 * GiB, 8),
              card("mistral-7b", 7 * GiB, 32), card(REFUSED_MODEL, 512 * GiB, 80)]
    nodes = {
        nid: NodeProfile(
            node_id=nid, boot_id=f"boot-{i}", friendly_name=f"box-{i}", memory_total=(16 + 8 * (i % 3)) * GiB,
            memory_available=(10 + 4 * (i % 3)) * GiB, cpu="arm64", cpu_count=8, os="Linux 6.8",
            addrs=(NetworkAddress(f"/ip4/10.0.0.{i + 1}/tcp/52514/p2p/{nid}", f"10.0.0.{i + 1}", "eth0", "ethernet"),),
            models=tuple(m.model_id for j, m in enumerate(models) if (i + j) % 2 == 0),
            models_disk_free=(100 + 10 * i) * GiB,
        )
        for i, nid in enumerate(ids)
    }
    edges = {a: {b: TopologyEdge(a, b, f"10.0.0.{j + 1}", "ethernet") for j, b in enumerate(ids) if b != a} for a in ids}
    instances: dict = {}
    runners: dict = {}

    def place(model: ModelCard, on: list[NodeId], statuses: list) -> Instance:
        iid = new_id()
        per = model.n_layers // len(on)
        shards = tuple(
            ShardMetadata(node_id=n, runner_id=f"{iid}-r{r}", rank=r, world_size=len(on), start_layer=r * per,
                          end_layer=model.n_layers if r == len(on) - 1 else (r + 1) * per, n_layers=model.n_layers,
                          share_bytes=model.storage_size // len(on), boot_id=nodes[n].boot_id)
            for r, n in enumerate(on)
        )
        inst = Instance(instance_id=iid, model_id=model.model_id, sharding="pipeline", shards=shards)
        instances[iid] = inst
        for sh, st in zip(shards, statuses):
            runners[sh.runner_id] = RunnerRecord(sh.runner_id, iid, sh.node_id, st)
        return inst

    ready = place(models[0], ids[:2], [RunnerReady(), RunnerReady()])
    place(models[1], ids[2:6], [RunnerReady()] * 4)
    place(models[2], ids[6:7], [RunnerLoading(3, 8)])
    place(models[3], ids[3:4], [RunnerFailed(error="out of memory while loading layer 7")])
    state = State(nodes=nodes, edges=edges, model_cards={m.model_id: m for m in models}, instances=instances,
                  runners=runners, master=ids[0], term=3, last_event_idx=100)
    from exo_p2p.types import GenerationParams, TaskRecord, TextGeneration

    task = TextGeneration(task_id=TaskId("t-1"), instance_id=ready.instance_id, model_id=ready.model_id,
                          params=GenerationParams(messages=()), api_node_id=ids[0])
    return State(**{**{f: getattr(state, f) for f in state.__struct_fields__}, "tasks": {task.task_id: TaskRecord(task, "running")}})


class FakeCluster:
    """The ApiBackend over ``synthetic_state()``; see the module docstring."""

    def __init__(self, state: State, token_delay: float = 0.15) -> None:
        self._state = state
        self.node_id = state.master or NodeId("node-0")
        self.token_delay = token_delay
        self.channels: dict[str, trio.MemorySendChannel[Chunk]] = {}
        self.cancelled: list[str] = []
        self.nursery: trio.Nursery | None = None

    def state(self) -> State:
        return self._state

    def health(self) -> NodeHealth:
        return NodeHealth(node_id=self.node_id, master=self._state.master, warnings=[], counters={})

    def nodes(self) -> list[NodeSummary]:
        return [NodeSummary(n.node_id, n.friendly_name, n.node_id == self.node_id, n.node_id == self._state.master,
                            n.memory_total, n.memory_available, [a.multiaddr for a in n.addrs], 0.0)
                for n in self._state.nodes.values()]

    def local_models(self) -> list[ModelCard]:
        return list(self._state.model_cards.values())

    def event_times(self, since: int):
        return None

    async def read_from_hub(self, name: str) -> tuple[str, ErrorInfo | None]:
        return name, None  # no hub here: an unknown model stays unknown

    def previews(self, model_id: str, nodes: tuple[str, ...]) -> list[dict]:
        if model_id not in self._state.model_cards:
            raise KeyError(model_id)
        first = next(iter(self._state.nodes))
        size = self._state.model_cards[model_id].storage_size
        if model_id == REFUSED_MODEL:  # the preview says it fits: the master refuses at placement
            return [{"sharding": "pipeline", "world_size": 1, "nodes": [first], "layers": [80], "bytes": [size], "error": None}]
        return [
            {"sharding": "pipeline", "world_size": 1, "nodes": [first], "layers": [8], "bytes": [size], "error": None},
            {"sharding": "tensor", "world_size": 2, "nodes": [], "layers": [], "bytes": [], "error": "tensor split needs 2 nodes with equal memory"},
        ]

    def _apply(self, event) -> None:
        self._state = apply(self._state, IndexedEvent(term=self._state.term, idx=self._state.last_event_idx + 1, event=event))

    async def command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        cid = command.command_id
        if isinstance(command, PlaceInstance):
            if command.model_id == REFUSED_MODEL:
                return CommandResult(cid, error=ErrorInfo(400, REFUSAL, code="placement_failed"))
            model = self._state.model_cards[command.model_id]
            node = next(iter(self._state.nodes))
            shard = ShardMetadata(node_id=node, runner_id=new_id(), rank=0, world_size=1, start_layer=0,
                                  end_layer=model.n_layers, n_layers=model.n_layers, share_bytes=model.storage_size,
                                  boot_id=self._state.nodes[node].boot_id)
            inst = Instance(instance_id=new_id(), model_id=model.model_id, sharding="pipeline", shards=(shard,))
            self._apply(InstanceCreated(instance=inst))
            return CommandResult(cid, instance=inst)
        if isinstance(command, DeleteInstance):
            if command.instance_id not in self._state.instances:
                return CommandResult(cid, error=ErrorInfo(404, f"no instance {command.instance_id}", "not_found_error"))
            self._apply(InstanceDeleted(instance_id=command.instance_id))
            return CommandResult(cid)
        if isinstance(command, SubmitTask):
            assert self.nursery is not None
            self.nursery.start_soon(self._feed, command.task_id)
            return CommandResult(cid, instance_id=next(iter(self._state.instances)))
        if isinstance(command, CancelGeneration):
            self.cancelled.append(command.task_id)
        return CommandResult(cid)

    def open_chunks(self, task_id: TaskId) -> trio.MemoryReceiveChannel[Chunk]:
        send, receive = trio.open_memory_channel[Chunk](64)
        self.channels[task_id] = send
        return receive

    def close_chunks(self, task_id: TaskId) -> None:
        send = self.channels.pop(task_id, None)
        if send is not None:
            send.close()

    async def _feed(self, task_id: TaskId) -> None:
        for i, text in enumerate(TOKENS, 1):
            await trio.sleep(self.token_delay)
            send = self.channels.get(task_id)
            if send is None or task_id in self.cancelled:
                return
            try:
                await send.send(TokenChunk(task_id=task_id, text=text, completion_tokens=i))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
        send = self.channels.get(task_id)
        if send is not None:
            await send.send(FinishChunk(task_id=task_id, finish_reason="stop", prompt_tokens=9, completion_tokens=len(TOKENS)))


class ServedBackend:
    """``create_app(backend)`` served by hypercorn on 127.0.0.1 (a free port) in a thread;
    ``url``; ``close()`` stops it (bounded)."""

    def __init__(self, backend: FakeCluster, **app_kwargs) -> None:
        self.backend = backend
        self._app_kwargs = app_kwargs
        self._started = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self.port = 0
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._cancel = nursery.cancel_scope
            self.backend.nursery = nursery
            self.port = await nursery.start(serve, create_app(self.backend, **self._app_kwargs), "127.0.0.1", 0)
            self._started.set()

    def start(self) -> "ServedBackend":
        self._thread.start()
        if not self._started.wait(10):
            raise TimeoutError("the fake backend's server did not start within 10 s")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, fn, *args):
        """Run ``fn(*args)`` in the server's trio thread (to change the backend's State)."""
        assert self._token is not None
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def close(self) -> None:
        if self._token is not None and self._cancel is not None:
            trio.from_thread.run_sync(self._cancel.cancel, trio_token=self._token)
        self._thread.join(10)
