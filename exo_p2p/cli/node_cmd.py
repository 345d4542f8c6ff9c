"""``exo-p2p node``: command-line flags → ``NodeConfig`` → ``exo_p2p.node.run_node``."""

from __future__ import annotations

import inspect
from pathlib import Path

from exo_p2p.cli.errors import CliError
from exo_p2p.config import CPU_WEIGHTS, NodeConfig, default_data_dir, parse_bytes
from exo_p2p.types.engine import EngineSettings
from exo_p2p.defaults import NODE_PROMPT_CACHE_BYTES

NODE_CONFIG_FILE = "config.toml"
"""The optional file of ``exo-p2p node`` settings in the data dir (TOML; keys are flag names)."""
LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")


def build_node_config(
    *,
    data_dir: Path | None = None,
    api_host: str | None = None,
    api_port: int | None = None,
    listen_host: str | None = None,
    listen_port: int | None = None,
    memory_limit: str | None = None,
    models_dirs: list[Path] | None = None,
    ollama_models: Path | None = None,
    ollama: bool = True,
    lmstudio_models: Path | None = None,
    lmstudio: bool = True,
    log_format: str | None = None,
    log_level: str | None = None,
    log_file: Path | None = None,
    cluster: str | None = None,
    cluster_secret_file: Path | None = None,
    bootstrap: list[str] | None = None,
    priority: int | None = None,
    new_identity: bool = False,
    friendly_name: str | None = None,
    queue_limit: int | None = None,
    prefill_chunk_size: int | None = None,
    max_batch: int | None = None,
    prompt_cache_bytes: int | None = None,
    kv_cache_bytes: int | None = None,
    micro_batches: int | None = None,
    mdns: bool = True,
    offline: bool = False,
    restore_size: bool = True,
    relink: bool = True,
    max_moves: int | None = None,
    compact_every: int | None = None,
    api_keys: list[str] | None = None,
    api_key_file: Path | None = None,
    cors_origins: list[str] | None = None,
    allowed_hosts: list[str] | None = None,
    join: str | None = None,
    cpu_weights: str | None = None,
    routing: str | None = None,
    metrics: bool = True,
    request_records: bool = True,
    metrics_loopback_open: bool = False,
    request_log_bytes: int | None = None,
    log_request_text: bool = False,
) -> NodeConfig:
    """A ``NodeConfig`` from flag values; None means "the default of ``NodeConfig``".

    ``memory_limit`` is text for ``parse_bytes`` ("17179869184", "16GiB"). Raises
    ``CliError`` with exit code 2 (a usage error) for a bad size, log format or level, or
    a ``cpu_weights`` other than auto/float32/stored, a ``routing`` other than prefix/load, a cluster-secret file that does not exist
    or is not a valid secret, or a priority out of the 32-bit range, an unreadable or empty
    ``api_key_file``, a malformed CORS origin or allowed host name, or an engine setting out of range. The five
    engine settings (``prefill_chunk_size`` tokens, ``max_batch`` sequences,
    ``prompt_cache_bytes`` and ``kv_cache_bytes`` bytes, ``micro_batches``) become ``NodeConfig.engine``.
    ``join`` (a token of ``exo-p2p invite``) and the secret stored in the data dir follow
    ``exo_p2p.cli.membership``.
    """
    given: dict = {}
    given.update(_access_flags(api_keys, api_key_file, cors_origins, allowed_hosts))
    if memory_limit is not None:
        try:
            given["memory_limit"] = parse_bytes(memory_limit)
        except ValueError as e:
            raise CliError(f"--memory-limit: {e}", exit_code=2) from e
        if given["memory_limit"] < 64 * 1024 * 1024:
            raise CliError(
                f"--memory-limit {memory_limit} is {given['memory_limit']} bytes, less than 64 MiB; "
                f"give a unit, e.g. {memory_limit}GiB",
                exit_code=2,
            )
    if cpu_weights is not None:
        if cpu_weights not in CPU_WEIGHTS:
            raise CliError(f"--cpu-weights must be one of {', '.join(CPU_WEIGHTS)}, got {cpu_weights!r}", 2)
        given["cpu_weights"] = cpu_weights
    if routing is not None:
        if routing not in ("prefix", "load"):
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
    if cluster_secret_file is not None:
        cluster_secret_file = Path(cluster_secret_file).expanduser()
        if not cluster_secret_file.is_file():
            raise CliError(
                f"--cluster-secret: no such file {cluster_secret_file} "
                "(create one with `exo-p2p cluster-secret FILE`)",
                2,
            )
        from exo_p2p.net.config import ConfigError, validate_secret

        try:
            validate_secret(cluster_secret_file.read_bytes())
        except (OSError, ConfigError) as e:
            raise CliError(f"--cluster-secret {cluster_secret_file}: {getattr(e, 'strerror', None) or e}", 2) from None
        given["cluster_secret_file"] = cluster_secret_file
    data_dir = (data_dir or default_data_dir()).expanduser()
    from exo_p2p.cli.membership import MembershipError, resolve_membership

    try:
        membership = resolve_membership(data_dir, join=join, secret_file=given.get("cluster_secret_file"), cluster=cluster)
    except MembershipError as e:
        raise CliError(str(e), 2) from None
    except OSError as e:
        raise CliError(f"cannot keep the cluster secret in {data_dir}: {e.strerror or e}", 1) from None
    if membership.secret_file is not None:
        given["cluster_secret_file"] = membership.secret_file
    cluster = membership.cluster
    bootstrap = [*(bootstrap or []), *membership.bootstrap]
    if priority is not None and not -(2**31) <= priority < 2**31:
        raise CliError(f"--priority must be between {-(2**31)} and {2**31 - 1}, got {priority}", 2)
    _validate_network_flags(cluster, api_port, listen_port, bootstrap)
    for name, value in (
        ("api_host", api_host),
        ("api_port", api_port),
        ("listen_host", listen_host),
        ("listen_port", listen_port),
        ("cluster", cluster),
        ("priority", priority),
        ("friendly_name", friendly_name),
        ("queue_limit", queue_limit),
        ("compact_every", compact_every),
        ("max_moves", max_moves),
        ("request_log_bytes", request_log_bytes),
    ):
        if value is not None:
            given[name] = value
    given["engine"] = _engine_settings(prefill_chunk_size, max_batch, prompt_cache_bytes, kv_cache_bytes, micro_batches)
    if log_file is not None:
        given["log_file"] = Path(log_file).expanduser()
    return NodeConfig(
        data_dir=Path(data_dir or default_data_dir()).expanduser(),
        models_dirs=[Path(d).expanduser() for d in models_dirs or []],
        ollama_models=Path(ollama_models).expanduser() if ollama_models else None,
        ollama=ollama,
        lmstudio_models=Path(lmstudio_models).expanduser() if lmstudio_models else None,
        lmstudio=lmstudio,
        bootstrap=list(bootstrap or []),
        new_identity=new_identity,
        mdns=mdns,
        offline=offline,
        restore_size=restore_size,
        relink=relink,
        metrics=metrics,
        request_records=request_records,
        metrics_loopback_open=metrics_loopback_open,
        log_request_text=log_request_text,
        **given,
    )


def _engine_settings(
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


def _access_flags(api_keys: list[str] | None, api_key_file: Path | None, cors_origins: list[str] | None,
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


def _validate_network_flags(
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


def read_node_config_file(path: Path) -> dict:
    """The settings in the TOML file at ``path`` (``{}`` when there is no such file).
    Raises ``CliError`` (exit 2) naming the file when it cannot be read or parsed."""
    import tomllib

    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror or e}", 2) from None
    try:
        return tomllib.loads(text.decode("utf-8", errors="replace"))
    except tomllib.TOMLDecodeError as e:
        raise CliError(f"{path} is not valid TOML: {e}", 2) from None


def run_node(config: NodeConfig) -> int:
    """Run a node until it is stopped (Ctrl-C / SIGTERM), through ``exo_p2p.node.run_node``
    (imported here so client commands never pay for the node's imports); returns its exit
    code (0 after a clean stop). Raises ``CliError`` when this installation has no node
    runtime."""
    from exo_p2p.limits import guard_setrlimit

    guard_setrlimit()  # before any import can lower the open-file limit (exo_p2p.limits)
    try:
        from exo_p2p.node import run_node as node_main
    except ImportError as e:
        raise CliError(f"this installation cannot run a node: {e}") from e
    if inspect.iscoroutinefunction(node_main):
        import trio

        code = trio.run(node_main, config)
    else:
        code = node_main(config)
    return code if isinstance(code, int) else 0
