"""Who may use the API: the Host rule, API keys, CORS, and the refusal of cross-site requests.

``AccessPolicy`` holds the settings (``--api-key``, ``--cors-origins``, ``--allowed-hosts``);
``AccessGuard`` is the ASGI middleware that applies them to every HTTP request before
routing, in this order, answering in the error shape of the route's API family
(``exo_p2p.api.errors.family_of``):

0. A request whose ``Host`` header is not an IP literal, ``localhost``, a name given to
   ``--allowed-hosts`` or the host of an origin given to ``--cors-origins`` gets 403
   (``host_not_allowed``), with or without ``Origin``, on every path: a DNS-rebinding page
   (same-origin for the browser, so no ``Origin`` on its GETs) cannot read anything. The
   rule, its edge cases (no ``Host``, ports, IPv6, ``localhost.``, ``*``) and why:
   ``exo_p2p.api.hosts``.
1. A request whose ``Origin`` header is present and not allowed gets 403. Allowed: an origin
   listed in ``cors_origins`` (``*`` allows every origin), or the API's own origin — the
   ``Origin`` equals ``http(s)://<Host header>`` and that host is an IP literal,
   ``localhost`` or a name given to ``--allowed-hosts`` (so a page the node itself serves
   can call it, while a DNS-rebinding page, whose host is another name, cannot). A web page
   on another site therefore cannot place, delete or chat through the user's browser, even
   with a form post that needs no preflight.
1b. A request with no ``Origin`` whose browser says it comes from another site
   (``Sec-Fetch-Site: cross-site``: an ``<img>``, ``<script>`` or ``<link>`` of another
   site's page, a link followed or a GET form sent from it) gets 403 (``cross_site_refused``)
   on every path but the public ones: such a GET carries no ``Origin``, so rule 1 never saw
   it, and on a keyless node it would otherwise be served (a preview that reads a hub repo,
   say). Browsers without Fetch Metadata headers are not stopped by this rule; what such a
   GET can make a node spend is bounded anyway (docs/security.md).
2. ``POST``/``PUT``/``PATCH`` bodies of a request with an ``Origin`` header must be
   ``application/json`` (415 otherwise): a cross-site form post
   (``application/x-www-form-urlencoded``, ``multipart/form-data``, ``text/plain``) never
   reaches a route, as a browser sends ``Origin`` on every cross-site POST. A request with no
   ``Origin`` (curl, SDKs, agents: ``curl -d '{…}'`` sends a form content type, as Ollama's
   own docs do) may use any content type; its body is still decoded as JSON (400 otherwise).
3. With API keys configured, every path but the public ones (``/health``, and the
   dashboard: ``/`` and ``/dashboard/…``) needs
   ``Authorization: Bearer KEY``; Anthropic routes (``/v1/messages…``) also accept
   ``x-api-key: KEY``. Missing or wrong → 401. Keys are compared in constant time. With
   ``--metrics-loopback-open``, ``GET /metrics`` from a loopback client address needs no
   key (a scraper on the same machine); from anywhere else it still does. An accepted
   request carries ``key_id`` (a digest of its key, never the key) in its scope's
   ``state["api_key_id"]`` for the request's record.

CORS preflights (``OPTIONS`` with ``Access-Control-Request-Method``) are answered by
Starlette's ``CORSMiddleware``, placed outside this guard (a preflight carries and returns
no data; the request that follows it meets every rule here, and its refusal carries the CORS
headers, so the calling page can show why).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from exo_p2p.api.errors import error_info, family_error_response, family_of
from exo_p2p.api.hosts import host_allowed, host_of, parse_names, refusal_message
from exo_p2p.types import ErrorInfo
from exo_p2p.dashboard.routes import ASSET_PREFIX

PUBLIC_PATHS: frozenset[str] = frozenset({"/health", "/"})
"""Paths served without an API key (``/``: the dashboard page or the Ollama banner; neither
carries cluster data)."""
PUBLIC_PREFIXES: tuple[str, ...] = (ASSET_PREFIX + "/",)
"""Path prefixes served without an API key: the dashboard's static assets (the page is not
secret; the data it then fetches is, and needs the key)."""
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
"""Methods whose body must be JSON."""


@dataclass(frozen=True)
class AccessPolicy:
    """The access settings of one API.

    ``api_keys``: accepted keys (empty: no key needed); ``cors_origins``: origins allowed to
    call the API from a browser (``"*"`` = any; empty = none but the API's own);
    ``allowed_hosts``: host names the API answers besides IP literals and ``localhost``
    (``"*"`` = any; ``exo_p2p.api.hosts``); ``public_paths``: paths that need no key;
    ``metrics_loopback_open``: ``GET /metrics`` needs no key from a loopback client.
    """

    api_keys: frozenset[str] = frozenset()
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    public_paths: frozenset[str] = field(default=PUBLIC_PATHS)
    metrics_loopback_open: bool = False

    @property
    def host_names(self) -> frozenset[str]:
        """Every name the ``Host`` rule allows besides IPs and ``localhost``: the
        ``allowed_hosts`` and the hosts of the ``cors_origins`` (``*`` only when it is in
        ``allowed_hosts``: a ``*`` origin allows no name)."""
        names = set(self.allowed_hosts)
        for origin in self.cors_origins:
            host = host_of(urlsplit(origin).netloc) if origin != "*" else None
            if host:
                names.add(host)
        return frozenset(names)

    @classmethod
    def of(cls, api_keys: Iterable[str] = (), cors_origins: Iterable[str] = (),
           allowed_hosts: Iterable[str] = (), metrics_loopback_open: bool = False) -> AccessPolicy:
        """A policy from flag values: keys stripped (empty ones dropped), origins split on
        commas, stripped, trailing ``/`` removed, host names as ``hosts.parse_names`` gives
        them. Raises ``ValueError`` for an origin that is not ``*`` or
        ``scheme://host[:port]``, or a host that is not a name or ``*``."""
        keys = frozenset(k.strip() for k in api_keys if k.strip())
        origins: list[str] = []
        for item in cors_origins:
            for part in item.split(","):
                origin = part.strip().rstrip("/")
                if not origin:
                    continue
                if origin != "*":
                    parts = urlsplit(origin)
                    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
                        raise ValueError(f"CORS origin {origin!r} is not '*' or scheme://host[:port], e.g. http://localhost:3000")
                origins.append(origin)
        return cls(api_keys=keys, cors_origins=tuple(dict.fromkeys(origins)), allowed_hosts=parse_names(allowed_hosts),
                   metrics_loopback_open=metrics_loopback_open)


def read_api_key_file(text: str) -> list[str]:
    """Keys from the text of an ``--api-key-file``: one per line; blank lines and lines
    starting with ``#`` are skipped."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def is_loopback_host(host: str) -> bool:
    """Whether an ``--api-host`` value only serves this machine (127.0.0.0/8, ::1, localhost)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin_allowed(origin: str, host_header: str | None, cors_origins: Iterable[str],
                   allowed_hosts: Iterable[str] = ()) -> bool:
    """Rule 1 of the module docstring: may a browser page of ``origin`` call this API,
    reached as ``host_header``, given the ``--allowed-hosts`` names ``allowed_hosts``?"""
    allowed = tuple(cors_origins)
    origin = origin.strip().rstrip("/")
    if "*" in allowed or origin in allowed:
        return True
    names = frozenset(allowed_hosts)
    if not host_header or not host_allowed(host_header, names):
        return False  # the API's own origin: only when its Host is one the Host rule allows
    return origin.lower() in (f"http://{host_header.strip().lower()}", f"https://{host_header.strip().lower()}")


def is_json_content_type(value: str | None) -> bool:
    """``application/json`` (any parameters, any case) or a ``+json`` subtype."""
    if not value:
        return False
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def presented_keys(headers: Headers, family: str) -> list[str]:
    """The keys a request presents: the ``Authorization: Bearer`` token, and on the
    Anthropic family the ``x-api-key`` header too."""
    keys: list[str] = []
    auth = headers.get("authorization", "")
    scheme, _, token = auth.strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    if family == "anthropic" and headers.get("x-api-key", "").strip():
        keys.append(headers["x-api-key"].strip())
    return keys


def key_accepted(presented: Iterable[str], keys: frozenset[str]) -> bool:
    """Whether any presented key is one of ``keys`` (constant-time per comparison)."""
    return accepted_key(presented, keys) is not None


def accepted_key(presented: Iterable[str], keys: frozenset[str]) -> str | None:
    """The first presented key that is one of ``keys`` (constant-time per comparison), or None."""
    for given in presented:
        for key in keys:
            if hmac.compare_digest(given.encode(), key.encode()):
                return key
    return None


def key_id(key: str) -> str:
    """A short, stable name of an API key for records: the first 12 hex digits of its
    sha256 (the key cannot be recovered from it)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def loopback_client(scope: Scope) -> bool:
    """Whether the request's client address is a loopback one (127.0.0.0/8, ::1)."""
    client = scope.get("client")
    return bool(client) and client[0] != "localhost" and is_loopback_host(str(client[0]))


class AccessGuard:
    """ASGI middleware applying an ``AccessPolicy`` (the rules of the module docstring) to
    every HTTP request; other scopes pass through."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy
        self._host_names = policy.host_names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET").upper()
        headers = Headers(scope=scope)
        family = family_of(path)
        problem = self._problem(path, method, headers, family, scope)
        if problem is not None:
            await family_error_response(family, problem)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _problem(self, path: str, method: str, headers: Headers, family: str, scope: Scope) -> ErrorInfo | None:
        host = headers.get("host")
        if not host_allowed(host, self._host_names):
            return error_info(403, refusal_message(host or ""), code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not origin_allowed(origin, host, self.policy.cors_origins, self.policy.allowed_hosts):
            return error_info(
                403,
                f"requests from origin {origin[:200]!r} are not allowed; start the node with --cors-origins to allow a web origin",
                code="origin_not_allowed",
            )
        if origin is None and headers.get("sec-fetch-site") == "cross-site" and not self._public(path):
            return error_info(403, "cross-site requests without an allowed Origin are refused (an <img>, <script>, "
                                   "link or form of another site's page); call the API from a page of an origin given "
                                   "to --cors-origins, or directly", code="cross_site_refused")
        if self.policy.api_keys and self._needs_key(path, scope):
            key = accepted_key(presented_keys(headers, family), self.policy.api_keys)
            if key is not None:
                scope.setdefault("state", {})["api_key_id"] = key_id(key)
            else:
                where = "Authorization: Bearer KEY" + (" or x-api-key: KEY" if family == "anthropic" else "")
                given = bool(presented_keys(headers, family))
                what = "invalid API key" if given else "missing API key"
                return error_info(401, f"{what}: this node requires {where}", code="invalid_api_key")
        if method in BODY_METHODS and "origin" in headers and not is_json_content_type(headers.get("content-type")):
            return self._not_json(headers)
        return None

    def _public(self, path: str) -> bool:
        return path in self.policy.public_paths or path.startswith(PUBLIC_PREFIXES)

    def _needs_key(self, path: str, scope: Scope) -> bool:
        if self._public(path):
            return False
        return not (path == "/metrics" and self.policy.metrics_loopback_open and loopback_client(scope))

    @staticmethod
    def _not_json(headers: Headers) -> ErrorInfo:
        got = headers.get("content-type")
        return error_info(
            415,
            f"request body must be application/json, got {got[:100]!r}" if got else "request body must be application/json (no Content-Type given)",
            code="unsupported_media_type",
        )
