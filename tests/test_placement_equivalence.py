"""Placement places exactly as recorded: the hashes of every placement and preview of 600
random clusters (``tests.support.rules.placement_clusters``) match ``tests/data/placement_hashes.json``,
written by ``scripts/record_placement_hashes.py``. A reorganisation of placement keeps them;
a change of placement's behaviour re-records them on purpose (docs/architecture.md#rules)."""

from __future__ import annotations

import json
from pathlib import Path

from master.placement.place import PlacementError, place_instance, placement_previews
from tests.support.rules.placement_clusters import clusters, outcome_hashes

DATA = Path(__file__).parent / "data" / "placement_hashes.json"


def test_placements_and_previews_hash_as_recorded() -> None:
    recorded = json.loads(DATA.read_text())
    assert recorded["count"] >= 500 and len(recorded["hashes"]) == recorded["count"]
    drawn = clusters(recorded["count"], recorded["seed"])
    differ = [
        i for i, (cluster, want) in enumerate(zip(drawn, recorded["hashes"], strict=True))
        if outcome_hashes(cluster, place_instance, placement_previews, PlacementError) != want
    ]
    assert differ == [], f"{len(differ)} of {len(drawn)} clusters place differently, first: {differ[:10]}"


def test_the_clusters_are_drawn_the_same_every_time() -> None:
    first, again = clusters(5, 7), clusters(5, 7)
    assert [(c.state, c.card, c.required) for c in first] == [(c.state, c.card, c.required) for c in again]
    assert first != clusters(5, 8)
