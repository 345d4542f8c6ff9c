"""Tasks: units of work a worker gives its runner (docs/architecture.md#vocabulary "task").

Runner lifecycle tasks (CreateRunner … Shutdown) are planned locally by each worker from the
replicated State; work tasks (``WorkTask``: one struct per kind of work, its msgspec tag the
kind on the wire) are created by the master (``TaskCreated``) and live in ``State.tasks``
until they end (docs/architecture.md#how-to-add-a-kind-of-work).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from exo_p2p.types.common import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_p2p.types.images import ImageParams, ImageRef  # noqa: F401 - ImageRef re-exported with the message types
from exo_p2p.types.instances import Instance, ShardMetadata

TaskStatus = Literal["pending", "running", "complete", "failed", "cancelled"]
FINISHED_TASK_STATUSES: tuple[str, ...] = ("complete", "failed", "cancelled")


class ToolCall(msgspec.Struct, frozen=True):
    """One tool call of an assistant turn: its ``id`` (the client's, or ours:
    ``call_<task>_<n>``), the tool's ``name`` and its ``arguments`` as JSON text of an object."""

    id: str
    name: str
    arguments: str


class ChatMessage(msgspec.Struct, frozen=True, omit_defaults=True):
    """One chat message with its text content (content parts already joined).

    An assistant turn may carry ``tool_calls`` and its ``reasoning`` (rendered by templates
    that show earlier reasoning); a ``tool`` turn is one call's result, ``tool_call_id``
    naming the call and ``name`` the tool (when the client says)."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None
    images: tuple[ImageRef, ...] = ()
    """The message's images in the order sent, shown before its text (docs/api.md "Images")."""


FormatKind = Literal["json_object", "json_schema", "regex", "lark"]


class OutputFormat(msgspec.Struct, frozen=True):
    """The shape a generation's output must have (structured output, ``exo_p2p.content.output_format``).

    ``kind``: ``json_object`` (any JSON object; ``source`` empty), ``json_schema`` (``source``
    is the schema as JSON text), ``regex`` (``source`` is the pattern, the whole output must
    match it) or ``lark`` (``source`` is a Lark grammar, llguidance's dialect). ``name`` is the
    client's name for the format (OpenAI's ``json_schema.name``), kept for error messages.
    The runner that samples constrains every token to the format; the output ends when the
    format is complete (docs/api.md#structured-output).
    """

    kind: FormatKind
    source: str = ""
    name: str | None = None


MAX_TOP_LOGPROBS = 20
"""Alternatives a request may ask for per generated token (OpenAI's own bound on
``top_logprobs``); it bounds what the sampling rank computes and every chunk carries."""


class GenerationParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """Validated sampling parameters of one generation (every API family maps to these).
    Encoded without the fields left at their defaults (``omit_defaults``, as ``ChatMessage``):
    a plain request's ``SubmitTask`` / ``TaskCreated`` carry ~50 bytes of parameters in
    every node's log, not ~440.

    ``messages`` are rendered with the model's chat template; when ``prompt`` is set it is
    the raw prompt text instead (``/v1/completions``, Ollama ``raw``) and ``messages`` is
    empty. ``max_tokens`` counts completion tokens; None = until the model stops or the
    context is full. ``temperature`` 0 is greedy; ``top_k`` 0, ``min_p`` 0, ``top_p`` 1 are
    off. Penalties follow mlx-lm's logits processors over the last ``penalty_context``
    tokens (prompt included): ``presence_penalty``/``frequency_penalty`` are additive (0 =
    off), ``repetition_penalty`` multiplicative (1 = off). ``logit_bias`` is
    ``((token_id, bias), …)`` added to the log-probabilities (-100 bans a token). ``stop``
    strings end generation wherever they appear in the new text and are never emitted.

    A resumed request (``exo_p2p.api.generation.resume``): ``resume_tokens`` are the token ids
    already generated (and sent to the client) by an earlier task of the same request; the
    runner prefills prompt + them, replays them through detokenizer and stop matcher without
    emitting their text, counts them as completion tokens, and continues. ``origin_task_id``
    is the request's first task id (the seed of a request without ``seed`` derives from it).

    ``output_format``: the shape the output must have (None: free text); a resumed request's
    ``resume_tokens`` are replayed into its grammar before it continues.

    Tools (docs/api.md#tools): ``tools`` is the JSON text of the request's function tools, each
    ``{"type": "function", "function": {"name", "description", "parameters"}}``, rendered by
    the model's chat template (or the generic tool format for a model without one);
    ``tool_choice`` is ``auto``, ``none``, ``required`` or ``function:NAME``. ``thinking``
    reaches the chat template as ``enable_thinking`` (None: the template's default).
    ``thinking_budget``: reasoning tokens at most (None: unbounded); when a row's think block
    reaches it the runner forces the end-of-reasoning marker (``worker.engine.think_budget``).

    ``logprobs``: None, or N in 0..``MAX_TOP_LOGPROBS``: every generated token's
    log-probability and the N most likely tokens' come with it (``TokenChunk.logprobs``;
    ``worker.engine.token_logprobs`` says which distribution).

    ``one_call``: at most one call (OpenAI ``parallel_tool_calls: false``, Anthropic
    ``disable_parallel_tool_use``): the call grammar ends the answer after its first call, so a
    forced call finishes as a call instead of repeating calls until ``max_tokens``.

    ``speculative``: False opts this request out of speculative decoding (its tokens are the
    same either way; ``worker/engine/spec/``).

    ``client``: who asked, as the runner's fairness rule shares prefill between clients
    (``worker.engine.fair_share``; set by the API node: ``exo_p2p.api.generation.client_key``, at most
    ``exo_p2p.api.generation.client_key.CLIENT_KEY_MAX`` characters); None: the unnamed client.
    """

    messages: tuple[ChatMessage, ...]
    max_tokens: int | None = None
    temperature: float = 0.7
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    penalty_context: int = 64
    logit_bias: tuple[tuple[int, float], ...] = ()
    prompt: str | None = None
    resume_tokens: tuple[int, ...] = ()
    origin_task_id: str | None = None
    output_format: OutputFormat | None = None
    tools: str | None = None
    tool_choice: str = "auto"
    thinking: bool | None = None
    one_call: bool = False
    client: str | None = None
    thinking_budget: int | None = None
    logprobs: int | None = None
    speculative: bool = True


class EmbeddingParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """One embedding request's inputs and options (every API family maps to these).

    ``inputs``: one tuple of token ids per input (the API node tokenizes with the model's
    tokenizer; each input non-empty and within the model's context). ``pooling``: how the
    final hidden states become one vector — None: as the model's files say (sentence-
    transformers' ``1_Pooling/config.json``, else the family's default), or ``mean``,
    ``cls``, ``last``. ``normalize``: L2-normalise each vector (None: as the model says).
    ``dimensions``: keep the first N values (Matryoshka truncation, then normalised again when
    normalising; None: the model's width). ``client``: as ``GenerationParams.client``.
    """

    inputs: tuple[tuple[int, ...], ...]
    pooling: Literal["mean", "cls", "last"] | None = None
    normalize: bool | None = None
    dimensions: int | None = None
    client: str | None = None


class RerankParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """One rerank request: the ``query``'s and each of the ``documents``' token ids (the API
    node tokenizes; the runner joins query and document as its model's pairs need). The
    runner answers one relevance score per document, in the documents' order
    (``EmbeddingChunk`` of width 1); ordering and ``top_n`` are the API's. ``client``: as
    ``GenerationParams.client``."""

    query: tuple[int, ...]
    documents: tuple[tuple[int, ...], ...]
    client: str | None = None


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


TaskKind = Literal["generate", "embed", "rerank", "image", "image_edit"]
"""The kinds of work (``WorkTask``); a ``ModelCard.tasks`` lists those its model can do."""
TASK_KINDS: tuple[TaskKind, ...] = ("generate", "embed", "rerank", "image", "image_edit")


class TextGeneration(_Task, tag="text_generation"):
    """A chat completion for ``model_id`` on ``instance_id``; ``api_node_id`` owns the client
    connection and receives the chunks; ``created_idx`` is the master's index of its
    ``TaskCreated`` event (agreed tasks run in that order). In a ``SubmitTask`` command
    ``instance_id`` is empty: the master chooses it."""

    task_kind: ClassVar[TaskKind] = "generate"
    task_id: TaskId
    instance_id: InstanceId
    model_id: ModelId
    params: GenerationParams
    api_node_id: NodeId
    created_idx: int = 0


class Embedding(_Task, tag="embedding"):
    """Embed ``params.inputs`` with ``model_id`` on ``instance_id``: one ``EmbeddingChunk``
    (a vector per input), then a ``FinishChunk``. Fields otherwise as ``TextGeneration``."""

    task_kind: ClassVar[TaskKind] = "embed"
    task_id: TaskId
    instance_id: InstanceId
    model_id: ModelId
    params: EmbeddingParams
    api_node_id: NodeId
    created_idx: int = 0


class Rerank(_Task, tag="rerank"):
    """Score ``params.documents`` against ``params.query`` with ``model_id`` on
    ``instance_id``: one ``EmbeddingChunk`` of width 1 (a score per document), then a
    ``FinishChunk``. Fields otherwise as ``TextGeneration``."""

    task_kind: ClassVar[TaskKind] = "rerank"
    task_id: TaskId
    instance_id: InstanceId
    model_id: ModelId
    params: RerankParams
    api_node_id: NodeId
    created_idx: int = 0


class ImageGeneration(_Task, tag="image_generation"):
    """Make one image of ``params`` with ``model_id`` on ``instance_id``: ``ImageChunk``s
    (partials, then the final), then a ``FinishChunk``. Fields otherwise as ``TextGeneration``."""

    task_kind: ClassVar[TaskKind] = "image"
    task_id: TaskId
    instance_id: InstanceId
    model_id: ModelId
    params: ImageParams
    api_node_id: NodeId
    created_idx: int = 0


class ImageEdits(ImageGeneration, tag="image_edits"):
    """As ``ImageGeneration``, repainting ``params.image`` (docs/images.md#edits)."""

    task_kind: ClassVar[TaskKind] = "image_edit"


WorkTask = TextGeneration | Embedding | Rerank | ImageGeneration | ImageEdits
"""A task of one kind of work; its tag names the kind on the wire and in the event log (a log
written before embeddings holds only ``text_generation`` tags, which decode unchanged)."""
WORK_TASKS: tuple[type, ...] = (TextGeneration, Embedding, Rerank, ImageGeneration, ImageEdits)


class CancelTask(_Task, tag="cancel_task"):
    runner_id: RunnerId
    task_id: TaskId


class Shutdown(_Task, tag="shutdown"):
    runner_id: RunnerId


Task = (CreateRunner | ConnectToGroup | LoadModel | StartWarmup | TextGeneration | Embedding | Rerank | ImageGeneration
        | ImageEdits | CancelTask | Shutdown)


class TaskRecord(msgspec.Struct, frozen=True):
    """A work task as State holds it: the task and its status."""

    task: WorkTask
    status: TaskStatus = "pending"
    cancel_requested: bool = False
