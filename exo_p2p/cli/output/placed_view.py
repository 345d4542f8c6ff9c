"""How ``exo-p2p ps`` tells a shrunk instance (re-placed on fewer ranks than it was placed
with, ``exo_p2p.types.Instance.placed``) and its restore (``master.restore``): pure functions
over the JSON of ``GET /instances`` and ``GET /state``."""

from __future__ import annotations

from exo_p2p.cli.output.readable import short_id


def with_placed(instances: list[dict], state: dict | None) -> list[dict]:
    """``GET /instances`` items with ``placed``, ``restores`` and ``moved`` (``exo_p2p.types.Instance``)
    copied from the same instance in ``state`` (``GET /state``), when it has them; the items
    are new dicts, ``instances`` is unchanged. ``state`` None: the items as they are."""
    by_id = (state or {}).get("instances") or {}
    out = []
    for inst in instances:
        known = by_id.get(str(inst.get("instance_id", ""))) or {}
        extra = {k: known[k] for k in ("placed", "restores", "replaces", "moved") if k in known and k not in inst}
        out.append({**inst, **extra})
    return out


def shrunk_text(inst: dict, names: dict[str, str] | None = None) -> str | None:
    """``"shrunk from 2 ranks (node a left)"`` for an instance re-placed on fewer ranks than
    its ``placed`` nodes (``with_placed``), naming the nodes it no longer has a rank on (the
    name recorded when it shrank, else ``names``, else the id); None when it is not shrunk."""
    placed = inst.get("placed") or []
    shards = inst.get("shards") or []
    if len(placed) <= len(shards):
        return None
    here = {s.get("node_id") for s in shards}
    left = [p.get("name") or short_id(p.get("node_id"), names) for p in placed if p.get("node_id") not in here]
    who = f" ({'node' if len(left) == 1 else 'nodes'} {', '.join(left)} left)" if left else ""
    return f"shrunk from {len(placed)} ranks{who}"


def restoring_text(inst: dict, prefixes: dict[str, str]) -> str | None:
    """``"restores the size of ID"`` for the full-size successor (``restores``) of a shrunk
    instance still listed, ``"moves ID to a cheaper ring"`` for the successor of an instance
    being moved (``moved``, ``master.relink``); ``prefixes``: instance id → the prefix the
    table shows. Else None."""
    old = inst.get("replaces")
    if not inst.get("restores") or old not in prefixes:
        return None
    return f"moves {prefixes[old]} to a cheaper ring" if inst.get("moved") else f"restores the size of {prefixes[old]}"
