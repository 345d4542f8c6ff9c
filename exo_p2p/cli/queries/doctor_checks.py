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
from exo_p2p.cli.output.readable import link_text

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
    me = next((n for n in f.nodes if n.get("is_self")), {"node_id": f.state.get("node_id")})
    peers = [n for n in f.nodes if not n.get("is_self")]
    ports = sorted({hp[1] for a in me.get("addrs") or [] if (hp := host_port(a))})
    bootstrap, refused = bootstrap_lines(f)
    hints = doctor_hints(f, peers, ports, bool(failing_bootstraps(f.state)) and not refused)
    return [*node_lines(f, me, ports), mdns_line(f), *peer_lines(f, me, peers), *bootstrap,
            *(f"hint: {hint}" for hint in hints)]


def node_lines(f: Findings, me: dict, ports: list[int]) -> list[str]:
    """This node: its name, API and master, its libp2p TCP ports and its addresses."""
    master = next((_label(n) for n in f.nodes if n.get("node_id") == f.state.get("master")), f.state.get("master") or "none yet")
    lines = [f"this node: {_label(me)}, API {f.api_url}, master {master}",
             f"  libp2p TCP port{'s' if len(ports) != 1 else ''}: {', '.join(map(str, ports)) or 'unknown'}"]
    return lines + [f"  address: {addr}" for addr in me.get("addrs") or []]


def mdns_off(f: Findings) -> bool:
    """Whether the node runs ``--no-mdns`` (its ``/state`` says ``"mdns": false``)."""
    return f.state.get("mdns") is False


def mdns_line(f: Findings) -> str:
    """Whether this node uses mDNS, whether mDNS could be listened to, and how many exo-p2p
    clusters announced meanwhile."""
    if mdns_off(f):
        return "mDNS: off on this node (--no-mdns): it finds other nodes only through --bootstrap addresses"
    if f.mdns_types is None:
        return "mDNS: could not listen on this machine (UDP 5353)"
    if not f.mdns_types:
        return f"mDNS: no exo-p2p announcement seen in {f.mdns_seconds:g} s (multicast blocked, or every node runs --no-mdns)"
    return f"mDNS: announcements of {len(f.mdns_types)} exo-p2p cluster{'s' if len(f.mdns_types) > 1 else ''} seen in {f.mdns_seconds:g} s"


def peer_lines(f: Findings, me: dict, peers: list[dict]) -> list[str]:
    """Each known peer: heard from within ``PEER_TIMEOUT`` or not (then its TCP probes), and
    the link figures this node measured to it."""
    lines = [f"peers known: {len(peers)}"]
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
    return lines


def bootstrap_lines(f: Findings) -> tuple[list[str], list[str]]:
    """A line per bootstrap address the node fails to dial, and those of them refused: their
    TCP port answers, so the libp2p handshake failed (another cluster secret or name)."""
    lines, refused = [], []
    for addr, error in failing_bootstraps(f.state).items():
        hp = host_port(addr)
        tcp = f.tcp.get(hp) if hp else None
        if tcp == "open":
            refused.append(addr)
            lines.append(f"refused: {addr}: its TCP port answers but the libp2p connection fails ({error}): "
                         "the two nodes do not share the cluster secret or cluster name (--cluster-secret, --cluster)")
        else:
            lines.append(f"unreachable: {addr}: {_tcp_text(tcp) if tcp else error}")
    return lines, refused


def doctor_hints(f: Findings, peers: list[dict], ports: list[int], bootstrap_silent: bool) -> list[str]:
    """What to try: with no peer, the cluster flags, the firewall rules and ``--bootstrap``;
    when a bootstrap address fails and none was refused (``bootstrap_silent``), checking that
    node and its port."""
    hints = []
    if not peers:
        hints.append("this node sees no other node.")
        if f.mdns_types and len(f.mdns_types) > 1:
            hints.append("nodes of several clusters announce here: nodes only join nodes started with the same --cluster and --cluster-secret.")
        port = ports[0] if ports else DEFAULT_LISTEN_PORT
        if mdns_off(f):
            hints.append("mDNS is off here (--no-mdns): restart this node with `--bootstrap ADDRESS` of another "
                         "node, or start the other node with `--bootstrap ADDRESS` using an address above "
                         f"(TCP port {port} must be reachable from there).")
            return hints
        hints.append(f"firewall: allow TCP port {port} (libp2p) and UDP 5353 (mDNS) on every machine, "
                     f"e.g. `sudo ufw allow {port}/tcp && sudo ufw allow 5353/udp`, "
                     f"or `sudo firewall-cmd --add-port={port}/tcp --add-service=mdns`.")
        hints.append("where multicast is blocked (Wi-Fi isolation, VLANs, VPNs), start the other node with "
                     "`--bootstrap ADDRESS` using an address above.")
    elif bootstrap_silent:
        hints.append("a bootstrap address does not answer: check that node runs and the firewall allows its TCP port.")
    return hints
