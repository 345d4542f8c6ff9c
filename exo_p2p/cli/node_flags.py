"""The flags of ``exo-p2p node``: one typer option per node setting, and the values the
command line, the environment and the data dir's ``config.toml`` give them, made into a
``NodeConfig``.

Every node flag is one alias below, ``node_option("--flag")``: its environment variable,
metavar and help (with the default, read from ``NodeConfig``) come from the one table of node
settings, ``exo_p2p.settings.table.SETTINGS``, which also renders docs/configuration.md. A
value neither given on the command line nor in the environment comes from the data dir's
``config.toml`` (``node_flag_values``), keyed by the flag's name. Adding a flag: one
``Setting`` in the table, one alias here, one parameter of ``node``
(``exo_p2p.cli.cluster_cmds``), one keyword in ``node_config``, one ``NodeFlags`` field
(``exo_p2p.cli.node_cmd``; its check, if any, in ``exo_p2p.cli.node_flag_checks``), one
``NodeConfig`` field (an engine setting: one ``EngineSettings`` field,
``exo_p2p.types.engine``); then run scripts/gen_config_docs.py.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer
from typer._click.core import ParameterSource  # typer ships its own click
from typer.core import TyperCommand

from exo_p2p.cli.errors import CliError
from exo_p2p.cli.node_cmd import NODE_CONFIG_FILE, build_node_config, read_node_config_file
from exo_p2p.config import NodeConfig, default_data_dir
from exo_p2p.settings.table import SETTINGS


class LogFormat(str, Enum):
    console = "console"
    json = "json"


HELP_PANELS: dict[str, tuple[str, ...]] = {
    "Basics": ("--data-dir", "--name", "--memory-limit", "--models-dir", "--log-level", "--log-file"),
    "Network and cluster": ("--api-port", "--api-host", "--listen-port", "--listen-host", "--cluster",
                            "--cluster-secret", "--bootstrap", "--join", "--no-mdns"),
    "API access": ("--api-key", "--api-key-file", "--cors-origins", "--allowed-hosts"),
    "Serving (--help-all)": ("--queue-limit", "--prefill-chunk-size", "--max-batch", "--prompt-cache-bytes",
                             "--kv-cache-bytes", "--micro-batches", "--cpu-weights", "--routing", "--max-moves"),
    "Model stores (--help-all)": ("--ollama-models", "--no-ollama", "--lmstudio-models", "--no-lmstudio", "--offline",
                                  "--hub-card-idle"),
    "Logs, records and metrics (--help-all)": ("--log-format", "--no-metrics", "--no-request-records",
                                               "--metrics-loopback-open", "--request-log-bytes", "--log-request-text"),
    "Recovery and identity (--help-all)": ("--priority", "--new-identity", "--no-restore-size", "--no-relink",
                                           "--compact-every"),
}
"""The groups ``exo-p2p node --help`` shows the flags in; the groups marked ``--help-all`` are
shown only by ``node --help-all`` (``NodeCommand``), so that the first help fits a screen."""
PANEL_OF = {flag: panel for panel, flags in HELP_PANELS.items() for flag in flags}
ALL_ONLY = frozenset(flag for panel, flags in HELP_PANELS.items() if panel.endswith("(--help-all)") for flag in flags)


def node_option(flag: str, **extra: Any) -> Any:
    """The ``typer.Option`` of the node flag ``flag`` (``"--api-port"``), from its entry in
    ``SETTINGS``, in its help group (``HELP_PANELS``); ``extra`` adds click settings such as
    ``min``. Its environment variable is shown only when it is not ``EXO_P2P_`` and the flag's
    name (the command's help says that rule once)."""
    setting = SETTINGS[flag]
    derived = "EXO_P2P_" + flag[2:].upper().replace("-", "_")
    return typer.Option(flag, envvar=setting.env, metavar=setting.metavar, help=setting.cli_help(), hidden=setting.hidden,
                        show_envvar=setting.env not in (None, derived), rich_help_panel=PANEL_OF.get(flag), **extra)


class NodeCommand(TyperCommand):
    """``exo-p2p node``'s command: ``--help`` leaves out the flags of the groups marked
    ``--help-all`` (``ALL_ONLY``); ``--help-all`` (``show_all_help``) shows every one."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if ctx.meta.get(HELP_ALL_KEY):
            return super().format_help(ctx, formatter)
        advanced = [p for p in self.get_params(ctx) if not p.hidden and set(p.opts) & ALL_ONLY]
        for param in advanced:
            param.hidden = True
        try:
            return super().format_help(ctx, formatter)
        finally:
            for param in advanced:
                param.hidden = False


HELP_ALL_KEY = "exo_p2p.help_all"


def show_all_help(ctx: typer.Context, value: bool) -> None:
    """``--help-all``'s callback: print the help with every flag and exit."""
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL_KEY] = True
        typer.echo(ctx.get_help())
        raise typer.Exit()


HelpAll = Annotated[bool, typer.Option("--help-all", is_eager=True, callback=show_all_help,
                                       help="Show every flag, also those of the groups --help leaves out.")]


ApiPort = Annotated[Optional[int], node_option("--api-port")]
ApiHost = Annotated[Optional[str], node_option("--api-host")]
ListenPort = Annotated[Optional[int], node_option("--listen-port")]
ListenHost = Annotated[Optional[str], node_option("--listen-host")]
DataDir = Annotated[Optional[Path], node_option("--data-dir")]
MemoryLimit = Annotated[Optional[str], node_option("--memory-limit")]
ModelsDir = Annotated[Optional[list[Path]], node_option("--models-dir")]
OllamaModels = Annotated[Optional[Path], node_option("--ollama-models")]
NoOllama = Annotated[bool, node_option("--no-ollama")]
LmstudioModels = Annotated[Optional[Path], node_option("--lmstudio-models")]
NoLmstudio = Annotated[bool, node_option("--no-lmstudio")]
LogFormatFlag = Annotated[Optional[LogFormat], node_option("--log-format")]
LogLevel = Annotated[Optional[str], node_option("--log-level")]
LogFile = Annotated[Optional[Path], node_option("--log-file")]
Cluster = Annotated[Optional[str], node_option("--cluster")]
ClusterSecret = Annotated[Optional[Path], node_option("--cluster-secret")]
Bootstrap = Annotated[Optional[list[str]], node_option("--bootstrap")]
Priority = Annotated[Optional[int], node_option("--priority")]
NewIdentity = Annotated[bool, node_option("--new-identity")]
Name = Annotated[Optional[str], node_option("--name")]
QueueLimit = Annotated[Optional[int], node_option("--queue-limit", min=1)]
PrefillChunkSize = Annotated[Optional[int], node_option("--prefill-chunk-size", min=1)]
MaxBatch = Annotated[Optional[int], node_option("--max-batch", min=1)]
PromptCacheBytes = Annotated[Optional[int], node_option("--prompt-cache-bytes", min=0)]
KvCacheBytes = Annotated[Optional[int], node_option("--kv-cache-bytes", min=0)]
MicroBatches = Annotated[Optional[int], node_option("--micro-batches", min=0)]
CpuWeights = Annotated[Optional[str], node_option("--cpu-weights")]
MaxMoves = Annotated[Optional[int], node_option("--max-moves", min=0)]
NoMdns = Annotated[bool, node_option("--no-mdns")]
Offline = Annotated[bool, node_option("--offline")]
NoRestoreSize = Annotated[bool, node_option("--no-restore-size")]
NoRelink = Annotated[bool, node_option("--no-relink")]
CompactEvery = Annotated[Optional[int], node_option("--compact-every", min=1)]
HubCardIdle = Annotated[Optional[int], node_option("--hub-card-idle", min=1)]
ApiKeys = Annotated[Optional[list[str]], node_option("--api-key")]
ApiKeyFile = Annotated[Optional[Path], node_option("--api-key-file")]
CorsOrigins = Annotated[Optional[list[str]], node_option("--cors-origins")]
AllowedHosts = Annotated[Optional[list[str]], node_option("--allowed-hosts")]
Routing = Annotated[Optional[str], node_option("--routing")]
NoMetrics = Annotated[bool, node_option("--no-metrics")]
NoRequestRecords = Annotated[bool, node_option("--no-request-records")]
MetricsLoopbackOpen = Annotated[bool, node_option("--metrics-loopback-open")]
RequestLogBytes = Annotated[Optional[int], node_option("--request-log-bytes", min=0)]
LogRequestText = Annotated[bool, node_option("--log-request-text")]
Join = Annotated[Optional[str], node_option("--join")]
FaultHook = Annotated[Optional[list[str]], node_option("--fault-hook")]


def node_flag_values(ctx: typer.Context, **skip: Any) -> dict[str, Any]:
    """The ``node`` command's flag values by parameter name, with the data dir's
    ``config.toml`` filling in every flag the command line and environment left at its
    default. Raises ``CliError`` (exit 2) for an unreadable file, an unknown key or a bad
    value (naming the file and the key)."""
    values = dict(ctx.params)
    data_dir = (values.get("data_dir") or default_data_dir()).expanduser()
    from_file = read_node_config_file(data_dir / NODE_CONFIG_FILE)
    if not from_file:
        return values
    params = {p.name: p for p in ctx.command.params if p.name and p.name not in skip}
    for key, raw in from_file.items():
        name = key.replace("-", "_")
        param = params.get(name)
        if name == "data_dir":
            raise CliError(f"{data_dir / NODE_CONFIG_FILE}: data-dir cannot be set in the data dir's own file", 2)
        if param is None or name == "help" or getattr(param, "hidden", False):
            raise CliError(f"{data_dir / NODE_CONFIG_FILE}: unknown setting {key!r} (keys are `exo-p2p node` flag names, e.g. api-port)", 2)
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            continue  # the command line or the environment wins
        if getattr(param, "multiple", False) and not isinstance(raw, list):
            raw = [raw]
        try:
            values[name] = param.process_value(ctx, raw)
        except (click.BadParameter, typer.BadParameter) as e:
            raise CliError(f"{data_dir / NODE_CONFIG_FILE}: {key}: {e.message}", 2) from None
    return values


def node_config(values: dict[str, Any]) -> NodeConfig:
    """The ``NodeConfig`` of the flag values ``values`` (``node_flag_values``): each flag to
    its ``build_node_config`` keyword, a ``--no-X`` flag to ``X=False``, then the test-only
    ``--fault-hook KEY=VALUE`` pairs into ``fault_hooks``. Raises ``CliError`` (exit 2) for
    a bad value, as ``build_node_config`` does, and for a fault hook without ``=`` or key."""
    log_format = values["log_format"]
    config = build_node_config(
        data_dir=values["data_dir"],
        api_host=values["api_host"],
        api_port=values["api_port"],
        listen_host=values["listen_host"],
        listen_port=values["listen_port"],
        memory_limit=values["memory_limit"],
        models_dirs=values["models_dir"],
        ollama_models=values["ollama_models"],
        ollama=not values["no_ollama"],
        lmstudio_models=values["lmstudio_models"],
        lmstudio=not values["no_lmstudio"],
        log_format=getattr(log_format, "value", log_format),
        log_level=values["log_level"],
        log_file=values["log_file"],
        cluster=values["cluster"],
        cluster_secret_file=values["cluster_secret"],
        bootstrap=values["bootstrap"],
        priority=values["priority"],
        new_identity=values["new_identity"],
        friendly_name=values["name"],
        queue_limit=values["queue_limit"],
        prefill_chunk_size=values["prefill_chunk_size"],
        max_batch=values["max_batch"],
        prompt_cache_bytes=values["prompt_cache_bytes"],
        kv_cache_bytes=values["kv_cache_bytes"],
        micro_batches=values["micro_batches"],
        mdns=not values["no_mdns"],
        offline=values["offline"],
        restore_size=not values["no_restore_size"],
        relink=not values["no_relink"],
        compact_every=values["compact_every"],
        hub_card_idle=values["hub_card_idle"],
        max_moves=values["max_moves"],
        api_keys=values["api_key"],
        api_key_file=values["api_key_file"],
        cors_origins=values["cors_origins"],
        allowed_hosts=values["allowed_hosts"],
        join=values["join"],
        cpu_weights=values["cpu_weights"],
        routing=values["routing"],
        metrics=not values["no_metrics"],
        request_records=not values["no_request_records"],
        metrics_loopback_open=values["metrics_loopback_open"],
        request_log_bytes=values["request_log_bytes"],
        log_request_text=values["log_request_text"],
    )
    add_fault_hooks(config, values["fault_hook"])
    return config


def add_fault_hooks(config: NodeConfig, hooks: list[str] | None) -> None:
    """Each ``KEY=VALUE`` of ``hooks`` (``--fault-hook``, tests only) into
    ``config.fault_hooks``. Raises ``CliError`` (exit 2) for one without ``=`` or a key."""
    for hook in hooks or []:
        key, sep, value = hook.partition("=")
        if not sep or not key:
            raise CliError(f"--fault-hook takes KEY=VALUE, got {hook!r}", 2)
        config.fault_hooks[key] = value
