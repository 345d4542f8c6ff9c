"""The checks of ``exo-p2p node``'s flag values: each turns what was given into
``NodeConfig`` fields, or raises ``CliError`` with exit code 2 (a usage error) naming the
flag. ``exo_p2p.cli.node_cmd.build_node_config`` applies them in order."""

from __future__ import annotations

from pathlib import Path

from exo_p2p.cli.errors import CliError
from exo_p2p.config import CPU_WEIGHTS, parse_bytes
from exo_p2p.defaults import NODE_PROMPT_CACHE_BYTES
from exo_p2p.types.engine import EngineSettings

LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
ROUTINGS = ("prefix", "load")
MIN_MEMORY_LIMIT = 64 * 1024 * 1024
"""The smallest ``--memory-limit`` taken (bytes): less is almost surely a size without its unit."""


def memory_limit_bytes(text: str) -> int:
    """``--memory-limit`` text ("17179869184", "16GiB", ``parse_bytes``) in bytes; at least
    ``MIN_MEMORY_LIMIT``."""
    try:
        limit = parse_bytes(text)
    except ValueError as e:
        raise CliError(f"--memory-limit: {e}", exit_code=2) from e
    if limit < MIN_MEMORY_LIMIT:
        raise CliError(f"--memory-limit {text} is {limit} bytes, less than 64 MiB; give a unit, e.g. {text}GiB", exit_code=2)
    return limit


def setting_fields(memory_limit: str | None, cpu_weights: str | None, routing: str | None, log_format: str | None,
                   log_level: str | None) -> dict:
    """The ``NodeConfig`` fields of the flags given (None: not given) among ``--memory-limit``,
    ``--cpu-weights`` (``CPU_WEIGHTS``), ``--routing`` (``ROUTINGS``), ``--log-format``
    (``LOG_FORMATS``) and ``--log-level`` (``LOG_LEVELS``, any case; kept lower-case), checked
    in that order."""
    given: dict = {}
    if memory_limit is not None:
        given["memory_limit"] = memory_limit_bytes(memory_limit)
    if cpu_weights is not None:
        if cpu_weights not in CPU_WEIGHTS:
            raise CliError(f"--cpu-weights must be one of {', '.join(CPU_WEIGHTS)}, got {cpu_weights!r}", 2)
        given["cpu_weights"] = cpu_weights
    if routing is not None:
        if routing not in ROUTINGS:
            raise CliError(f"--routing must be prefix or load, got {routing!r}", 2)
        given["routing"] = routing
    if log_format is not None:
        if log_format not in LOG_FORMATS:
            raise CliError(f"--log-format must be one of {', '.join(LOG_FORMATS)}", 2)
        given["log_format"] = log_format
    if log_level is not None:
        if log_level.lower() not in LOG_LEVELS:
            raise CliError(f"--log-level must be one of {', '.join(LOG_LEVELS)}", 2)
        given["log_level"] = log_level.lower()
    return given


def secret_file(path: Path) -> Path:
    """The ``--cluster-secret`` file, ``~`` expanded: it must exist and hold a valid secret
    (``exo_p2p.net.config.validate_secret``)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CliError(f"--cluster-secret: no such file {path} (create one with `exo-p2p cluster-secret FILE`)", 2)
    from exo_p2p.net.config import ConfigError, validate_secret

    try:
        validate_secret(path.read_bytes())
    except (OSError, ConfigError) as e:
        raise CliError(f"--cluster-secret {path}: {getattr(e, 'strerror', None) or e}", 2) from None
    return path


def check_priority(priority: int | None) -> None:
    """``--priority`` fits in 32 bits, signed."""
    if priority is not None and not -(2**31) <= priority < 2**31:
        raise CliError(f"--priority must be between {-(2**31)} and {2**31 - 1}, got {priority}", 2)


def engine_settings(
    prefill_chunk_size: int | None, max_batch: int | None, prompt_cache_bytes: int | None, kv_cache_bytes: int | None,
    micro_batches: int | None = None,
) -> EngineSettings:
    """``NodeConfig.engine`` from ``--prefill-chunk-size`` (tokens), ``--max-batch``
    (sequences), ``--prompt-cache-bytes`` and ``--kv-cache-bytes`` (bytes), ``--micro-batches``; None keeps the
    default of ``EngineSettings`` (``NODE_PROMPT_CACHE_BYTES`` for the prompt cache). A value
    out of range is a ``CliError`` (exit 2)."""
    values = {"prefill_chunk_size": prefill_chunk_size, "max_batch": max_batch,
              "prompt_cache_bytes": NODE_PROMPT_CACHE_BYTES if prompt_cache_bytes is None else prompt_cache_bytes,
              "kv_cache_bytes": kv_cache_bytes, "micro_batches": micro_batches}
    try:
        return EngineSettings(**{k: v for k, v in values.items() if v is not None}).check()
    except ValueError as e:
        raise CliError(f"--{str(e).split(' ', 1)[0].replace('_', '-')}: {e}", 2) from None


def access_fields(api_keys: list[str] | None, api_key_file: Path | None, cors_origins: list[str] | None,
                  allowed_hosts: list[str] | None = None) -> dict:
    """``api_keys``/``cors_origins``/``allowed_hosts`` of ``NodeConfig`` from ``--api-key``
    (repeatable), ``--api-key-file`` (one key a line), ``--cors-origins`` and
    ``--allowed-hosts`` (comma-separated, repeatable)."""
    from exo_p2p.api.access import AccessPolicy, read_api_key_file
    from exo_p2p.api.hosts import parse_names

    keys = [k.strip() for k in api_keys or [] if k.strip()]
    if api_keys and not keys:
        raise CliError("--api-key must not be empty", 2)
    if api_key_file is not None:
        try:
            from_file = read_api_key_file(api_key_file.expanduser().read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"--api-key-file {api_key_file}: {getattr(e, 'strerror', None) or e}", 2) from None
        if not from_file:
            raise CliError(f"--api-key-file {api_key_file} holds no key (one key a line)", 2)
        keys += from_file
    try:
        policy = AccessPolicy.of(keys, cors_origins or [])
    except ValueError as e:
        raise CliError(f"--cors-origins: {e}", 2) from None
    try:
        hosts = parse_names(allowed_hosts or [])
    except ValueError as e:
        raise CliError(f"--allowed-hosts: {e}", 2) from None
    out: dict = {}
    if keys:
        out["api_keys"] = sorted(policy.api_keys)
    if policy.cors_origins:
        out["cors_origins"] = list(policy.cors_origins)
    if hosts:
        out["allowed_hosts"] = list(hosts)
    return out


def check_network_flags(
    cluster: str | None, api_port: int | None, listen_port: int | None, bootstrap: list[str] | None
) -> None:
    """Usage errors (exit 2) for a bad cluster name, a port out of range, or a bootstrap
    address that is not a ``/ip4/A/tcp/P/p2p/<node id>`` multiaddr."""
    from exo_p2p.net.config import ConfigError, validate_cluster_name

    if cluster is not None:
        try:
            validate_cluster_name(cluster)
        except ConfigError as e:
            raise CliError(f"--cluster: {e}", 2) from e
    for flag, port in (("--api-port", api_port), ("--listen-port", listen_port)):
        if port is not None and not 0 <= port <= 65535:
            raise CliError(f"{flag} must be between 0 and 65535, got {port}", 2)
    for addr in bootstrap or []:
        try:
            import multiaddr
            from libp2p.peer.peerinfo import info_from_p2p_addr

            info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as e:  # noqa: BLE001 - any parse failure is the same usage error
            raise CliError(
                f"--bootstrap {addr!r} is not a peer address like /ip4/10.0.0.2/tcp/52514/p2p/12D3KooW... "
                "(`exo-p2p nodes` on that node prints them)",
                2,
            ) from e
