"""Which node API a command talks to: its URL (from ``--api``, ``$EXO_P2P_API`` or the
default, normalized and checked), whether that URL is on this machine with a node still
starting behind it, and the API key to send (``--api-key`` or ``$EXO_P2P_API_KEY``).

Every check raises ``CliError`` with exit 2 (bad arguments) and a message naming the flag.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import httpx

from exo_p2p.cli.errors import CliError
from exo_p2p.cli.messages import API_KEY_ENV, check_api_key
from exo_p2p.config import DEFAULT_API_HOST, DEFAULT_API_PORT

DEFAULT_API = f"http://{DEFAULT_API_HOST}:{DEFAULT_API_PORT}"
API_ENV = "EXO_P2P_API"


def normalize_api_url(url: str) -> str:
    """``"host:port"`` → ``"http://host:port"``; trailing slashes removed. Raises
    ``CliError`` (exit 2) for a URL with a path, or one that is no URL (an unclosed IPv6
    bracket, a port out of range, an IPv4 address with a part above 255, no host)."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing it raises for a bad port
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        raise CliError(f"--api {url}: not a valid URL ({exc})", 2) from None
    if not parts.hostname:
        raise CliError(f"--api {url}: no host in the URL (e.g. --api http://127.0.0.1:52515)", 2)
    if parts.path or parts.query:
        base = f"{parts.scheme}://{parts.netloc}"
        hint = " (OpenAI clients take …/v1; exo-p2p commands take the node's address)" if parts.path.rstrip("/").endswith("/v1") else ""
        raise CliError(f"--api {url}: give the node's address without a path: --api {base}{hint}", 2)
    return url


def resolve_api_url(*candidates: str | None) -> str:
    """The first given URL among ``candidates`` (e.g. subcommand ``--api``, then the global
    one), else ``$EXO_P2P_API``, else ``DEFAULT_API``; normalized."""
    for candidate in candidates:
        if candidate:
            return normalize_api_url(candidate)
    return normalize_api_url(os.environ.get(API_ENV) or DEFAULT_API)


def is_local_url(url: str) -> bool:
    """True when the API URL points at this machine (loopback or ``localhost``)."""
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _api_port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def local_node_starting(url: str) -> bool:
    """True when ``url`` is on this machine and a process here is an ``exo-p2p node`` whose
    API port is the URL's (``--api-port``, ``EXO_P2P_API_PORT`` or the default): a node that
    is starting and will answer soon."""
    if not is_local_url(url):
        return False
    import psutil

    port = _api_port(url)
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            argv = proc.info["cmdline"] or []
            if "node" not in argv or not any("exo_p2p" in a or "exo-p2p" in a for a in argv[: argv.index("node")]):
                continue
            given = None
            for i, arg in enumerate(argv):
                if arg == "--api-port" and i + 1 < len(argv):
                    given = argv[i + 1]
                elif arg.startswith("--api-port="):
                    given = arg.split("=", 1)[1]
            if given is None:
                given = (proc.info.get("environ") or {}).get("EXO_P2P_API_PORT") or str(DEFAULT_API_PORT)
            if given == str(port):
                return True
        except (psutil.Error, ValueError):
            continue
    return False


def resolve_api_key(given: str | None) -> tuple[str | None, str | None]:
    """The API key to send and where it came from: ``given`` (``--api-key``), else
    ``$EXO_P2P_API_KEY`` when set and not blank, else ``(None, None)``. Raises ``CliError``
    (exit 2) for a given key that is blank or no HTTP header can carry (``check_api_key``)."""
    try:
        if given is not None:
            return check_api_key(given, "--api-key"), "--api-key"
        env = os.environ.get(API_KEY_ENV, "")
        if env.strip():
            return check_api_key(env, f"${API_KEY_ENV}"), f"${API_KEY_ENV}"
    except ValueError as e:
        raise CliError(str(e), 2) from None
    return None, None

