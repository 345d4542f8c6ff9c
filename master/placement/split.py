"""How one cycle's ranks share a model: pipeline layer split and tensor shares (docs/architecture.md#rules).

Pure arithmetic on integers (bytes, layers); no State. A rank's *share* is the bytes it loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from exo_p2p.types import ModelCard, Sharding


@dataclass(frozen=True)
class RankShare:
    """One rank's part: layers ``[start_layer, end_layer)``, the weights its runner holds
    (``weights_dtype``: ``"stored"`` or ``"float32"``) and ``share_bytes`` it loads, in
    those weights' bytes."""

    start_layer: int
    end_layer: int
    share_bytes: int
    weights_dtype: str = "stored"


WEIGHT_POLICIES = ("auto", "float32", "stored")
"""A node's ``cpu_weights`` (its profile): what its runners may hold."""


def headroom_bytes(share: int) -> int:
    """Bytes a node must offer to hold ``share`` bytes with the 10% headroom rule:
    ``ceil(1.1 × share)`` in integers (the same rule as a cycle's ``required_bytes``)."""
    return -(-share * 11 // 10)


def effective_policies(card: ModelCard, policies: list[str] | None, world: int) -> list[str]:
    """Per rank, the policy placement applies: the node's ``cpu_weights`` (None: all
    ``"stored"``, as nodes from before the setting), ``"stored"`` when the card has no
    float32 sizes (``ModelCard.expandable``) or the policy is unknown."""
    if policies is None:
        return ["stored"] * world
    if len(policies) != world:
        raise ValueError(f"{len(policies)} weight policies for {world} ranks")
    if not card.expandable:
        return ["stored"] * world
    return [p if p in WEIGHT_POLICIES else "stored" for p in policies]


@dataclass(frozen=True)
class Overflow:
    """Why a cycle cannot hold the model: ``rank`` needs ``need`` bytes but has ``have``."""

    rank: int
    need: int
    have: int


def non_layer_bytes_of_rank(card: ModelCard, rank: int, world_size: int, sharding: Sharding) -> int:
    """Bytes of non-layer tensors rank ``rank`` loads.

    Pipeline: a single rank loads all of them once (embedding, norm, head — a tied head is the
    embedding, loaded once), so its share is the whole model; with several ranks the first
    loads the embedding, the last the final norm and the head (the embedding again when
    tied), the others none. Tensor: every rank loads all non-layer tensors whole (they are
    not sharded).
    """
    if sharding == "tensor" or world_size == 1:
        return card.non_layer_bytes
    extra = card.shared_bytes  # held by every pipeline rank (an image model's: docs/images.md#pipeline)
    if rank == 0:
        extra += card.first_rank_extra_bytes()
    if rank == world_size - 1:
        extra += card.last_rank_extra_bytes()
    return extra


def split_layers(n_layers: int, weights: list[int]) -> list[int] | None:
    """Layer counts per rank, in proportion to ``weights`` (bytes), each rank >= 1 layer.

    Largest remainder, exact integer arithmetic: rank r's quota is ``n * weights[r] / sum``;
    ranks whose quota is below one layer get exactly one and the others share the rest again
    in proportion; then each rank gets the floor of its quota and the layers left go one each
    to the largest remainders (ties to the lower rank). Negative weights count as 0; when all
    are 0 the split is equal. None when there are fewer layers than ranks.
    """
    ranks = len(weights)
    if ranks == 0 or n_layers < ranks:
        return None
    weights = [max(0, x) for x in weights]
    counts = [0] * ranks
    active = list(range(ranks))
    layers = n_layers
    while True:
        total = sum(weights[r] for r in active)
        if total == 0:
            weights = [1] * ranks
            total = len(active)
        small = [r for r in active if layers * weights[r] < total]
        if not small:
            break
        for r in small:
            counts[r] = 1
        layers -= len(small)
        active = [r for r in active if r not in small]
    remainders = []
    for r in active:
        counts[r], rem = divmod(layers * weights[r], total)
        remainders.append((-rem, r))
    left = layers - sum(counts[r] for r in active)
    for _, r in sorted(remainders)[:left]:
        counts[r] += 1
    return counts


def _pipeline_split(card: ModelCard, usable: list[int], dtypes: list[str]) -> list[RankShare] | None:
    """Pipeline shares for fixed per-rank weights (no fit check), None when the model has
    fewer layers than ranks. Layers are split in proportion to each rank's capacity: its
    usable bytes left after its non-layer tensors, in stored-weight bytes (a float32 rank's
    bytes scaled by stored ÷ float32 layer bytes), so with every rank stored the split is in
    proportion to the usable bytes left, as before float32 ranks existed."""
    world = len(usable)
    cards = [card.sized_for(d) for d in dtypes]
    stored_layers = max(1, sum(card.layer_bytes))
    weights = []
    for r in range(world):
        left = usable[r] - non_layer_bytes_of_rank(cards[r], r, world, "pipeline") - (card.work_bytes if r == 0 else 0)
        weights.append(left if dtypes[r] == "stored" else left * stored_layers // max(1, sum(cards[r].layer_bytes)))
    counts = split_layers(card.n_layers, weights)
    if counts is None:
        return None
    shares: list[RankShare] = []
    start = 0
    for r, n in enumerate(counts):
        share = non_layer_bytes_of_rank(cards[r], r, world, "pipeline") + sum(cards[r].layer_bytes[start : start + n])
        share += card.work_bytes if r == 0 else 0  # rank 0's working memory (an image model's decode)
        shares.append(RankShare(start, start + n, share, dtypes[r]))
        start += n
    return shares


def pipeline_shares(card: ModelCard, usable: list[int], policies: list[str] | None = None) -> list[RankShare] | Overflow:
    """Pipeline shares of ranks with ``usable`` bytes (rank order), contiguous in rank order
    (split: ``_pipeline_split``). ``policies`` per rank (``effective_policies``): a
    ``"float32"`` rank holds float32, a ``"stored"`` rank the stored weights, an ``"auto"``
    rank float32 while its float32 share fits its usable bytes with headroom
    (``headroom_bytes``), else stored — decided by splitting with every auto rank in float32,
    moving the auto ranks that do not fit to stored, and splitting again until none moves (at
    most one round per rank). Returns ``Overflow`` (the first rank whose share exceeds its
    usable bytes, or rank -1 when the model has fewer layers than ranks)."""
    world = len(usable)
    policies = effective_policies(card, policies, world)
    dtypes = ["stored" if p == "stored" else "float32" for p in policies]
    for _ in range(world + 1):
        shares = _pipeline_split(card, usable, dtypes)
        if shares is None:
            return Overflow(-1, card.n_layers, world)
        moved = [r for r, sh in enumerate(shares)
                 if policies[r] == "auto" and dtypes[r] == "float32" and headroom_bytes(sh.share_bytes) > usable[r]]
        if not moved:
            break
        for r in moved:
            dtypes[r] = "stored"
    for r, sh in enumerate(shares):
        # a card with working memory (an image model) needs the 10% headroom on every rank:
        # its storage size, which the cycle's total is checked against, leaves out that memory
        # and the bytes every rank holds again (docs/images.md#placement)
        need = headroom_bytes(sh.share_bytes) if card.work_bytes else sh.share_bytes
        if need > usable[r]:
            return Overflow(r, need, usable[r])
    return shares


def tensor_divisibility_problem(card: ModelCard, world_size: int) -> str | None:
    """Why ``card`` cannot be tensor-sharded over ``world_size`` ranks, or None if it can:
    attention heads, kv heads, hidden size and MLP width (when the card knows it) must all
    divide by ``world_size``; for a quantized model each rank's slice of the hidden size and
    of the MLP width (the input dimension of its sharded o_proj and down_proj) must also be a
    whole number of quantization groups (mlx-lm's shard cannot split a group)."""
    counts = [
        (card.num_attention_heads, "heads"),
        (card.num_key_value_heads, "kv heads"),
        (card.hidden_size, "hidden size"),
    ]
    if card.intermediate_size:
        counts.append((card.intermediate_size, "MLP width (intermediate size)"))
    for count, what in counts:
        if count % world_size:
            return f"tensor sharding needs {count} {what} divisible by {world_size}"
    group = card.quant_group_size
    if group:
        for count, what in counts[2:]:
            if (count // world_size) % group:
                return (f"tensor sharding over {world_size} ranks splits the {what} {count} into slices of "
                        f"{count // world_size}, not a multiple of the quantization group size {group}")
    return None


def tensor_share_bytes(card: ModelCard, world_size: int) -> int:
    """Bytes every tensor rank loads: ``ceil(sum(layer_bytes) / world_size)`` of the layers plus
    all non-layer tensors (the same on every rank)."""
    return -(-sum(card.layer_bytes) // world_size) + non_layer_bytes_of_rank(card, 0, world_size, "tensor")


def tensor_shares(card: ModelCard, usable: list[int], policies: list[str] | None = None) -> list[RankShare] | Overflow:
    """Tensor shares (``tensor_share_bytes`` of the rank's weights, all layers). ``policies``
    as in ``pipeline_shares``: an ``"auto"`` rank holds float32 when its float32 share fits
    its usable bytes with headroom, else stored. ``Overflow`` names the first rank that does
    not fit its usable bytes."""
    world = len(usable)
    policies = effective_policies(card, policies, world)
    stored = tensor_share_bytes(card, world)
    expanded = tensor_share_bytes(card.sized_for("float32"), world) if card.expandable else stored
    shares: list[RankShare] = []
    for r, have in enumerate(usable):
        dtype = policies[r]
        if dtype == "auto":
            dtype = "float32" if headroom_bytes(expanded) <= have else "stored"
        share = expanded if dtype == "float32" else stored
        if share > have:
            return Overflow(r, share, have)
        shares.append(RankShare(0, card.n_layers, share, dtype))
    return shares
