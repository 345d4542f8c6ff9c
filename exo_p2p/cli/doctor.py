"""``exo-p2p doctor``: why two machines do not see each other.

It asks the node (``GET /state``, ``GET /nodes``) for its addresses, its peers and the
bootstrap addresses it fails to reach, probes those addresses over TCP from this machine,
and listens for mDNS announcements of exo-p2p nodes on the LAN. ``diagnose`` (pure) turns
what was found into the report's lines; the probes are the only I/O.

A bootstrap address whose TCP port answers while the node's libp2p dial to it fails is a
refused peer: the two nodes do not share the cluster secret (or the cluster name), since
with a secret the connection is refused before any libp2p handshake (private network).
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

from exo_p2p.config import DEFAULT_LISTEN_PORT, PEER_TIMEOUT
from exo_p2p.cli.readable import link_text

MDNS_SERVICE_PREFIX = "_p2p-x"
"""exo-p2p nodes announce ``_p2p-x<10 hex>._udp.local.``, one type per cluster name and secret."""
BOOTSTRAP_WARNING = "bootstrap peer unreachable: "
"""How a node's ``/state`` warnings name a bootstrap address it fails to dial."""
TCP_TIMEOUT = 1.5
"""Seconds a TCP probe waits for an answer."""


@dataclass
class Findings:
    """What ``doctor`` found. ``tcp`` maps ``(host, port)`` to a probe result ("open",
    "refused", "no answer", or an error text); ``mdns_types`` is None when mDNS could not be
    listened to (else the exo-p2p service types seen)."""

    api_url: str
    state: dict
    nodes: list[dict]
    tcp: dict[tuple[str, int], str] = field(default_factory=dict)
    mdns_types: list[str] | None = None
    mdns_seconds: float = 0.0


def host_port(multiaddr: str) -> tuple[str, int] | None:
    """``/ip4/10.0.0.2/tcp/52514/p2p/…`` → ``("10.0.0.2", 52514)``; None for other shapes."""
    parts = multiaddr.split("/")
    try:
        if parts[1] in ("ip4", "ip6", "dns", "dns4", "dns6") and parts[3] == "tcp":
            return parts[2], int(parts[4])
    except (IndexError, ValueError):
        pass
    return None


def failing_bootstraps(state: dict) -> dict[str, str]:
    """Bootstrap address → the node's dial error, from its ``/state`` warnings."""
    out = {}
    for warning in state.get("warnings") or []:
        if warning.startswith(BOOTSTRAP_WARNING):
            addr, _, error = warning.removeprefix(BOOTSTRAP_WARNING).partition(": ")
            out[addr] = error
    return out


def addresses_to_probe(state: dict, nodes: list[dict]) -> list[tuple[str, int]]:
    """The TCP endpoints doctor probes: the failing bootstrap addresses and each known
    peer's addresses (not this node's)."""
    seen: list[tuple[str, int]] = []
    addrs = list(failing_bootstraps(state))
    for n in nodes:
        if not n.get("is_self"):
            addrs += n.get("addrs") or []
    for addr in addrs:
        hp = host_port(addr)
        if hp is not None and hp not in seen:
            seen.append(hp)
    return seen


def tcp_probe(host: str, port: int, timeout: float = TCP_TIMEOUT) -> str:
    """"open" when a TCP connection to ``host:port`` succeeds, "refused" when nothing
    listens there, "no answer" when nothing came back within ``timeout`` seconds (a firewall
    dropping the packets, or no such host), else the error's text."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except (TimeoutError, socket.timeout):
        return "no answer"
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "no route to host"
        return e.strerror or str(e)


def mdns_service_types(seconds: float) -> list[str] | None:
    """The exo-p2p mDNS service types announced on this machine's networks, listening
    ``seconds`` seconds; None when mDNS cannot be used here (no zeroconf, no multicast)."""
    try:
        from zeroconf import ZeroconfServiceTypes

        found = ZeroconfServiceTypes.find(timeout=seconds)
    except Exception:  # noqa: BLE001 - any failure means "could not listen"
        return None
    return sorted(t for t in found if t.startswith(MDNS_SERVICE_PREFIX))


def _tcp_text(result: str) -> str:
    return {
        "open": "TCP open",
        "refused": "TCP refused (nothing listens there: node down or wrong port)",
        "no answer": "TCP no answer (a firewall drops it, or the host is down)",
    }.get(result, f"TCP {result}")


def _label(n: dict) -> str:
    node_id = str(n.get("node_id", ""))
    short = node_id[:16] + "…" if len(node_id) > 16 else node_id
    return f"{n['friendly_name']} ({short})" if n.get("friendly_name") else short


def diagnose(f: Findings) -> list[str]:
    """The report's lines: this node (addresses, ports), mDNS, peers (known, reachable,
    refused), then hints. Pure."""
    lines: list[str] = []
    me = next((n for n in f.nodes if n.get("is_self")), {"node_id": f.state.get("node_id")})
    peers = [n for n in f.nodes if not n.get("is_self")]
    ports = sorted({hp[1] for a in me.get("addrs") or [] if (hp := host_port(a))})
    master = next((_label(n) for n in f.nodes if n.get("node_id") == f.state.get("master")), f.state.get("master") or "none yet")
    lines.append(f"this node: {_label(me)}, API {f.api_url}, master {master}")
    lines.append(f"  libp2p TCP port{'s' if len(ports) != 1 else ''}: {', '.join(map(str, ports)) or 'unknown'}")
    for addr in me.get("addrs") or []:
        lines.append(f"  address: {addr}")

    if f.mdns_types is None:
        lines.append("mDNS: could not listen on this machine (UDP 5353)")
    elif not f.mdns_types:
        lines.append(f"mDNS: no exo-p2p announcement seen in {f.mdns_seconds:g} s (multicast blocked, or every node runs --no-mdns)")
    else:
        lines.append(f"mDNS: announcements of {len(f.mdns_types)} exo-p2p cluster{'s' if len(f.mdns_types) > 1 else ''} seen in {f.mdns_seconds:g} s")

    lines.append(f"peers known: {len(peers)}")
    for n in peers:
        seen = n.get("last_seen")
        heard = seen is not None and seen <= PEER_TIMEOUT
        status = f"reachable (heard {seen:.0f} s ago)" if heard else "not heard from"
        probes = []
        for addr in n.get("addrs") or []:
            hp = host_port(addr)
            if hp is not None and hp in f.tcp:
                probes.append(f"{hp[0]}:{hp[1]} {_tcp_text(f.tcp[hp])}")
        lines.append(f"  {_label(n)}: {status}" + (f"; {'; '.join(probes)}" if probes and not heard else ""))
        for link in me.get("links") or []:
            if link.get("sink") == n.get("node_id"):
                lines.append(f"    link at {link.get('address')}: {link_text(link.get('rtt_us'), link.get('bytes_per_s'))}")

    failing = failing_bootstraps(f.state)
    refused = []
    for addr, error in failing.items():
        hp = host_port(addr)
        tcp = f.tcp.get(hp) if hp else None
        if tcp == "open":
            refused.append(addr)
            lines.append(f"refused: {addr}: its TCP port answers but the libp2p connection fails ({error}): "
                         "the two nodes do not share the cluster secret or cluster name (--cluster-secret, --cluster)")
        else:
            lines.append(f"unreachable: {addr}: {_tcp_text(tcp) if tcp else error}")

    hints = []
    if not peers:
        hints.append("this node sees no other node.")
        if f.mdns_types and len(f.mdns_types) > 1:
            hints.append("nodes of several clusters announce here: nodes only join nodes started with the same --cluster and --cluster-secret.")
        port = ports[0] if ports else DEFAULT_LISTEN_PORT
        hints.append(f"firewall: allow TCP port {port} (libp2p) and UDP 5353 (mDNS) on every machine, "
                     f"e.g. `sudo ufw allow {port}/tcp && sudo ufw allow 5353/udp`, "
                     f"or `sudo firewall-cmd --add-port={port}/tcp --add-service=mdns`.")
        hints.append("where multicast is blocked (Wi-Fi isolation, VLANs, VPNs), start the other node with "
                     "`--bootstrap ADDRESS` using an address above.")
    elif failing and not refused:
        hints.append("a bootstrap address does not answer: check that node runs and the firewall allows its TCP port.")
    for hint in hints:
        lines.append(f"hint: {hint}")
    return lines
