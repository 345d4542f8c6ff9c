"""Sizes, times, ids and link figures as people read them in the CLI's tables and progress
lines: ``"16.0 GiB"``, ``"3 s ago"``, an id's shortest unique prefix, ``"RTT 0.42 ms, 94.0 Mbit/s"``.

Pure functions of numbers and strings; memory is in bytes in, GiB or MiB (one decimal) out.
"""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2


def gib(n_bytes: int | float | None) -> str:
    """A size for people: ``17179869184`` → ``"16.0 GiB"``, under 1 GiB in MiB
    (``98_000_000`` → ``"93.5 MiB"``); None → ``"unknown"``."""
    if n_bytes is None:
        return "unknown"
    if abs(n_bytes) < GIB:
        return f"{n_bytes / MIB:.1f} MiB"
    return f"{n_bytes / GIB:.1f} GiB"


SHORT_ID = 8
"""Fewest characters of an instance id shown in tables (like git's short hashes)."""


def short_ids(ids: list[str], minimum: int = SHORT_ID) -> dict[str, str]:
    """Each id → its shortest prefix of at least ``minimum`` characters that no other id in
    ``ids`` starts with (the whole id when it is a prefix of another). ``delete`` and
    ``--nodes`` accept such a prefix."""
    out = {}
    unique = set(ids)
    for ident in unique:
        n = min(minimum, len(ident))
        while n < len(ident) and any(o != ident and o.startswith(ident[:n]) for o in unique):
            n += 1
        out[ident] = ident[:n]
    return out


NODE_ID_CHARS = 12
"""Fewest characters of a node id shown where a name is missing or shared: every libp2p id
of an Ed25519 key begins ``12D3KooW``, so 8 would name every node alike; 12 tell a home
cluster's nodes apart (``short_ids`` adds more when two still share them)."""


def node_labels(names: dict[str, str]) -> dict[str, str]:
    """Node id → how a table names it: its friendly name (``names[id]``) when that is set and
    no other node has it, else its shortest unique id prefix of at least ``NODE_ID_CHARS``,
    after the name when there is one (``"box 12D3KooWAbCd"``)."""
    prefixes = short_ids(list(names), NODE_ID_CHARS)
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    return {nid: name if name and counts[name] == 1 else f"{name} {prefixes[nid]}".strip()
            for nid, name in names.items()}


def ago(seconds: float | None) -> str:
    """Seconds since last heard from → ``"now"``, ``"3 s ago"``, ``"2 min ago"``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return "now"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago"

def short_id(node_id: str | None, names: dict[str, str] | None = None) -> str:
    """A node as people read it: its friendly name when known, else its id."""
    if not node_id:
        return "-"
    if names and names.get(node_id):
        return names[node_id]
    return id_prefix(node_id)


ID_PREFIX = 16
"""Characters of a node id shown in tables; a unique prefix is enough for ``--nodes``, and the
full id ends every address (``/p2p/<node_id>``) and is in ``--json``."""


def id_prefix(node_id: str) -> str:
    """The first ``ID_PREFIX`` characters of ``node_id`` and an ellipsis when cut."""
    return node_id if len(node_id) <= ID_PREFIX else node_id[:ID_PREFIX] + "…"


def link_text(rtt_us: int | None, bytes_per_s: int | None) -> str:
    """A link's figures as people read them: ``"RTT 0.42 ms, 94.0 Mbit/s"`` (bandwidth
    ``"not measured yet"`` while unknown)."""
    rtt = "RTT ?" if rtt_us is None else f"RTT {rtt_us / 1000:.2f} ms"
    bw = "bandwidth not measured yet" if not bytes_per_s else f"{bytes_per_s * 8 / 1e6:.1f} Mbit/s"
    return f"{rtt}, {bw}"


def size_text(n: int | float) -> str:
    """Bytes as KiB / MiB / GiB with one decimal (``"3.2 MiB"``)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{int(n)} B"


def source_split(from_peers: int, from_hub: int) -> str:
    """Where a fetch's bytes came from: ``" (1.0 MiB from peers, 2.0 MiB from the hub)"``;
    ``""`` when nothing was received yet."""
    parts = [f"{size_text(n)} from {where}" for n, where in ((from_peers, "peers"), (from_hub, "the hub")) if n]
    return f" ({', '.join(parts)})" if parts else ""


def download_text(done: int, total: int, speed: float, width: int = 10, from_peers: int = 0, from_hub: int = 0) -> str:
    """A text progress bar of a shard fetch: ``"downloading [####------] 40% 3.2 MiB/8.0 MiB at
    1.5 MiB/s (1.0 MiB from peers, 2.2 MiB from the hub)"`` (the split: ``source_split``)."""
    frac = min(1.0, done / total) if total > 0 else 0.0
    filled = int(round(frac * width))
    return (f"downloading [{'#' * filled}{'-' * (width - filled)}] {frac * 100:.0f}% "
            f"{size_text(done)}/{size_text(total)} at {size_text(speed)}/s{source_split(from_peers, from_hub)}")


def wrapped_lines(lines: list[str], width: int) -> list[str]:
    """Report lines folded at ``width`` columns between words, never inside one: a folded
    line's next lines are indented under its text (past its own indent and a ``word:``
    label such as ``hint:``). A line holding a word too long to fit beside its label (an
    address to copy) is left whole, however wide."""
    import textwrap

    out = []
    for line in lines:
        indent = line[: len(line) - len(line.lstrip(" "))]
        label, _, rest = line.lstrip(" ").partition(": ")
        hang = indent + " " * (len(label) + 2) if rest and " " not in label else indent + "  "
        if len(line) <= width or max(map(len, line.split()), default=0) > width - len(hang):
            out.append(line)
            continue
        out.extend(textwrap.wrap(line, width, subsequent_indent=hang, break_long_words=False, break_on_hyphens=False))
    return out
