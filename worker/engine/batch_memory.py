"""Memory-checked joins: whether a sequence may join a runner's continuous batch.

A sequence joins the batch only when the KV cache it can grow to fits beside the batch's
within the runner's KV budget; otherwise it waits in the queue, and a sequence that could
never fit (not even alone) is refused at once with the out-of-memory 503.

Sizes are in **tokens of KV** (one token = its K and V in every layer of this rank), so the
rule is the same on every rank of an instance: every rank holds the same rows with the same
token counts (they are decided by the agreed requests and the shared tokens), and the
capacity is the smallest of the ranks' capacities, agreed once at warm-up (``min`` of an
all-gather). Decisions are therefore identical on every rank without a round of their own.

The model of the batch's KV (``peak_batch_tokens``) is the layout mlx-lm's left-padded
``BatchKVCache`` holds: ``B`` rows of one common buffer length — the longest row's tokens
plus less than ``KV_STEP`` tokens of room (the buffer grows by ``KV_STEP`` from where it is
full). A row ``i`` holds ``used_i`` tokens now and may add ``remaining_i``
more (its token budget: ``max_tokens`` clamped to the context, so ``used + remaining`` is at
most the context). In the worst case every row runs its full budget; at ``s`` steps from now
the rows still there are those with ``remaining_i ≥ s`` and the buffer is as long as their
longest (the cache trims the padding left of them when a row leaves), so

    peak = max over s of  |{i : r_i ≥ s}| × (max{u_i : r_i ≥ s} + s + KV_STEP − 1)

and the maximum is reached at some ``s = r_j``. Rows that end early only lower it. Transient
copies while the buffer grows are not counted: they are the budget's headroom.

The budget (bytes) is what the runner's node can give to KV (``RunnerSetup.kv_budget_bytes``,
see ``worker.worker``) less the prompt cache's bound; ``capacity_tokens`` turns it into tokens
with this rank's ``kv_bytes_per_token``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

KV_STEP = 256
"""Tokens the batch's KV buffer grows by (mlx-lm ``BatchKVCache.step``)."""

Verdict = Literal["join", "wait", "never"]


@dataclass(frozen=True)
class RowKV:
    """One sequence's KV in tokens: ``used`` held now, ``remaining`` it may still add."""

    used: int
    remaining: int


def peak_batch_tokens(rows: Sequence[RowKV], step: int = KV_STEP) -> int:
    """Largest KV (tokens, padding included) a left-padded batch of ``rows`` can reach if
    every row runs its whole budget (see the module docstring); 0 for no rows."""
    peak = 0
    for s in sorted({r.remaining for r in rows} | {0}):
        alive = [r for r in rows if r.remaining >= s]
        if not alive:
            continue
        peak = max(peak, len(alive) * (max(r.used for r in alive) + s + step - 1))
    return peak


def join_verdict(candidate: RowKV, batch: Sequence[RowKV], capacity: int | None, step: int = KV_STEP) -> Verdict:
    """Whether ``candidate`` may join ``batch`` now with ``capacity`` tokens of KV (None:
    unbounded): "join" when the batch with it stays within capacity, "never" when it does
    not fit even alone, else "wait" (it fits once rows have left)."""
    if capacity is None:
        return "join"
    if peak_batch_tokens([candidate], step) > capacity:
        return "never"
    if peak_batch_tokens([*batch, candidate], step) <= capacity:
        return "join"
    return "wait"


def capacity_tokens(budget_bytes: int | None, prompt_cache_bytes: int, kv_bytes_per_token: int) -> int | None:
    """Tokens of batch KV a budget of ``budget_bytes`` holds beside a prompt cache of
    ``prompt_cache_bytes`` (None budget: unbounded, None)."""
    if budget_bytes is None or kv_bytes_per_token <= 0:
        return None
    return max(0, budget_bytes - prompt_cache_bytes) // kv_bytes_per_token


def kv_layout(model: Any) -> list[tuple[int, int, int]]:
    """Per layer of this rank's part of ``model`` (an mlx-lm model whose ``model.layers`` are
    this rank's; a tensor rank's attention holds its share of the heads): ``(kv_heads,
    head_dim, b)``, ``b`` the bytes of the K projection's output (its weight's dtype; a
    quantized one's scales'). Empty when the layout is unknown."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None) or getattr(model, "layers", None) or []
    out = []
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        heads = getattr(attn, "n_kv_heads", None) or getattr(attn, "num_key_value_heads", None)
        dim = getattr(attn, "head_dim", None)
        if dim is None and attn is not None and hasattr(attn, "k_proj") and heads:
            weight = getattr(attn.k_proj, "weight", None)
            dim = None if weight is None else int(weight.shape[0]) // int(heads)
        proj = getattr(attn, "k_proj", None)
        like = getattr(proj, "scales", None)
        like = getattr(proj, "weight", None) if like is None else like
        if not heads or not dim or like is None:
            return []
        out.append((int(heads), int(dim), int(like.dtype.size)))
    return out


def model_kv_bytes_per_token(model: Any, bits: int = 0) -> int:
    """KV bytes one token adds on this rank's layers of ``model`` (``kv_layout``): Σ over
    layers of ``n_kv_heads × 2 (K and V) ×`` a vector's bytes at ``bits`` (0: full precision,
    ``head_dim × b``; quantized: ``exo_p2p.models.kv_bytes.vector_bytes``). 0 when the layout
    is unknown (then no memory check)."""
    from exo_p2p.models.kv_bytes import token_bytes

    return sum(token_bytes(heads, dim, b, bits) for heads, dim, b in kv_layout(model))


def model_head_dim(model: Any) -> int:
    """The head size of this rank's first layer (0 when unknown)."""
    layout = kv_layout(model)
    return layout[0][1] if layout else 0
