"""Which nodes hold *the same* model under one name (docs/models.md): placement never mixes
different manifests under one name.

A node's profile lists the manifests it holds (``NodeProfile.held_models``: name, digest,
complete). For a model name, the nodes that publish a complete manifest of that name are
grouped by digest; when there is more than one group, the group with the most nodes is the
model (ties: the smallest digest, so every master decides the same) and the nodes of the
other groups are excluded with the reason. A node that lists the name in ``models`` but
publishes no manifest for it (a GGUF not imported yet, a node from before manifests) is
not excluded: nothing says its files differ. Pure.
"""

from __future__ import annotations

from exo_p2p.types import NodeId, State


def manifest_groups(state: State, name: str) -> dict[str, list[NodeId]]:
    """Digest -> nodes (sorted) publishing a complete manifest of ``name``."""
    groups: dict[str, list[NodeId]] = {}
    for node_id, profile in sorted(state.nodes.items()):
        for held in profile.held_models:
            if held.name == name and held.complete:
                groups.setdefault(held.digest, []).append(node_id)
    return groups


def chosen_digest(state: State, name: str) -> str | None:
    """The digest placement uses for ``name`` (rule: module docstring); None when no node
    publishes a manifest of it."""
    groups = manifest_groups(state, name)
    if not groups:
        return None
    return min(groups, key=lambda d: (-len(groups[d]), d))


def mismatched_nodes(state: State, name: str) -> dict[NodeId, str]:
    """Nodes holding other files under ``name`` than the chosen manifest -> the reason."""
    groups = manifest_groups(state, name)
    chosen = chosen_digest(state, name)
    out: dict[NodeId, str] = {}
    for digest, nodes in groups.items():
        if digest == chosen:
            continue
        for node in nodes:
            out[node] = (f"holds other files under the name {name} (manifest {digest[:12]}, "
                         f"not {chosen[:12] if chosen else '?'} of {len(groups[chosen]) if chosen else 0} node(s))")
    return out
