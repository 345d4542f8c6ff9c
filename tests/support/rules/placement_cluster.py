"""Cards and clusters for placement tests."""

from __future__ import annotations

from exo_p2p.types import Instance, ModelCard, NodeProfile, State, TopologyEdge


GIB = 1 << 30


def card(n_layers: int, total: int, *, model_id: str = "m", heads: int = 8, kv: int = 4, hidden: int = 64, emb: int = 0, tied: bool = False, layer_bytes: tuple[int, ...] | None = None) -> ModelCard:
    """A synthetic card: equal layers of ``total // n_layers`` bytes unless given."""
    layers = layer_bytes or (total // n_layers,) * n_layers
    head = 0 if tied else emb
    return ModelCard(
        model_id=model_id, n_layers=n_layers, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
        vocab_size=100, context_length=2048, storage_size=sum(layers) + emb + head, layer_bytes=layers,
        embedding_bytes=emb, head_bytes=head, norm_bytes=0, tie_word_embeddings=tied,
    )


def cluster(memory: list[tuple[int | None, int | None]], *, links: str = "full", kind: str = "ethernet", model: str = "m", instances: dict | None = None) -> State:
    """Nodes n0.. named node-a.. with (total, available) bytes, holding ``model``; ``full``
    links both ways between all, or ``ring`` n0→n1→...→n0 and back."""
    ids = [f"n{i}" for i in range(len(memory))]
    nodes = {nid: NodeProfile(nid, f"boot-{nid}", f"node-{chr(97 + i)}", t, a, models=(model,)) for i, (nid, (t, a)) in enumerate(zip(ids, memory))}  # type: ignore[arg-type]
    edges: dict = {}
    for i, a in enumerate(ids):
        for j, b in enumerate(ids):
            if a != b and (links == "full" or abs(i - j) in (1, len(ids) - 1)):
                edges.setdefault(a, {})[b] = TopologyEdge(a, b, f"10.0.{i}.{j}", kind)  # type: ignore[arg-type]
    return State(nodes=nodes, edges=edges, instances=instances or {})  # type: ignore[arg-type]


def layers(inst: Instance) -> list[int]:
    return [s.end_layer - s.start_layer for s in inst.shards]
