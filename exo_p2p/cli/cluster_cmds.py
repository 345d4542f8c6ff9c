"""The commands that make a cluster: ``node`` runs a node on this machine until Ctrl-C,
``cluster-secret`` makes the key of a private cluster, ``invite`` a join token for a new
machine (``exo_p2p.cli.invite_cmd``).

``node``'s flags are declared in ``exo_p2p.cli.node_flags`` (from the one table of node
settings); the node itself is imported only when it runs (``node_cmd.run_node``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import click
import typer

from exo_p2p.cli import invite_cmd
from exo_p2p.cli import node_flags as flag
from exo_p2p.cli.common import app, handled
from exo_p2p.cli.errors import CliError
from exo_p2p.cli.node_cmd import run_node
from exo_p2p.cli.secret import new_cluster_secret, write_cluster_secret


@app.command(cls=flag.NodeCommand)
@handled
def node(
    ctx: typer.Context,
    api_port: flag.ApiPort = None, api_host: flag.ApiHost = None,
    listen_port: flag.ListenPort = None, listen_host: flag.ListenHost = None,
    data_dir: flag.DataDir = None, memory_limit: flag.MemoryLimit = None,
    models_dir: flag.ModelsDir = None,
    ollama_models: flag.OllamaModels = None, no_ollama: flag.NoOllama = False,
    lmstudio_models: flag.LmstudioModels = None, no_lmstudio: flag.NoLmstudio = False,
    log_format: flag.LogFormatFlag = None, log_level: flag.LogLevel = None, log_file: flag.LogFile = None,
    cluster: flag.Cluster = None, cluster_secret: flag.ClusterSecret = None, bootstrap: flag.Bootstrap = None,
    priority: flag.Priority = None, new_identity: flag.NewIdentity = False, name: flag.Name = None,
    queue_limit: flag.QueueLimit = None, prefill_chunk_size: flag.PrefillChunkSize = None,
    max_batch: flag.MaxBatch = None, prompt_cache_bytes: flag.PromptCacheBytes = None,
    kv_cache_bytes: flag.KvCacheBytes = None, micro_batches: flag.MicroBatches = None,
    cpu_weights: flag.CpuWeights = None, max_moves: flag.MaxMoves = None,
    no_mdns: flag.NoMdns = False, offline: flag.Offline = False,
    no_restore_size: flag.NoRestoreSize = False, no_relink: flag.NoRelink = False,
    compact_every: flag.CompactEvery = None, hub_card_idle: flag.HubCardIdle = None,
    api_key: flag.ApiKeys = None, api_key_file: flag.ApiKeyFile = None,
    cors_origins: flag.CorsOrigins = None, allowed_hosts: flag.AllowedHosts = None,
    routing: flag.Routing = None,
    no_metrics: flag.NoMetrics = False, no_request_records: flag.NoRequestRecords = False,
    metrics_loopback_open: flag.MetricsLoopbackOpen = False,
    request_log_bytes: flag.RequestLogBytes = None, log_request_text: flag.LogRequestText = False,
    join: flag.Join = None,
    fault_hook: flag.FaultHook = None,
    help_all: flag.HelpAll = False,
) -> None:
    """Run a node on this machine until Ctrl-C.

    Every flag can also come from its environment variable (EXO_P2P_ and the flag's name:
    --api-port is EXO_P2P_API_PORT) or from config.toml in the data dir (keys are the flag
    names: api-port = 52525); the command line wins, then the environment, then the file.
    --help-all shows the flags of every group; every setting: docs/configuration.md.
    """
    config = flag.node_config(flag.node_flag_values(ctx, fault_hook=fault_hook))
    code = run_node(config)
    if code:
        raise typer.Exit(code)


@app.command("cluster-secret")
@handled
def cluster_secret_cmd(
    file: Annotated[
        Optional[Path],
        typer.Argument(metavar="FILE", help="Write the secret here (mode 0600); print it when omitted."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """Make a new random cluster secret (32 bytes, hex)."""
    if file is None:
        click.echo(new_cluster_secret())
        return
    try:
        write_cluster_secret(file, force=force)
    except FileExistsError:
        raise CliError(f"{file} exists; pass --force to replace it", 1) from None
    except OSError as e:
        raise CliError(f"cannot write {file}: {e.strerror or e}") from None
    click.echo(
        f"wrote a new cluster secret to {file} (mode 0600); "
        f"start every node with --cluster-secret {file}"
    )


app.command("invite")(handled(invite_cmd.invite))
