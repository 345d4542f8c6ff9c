"""Which ``Host`` names the API answers: the defence against DNS rebinding.

The attack: a web page on ``evil.example`` (loaded while that name pointed at the attacker's
server) has the name re-pointed at ``127.0.0.1`` or a LAN address of a node. Its script's
requests to ``http://evil.example:52515/state`` are then *same-origin* for the browser: no
CORS check, no ``Origin`` header on a GET, yet they reach the node, which would answer a
keyless node's State (node addresses, prompts in flight) to the attacker's script. What such a
request cannot hide is its ``Host`` header, which the browser sets to the name in the URL
(``evil.example:52515``); scripts cannot change it.

The rule (``host_allowed``), applied to every HTTP request before anything else, with or
without ``Origin`` and on every path (``/health`` and the dashboard included):

- The ``Host`` must name an IP literal (``127.0.0.1``, ``192.168.1.5``, ``[::1]``,
  ``[fe80::1%25eth0]``), ``localhost``, a name given to ``--allowed-hosts``, or the host of
  an origin given to ``--cors-origins``. Case does not matter, one trailing dot is ignored
  (``localhost.`` is ``localhost``), and so is the port (the node answers on one port; a
  rebinding page uses that same port). An IP is safe because the attacker cannot make the
  browser send a name it does not own as ``Host``, and a page loaded from an IP (not a name)
  cannot be rebound. ``localhost`` is resolved by browsers and resolvers to this machine
  without asking DNS (RFC 6761), so no one can rebind it.
- A ``Host`` that is malformed (a port that is not digits, an unclosed ``[``) is refused.
- A request without ``Host`` (HTTP/1.0; an empty value counts as none) is allowed: every
  browser sends ``Host`` and no script can remove it, so such a request is not a browser's
  and the rebinding attack cannot make one. (HTTP/1.1 requires it; the server refuses an
  HTTP/1.1 request without it with 400 before the app sees it. HTTP/2 requests carry
  ``:authority``, which the server hands on as ``Host``.)
- ``*`` in ``--cors-origins`` does not widen the rule. It lets pages of any site call the
  API *cross-origin*, where the browser's own checks still apply (a public page reaching a
  private address needs the browser's Private Network Access consent, which the API does
  not give); a rebound page is same-origin and escapes those checks. A user who wants any
  ``Host`` answered (behind a proxy that passes on arbitrary names) says so with
  ``--allowed-hosts '*'``, which turns this rule off and reopens the attack on a keyless
  node.
- The ``--api-host`` of the node, when it is a name rather than an address, is allowed too
  (``bind_names``): the node prints it as its address.
- Names are matched exactly: ``--allowed-hosts macbook.local`` allows ``macbook.local`` and
  not ``x.macbook.local``.

A refused request gets 403 (``host_not_allowed``) whose message names the flag to set,
e.g. ``--allowed-hosts macbook.local``. Not 421 (Misdirected Request): HTTP/2 clients,
browsers included, retry a 421 on a new connection, and the answer is a refusal by policy,
not a wrong connection; not 400: the request is well formed. 403 is also what a foreign
``Origin`` gets (``exo_p2p.api.access``), and clients do not retry it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

ANY_HOST = "*"
"""In ``--allowed-hosts``: answer every ``Host`` (turns the rule of the module docstring off)."""
_NAME_RE = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")
MAX_NAME_CHARS = 253
"""The longest DNS name (characters, without the trailing dot)."""


def host_of(netloc: str) -> str | None:
    """The host name in a ``Host`` header or URL authority (``host[:port]``,
    ``[v6][:port]``): lower-cased, without brackets, port and one trailing dot; ``%25`` of
    an IPv6 zone decoded. None when malformed: empty host, a port that is not 0–5 digits, an
    unclosed ``[`` or text after ``]`` that is not ``:port``."""
    text = netloc.strip().lower()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not re.fullmatch(r":[0-9]{0,5}", rest)):
            return None
        return host.replace("%25", "%") or None
    if text.count(":") == 1:
        text, port = text.split(":")
        if not re.fullmatch(r"[0-9]{0,5}", port):
            return None
    if text.endswith("."):
        text = text[:-1]
    return text or None


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` (as ``host_of`` returns it) is an IPv4 or IPv6 address."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_ip_or_localhost(host: str) -> bool:
    """Whether ``host`` (as ``host_of`` returns it) is an IP literal or ``localhost``."""
    return host == "localhost" or is_ip_literal(host)


def host_allowed(host_header: str | None, names: Iterable[str]) -> bool:
    """The rule of the module docstring: may a request with this ``Host`` header (None:
    none) be answered, given the extra allowed ``names`` (normalized as ``parse_names``
    returns them, ``*`` = any)?"""
    if host_header is None or not host_header.strip():
        return True
    names = frozenset(names)
    if ANY_HOST in names:
        return True
    host = host_of(host_header)
    return host is not None and (is_ip_or_localhost(host) or host in names)


def _is_name(host: str) -> bool:
    return len(host) <= MAX_NAME_CHARS and (_NAME_RE.fullmatch(host) is not None or is_ip_literal(host))


def parse_names(values: Iterable[str]) -> tuple[str, ...]:
    """``--allowed-hosts`` values: split on commas, stripped, lower-cased, one trailing dot
    removed, duplicates and empty parts dropped; ``*`` kept as is. Raises ``ValueError`` for
    a value that is not a host name (a URL, a port, a wildcard other than ``*``)."""
    names: list[str] = []
    for item in values:
        for part in item.split(","):
            name = part.strip().lower()
            name = name[:-1] if name.endswith(".") and name != "." else name
            if not name:
                continue
            if name != ANY_HOST and not _is_name(name):
                raise ValueError(f"allowed host {part.strip()!r} is not a host name (e.g. macbook.local) or '*'; "
                                 "give the name without scheme or port")
            names.append(name)
    return tuple(dict.fromkeys(names))


def bind_names(api_host: str) -> tuple[str, ...]:
    """The names an ``--api-host`` value adds to the allowed ones: itself when it is a host
    name (a node told to listen on ``box.lan`` answers requests addressed to ``box.lan``,
    the address its banner prints); nothing for an IP, ``localhost`` or a value that is not
    a name."""
    host = host_of(api_host)
    if host is None or is_ip_or_localhost(host) or not _is_name(host):
        return ()
    return (host,)


def refusal_message(host_header: str) -> str:
    """The message of the 403 for a refused ``Host``: why, and the flag that allows it."""
    host = host_of(host_header)
    shown = host_header.strip()[:200]
    if host is None or not _is_name(host):
        return f"malformed Host header {shown!r}; this node answers requests addressed to an IP address or localhost"
    return (
        f"host {host[:200]!r} is not allowed (protection against DNS rebinding: this node answers requests "
        f"addressed to an IP address, localhost or a name it was started with); to reach it as {host[:200]!r}, "
        f"start the node with --allowed-hosts {host[:200]}"
    )
