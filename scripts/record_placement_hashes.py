"""Record the placement equivalence data: hashes of every placement and preview of random clusters.

Draws ``--count`` clusters from ``tests.support.rules.placement_clusters.clusters(count, seed)`` and writes,
per cluster, the hash of every ``place_instance`` result and of its ``placement_previews``
(``tests.support.rules.placement_clusters.outcome_hashes``) to ``tests/data/placement_hashes.json``.
``tests/test_placement_equivalence.py`` recomputes them and fails on any difference, so a
change that only reorganises placement can show it places exactly as before. Re-record only
when placement's behaviour changes on purpose (and say so in the commit).

    python scripts/record_placement_hashes.py [--count 600] [--seed 45]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from master.placement.place import PlacementError, place_instance, placement_previews  # noqa: E402
from tests.support.rules.placement_clusters import clusters, outcome_hashes  # noqa: E402

DATA = ROOT / "tests" / "data" / "placement_hashes.json"


def main() -> None:
    """Parse the flags, hash every cluster's outcomes, write ``DATA``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--seed", type=int, default=45)
    args = parser.parse_args()
    if not 1 <= args.count <= 100_000:
        parser.error("--count must be 1..100000")
    start = time.perf_counter()
    hashes = [outcome_hashes(c, place_instance, placement_previews, PlacementError) for c in clusters(args.count, args.seed)]
    DATA.write_text(json.dumps({"seed": args.seed, "count": args.count, "hashes": hashes}, separators=(",", ":")) + "\n")
    print(f"{args.count} clusters in {time.perf_counter() - start:.1f} s -> {DATA.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
