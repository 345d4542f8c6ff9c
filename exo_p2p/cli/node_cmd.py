"""``exo-p2p node``: command-line flags (``NodeFlags``) → ``NodeConfig`` → ``exo_p2p.node.node.run_node``.

The checks of each flag's value are ``exo_p2p.cli.node_flag_checks``'."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exo_p2p.cli.errors import CliError
from exo_p2p.cli.node_flag_checks import (access_fields, check_network_flags, check_priority, engine_settings, secret_file,
                                          setting_fields)
from exo_p2p.config import NodeConfig, default_data_dir

if TYPE_CHECKING:
    from exo_p2p.cli.membership import Membership

NODE_CONFIG_FILE = "config.toml"
"""The optional file of ``exo-p2p node`` settings in the data dir (TOML; keys are flag names)."""


@dataclass(frozen=True)
class NodeFlags:
    """The values of ``exo-p2p node``'s flags, as ``build_node_config`` takes them: None (or
    the default below) means "the default of ``NodeConfig``"; a ``--no-X`` flag is ``X=False``."""

    data_dir: Path | None = None
    api_host: str | None = None
    api_port: int | None = None
    listen_host: str | None = None
    listen_port: int | None = None
    memory_limit: str | None = None
    models_dirs: list[Path] | None = None
    ollama_models: Path | None = None
    ollama: bool = True
    lmstudio_models: Path | None = None
    lmstudio: bool = True
    log_format: str | None = None
    log_level: str | None = None
    log_file: Path | None = None
    cluster: str | None = None
    cluster_secret_file: Path | None = None
    bootstrap: list[str] | None = None
    priority: int | None = None
    new_identity: bool = False
    friendly_name: str | None = None
    queue_limit: int | None = None
    prefill_chunk_size: int | None = None
    max_batch: int | None = None
    prompt_cache_bytes: int | None = None
    kv_cache_bytes: int | None = None
    micro_batches: int | None = None
    mdns: bool = True
    offline: bool = False
    restore_size: bool = True
    relink: bool = True
    max_moves: int | None = None
    compact_every: int | None = None
    hub_card_idle: int | None = None
    api_keys: list[str] | None = None
    api_key_file: Path | None = None
    cors_origins: list[str] | None = None
    allowed_hosts: list[str] | None = None
    join: str | None = None
    cpu_weights: str | None = None
    routing: str | None = None
    metrics: bool = True
    request_records: bool = True
    metrics_loopback_open: bool = False
    request_log_bytes: int | None = None
    log_request_text: bool = False


_PLAIN_FIELDS = ("api_host", "api_port", "listen_host", "listen_port", "priority", "friendly_name", "queue_limit",
                 "compact_every", "hub_card_idle", "max_moves", "request_log_bytes")
"""Flags whose value, when given, is the ``NodeConfig`` field of that name as it is."""
_SWITCHES = ("ollama", "lmstudio", "new_identity", "mdns", "offline", "restore_size", "relink", "metrics",
             "request_records", "metrics_loopback_open", "log_request_text")
"""Flags that are ``NodeConfig`` booleans of the same name."""


def build_node_config(**flags: Any) -> NodeConfig:
    """A ``NodeConfig`` from flag values, ``NodeFlags``' fields as keywords (another keyword
    is a ``TypeError``); None means "the default of ``NodeConfig``".

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
    f = NodeFlags(**flags)
    given: dict = access_fields(f.api_keys, f.api_key_file, f.cors_origins, f.allowed_hosts)
    given.update(setting_fields(f.memory_limit, f.cpu_weights, f.routing, f.log_format, f.log_level))
    if f.cluster_secret_file is not None:
        given["cluster_secret_file"] = secret_file(f.cluster_secret_file)
    data_dir = (f.data_dir or default_data_dir()).expanduser()
    membership = _membership(data_dir, f.join, given.get("cluster_secret_file"), f.cluster)
    if membership.secret_file is not None:
        given["cluster_secret_file"] = membership.secret_file
    bootstrap = [*(f.bootstrap or []), *membership.bootstrap]
    check_priority(f.priority)
    check_network_flags(membership.cluster, f.api_port, f.listen_port, bootstrap)
    plain = {name: getattr(f, name) for name in _PLAIN_FIELDS} | {"cluster": membership.cluster}
    given.update({name: value for name, value in plain.items() if value is not None})
    given["engine"] = engine_settings(f.prefill_chunk_size, f.max_batch, f.prompt_cache_bytes, f.kv_cache_bytes,
                                      f.micro_batches)
    if f.log_file is not None:
        given["log_file"] = Path(f.log_file).expanduser()
    return NodeConfig(
        data_dir=data_dir,
        models_dirs=[Path(d).expanduser() for d in f.models_dirs or []],
        ollama_models=Path(f.ollama_models).expanduser() if f.ollama_models else None,
        lmstudio_models=Path(f.lmstudio_models).expanduser() if f.lmstudio_models else None,
        bootstrap=bootstrap,
        **{name: getattr(f, name) for name in _SWITCHES},
        **given,
    )


def _membership(data_dir: Path, join: str | None, secret: Path | None, cluster: str | None) -> Membership:
    """The cluster this node belongs to (``exo_p2p.cli.membership.resolve_membership``): a
    bad ``join`` token is a usage error (exit 2), a secret that cannot be kept in
    ``data_dir`` exit 1."""
    from exo_p2p.cli.membership import MembershipError, resolve_membership

    try:
        return resolve_membership(data_dir, join=join, secret_file=secret, cluster=cluster)
    except MembershipError as e:
        raise CliError(str(e), 2) from None
    except OSError as e:
        raise CliError(f"cannot keep the cluster secret in {data_dir}: {e.strerror or e}", 1) from None


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
    """Run a node until it is stopped (Ctrl-C / SIGTERM), through ``exo_p2p.node.node.run_node``
    (imported here so client commands never pay for the node's imports); returns its exit
    code (0 after a clean stop). Raises ``CliError`` when this installation has no node
    runtime."""
    from exo_p2p.limits import guard_setrlimit

    guard_setrlimit()  # before any import can lower the open-file limit (exo_p2p.limits)
    try:
        from exo_p2p.node.node import run_node as node_main
    except ImportError as e:
        raise CliError(f"this installation cannot run a node: {e}") from e
    if inspect.iscoroutinefunction(node_main):
        import trio

        code = trio.run(node_main, config)
    else:
        code = node_main(config)
    return code if isinstance(code, int) else 0
