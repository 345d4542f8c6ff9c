"""The cluster-wide bound on request text held in State (docs/architecture.md#log-guarantees).

Every unfinished generation's ``GenerationParams`` (its prompt, messages, stop strings, tools)
sits in State on every node until the task ends, and State travels whole as a snapshot to a
node that joins or falls behind. The API bounds one request (``exo_p2p.api.bounds``,
128 KiB as a command) and the master bounds each instance's queue (``--queue-limit``), but
many instances' queues together could still grow State toward the 64 MiB frame a snapshot
travels in. So the master also refuses (429, ``code="cluster_busy"``) a generation that would
bring the text of all unfinished generations past ``IN_FLIGHT_BYTES_LIMIT``.

The size counted is the text's UTF-8 bytes (``params_bytes``), not the encoded bytes: cheap to
sum over every task at each submission, and within a small factor of the encoded size.
"""

from __future__ import annotations

from exo_p2p.types import EmbeddingParams, GenerationParams, ImageParams, RerankParams, State
from exo_p2p.types.tasks import FINISHED_TASK_STATUSES

IN_FLIGHT_BYTES_LIMIT = 16 * 1024 * 1024
"""Bytes of request text (prompts, messages, stop strings, tools) all unfinished generations
of the cluster may hold in State at once: 128 requests of the largest size, a quarter of the
frame a snapshot travels in."""

TOKEN_ID_BYTES = 4
"""Bytes one token id of an embedding or rerank input counts as in the in-flight bound
(a msgpack int of a vocabulary id takes up to 5 bytes)."""


def held_bytes(params: object) -> int | None:
    """Bytes an embedding's or a rerank's inputs count as in flight (``TOKEN_ID_BYTES`` per
    token id); None for other parameters (``params_bytes`` counts a
    generation's text)."""
    if isinstance(params, EmbeddingParams):
        return TOKEN_ID_BYTES * sum(len(i) for i in params.inputs)
    if isinstance(params, RerankParams):
        return TOKEN_ID_BYTES * (len(params.query) + sum(len(d) for d in params.documents))
    if isinstance(params, ImageParams):  # its prompt, and an edit's input image
        return len(params.prompt.encode()) + len(params.image or b"")
    return None


def params_bytes(params: GenerationParams | object) -> int:
    """UTF-8 bytes of the text ``params`` carries (an embedding's or a rerank's token ids:
    ``held_bytes``): the prompt, every message's content,
    reasoning and tool calls' arguments, the stop strings and the tools' JSON. Pure."""
    if not isinstance(params, GenerationParams):
        return held_bytes(params) or 0
    size = len((params.prompt or "").encode()) + len((params.tools or "").encode())
    size += sum(len(s.encode()) for s in params.stop)
    for m in params.messages:
        size += len(m.content.encode()) + len((m.reasoning or "").encode())
        size += sum(len(c.arguments.encode()) + len(c.name) for c in m.tool_calls)
    return size


def in_flight_bytes(state: State) -> int:
    """``params_bytes`` summed over the unfinished generations in ``state``. Pure."""
    return sum(params_bytes(r.task.params) for r in state.tasks.values() if r.status not in FINISHED_TASK_STATUSES)


def busy_refusal(state: State, params: GenerationParams, limit: int | None = None) -> str | None:
    """None when a generation with ``params`` may join the unfinished ones in ``state``
    within ``limit`` bytes of text (None: ``IN_FLIGHT_BYTES_LIMIT``), else the 429 message.
    A request alone larger than the limit is not refused here (the API's per-request bound
    is far below it)."""
    limit = IN_FLIGHT_BYTES_LIMIT if limit is None else limit
    held = in_flight_bytes(state)
    if held == 0 or held + params_bytes(params) <= limit:
        return None
    return (f"cluster busy: the requests in flight hold {held // 1024} KiB of text, and this one would pass the cluster's "
            f"bound of {limit // (1024 * 1024)} MiB (every request is held by every node until it ends); retry later")
