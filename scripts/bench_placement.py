"""Time placement and previews on synthetic clusters of 8, 16, 32 and 64 nodes.

Shapes: ``mesh`` (every node reaches every other over Ethernet) and ``sparse`` (a two-way
ring plus ``n`` random extra one-way edges; mixed Thunderbolt/Ethernet/Wi-Fi links). Node
memory is random 16..192 GiB (seeded); two instances already run on the first nodes. The
model is a 64-layer card of ``--model-gib`` GiB (default 400: needs several nodes).

Prints, per shape and size, the median over ``--repeat`` runs of one ``place_instance``
(pipeline, min_nodes=1) and of one ``placement_previews`` (pipeline and tensor, world sizes
1..n), in milliseconds. Target: placement and previews <= 50 ms each at 64 nodes (tests/test_placement.py bounds it).

    python scripts/bench_placement.py [--repeat 5] [--model-gib 400] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exo_p2p.types import Instance, ModelCard, NodeProfile, ShardMetadata, State, TopologyEdge  # noqa: E402
from master.placement.place import PlacementError, place_instance, placement_previews  # noqa: E402

GIB = 1 << 30
KINDS = ("thunderbolt", "ethernet", "wifi")


def make_card(total_gib: float, n_layers: int = 64) -> ModelCard:
    """A 64-layer synthetic card with equal layers, 1% embedding, untied 1% head."""
    total = int(total_gib * GIB)
    emb = total // 100
    layer = (total - 2 * emb) // n_layers
    return ModelCard(
        model_id="bench", n_layers=n_layers, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
        vocab_size=128000, context_length=8192, storage_size=layer * n_layers + 2 * emb,
        layer_bytes=(layer,) * n_layers, embedding_bytes=emb, head_bytes=emb, norm_bytes=0, tie_word_embeddings=False,
    )


def make_state(n: int, shape: str, seed: int) -> State:
    """A cluster of ``n`` nodes of the given shape (see module docstring)."""
    rng = random.Random(seed * 1000 + n)
    ids = [f"node{i:03d}" for i in range(n)]
    nodes = {}
    for i, nid in enumerate(ids):
        total = rng.randint(16, 192) * GIB
        nodes[nid] = NodeProfile(nid, f"boot-{nid}", f"host-{i}", total, total - rng.randint(0, 8) * GIB, models=("bench",))
    edges: dict[str, dict[str, TopologyEdge]] = {nid: {} for nid in ids}

    def add(a: int, b: int, kind: str) -> None:
        edges[ids[a]][ids[b]] = TopologyEdge(ids[a], ids[b], f"10.{b // 250}.{b % 250}.1", kind)  # type: ignore[arg-type]

    if shape == "mesh":
        for a in range(n):
            for b in range(n):
                if a != b:
                    add(a, b, "ethernet")
    else:
        for a in range(n):
            kind = rng.choice(KINDS)
            add(a, (a + 1) % n, kind)
            add((a + 1) % n, a, kind)
        for _ in range(n):
            a, b = rng.sample(range(n), 2)
            add(a, b, rng.choice(KINDS))
    instances = {}
    for k in range(2):
        shard = ShardMetadata(ids[k], f"old{k}-r0", 0, 1, 0, 1, 1, 1, f"boot-{ids[k]}", "")
        instances[f"old{k}"] = Instance(f"old{k}", "other", "pipeline", (shard,))  # type: ignore[arg-type]
    return State(nodes=nodes, edges=edges, instances=instances)  # type: ignore[arg-type]


def timed(fn, repeat: int) -> tuple[float, object]:
    """Median wall time of ``fn()`` in ms over ``repeat`` runs, and its last result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            result = fn()
        except PlacementError as exc:
            result = exc
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--model-gib", type=float, default=400.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    card = make_card(args.model_gib)
    print(f"model {args.model_gib} GiB, 64 layers; median of {args.repeat} runs")
    print(f"{'shape':7} {'nodes':>5} {'place ms':>9} {'preview ms':>11}  result")
    for shape in ("mesh", "sparse"):
        for n in (8, 16, 32, 64):
            state = make_state(n, shape, args.seed)
            place_ms, inst = timed(lambda: place_instance(state, card), args.repeat)
            prev_ms, previews = timed(lambda: placement_previews(state, card), args.repeat)
            if isinstance(inst, Instance):
                what = f"{inst.world_size} ranks: " + "/".join(str(s.end_layer - s.start_layer) for s in inst.shards) + " layers"
            else:
                what = f"error: {inst}"
            ok = sum(1 for p in previews if getattr(p, "instance", None) is not None) if isinstance(previews, list) else 0
            print(f"{shape:7} {n:>5} {place_ms:>9.1f} {prev_ms:>11.1f}  {what}; {ok} previews place")


if __name__ == "__main__":
    main()
