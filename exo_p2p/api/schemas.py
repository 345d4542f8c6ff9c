"""HTTP request and response bodies as msgspec Structs: the type is the schema.

Requests follow the OpenAI chat-completions schema (unknown fields are ignored; known
parameters we do not support are decoded so that ``exo_p2p.api.families.openai.chat`` can
refuse them by name). Responses are encoded with ``msgspec.json``. Stream chunks omit what
they do not carry (``tool_calls``, ``function_call``, ``name``, ``logprobs``, ``refusal``
never appear there); a non-streamed ``chat.completion`` carries the fields the spec
requires even when null (``choices[].logprobs``, ``message.refusal``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

MAX_TOKENS_LIMIT = 2**31 - 1
"""Largest ``max_tokens`` accepted by the schema (the runner checks it against the context)."""
SEED_LIMIT = 2**63 - 1

PositiveTokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS_LIMIT)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
Seed = Annotated[int, msgspec.Meta(ge=0, le=SEED_LIMIT)]
StopList = list[str]
"""Stop strings; their count and bytes are checked by ``exo_p2p.api.bounds.check_stop`` (400)."""
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
TOKEN_ID_LIMIT = 2**31 - 1
"""Largest ``top_k`` and token id accepted (a larger integer cannot travel in a command)."""
TopK = Annotated[int, msgspec.Meta(ge=0, le=TOKEN_ID_LIMIT)]
MinP = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
RepetitionPenalty = Annotated[float, msgspec.Meta(gt=0.0, le=10.0)]
MAX_NAME_CHARS = 512
"""Characters of a model name at most (it travels in every command and event of a request);
model ids are a few dozen characters."""
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]
"""A model name: 1 to ``MAX_NAME_CHARS`` characters."""


# ----------------------------------------------------------------------------- requests


class ContentPart(msgspec.Struct, frozen=True):
    """One part of a message's content list: ``{"type": "text", "text": ...}``, or an image:
    chat's ``{"type": "image_url", "image_url": {"url": ...}}``, Responses' ``{"type":
    "input_image", "image_url": ...}`` (``exo_p2p.api.vision.parts``)."""

    type: str
    text: str | None = None
    image_url: Any = None
    file_id: str | None = None


class MessageIn(msgspec.Struct, frozen=True):
    """A chat message as a client sends it (``content`` a string or a list of parts)."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool | None = None


class ChatCompletionRequest(msgspec.Struct, frozen=True):
    """``POST /v1/chat/completions``; token counts in tokens. Unsupported parameters are
    kept so they can be refused with a 400 that names them when set to a non-default value."""

    model: NonEmptyStr
    messages: list[MessageIn]
    max_tokens: PositiveTokens | None = None
    max_completion_tokens: PositiveTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: str | StopList | None = None
    seed: Seed | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, Any] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # Common extensions (vLLM, llama-server; the openai SDK sends them via ``extra_body``)
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    speculative: bool | None = None  # false: no speculative decoding for this request (docs/api.md)
    # Structured output (exo_p2p.api.formats); ``regex`` and ``grammar`` as llama-server and vLLM
    response_format: Any = None
    regex: str | None = None
    grammar: str | None = None
    # Tools and reasoning (exo_p2p.api.families.openai.chat_tools)
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    enable_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Known but unsupported: refused by name when not at their default.
    n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    audio: Any = None
    modalities: list[str] | None = None


class PlaceRequest(msgspec.Struct, frozen=True):
    """``POST /instances``: ``nodes`` is a list of node ids / prefixes / friendly names, or
    one comma-separated string; ``keep_alive`` and ``pin`` as below."""

    model: NonEmptyStr
    min_nodes: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1
    sharding: Literal["pipeline", "tensor"] = "pipeline"
    nodes: list[str] | str | None = None
    keep_alive: Any = None
    """Seconds or a duration (``"10m"``) the instance stays once idle; negative or absent:
    until deleted (``exo_p2p.api.demand.keep_alive``)."""
    pin: bool = False
    """Never unloaded to make room for another model (docs/models.md)."""
    split: Literal["speed", "memory"] = "speed"
    """Pipeline layers split by measured speed, or in proportion to memory (docs/placement-speed.md)."""


# ---------------------------------------------------------------------------- responses


class ErrorDetail(msgspec.Struct, frozen=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, frozen=True):
    """OpenAI-shaped error: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail


class CachedTokens(msgspec.Struct, frozen=True):
    """``prompt_tokens_details``: ``cached_tokens`` of the prompt taken from the prompt cache."""

    cached_tokens: int = 0


class Usage(msgspec.Struct, frozen=True):
    """OpenAI's usage; ``prompt_tokens_details.cached_tokens`` counts the prompt tokens the
    prompt cache served (OpenAI's field, which agents read as cache hits)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: CachedTokens = CachedTokens()


class Delta(msgspec.Struct, frozen=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class StreamChoice(msgspec.Struct, frozen=True):
    index: int
    delta: Delta
    finish_reason: str | None


class ChatCompletionChunk(msgspec.Struct, frozen=True, omit_defaults=True):
    """One SSE event of a streamed completion; ``usage`` only on the final usage chunk."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[StreamChoice]
    usage: Usage | None = None


class AssistantMessage(msgspec.Struct, frozen=True):
    role: str
    content: str
    refusal: None = None


class Choice(msgspec.Struct, frozen=True):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


class ChatCompletion(msgspec.Struct, frozen=True):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class ModelEntry(msgspec.Struct, frozen=True):
    """An entry of ``GET /v1/models``; sizes in bytes, context in tokens."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    n_layers: int
    storage_size: int
    context_length: int
    tasks: list[str] = []
    """The kinds of work it can do (``generate``, ``embed``, ``rerank``)."""
    capabilities: list[str] = []
    """What it knows beyond text: ``vision`` when it takes images (``exo_p2p.models.card.capabilities``)."""


class ModelList(msgspec.Struct, frozen=True):
    object: Literal["list"]
    data: list[ModelEntry]


class LocalModel(msgspec.Struct, frozen=True):
    """An entry of ``GET /models``: a model this node can serve from its own store; ``source``
    says where it was found (embedded, models_dir, pulled, hf_cache, ollama, lmstudio; null
    when the backend cannot say). ``family`` (config.json's ``model_type``),
    ``quantization`` (the card's), ``shardings``: the ways it may be split over several nodes,
    ``sharding_notes``: why another is not, or that an allowed one is untested for the family
    (``exo_p2p.models.card.families``)."""

    model: str
    n_layers: int
    storage_size: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    context_length: int
    source: str | None = None
    family: str = ""
    quantization: str = ""
    shardings: list[str] = []
    sharding_notes: dict[str, str] = {}
    tasks: list[str] = []
    """The kinds of work it can do (``generate``, ``embed``, ``rerank``: ``exo_p2p.types.kinds``)."""
    capabilities: list[str] = []
    """Its card's capabilities (``completion``, ``tools``, ``thinking``, ``vision``)."""


class ShardView(msgspec.Struct, frozen=True):
    node_id: str
    runner_id: str
    rank: int
    start_layer: int
    end_layer: int
    share_bytes: int
    status: str
    weights_dtype: str = "stored"
    """What the shard's runner holds: ``stored`` (as on disk) or ``float32`` (a CPU node)."""
    bytes_done: int | None = None
    bytes_total: int | None = None
    bytes_per_second: float | None = None
    bytes_from_peers: int | None = None
    bytes_from_hub: int | None = None
    """While the shard's node fetches it (status ``downloading``): bytes fetched (those
    already on disk included), of total, the speed, and of the bytes received those from
    other nodes and from a model hub; None otherwise (docs/models.md)."""


class InstanceOut(msgspec.Struct, frozen=True):
    """An instance as ``/instances`` shows it (status as docs/architecture.md#instance-lifecycle)."""

    instance_id: str
    model: str
    sharding: str
    status: str
    reason: str | None
    layers_loaded: int
    layers_total: int
    shards: list[ShardView]
    bytes_downloaded: int = 0
    bytes_to_download: int = 0
    bytes_from_peers: int = 0
    bytes_from_hub: int = 0
    """Sums over the shards still downloading (0 when none is): bytes fetched and total, and
    of the bytes received those from other nodes and from a model hub."""
    keep_alive: float | None = None
    """Seconds it stays once idle; None: until deleted (docs/models.md "Placement on demand")."""
    last_used: float | None = None
    expires_at: float | None = None
    """Unix seconds: its last request's start or end, and when it goes once idle (None: never)."""
    pinned: bool = False
    on_demand: bool = False
