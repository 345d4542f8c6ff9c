"""Memory admission: refuse a generation whose prompt would not fit in a rank's free memory
(a prompt within the context can still exceed it), before its task is created — so before any prefill.

A rank needs, for a prompt of ``T`` tokens prefilled in chunks of ``C`` tokens:

    kv(T)          = T × kv_bytes_per_token(rank)           (its layers' K and V, all T)
    activations(C) = C × hidden × ACTIVATION_VECTORS × b     (residual, norms, q/k/v, MLP)
                   + C × T × heads(rank) × 4                 (attention scores, float32)
                   + C × vocab × 4  (last rank only: logits)

where ``kv_bytes_per_token(rank) = layers(rank) × kv_heads(rank) × head_dim × 2 (K and V) × b``
(with the instance's ``--kv-cache-bits`` 8 or 4, the quantized bytes: ``kv_bytes_per_token``;
the full-precision K and V a quantized prefill chunk computes are among the activations' q/k/v)
and ``b`` is bytes per activation element (4 on a rank holding float32 weights). A pipeline rank holds only its layers
``[start_layer, end_layer)``; a tensor rank holds every layer but ``kv_heads / world_size``
heads. The rank is admitted when that sum is ≤ its node's usable memory in State
(``master.placement.memory.usable_memory``: the reported available memory, already capped by
``--memory-limit``, and never more than the total minus the shares State places on the
node); a node that has not reported memory is admitted.

The master does not tokenize, so ``T`` is an upper bound (``prompt_token_bound``): every
token of a byte-level BPE (or a SentencePiece with byte fallback) covers at least one byte of
text, so the prompt's UTF-8 bytes plus the chat template's tokens bound it; it is capped at
the context length (a longer prompt is refused by the runner's context rule anyway). The
bound over-estimates ordinary text about four-fold: a refusal here means the prompt *may*
not fit, which is the safe side of an allocation failure that would kill the runner.
"""

from __future__ import annotations

import msgspec

from exo_p2p.types import GenerationParams, Instance, ModelCard, NodeId, ShardMetadata, State
from master.placement.memory import usable_memory

DEFAULT_ACTIVATION_DTYPE_BYTES = 4
"""Bytes per activation / KV element when the card does not say (float32: the largest)."""

ACTIVATION_VECTORS = 16
"""Hidden-size vectors per prompt token alive at once in one layer's forward (residual,
norm, q, k, v, attention output, and the MLP's gate/up/product at ~4× hidden)."""

PREFILL_CHUNK_BOUND = 256
"""Prompt tokens per prefill step assumed (tokens) for an instance placed without settings
(``Instance.settings`` None, by a master that did not fix its ranks' ``prefill_chunk_size``):
its ranks use their own nodes' ``--prefill-chunk-size``, unknown here, so a generous bound."""

TEMPLATE_TOKENS = 64
"""Tokens a chat template adds besides the messages (tokens): a default system prompt and
the generation prompt (ChatML with SmolLM2's default system prompt is ~30)."""

TOKENS_PER_MESSAGE = 8
"""Template tokens around each message besides its role (tokens): ``<|im_start|>``, the
newline, ``<|im_end|>`` and its newline in ChatML."""


class RankNeed(msgspec.Struct, frozen=True):
    """What one rank needs for one prompt (bytes) against what its node has free."""

    rank: int
    node_id: NodeId
    kv_bytes: int
    activation_bytes: int
    free_bytes: int | None

    @property
    def need_bytes(self) -> int:
        return self.kv_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.free_bytes is None or self.need_bytes <= self.free_bytes


def dtype_bytes(card: ModelCard, shard: ShardMetadata | None = None) -> int:
    """Bytes per activation / KV-cache element of ``card`` on ``shard``: 4 on a shard whose
    runner holds float32 weights (``weights_dtype``; it computes in float32), else the
    card's field, else float32's 4."""
    if shard is not None and shard.weights_dtype == "float32":
        return 4
    return card.activation_dtype_bytes or DEFAULT_ACTIVATION_DTYPE_BYTES


def head_dim(card: ModelCard) -> int:
    """Elements per attention head: the card's ``head_dim``, else ``hidden // heads``."""
    if card.head_dim:
        return card.head_dim
    return card.hidden_size // max(1, card.num_attention_heads)


def kv_bytes_per_token(card: ModelCard, shard: ShardMetadata | None = None, sharding: str = "pipeline",
                       bits: int = 0) -> int:
    """KV-cache bytes one token adds on ``shard`` (the whole model when None):
    ``layers × kv_heads × 2 ×`` a vector's bytes — ``head_dim × dtype_bytes`` at full
    precision (``bits`` 0), else ``exo_p2p.models.kv_bytes.vector_bytes`` (the instance's
    ``--kv-cache-bits``: packed words plus a scale and a bias per group; a head size the
    quantized cache refuses is counted at full precision, the safe side). Pipeline: the
    shard's layers; tensor: every layer, ``ceil(kv_heads / world_size)`` heads."""
    from exo_p2p.models.kv_bytes import token_bytes

    layers, kv_heads = card.n_layers, card.num_key_value_heads
    if shard is not None:
        if sharding == "tensor":
            kv_heads = -(-kv_heads // max(1, shard.world_size))
        else:
            layers = shard.end_layer - shard.start_layer
    try:
        per_layer = token_bytes(kv_heads, head_dim(card), dtype_bytes(card, shard), bits)
    except ValueError:
        per_layer = token_bytes(kv_heads, head_dim(card), dtype_bytes(card, shard), 0)
    return layers * per_layer


def activation_bytes(
    card: ModelCard, prompt_tokens: int, shard: ShardMetadata | None = None, sharding: str = "pipeline", chunk_tokens: int = PREFILL_CHUNK_BOUND
) -> int:
    """Peak activation bytes of one prefill chunk on ``shard`` (the whole model when None):
    hidden vectors, float32 attention scores against all ``prompt_tokens``, and float32
    logits on the last rank (see the module docstring)."""
    chunk = max(0, min(chunk_tokens, prompt_tokens))
    heads = card.num_attention_heads
    last = True
    if shard is not None:
        last = shard.rank == shard.world_size - 1 or sharding == "tensor"
        if sharding == "tensor":
            heads = -(-heads // max(1, shard.world_size))
    hidden = chunk * card.hidden_size * ACTIVATION_VECTORS * dtype_bytes(card, shard)
    scores = chunk * prompt_tokens * heads * 4
    logits = chunk * card.vocab_size * 4 if last else 0
    return hidden + scores + logits


MAX_BYTES_PER_TOKEN = 64
"""No token of a byte-level BPE vocabulary of the models we serve is longer than this many
UTF-8 bytes (SmolLM2's longest is far shorter), so a prompt of more than ``context ×
MAX_BYTES_PER_TOKEN`` bytes cannot fit the context, whatever its tokens."""


def prompt_bytes(params: GenerationParams) -> int:
    """UTF-8 bytes of every message's content (and of a raw ``prompt``)."""
    raw = len(params.prompt.encode("utf-8", "surrogatepass")) if params.prompt is not None else 0
    return raw + sum(len(m.content.encode("utf-8", "surrogatepass")) for m in params.messages)


def oversized_prompt(params: GenerationParams, context_length: int) -> str | None:
    """Why the prompt surely exceeds ``context_length`` tokens without tokenizing it (more than
    ``MAX_BYTES_PER_TOKEN`` bytes per token of context), else None. The runner checks the
    exact token count; this bound keeps a multi-megabyte prompt from ever reaching a runner,
    whose tokenizer would be busy (and silent) for seconds (adversarial test: a 5 MB prompt
    got every rank of an instance killed by the 10 s silence bound)."""
    size = prompt_bytes(params)
    if size > context_length * MAX_BYTES_PER_TOKEN:
        return (f"the prompt is {size} bytes, more than the model's context of {context_length} tokens can hold "
                f"(at most {MAX_BYTES_PER_TOKEN} bytes a token); shorten it")
    return None


def prompt_token_bound(params: GenerationParams, context_length: int) -> int:
    """An upper bound of the prompt's tokens (see the module docstring): UTF-8 bytes of every
    message's role and content, ``TOKENS_PER_MESSAGE`` per message and ``TEMPLATE_TOKENS``
    (plus a resumed request's ``resume_tokens``: they are prefilled too, ``exo_p2p.api.generation.resume``), capped at
    ``context_length``."""
    total = TEMPLATE_TOKENS + len(params.resume_tokens)
    if params.prompt is not None:
        total += len(params.prompt.encode("utf-8", "surrogatepass"))
    for message in params.messages:
        total += TOKENS_PER_MESSAGE + len(message.role.encode()) + len(message.content.encode("utf-8", "surrogatepass"))
    return min(total, context_length)


def rank_needs(state: State, instance: Instance, card: ModelCard, prompt_tokens: int, chunk_tokens: int = PREFILL_CHUNK_BOUND) -> list[RankNeed]:
    """Per rank of ``instance``: estimated bytes for a prompt of ``prompt_tokens`` tokens and
    its node's usable memory from State (``usable_memory``; None when not reported)."""
    out = []
    bits = instance.settings.kv_cache_bits if instance.settings is not None else 0
    for shard in instance.shards:
        out.append(
            RankNeed(
                rank=shard.rank,
                node_id=shard.node_id,
                kv_bytes=prompt_tokens * kv_bytes_per_token(card, shard, instance.sharding, bits),
                activation_bytes=activation_bytes(card, prompt_tokens, shard, instance.sharding, chunk_tokens),
                free_bytes=usable_memory(state, shard.node_id),
            )
        )
    return out


def memory_refusal(state: State, instance: Instance, card: ModelCard, params: GenerationParams | int) -> str | None:
    """None when every rank of ``instance`` has the memory for ``params``' prompt (or for a
    prefill of ``params`` tokens: ``master.task_kinds.prefill_tokens``); else the
    out-of-memory message for the first rank that has not (sizes in bytes and MiB). An
    embedding's or a rerank's prefill counts its KV cache too: a chunked prefill holds it
    until the row is pooled."""
    tokens = params if isinstance(params, int) else prompt_token_bound(params, card.context_length)
    chunk = instance.settings.prefill_chunk_size if instance.settings is not None else PREFILL_CHUNK_BOUND
    for need in rank_needs(state, instance, card, tokens, chunk):
        if not need.fits:
            return (
                f"out of memory: the prompt (up to {tokens} tokens) needs an estimated {need.need_bytes} bytes "
                f"({_mib(need.need_bytes)}: KV cache {need.kv_bytes}, activations {need.activation_bytes}) on rank {need.rank} "
                f"(node {need.node_id}), which has {need.free_bytes} bytes ({_mib(need.free_bytes or 0)}) free; "
                "shorten the prompt or free memory on that node"
            )
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
