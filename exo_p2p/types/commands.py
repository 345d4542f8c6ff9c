"""Commands: requests to the master, answered over a direct request/response stream with a
``CommandResult`` (docs/architecture.md#vocabulary)."""

from __future__ import annotations

import msgspec

from exo_p2p.types.common import PROTOCOL_VERSION, CommandId, ErrorInfo, InstanceId, ModelId, NodeId, TaskId
from exo_p2p.types.instances import Instance, Sharding
from exo_p2p.types.tasks import GenerationParams, TextGeneration, WorkTask


class _Command(msgspec.Struct, frozen=True, tag=True, tag_field="kind"):
    command_id: CommandId


class PlaceInstance(_Command, tag="place_instance"):
    """Place ``model_id``; ``nodes`` are node ids, unique id prefixes or friendly names the
    placement must include."""

    model_id: ModelId
    min_nodes: int = 1
    sharding: Sharding = "pipeline"
    nodes: tuple[str, ...] = ()
    keep_alive: float | None = None
    """Seconds the instance stays loaded once idle (negative or None: forever; docs/models.md)."""
    pin: bool = False
    """Never unloaded to make room for another model."""
    on_demand: bool = False
    """Placed because a request named the model: an existing instance of the model (not
    failed) is answered instead of a second placement (``master.commands``)."""
    split: str = "speed"
    """Pipeline layers split by measured speed (``"speed"``) or usable memory (``"memory"``)."""


class DeleteInstance(_Command, tag="delete_instance"):
    instance_id: InstanceId


class SubmitTask(_Command, tag="submit_task"):
    """Run ``task`` (any kind of work: its tag says which) on an instance of its model; its
    ``instance_id`` is empty, the master chooses it (``master.commands``). The wire tag is new
    with task kinds: commands are never stored (only events are), and every node of a cluster
    runs the same version."""

    task: WorkTask
    keep_alive: float | None = None
    """The request's keep-alive for its instance (seconds; negative: forever; None: keep the
    instance's own; ``exo_p2p.state.usage``)."""

    @property
    def task_id(self) -> TaskId:
        return self.task.task_id

    @property
    def model_id(self) -> ModelId:
        return self.task.model_id

    @property
    def api_node_id(self) -> NodeId:
        return self.task.api_node_id

    @property
    def params(self) -> object:
        """The task's parameters (``GenerationParams``, ``EmbeddingParams``, ...)."""
        return self.task.params

    @classmethod
    def generation(cls, command_id: CommandId, task_id: TaskId, model_id: ModelId, params: GenerationParams,
                   api_node_id: NodeId) -> SubmitTask:
        """The command for a text generation (its instance chosen by the master)."""
        return cls(command_id, TextGeneration(task_id=task_id, instance_id=InstanceId(""), model_id=model_id,
                                              params=params, api_node_id=api_node_id))


class CancelGeneration(_Command, tag="cancel_generation"):
    task_id: TaskId


class FinishGeneration(_Command, tag="finish_generation"):
    """The API node saw the task's last chunk: the master ends and removes the task."""

    task_id: TaskId
    status: str = "complete"


Command = PlaceInstance | DeleteInstance | SubmitTask | CancelGeneration | FinishGeneration


class CommandEnvelope(msgspec.Struct, frozen=True):
    """A command on the wire, with the protocol version and the sending node."""

    origin: NodeId
    command: Command
    version: int = PROTOCOL_VERSION


class CommandResult(msgspec.Struct, frozen=True):
    """The master's answer: ``error`` is None on success; ``instance`` is set by a placement,
    ``instance_id`` by a generation (the instance chosen), ``event_idx`` is the index of the
    event the answer depends on (committed before the answer is sent, docs/architecture.md#log-guarantees);
    ``route`` says why a generation's instance was chosen (``master.routing``)."""

    command_id: CommandId
    error: ErrorInfo | None = None
    instance: Instance | None = None
    instance_id: InstanceId | None = None
    event_idx: int = 0
    route: str | None = None
