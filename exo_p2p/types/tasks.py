"""Tasks: units of work a worker gives its runner (design.md §3 "task").

Runner lifecycle tasks (CreateRunner … Shutdown) are planned locally by each worker from the
replicated State; generation tasks are created by the master (``TaskCreated``) and live in
``State.tasks`` until they end.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from exo_p2p.types.common import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_p2p.types.instances import Instance, ShardMetadata

TaskStatus = Literal["pending", "running", "complete", "failed", "cancelled"]
FINISHED_TASK_STATUSES: tuple[str, ...] = ("complete", "failed", "cancelled")


class ChatMessage(msgspec.Struct, frozen=True):
    """One chat message with its text content (content parts already joined)."""

    role: str
    content: str


class GenerationParams(msgspec.Struct, frozen=True):
    """Validated sampling parameters of one chat completion.

    ``max_tokens`` counts completion tokens; ``temperature`` 0 is greedy; ``stop`` strings end
    generation wherever they appear in the new text and are never emitted.
    """

    messages: tuple[ChatMessage, ...]
    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


class _Task(msgspec.Struct, frozen=True, tag=True, tag_field="kind"):
    pass


class CreateRunner(_Task, tag="create_runner"):
    instance: Instance
    shard: ShardMetadata


class ConnectToGroup(_Task, tag="connect_to_group"):
    runner_id: RunnerId


class LoadModel(_Task, tag="load_model"):
    runner_id: RunnerId


class StartWarmup(_Task, tag="start_warmup"):
    runner_id: RunnerId


class TextGeneration(_Task, tag="text_generation"):
    """A chat completion for ``model_id`` on ``instance_id``; ``api_node_id`` owns the client
    connection and receives the chunks; ``created_idx`` is the master's index of its
    ``TaskCreated`` event (agreed tasks run in that order)."""

    task_id: TaskId
    instance_id: InstanceId
    model_id: ModelId
    params: GenerationParams
    api_node_id: NodeId
    created_idx: int = 0


class CancelTask(_Task, tag="cancel_task"):
    runner_id: RunnerId
    task_id: TaskId


class Shutdown(_Task, tag="shutdown"):
    runner_id: RunnerId


Task = CreateRunner | ConnectToGroup | LoadModel | StartWarmup | TextGeneration | CancelTask | Shutdown


class TaskRecord(msgspec.Struct, frozen=True):
    """A generation task as State holds it: the task and its status."""

    task: TextGeneration
    status: TaskStatus = "pending"
    cancel_requested: bool = False
