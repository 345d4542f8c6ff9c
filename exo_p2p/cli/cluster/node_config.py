"""``exo-p2p node``: the flags' values → ``NodeConfig`` → ``exo_p2p.node.node.run_node``.

``build_node_config`` applies the values the way ``exo_p2p.settings.apply`` applies every
setting (each setting's type, check, bounds and choices from ``exo_p2p.settings.table``); the
rules here are the ones that join several flags: the data dir's default, and the cluster this
node belongs to (``--join``, ``--cluster-secret``, ``--cluster``, ``--bootstrap`` and what the
data dir keeps, ``exo_p2p.cli.cluster.membership``)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exo_p2p.cli.errors import CliError
from exo_p2p.config import NodeConfig, default_data_dir
from exo_p2p.settings.apply import SettingError, checked, field_values, node_config
from exo_p2p.settings.table import SETTINGS

if TYPE_CHECKING:
    from exo_p2p.cli.cluster.membership import Membership

NODE_CONFIG_FILE = "config.toml"
"""The optional file of ``exo-p2p node`` settings in the data dir (TOML; keys are flag names)."""


def build_node_config(**given: Any) -> NodeConfig:
    """A ``NodeConfig`` from setting values, by ``Setting.keyword`` (the ``NodeConfig`` field's
    name: ``max_batch=4``, ``mdns=False``, ``api_key_file=Path(...)``; another keyword is a
    ``TypeError``); None, or a keyword left out, means "the default of ``NodeConfig``".

    ``memory_limit`` is text for ``parse_bytes`` ("17179869184", "16GiB"). Raises ``CliError``
    with exit code 2 (a usage error) naming the flag for a value its setting refuses (its
    check, bounds or choices: ``exo_p2p.settings.table``), and for a ``join`` token or a
    cluster that do not go together (``exo_p2p.cli.cluster.membership``); exit 1 when the cluster
    secret cannot be kept in the data dir.
    """
    try:
        fields = field_values(given)
    except SettingError as e:
        raise CliError(str(e), 2) from None
    data_dir = fields.setdefault("data_dir", default_data_dir().expanduser())
    membership = _membership(data_dir, given.get("join"), fields.get("cluster_secret_file"), fields.get("cluster"))
    try:
        if membership.cluster is not None:
            fields["cluster"] = checked(SETTINGS["--cluster"], membership.cluster)
        if membership.bootstrap:
            invited = checked(SETTINGS["--bootstrap"], membership.bootstrap)
            fields["bootstrap"] = [*fields.get("bootstrap", []), *invited]
    except SettingError as e:
        raise CliError(str(e), 2) from None
    if membership.secret_file is not None:
        fields["cluster_secret_file"] = membership.secret_file
    return node_config(fields)


def _membership(data_dir: Path, join: str | None, secret: Path | None, cluster: str | None) -> Membership:
    """The cluster this node belongs to (``exo_p2p.cli.cluster.membership.resolve_membership``): a
    bad ``join`` token is a usage error (exit 2), a secret that cannot be kept in
    ``data_dir`` exit 1."""
    from exo_p2p.cli.cluster.membership import MembershipError, resolve_membership

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
