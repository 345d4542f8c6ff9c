"""How the CLI shows API answers to people: rich tables and the lines beside them.

Memory is shown in GiB with one decimal (``exo_p2p.cli.output.readable``); node ids as friendly
names where known, else a prefix. The ``--json`` shapes for scripts: ``exo_p2p.cli.output.json_shapes``.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from exo_p2p.cli.output.placed_view import restoring_text, shrunk_text
from exo_p2p.cli.output.readable import ago, download_text, gib, id_prefix, link_text, short_id, short_ids, size_text, source_split


def nodes_table(nodes: list[dict]) -> Table:
    """id (prefix), name, master mark, memory available / total, last seen. Addresses are
    too long for a column: ``address_lines`` lists them whole, for ``--bootstrap``."""
    table = Table(title="nodes", title_justify="left")
    table.add_column("node id", no_wrap=True)
    table.add_column("name")
    table.add_column("master", justify="center")
    table.add_column("available / total", justify="right", no_wrap=True)
    table.add_column("last seen", justify="right")
    for n in nodes:
        mark = "*" if n.get("is_master") else ""
        name = n.get("friendly_name") or ""
        if n.get("is_self"):
            name = f"{name} (this node)" if name else "(this node)"
        memory = f"{gib(n.get('memory_available'))} / {gib(n.get('memory_total'))}"
        table.add_row(
            id_prefix(str(n.get("node_id", ""))),
            name,
            mark,
            memory,
            ago(n.get("last_seen")),
        )
    return table


def speed_text(speed: Any) -> str:
    """A node's measured speed as ``decode µs/MiB · MiB/s`` (docs/placement-speed.md); ``-`` when
    not measured or not a mapping of numbers."""
    if not isinstance(speed, dict):
        return "-"
    decode, mem = speed.get("decode_ns_per_kib"), speed.get("mem_mib_per_s")
    if not isinstance(decode, int) or not isinstance(mem, int):
        return "-"
    return f"{decode * 1024 / 1000:.0f} µs/MiB · {mem} MiB/s"


def speed_lines(nodes: list[dict]) -> list[str]:
    """``"  <name or id prefix>  decode … µs per MiB of weights · … MiB/s"`` per node that
    published a speed (below the table: a column would not fit 80 columns)."""
    rows = [(n.get("friendly_name") or id_prefix(str(n.get("node_id", ""))), speed_text(n.get("speed")))
            for n in nodes if n.get("speed")]
    width = max((len(label) for label, _ in rows), default=0)
    return [f"  {label:<{width}}  decode {text}" for label, text in rows]


def address_lines(nodes: list[dict]) -> list[str]:
    """``"<name or id prefix>  <multiaddr>"`` per address of each node, unwrapped, so that
    each can be copied into ``--bootstrap``; the names padded to one width, so the addresses
    start in one column."""
    labelled = [(n.get("friendly_name") or id_prefix(str(n.get("node_id", ""))), addr)
                for n in nodes for addr in n.get("addrs") or []]
    width = max((len(label) for label, _ in labelled), default=0)
    return [f"  {label:<{width}}  {addr}" for label, addr in labelled]


def link_lines(nodes: list[dict]) -> list[str]:
    """``"A -> B at IP: RTT …, … Mbit/s"`` per measured address of each node's links
    (``GET /nodes`` ``links``), names where known."""
    names = {str(n.get("node_id")): n.get("friendly_name") or id_prefix(str(n.get("node_id", ""))) for n in nodes}
    lines = []
    for n in nodes:
        source = names[str(n.get("node_id"))]
        for link in n.get("links") or []:
            sink = names.get(str(link.get("sink")), id_prefix(str(link.get("sink", ""))))
            lines.append(f"  {source} -> {sink} at {link.get('address')}: {link_text(link.get('rtt_us'), link.get('bytes_per_s'))}")
    return lines


def instance_progress(inst: dict) -> str:
    """``"ready"``, ``"downloading [###-------] 30% ..."`` (shards fetched from peers first,
    docs/models.md), ``"loading 12/30 layers"`` or ``"failed: <reason>"``."""
    status = inst.get("status") or "unknown"
    downloading = [s for s in inst.get("shards") or [] if s.get("status") == "downloading"]
    if status == "loading" and downloading:
        return download_text(sum(s.get("bytes_done") or 0 for s in downloading),
                             sum(s.get("bytes_total") or 0 for s in downloading),
                             sum(s.get("bytes_per_second") or 0.0 for s in downloading),
                             from_peers=sum(s.get("bytes_from_peers") or 0 for s in downloading),
                             from_hub=sum(s.get("bytes_from_hub") or 0 for s in downloading))
    if status == "loading" and inst.get("layers_total"):
        return f"loading {inst.get('layers_loaded', 0)}/{inst['layers_total']} layers"
    if status == "failed" and inst.get("reason"):
        return f"failed: {inst['reason']}"
    return str(status)


def shard_line(shard: dict, names: dict[str, str] | None = None) -> str:
    """``"rank 0: <node> layers [0, 15) 0.1 GiB loading"``."""
    text = (
        f"rank {shard.get('rank')}: {short_id(shard.get('node_id'), names)} "
        f"layers [{shard.get('start_layer')}, {shard.get('end_layer')})"
    )
    if shard.get("share_bytes") is not None:
        text += f" {gib(shard['share_bytes'])}"
    if shard.get("status") == "downloading" and shard.get("bytes_total"):
        text += f" downloading {size_text(shard.get('bytes_done') or 0)}/{size_text(shard['bytes_total'])}"
        text += source_split(shard.get("bytes_from_peers") or 0, shard.get("bytes_from_hub") or 0)
    elif shard.get("status"):
        text += f" {shard['status']}"
    return text


def instances_table(instances: list[dict], names: dict[str, str] | None = None) -> Table:
    """One row per instance: id (a unique prefix, never wrapped; ``--json`` has the whole
    id), model, sharding, status / progress (and ``shrunk_text``), shards."""
    table = Table(title="instances", title_justify="left")
    table.add_column("id", no_wrap=True)
    # the model name is copied too (`exo-p2p stop MODEL`): never cut
    table.add_column("model", min_width=max((len(str(i.get("model", ""))) for i in instances), default=5))
    table.add_column("sharding")
    table.add_column("status")
    table.add_column("shards", overflow="fold")
    prefixes = short_ids([str(i.get("instance_id", "")) for i in instances])
    for inst in instances:
        shards = "\n".join(shard_line(s, names) for s in inst.get("shards") or []) or "-"
        status = "\n".join(t for t in (instance_progress(inst), shrunk_text(inst, names), restoring_text(inst, prefixes),
                                        keep_alive_text(inst)) if t)
        table.add_row(
            prefixes[str(inst.get("instance_id", ""))],
            str(inst.get("model", "")),
            str(inst.get("sharding", "")),
            status,
            shards,
        )
    return table


def keep_alive_text(inst: dict, now: float | None = None) -> str:
    """When ``inst`` (a ``/instances`` entry) goes once idle and when it was last used
    (docs/models.md "Placement on demand and idle unload"): ``pinned``, ``idle unload in 4m
    (used 10s ago)``; ``""`` for one placed by hand with no keep-alive (kept until deleted)."""
    import time

    if inst.get("pinned"):
        return "pinned"
    last, expires = inst.get("last_used"), inst.get("expires_at")
    if last is None:
        return ""
    now = time.time() if now is None else now
    used = f"used {readable_seconds(max(0.0, now - last))} ago"
    if expires is None:
        return f"kept forever ({used})"
    return f"idle unload in {readable_seconds(max(0.0, expires - now))} ({used})"


def readable_seconds(seconds: float) -> str:
    """``42s``, ``4m``, ``2h`` (rounded down to the largest unit)."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds)}s"


def models_table(models: list[dict]) -> Table:
    """model (never cut: it is copied into commands), family, quantization (compact: ``4-bit,
    group 32, some modules 8-bit`` → ``4-bit g32 +8-bit``), layers, size on disk, the shardings
    it allows over several nodes (an untested one marked ``?``), the kinds of work it does
    (``generate``, ``embed``, ``rerank``; ``+ vision`` when it takes images), where the node found it. The
    context length is in ``--json``; text columns fold rather than cut."""
    table = Table(title="models on this node", title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("family", overflow="fold")
    table.add_column("quantization", overflow="fold")
    table.add_column("layers", justify="right")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("split by", overflow="fold")
    table.add_column("tasks", overflow="fold")
    table.add_column("source", overflow="fold")
    for m in models:
        notes = m.get("sharding_notes") or {}
        split = [s + ("?" if s in notes else "") for s in m.get("shardings") or []]
        table.add_row(
            str(m.get("model", "")),
            str(m.get("family") or "-"),
            str(m.get("quantization") or "-").replace(", group ", " g").replace(", some modules ", " +"),
            str(m.get("n_layers", "?")),
            gib(m.get("storage_size")),
            ", ".join(split) or "one node only",
            ", ".join(m.get("tasks") or ["generate"])  # a node from before kinds: generation only
            + (" + vision" if "vision" in (m.get("capabilities") or ()) else ""),
            str(m.get("source") or "-"),
        )
    return table


def unsupported_table(problems: list[dict]) -> Table:
    """model, source, why this node cannot serve it (``GET /models/unsupported``)."""
    table = Table(title="models found on this node that it cannot serve", title_justify="left")
    table.add_column("model")
    table.add_column("source")
    table.add_column("why not", overflow="fold")
    for p in problems:
        table.add_row(str(p.get("model", "")), str(p.get("source") or "-"), str(p.get("reason") or "-"))
    return table


def cluster_models_table(models: list[dict], names: dict[str, str] | None = None) -> Table:
    """model, manifest digest (12 hex), nodes holding it complete, nodes holding part of it."""
    names = names or {}
    table = Table(title="models in the cluster", title_justify="left")
    for col in ("model", "manifest", "complete on", "partial on"):
        table.add_column(col, overflow="fold")
    for m in models:
        for entry in m.get("manifests", []):
            table.add_row(str(m.get("model", "")), str(entry.get("digest", ""))[:12],
                          ", ".join(names.get(n, n[:12]) for n in entry.get("complete", [])) or "-",
                          ", ".join(names.get(n, n[:12]) for n in entry.get("partial", [])) or "-")
    return table


def previews_table(model: str, previews: list[dict], names: dict[str, str] | None = None) -> Table:
    """sharding, nodes, layers per node, memory per node, the estimated network cost per token,
    or why that placement is impossible."""
    table = Table(title=f"placements of {model}", title_justify="left")
    table.add_column("sharding")
    table.add_column("nodes", justify="right")
    table.add_column("placement (node: layers, memory)", overflow="fold")
    for p in previews:
        world = str(p.get("world_size", "?"))
        if p.get("error"):
            detail = f"not possible: {p['error']}"
        else:
            nodes = p.get("nodes") or []
            layers = p.get("layers") or []
            sizes = p.get("bytes") or []
            fetch = p.get("fetch_bytes") or []
            rows = []
            for i, node in enumerate(nodes):
                layer = _layers_text(layers[i]) if i < len(layers) else "?"
                size = gib(sizes[i]) if i < len(sizes) else "?"
                fetched = f", {_fetch_text(p, i)}" if i < len(fetch) and fetch[i] else ""
                rows.append(f"{short_id(node, names)}: {layer}, {size}{fetched}")
            cost = p.get("network_us_per_token")
            if cost and len(nodes) > 1:
                guess = "" if p.get("links_measured", True) else ", links not all measured yet"
                rows.append(f"network: ~{cost / 1000:.2f} ms per token (estimated{guess})")
            if p.get("decode_us_per_token") and len(nodes) > 1:
                rows.append(f"decode: ~{p['decode_us_per_token'] / 1000:.2f} ms per token, prefill ~"
                            f"{(p.get('prefill_us_per_token') or 0) / 1000:.2f} ms per prompt token (estimated); "
                            f"split {p.get('split_reason') or '?'}")
            detail = "\n".join(rows) or "-"
        table.add_row(str(p.get("sharding", "")), world, detail)
    return table


def _fetch_text(preview: dict, i: int) -> str:
    """What node ``i`` of a preview fetches and from where: ``"fetches 1.0 GiB from the hub"``,
    ``"fetches 1.2 GiB (0.2 GiB from peers, 1.0 GiB from the hub)"``."""
    total = preview["fetch_bytes"][i]
    peers, hub = (preview.get("fetch_from_peers") or []), (preview.get("fetch_from_hub") or [])
    if i >= len(peers) or i >= len(hub):  # an older node: one source for all
        return f"fetches {size_text(total)} from {preview.get('fetch_from') or 'peers'}"
    if peers[i] and hub[i]:
        return f"fetches {size_text(total)}{source_split(peers[i], hub[i])}"
    return f"fetches {size_text(total)} from {'the hub' if hub[i] else 'peers'}"


def _layers_text(layers: Any) -> str:
    """A preview's layers entry: a count, a ``[start, end)`` pair, or anything else as is."""
    if isinstance(layers, (list, tuple)) and len(layers) == 2:
        return f"layers [{layers[0]}, {layers[1]})"
    if isinstance(layers, int):
        return f"{layers} layers"
    return str(layers)
