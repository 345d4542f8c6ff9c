"""What a node observes of its own work: a runner's engine figures (``EngineStats``, sent
with every runner heartbeat) and the record of one finished request (``RequestRecord``, one
log line and one JSONL line each; docs/operations.md)."""

from __future__ import annotations

import msgspec


class EngineStats(msgspec.Struct, frozen=True):
    """A runner's engine at one moment (counts; tokens; bytes). Counters (``*_total``) are
    cumulative since the runner started.

    ``queued``: requests waiting for a batch row; ``batch_rows``/``batch_limit``: sequences
    being served (prefilling or decoding) and ``--max-batch``; ``kv_tokens``: tokens of KV
    the batch holds now; ``kv_capacity_tokens``: what it may hold (None: no memory check);
    ``kv_bytes_per_token``: this rank's KV bytes per token (0: unknown), so bytes = tokens ×
    it; ``cache_tokens``/``cache_bound_tokens``: the prompt cache's tokens held and bound
    (0: off); ``cache_hits_total``/``cache_misses_total``: requests that did / did not
    reuse a cached prefix; ``reused_tokens_total``: prompt tokens not prefilled thanks to
    it; ``prefilled_tokens_total``: prompt tokens fed through the model;
    ``generated_tokens_total``: tokens sampled for requests; ``draft_proposed_total`` /
    ``draft_accepted_total``: speculative decoding's drafted tokens verified / accepted
    (``worker/engine/spec/``; accepted ones are part of ``generated_tokens_total``). The prompt
    cache's disk tier (docs/architecture.md "Prompt cache disk tier"):
    ``cache_disk_bytes``/``cache_disk_blocks`` on disk now, ``cache_disk_hits_total`` (of
    ``cache_hits_total``, those read back from disk), ``cache_restored_tokens_total`` (prompt
    tokens reused from them), ``cache_disk_rejected_total`` (blocks deleted for failing a
    check) and ``cache_disk_writable`` (False once a write failed: the tier stopped writing).
    """

    queued: int = 0
    batch_rows: int = 0
    batch_limit: int = 1
    kv_tokens: int = 0
    kv_capacity_tokens: int | None = None
    kv_bytes_per_token: int = 0
    cache_tokens: int = 0
    cache_bound_tokens: int = 0
    cache_hits_total: int = 0
    cache_misses_total: int = 0
    reused_tokens_total: int = 0
    prefilled_tokens_total: int = 0
    generated_tokens_total: int = 0
    cache_disk_bytes: int = 0
    cache_disk_blocks: int = 0
    cache_disk_hits_total: int = 0
    cache_restored_tokens_total: int = 0
    cache_disk_rejected_total: int = 0
    cache_disk_writable: bool = True
    draft_proposed_total: int = 0
    draft_accepted_total: int = 0


class RequestRecord(msgspec.Struct, frozen=True, omit_defaults=False):
    """One finished request, as its API node saw it (times in seconds, Unix time for
    ``started``).

    ``request_id``: the request's first task id; ``family``: the API family; ``status``:
    the HTTP status answered (499: the client went away first); ``outcome``: a short word
    (complete, streamed, error, refused, disconnected); ``instance``/``nodes``: where its
    last task ran; ``prompt_tokens``/``cached_tokens``/``completion_tokens``: the runner's
    counts (``cached_tokens``: prompt tokens reused from the prompt cache); ``ttft``: from
    the request's arrival to its first token; ``decode_tps``: completion tokens per second
    after the first; ``moves``: times it moved after a failure; ``key_id``: a short digest
    of the API key it presented (never the key; None without keys); ``route``: why the
    master chose its instance; ``prompt``/``output``: only when the node logs them
    (``--log-request-text``); ``kind``: the kind of work asked (``exo_p2p.types.TaskKind``:
    ``generate``, ``embed``, ``rerank``; records from before kinds are generations);
    ``draft_proposed``/``draft_accepted``: speculative decoding's drafted tokens verified and
    accepted for its last task (``worker/engine/spec/``; 0 when it did not draft).

    What the TTFT is made of (docs/operations.md): ``routed``, from the request's arrival to
    the master's answer naming its instance (the command's round trip and the log's commit);
    ``runner_ttft``, from the task's arrival at its runner's engine to its first token, of
    which ``runner_queued`` waiting in the engine's queue (the rest prefills the part of the
    prompt not cached, with the group it joined). ``ttft − routed − runner_ttft`` is the
    task's way to the runner (the log, the worker, the pipe) and its first token's way back.
    The runner's times are of its last task (a moved request's continuation).
    """

    request_id: str
    family: str
    model: str
    status: int
    outcome: str
    started: float
    duration: float
    instance: str | None = None
    nodes: tuple[str, ...] = ()
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft: float | None = None
    decode_tps: float | None = None
    moves: int = 0
    key_id: str | None = None
    route: str | None = None
    routed: float | None = None
    runner_ttft: float | None = None
    runner_queued: float | None = None
    prompt: str | None = None
    output: str | None = None
    kind: str = "generate"
    draft_proposed: int = 0
    draft_accepted: int = 0
