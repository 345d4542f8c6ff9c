"""Hypothesis strategies for events over a small universe of ids (so events interact)."""

from __future__ import annotations

from hypothesis import strategies as st

from exo_p2p.types import (
    ChatMessage,
    GenerationParams,
    IndexedEvent,
    Instance,
    InstanceCreated,
    InstanceDeleted,
    InstanceFailed,
    InstancePrefixesUpdated,
    MasterElected,
    ModelCard,
    NodeModelsUpdated,
    NodeProfile,
    NodeProfileUpdated,
    NodeTimedOut,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerStatusUpdated,
    ShardMetadata,
    TaskCancelRequested,
    TaskCreated,
    TaskDeleted,
    TaskStatusUpdated,
    TextGeneration,
    TopologyEdge,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)

NODES = ["node-a", "node-b", "node-c"]
INSTANCES = ["inst-1", "inst-2"]
TASKS = ["task-1", "task-2", "task-3"]
node_ids = st.sampled_from(NODES)

CARD = ModelCard(
    model_id="m", n_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
    context_length=2048, storage_size=1000, layer_bytes=(200, 200, 200, 200), embedding_bytes=190,
    head_bytes=0, norm_bytes=10, tie_word_embeddings=True,
)

profiles = st.builds(
    NodeProfile,
    node_id=node_ids,
    boot_id=st.sampled_from(["boot-1", "boot-2"]),
    friendly_name=st.sampled_from(["a", "b"]),
    memory_total=st.one_of(st.none(), st.integers(0, 2**40)),
    memory_available=st.one_of(st.none(), st.integers(0, 2**40)),
)


def _instance(instance_id: str, node: str) -> Instance:
    shard = ShardMetadata(node, f"{instance_id}-r0", 0, 1, 0, 4, 4, 1000, "boot-1")
    return Instance(instance_id, "m", "pipeline", (shard,))


statuses = st.sampled_from([RunnerLoading(1, 4), RunnerReady(), RunnerRunning(), RunnerFailed("boom")])

events = st.one_of(
    st.builds(NodeProfileUpdated, profile=profiles),
    st.builds(NodeModelsUpdated, node_id=node_ids, cards=st.just((CARD,))),
    st.builds(NodeTimedOut, node_id=node_ids),
    st.builds(lambda s, d: TopologyEdgeCreated(TopologyEdge(s, d, "127.0.0.1")), node_ids, node_ids),
    st.builds(TopologyEdgeDeleted, source=node_ids, sink=node_ids),
    st.builds(MasterElected, node_id=node_ids, term=st.integers(0, 5)),
    st.builds(lambda i, n: InstanceCreated(_instance(i, n)), st.sampled_from(INSTANCES), node_ids),
    st.builds(InstanceDeleted, instance_id=st.sampled_from(INSTANCES)),
    st.builds(InstanceFailed, instance_id=st.sampled_from(INSTANCES), reason=st.just("x")),
    st.builds(InstancePrefixesUpdated, instance_id=st.sampled_from(INSTANCES),
              digests=st.lists(st.integers(0, 2**63 - 1), max_size=80).map(tuple)),
    st.builds(
        lambda i, n, s: RunnerStatusUpdated(f"{i}-r0", i, n, s), st.sampled_from(INSTANCES), node_ids, statuses
    ),
    st.builds(
        lambda t, i: TaskCreated(
            TextGeneration(t, i, "m", GenerationParams((ChatMessage("user", "hi"),)), "node-a")
        ),
        st.sampled_from(TASKS),
        st.sampled_from(INSTANCES),
    ),
    st.builds(TaskStatusUpdated, task_id=st.sampled_from(TASKS), status=st.sampled_from(["running", "complete", "failed"])),
    st.builds(TaskCancelRequested, task_id=st.sampled_from(TASKS)),
    st.builds(TaskDeleted, task_id=st.sampled_from(TASKS)),
)


def index(evs: list) -> list[IndexedEvent]:
    """Number events 1..n in term 1."""
    return [IndexedEvent(term=1, idx=i + 1, event=e) for i, e in enumerate(evs)]
