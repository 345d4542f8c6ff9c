"""Random clusters for the placement equivalence check (tests/test_placement_equivalence.py).

``clusters(count, seed)`` builds ``count`` clusters deterministically from ``seed`` with
``random.Random`` (no hypothesis: the same seed gives the same clusters on every run and
every Python, so a recorded hash stays comparable). Each cluster is a ``State`` and a
``ModelCard`` plus the required node names, drawn so that every path of placement is taken:
1 to 11 nodes (beyond ``EXACT_SEARCH_MAX_NODES`` the budgeted sweep), nodes without a
memory report, nodes that fetch (with and without free disk, from peers or a hub), other
files under the model's name, hosts of existing instances (the second memory mode), float32
weights, partial meshes of every interface type, measured link figures, tensor-shardable or
not, and unknown required names.

``outcome_hashes(state, card, required)`` is what is recorded: a 16-hex-digit sha256 of
every ``place_instance`` result (or error) over both shardings and every ``min_nodes``, and
one of the ``placement_previews`` list (or its error). Pure; no processes.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from exo_p2p.types import (
    HubSource,
    Instance,
    LinkFigures,
    ModelCard,
    NodeProfile,
    ShardMetadata,
    State,
    TopologyEdge,
)
from exo_p2p.types.manifest import HeldModel

GIB = 1 << 30
KINDS = ("thunderbolt", "ethernet", "wifi", "other", "loopback")
MODEL = "m"


@dataclass(frozen=True)
class Cluster:
    """One drawn cluster: the State, the card placed on it and the required node names."""

    state: State
    card: ModelCard
    required: tuple[str, ...]


def _card(rng: random.Random) -> ModelCard:
    n_layers = rng.choice((1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48))
    per = rng.randint(1, 12) * GIB // 16
    layers = tuple(per + rng.randint(0, per // 4) if rng.random() < 0.3 else per for _ in range(n_layers))
    emb = rng.choice((0, per // 2, per))
    tied = rng.random() < 0.5
    head = 0 if tied else emb
    heads = rng.choice((4, 6, 8, 12, 16))
    kv = rng.choice([k for k in (1, 2, 3, 4, 8) if heads % k == 0])
    f32 = rng.random() < 0.3
    return ModelCard(
        model_id=MODEL, n_layers=n_layers, hidden_size=rng.choice((64, 128, 4096)), num_attention_heads=heads,
        num_key_value_heads=kv, vocab_size=100, context_length=2048, storage_size=sum(layers) + emb + head + 16,
        layer_bytes=layers, embedding_bytes=emb, head_bytes=head, norm_bytes=16, tie_word_embeddings=tied,
        architecture=rng.choice(("llama", "llama", "llama", "qwen2", "gemma3_text")), supports_tensor=rng.random() < 0.7,
        intermediate_size=rng.choice((None, 256, 384)), quant_group_size=rng.choice((None, None, 64)),
        float32_layer_bytes=tuple(2 * b for b in layers) if f32 else (),
        float32_embedding_bytes=2 * emb if f32 else 0, float32_head_bytes=2 * head if f32 else 0,
        float32_norm_bytes=32 if f32 else 0,
    )


def _profile(rng: random.Random, i: int, node: str, card: ModelCard) -> NodeProfile:
    total = rng.randint(1, 64) * GIB // 2 if rng.random() > 0.05 else None
    available = None if total is None or rng.random() < 0.03 else rng.randint(total // 4, total)
    holds = rng.random() < 0.7
    held: tuple[HeldModel, ...] = ()
    if holds and rng.random() < 0.6:
        held = (HeldModel(MODEL, "digest-b" if rng.random() < 0.1 else "digest-a"),)
    elif not holds and rng.random() < 0.2:
        held = (HeldModel(MODEL, "digest-a", complete=rng.random() < 0.5),)
    disk = rng.choice((None, 0, card.storage_size // 3, card.storage_size, 4 * card.storage_size))
    name = f"node-{chr(97 + i)}" if rng.random() < 0.9 else "twin"
    return NodeProfile(
        node, f"boot-{node}", name, total, available, models=(MODEL,) if holds else (),  # type: ignore[arg-type]
        cpu_weights="float32" if rng.random() < 0.15 else "stored", held_models=held, models_disk_free=disk,
    )


def _edges(rng: random.Random, ids: list[str]) -> tuple[dict, dict]:
    density = rng.choice((0.4, 0.7, 1.0, 1.0))
    edges: dict = {}
    links: dict = {}
    for i, a in enumerate(ids):
        for j, b in enumerate(ids):
            if a == b or rng.random() > density:
                continue
            address = f"10.{i}.{j}.1" if rng.random() > 0.03 else "no-ip-here"
            edges.setdefault(a, {})[b] = TopologyEdge(a, b, address, rng.choice(KINDS))  # type: ignore[arg-type]
            if rng.random() < 0.3:
                figures = [LinkFigures(address, rng.randint(50, 20_000), rng.choice((None, 10**6, 10**8, 10**10)))]
                if rng.random() < 0.3:
                    figures.append(LinkFigures(f"10.99.{i}.{j}", rng.randint(50, 20_000), rng.choice((None, 10**9))))
                links.setdefault(a, {})[b] = {f.address: f for f in figures}
    return edges, links


def _instances(rng: random.Random, ids: list[str]) -> dict:
    out: dict = {}
    for k in range(rng.choice((0, 0, 1, 2))):
        node = rng.choice(ids)
        shard = ShardMetadata(node, f"old{k}-r0", 0, 1, 0, 1, 1, rng.randint(1, 8) * GIB, f"boot-{node}", "10.9.9.9:52000")  # type: ignore[arg-type]
        out[f"old{k}"] = Instance(f"old{k}", "other", "pipeline", (shard,))  # type: ignore[arg-type]
    return out


def draw_cluster(rng: random.Random) -> Cluster:
    """One random cluster (module docstring)."""
    card = _card(rng)
    count = rng.choice((1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8, 9, 11))
    ids = [f"n{i}" for i in range(count)]
    nodes = {nid: _profile(rng, i, nid, card) for i, nid in enumerate(ids)}
    edges, links = _edges(rng, ids)
    hub = {MODEL: HubSource("org/m", "main", "digest-h")} if rng.random() < 0.3 else {}
    state = State(nodes=nodes, edges=edges, links=links, instances=_instances(rng, ids), hub_models=hub)  # type: ignore[arg-type]
    required: tuple[str, ...] = ()
    if rng.random() < 0.25:
        required = tuple(rng.sample([p.friendly_name for p in nodes.values()] + ["n0", "nope"], k=rng.randint(1, 2)))
    return Cluster(state, card, required)


def clusters(count: int, seed: int) -> list[Cluster]:
    """``count`` clusters drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    return [draw_cluster(rng) for _ in range(count)]


def _digest(value: object) -> str:
    return hashlib.sha256(msgspec.json.encode(value)).hexdigest()[:16]


def _outcome(call: Callable[[], object], error: type[Exception]) -> object:
    try:
        return call()
    except error as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def outcome_hashes(cluster: Cluster, place: Callable, previews: Callable, error: type[Exception]) -> list[str]:
    """[hash of every ``place(...)`` result, hash of ``previews(...)``] for ``cluster``.

    ``place``/``previews``/``error`` are ``place_instance``, ``placement_previews`` and
    ``PlacementError`` (passed in, so the same function hashes the code before and after a move).
    """
    state, card, nodes = cluster.state, cluster.card, cluster.required
    places = [
        _outcome(lambda: place(state, card, min_nodes=m, sharding=s, nodes=nodes, instance_id="eq"), error)
        for s in ("pipeline", "tensor")
        for m in range(1, len(state.nodes) + 1)
    ]
    return [_digest(places), _digest(_outcome(lambda: previews(state, card, nodes=nodes), error))]
