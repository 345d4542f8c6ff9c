"""The checks of node settings that are more than a type, bounds and choices: each takes the
value given (a list for a repeatable flag) and returns the ``NodeConfig`` field's value, or
raises ``ValueError`` with the reason (``exo_p2p.settings.apply`` puts the flag in front).

Pure but for reading the file a flag names; the libraries a check needs are imported when it
runs, so that the CLI's client commands never pay for them (``tests/test_cli_imports.py``).
"""

from __future__ import annotations

from pathlib import Path

from exo_p2p.config import parse_bytes

MIN_MEMORY_LIMIT = 64 * 1024 * 1024
"""The smallest ``--memory-limit`` taken (bytes): less is almost surely a size without its unit."""


def memory_limit_bytes(text: str) -> int:
    """``--memory-limit`` text ("17179869184", "16GiB", ``parse_bytes``) in bytes; at least
    ``MIN_MEMORY_LIMIT``."""
    limit = parse_bytes(str(text))
    if limit < MIN_MEMORY_LIMIT:
        raise ValueError(f"{text} is {limit} bytes, less than 64 MiB; give a unit, e.g. {text}GiB")
    return limit


def keep_alive_seconds(text: str) -> float:
    """``--keep-alive`` text (seconds, or a duration such as ``5m``; negative: forever, -1.0)
    in seconds (``exo_p2p.api.demand.keep_alive.parse_keep_alive``)."""
    from exo_p2p.api.demand.keep_alive import parse_keep_alive

    seconds = parse_keep_alive(str(text))
    assert seconds is not None
    return seconds


def aliases(texts: list[str]) -> list[str]:
    """``--alias NAME=MODEL`` values checked: the shape, the bounds, no loop
    (``exo_p2p.api.demand.aliases.check_aliases``)."""
    from exo_p2p.api.demand.aliases import check_aliases

    return check_aliases(texts)


def cluster_name(name: str) -> str:
    """A cluster name ``exo_p2p.net.config.validate_cluster_name`` takes."""
    from exo_p2p.net.config import ConfigError, validate_cluster_name

    try:
        validate_cluster_name(name)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return name


def secret_file(path: Path) -> Path:
    """A file holding a valid cluster secret (``exo_p2p.net.config.validate_secret``)."""
    if not path.is_file():
        raise ValueError(f"no such file {path} (create one with `exo-p2p cluster-secret FILE`)")
    from exo_p2p.net.config import ConfigError, validate_secret

    try:
        validate_secret(path.read_bytes())
    except (OSError, ConfigError) as e:
        raise ValueError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    return path


def peer_addresses(addrs: list[str]) -> list[str]:
    """Each a ``/ip4/A/tcp/P/p2p/<node id>`` multiaddr of a peer."""
    import multiaddr
    from libp2p.peer.peerinfo import info_from_p2p_addr

    for addr in addrs:
        try:
            info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception:  # noqa: BLE001 - any parse failure is the same usage error
            raise ValueError(f"{addr!r} is not a peer address like /ip4/10.0.0.2/tcp/52514/p2p/12D3KooW... "
                             "(`exo-p2p nodes` on that node prints them)") from None
    return list(addrs)


def api_keys(keys: list[str]) -> list[str]:
    """The keys given, stripped, blanks dropped; not all blank."""
    kept = [k.strip() for k in keys if k.strip()]
    if not kept:
        raise ValueError("must not be empty")
    return kept


def api_key_file(path: Path) -> list[str]:
    """The keys of a file of API keys (one a line, # comments; ``exo_p2p.api.access``); at least one."""
    from exo_p2p.api.access import read_api_key_file

    try:
        keys = read_api_key_file(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    if not keys:
        raise ValueError(f"{path} holds no key (one key a line)")
    return keys


def cors_origins(origins: list[str]) -> list[str]:
    """Web origins, comma-separated or repeated (``exo_p2p.api.access.AccessPolicy``)."""
    from exo_p2p.api.access import AccessPolicy

    return list(AccessPolicy.of([], origins).cors_origins)


def host_names(names: list[str]) -> list[str]:
    """Host names, comma-separated or repeated (``exo_p2p.api.hosts.parse_names``)."""
    from exo_p2p.api.hosts import parse_names

    return list(parse_names(names))


def fault_hooks(hooks: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` pairs (``--fault-hook``, tests only) as a dict."""
    out = {}
    for hook in hooks:
        key, sep, value = hook.partition("=")
        if not sep or not key:
            raise ValueError(f"takes KEY=VALUE, got {hook!r}")
        out[key] = value
    return out


def kv_cache_bits(value: int | str) -> int:
    """``--kv-cache-bits``: 0, 8 or 4 (``exo_p2p.models.kv_bytes.KV_BITS``), else ``ValueError``."""
    bits = int(value) if str(value).strip().isdigit() else -1
    if bits not in (0, 4, 8):
        raise ValueError(f"must be 0, 8 or 4, got {value!r}")
    return bits
