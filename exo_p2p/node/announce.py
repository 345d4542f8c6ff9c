"""What a node tells its user at start and while alone (pure; the node prints, ``exo_p2p.node``).

At start, once membership is known (a master followed or elected), the node says which
cluster it is in ("joined cluster NAME: N nodes, master NAME" or "started a new cluster
NAME"), whether it is open, and which instances from before its restart the cluster is
re-placing ("re-placing 1 instance from before: MODEL on NODES; `exo-p2p stop MODEL` to drop
it"). Each fact is printed once: as a line of the console banner, or, with the JSON log
format, as one log record (``exo_p2p.logs.configure.announce``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from exo_p2p.state.views import instance_view
from exo_p2p.types import Instance, State


@dataclass(frozen=True)
class Fact:
    """One thing the node says at start: ``text`` for people, ``event`` and ``fields`` for
    the JSON log, ``level`` its log level (``info`` or ``warning``)."""

    event: str
    text: str
    level: str = "info"
    fields: dict = field(default_factory=dict)


def node_label(state: State, node_id: str) -> str:
    """The name of ``node_id`` for people: its friendly name in ``state``, else the first 12
    characters of its id."""
    profile = state.nodes.get(node_id)  # type: ignore[call-overload]
    return profile.friendly_name if profile is not None and profile.friendly_name else node_id[:12]


def membership_fact(cluster: str, node_id: str, master: str | None, reachable: Collection[str], state: State) -> Fact:
    """Which cluster this node is in, once membership is known.

    ``cluster``: the cluster name (``--cluster``); ``master``: the master this node follows
    (itself when elected; None when none is known yet); ``reachable``: the node ids it hears
    now, itself included. Alone (no other node reachable) it started a new cluster, else it
    joined one of ``len(reachable)`` nodes."""
    others = sorted(set(reachable) - {node_id})
    n = len(others) + 1
    fields: dict = {"cluster": cluster, "nodes": n, "master": master}
    if master is None:
        text, level = f"cluster {cluster}: no master yet ({n} node{'s' if n > 1 else ''} heard)", "warning"
    elif not others:
        text, level = f"started a new cluster {cluster}", "info"
    else:
        name = node_label(state, master) + (" (this node)" if master == node_id else "")
        text, level = f"joined cluster {cluster}: {n} nodes, master {name}", "info"
    return Fact("cluster membership", text, level, {"detail": text, **fields, "joined": bool(others)})


def instances_from_before(state: State, node_id: str, boot_id: str) -> tuple[Instance, ...]:
    """Instances of ``state`` (a node's persisted State, read before it joins) with a rank
    placed on an earlier boot of ``node_id`` (this boot is ``boot_id``) and not given up: the
    master fails them (their runners are not revived) and re-places them. In instance-id
    order."""
    return tuple(
        inst for _, inst in sorted(state.instances.items())
        if not inst.gave_up and any(s.node_id == node_id and s.boot_id != boot_id for s in inst.shards)
    )


def still_coming(state: State, earlier: Sequence[Instance]) -> tuple[Instance, ...]:
    """Those of ``earlier`` still on their way back in ``state``: the instance itself (not
    given up), or its re-placement (the instance whose ``replaces`` chain, through instances
    ``state`` holds, leads to it) while that is not ready yet. Deleted and given-up ones are dropped, as are those already
    re-placed and serving. Each as the newest instance of its chain, in the order of
    ``earlier``."""
    successor = {i.replaces: i.instance_id for i in state.instances.values() if i.replaces is not None}
    out = []
    for inst in earlier:
        current = inst.instance_id
        for _ in range(len(successor)):  # bounded: a chain never loops
            if current not in successor:
                break
            current = successor[current]
        found = state.instances.get(current)  # type: ignore[call-overload]
        if found is None or found.gave_up:
            continue
        if current != inst.instance_id and instance_view(state, found).status == "ready":
            continue
        out.append(found)
    return tuple(out)


def from_before_fact(state: State, instances: Sequence[Instance]) -> Fact | None:
    """"re-placing N instance(s) from before: MODEL on NODES; ..." for ``instances`` (from
    ``still_coming``), nodes named as in ``state``; None when there are none."""
    if not instances:
        return None
    parts = [f"{i.model_id} on {', '.join(node_label(state, s.node_id) for s in i.shards)}" for i in instances]
    n = len(instances)
    if n == 1:
        how = f"`exo-p2p stop {instances[0].model_id}` to drop it"
    else:
        how = "`exo-p2p stop MODEL` to drop one"
    text = f"re-placing {n} instance{'s' if n > 1 else ''} from before: {'; '.join(parts)}; {how}"
    return Fact("instances from before", text, "info",
                {"detail": text, "instances": [i.instance_id for i in instances], "models": [i.model_id for i in instances]})


def secret_fact(open_notice: str | None) -> Fact:
    """Whether the cluster is open (``open_notice``: what to say about it; a warning) or
    closed (None: the node has a cluster secret)."""
    if open_notice is not None:
        return Fact("open cluster", f"note: {open_notice}", "warning", {"notice": open_notice})
    return Fact("closed cluster", "cluster: closed (members share a cluster secret)", "info",
                {"detail": "members share a cluster secret"})


def no_peers_warning(alone_for: float | None, peer_left: bool, after: float) -> str | None:
    """The warning of a node without a connected peer for ``alone_for`` seconds (None: it
    has one) once that reaches ``after`` seconds; ``peer_left``: it had a peer, which left
    (then the time counts from that). None below ``after``."""
    if alone_for is None or alone_for < after:
        return None
    if peer_left:
        return f"no peers: the last peer left {alone_for:.0f} s ago; this node is a cluster of one"
    return f"no peers found for {alone_for:.0f} s: this node is a cluster of one"


def banner(node_id: str, api_url: str, addrs: Sequence[str], facts: Sequence[Fact]) -> list[str]:
    """The console banner's lines: a header naming ``node_id``, its ``api_url`` and listen
    ``addrs``, then one indented line per fact."""
    lines = [f"exo-p2p node {node_id} ready", f"  api: {api_url}"]
    lines += [f"  addr: {addr}" for addr in addrs]
    lines += [f"  {fact.text}" for fact in facts]
    return lines
