"""The ``exo-p2p`` typer app: ``node`` runs a node, the other commands are API clients.

Exit codes: 0 success, 1 a failure the node reported or an unreachable node (one line
``error: ...`` on stderr), 2 bad arguments, 130 Ctrl-C. Never a traceback.
``--api URL`` and ``--api-key KEY`` are accepted before or after the subcommand;
``$EXO_P2P_API`` and ``$EXO_P2P_API_KEY`` otherwise. The shared options and the ``app``
itself are in ``exo_p2p.cli.common``; ``chat`` and ``run`` in ``exo_p2p.cli.chat_cmds``.
Nothing imported here loads py-libp2p, MLX or the node: the commands that need them import
them when they run (``tests/test_cli_imports.py``).
"""

from __future__ import annotations

import os
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer
from typer._click.core import ParameterSource  # typer ships its own click
from rich.console import Console

from exo_p2p.cli import invite_cmd, placed_view, render
from exo_p2p.cli.client import ApiError, CliError, NodeClient
from exo_p2p.cli.common import (  # noqa: F401  (Globals and root: the app's global options)
    PLACE_TIMEOUT,
    ApiKeyOpt,
    ApiOpt,
    Globals,
    JsonOpt,
    NodesOpt,
    app,
    client_for as _client,
    handled,
    model_name,
    node_names as _node_names,
    root,
    split_nodes as _split_nodes,
    stderr_console as _stderr,
    stdout_console as _stdout,
)
from exo_p2p.cli.messages import name_node_ids, named_reasons
from exo_p2p.cli.node_cmd import NODE_CONFIG_FILE, build_node_config, read_node_config_file, run_node
from exo_p2p.cli.secret import new_cluster_secret, write_cluster_secret
from exo_p2p.cli.waiting import wait_until_ready
from exo_p2p.config import default_data_dir
from exo_p2p.settings_table import SETTINGS



class Sharding(str, Enum):
    pipeline = "pipeline"
    tensor = "tensor"


class LogFormat(str, Enum):
    console = "console"
    json = "json"


def _state_or_none(client: NodeClient) -> dict | None:
    """``GET /state``, or None when the node does not answer it (tables then show less)."""
    try:
        return client.state()
    except CliError:
        return None


# -- the node -------------------------------------------------------------------------------
#
# Every node flag is one parameter of ``node`` below, ``node_option("--flag")``: its
# environment variable, metavar and help (with the default, read from ``NodeConfig``) come
# from the one table of node settings, ``exo_p2p.settings_table.SETTINGS``, which also renders
# docs/configuration.md. A value neither given on the command line nor in the environment
# comes from the data dir's ``config.toml`` (``node_flag_values``), keyed by the flag's name.
# Adding a flag: one ``Setting`` in the table, one parameter here, one keyword to
# ``build_node_config``, one ``NodeConfig`` field (an engine setting: one ``EngineSettings``
# field, ``exo_p2p.types.engine``); then run scripts/gen_config_docs.py.


def node_option(flag: str, **extra: Any) -> Any:
    """The ``typer.Option`` of the node flag ``flag`` (``"--api-port"``), from its entry in
    ``SETTINGS``; ``extra`` adds click settings such as ``min``."""
    setting = SETTINGS[flag]
    return typer.Option(flag, envvar=setting.env, metavar=setting.metavar, help=setting.cli_help(), hidden=setting.hidden, **extra)


@app.command()
@handled
def node(
    ctx: typer.Context,
    api_port: Annotated[Optional[int], node_option("--api-port")] = None,
    api_host: Annotated[
        Optional[str],
        node_option("--api-host"),
    ] = None,
    listen_port: Annotated[
        Optional[int],
        node_option("--listen-port"),
    ] = None,
    listen_host: Annotated[
        Optional[str],
        node_option("--listen-host"),
    ] = None,
    data_dir: Annotated[
        Optional[Path],
        node_option("--data-dir"),
    ] = None,
    memory_limit: Annotated[
        Optional[str],
        node_option("--memory-limit"),
    ] = None,
    models_dir: Annotated[
        Optional[list[Path]],
        node_option("--models-dir"),
    ] = None,
    ollama_models: Annotated[Optional[Path], node_option("--ollama-models")] = None,
    no_ollama: Annotated[bool, node_option("--no-ollama")] = False,
    lmstudio_models: Annotated[Optional[Path], node_option("--lmstudio-models")] = None,
    no_lmstudio: Annotated[bool, node_option("--no-lmstudio")] = False,
    log_format: Annotated[
        Optional[LogFormat],
        node_option("--log-format"),
    ] = None,
    log_level: Annotated[
        Optional[str],
        node_option("--log-level"),
    ] = None,
    log_file: Annotated[
        Optional[Path],
        node_option("--log-file"),
    ] = None,
    cluster: Annotated[
        Optional[str],
        node_option("--cluster"),
    ] = None,
    cluster_secret: Annotated[
        Optional[Path],
        node_option("--cluster-secret"),
    ] = None,
    bootstrap: Annotated[
        Optional[list[str]],
        node_option("--bootstrap"),
    ] = None,
    priority: Annotated[
        Optional[int],
        node_option("--priority"),
    ] = None,
    new_identity: Annotated[
        bool,
        node_option("--new-identity"),
    ] = False,
    name: Annotated[
        Optional[str],
        node_option("--name"),
    ] = None,
    queue_limit: Annotated[
        Optional[int],
        node_option("--queue-limit", min=1),
    ] = None,
    prefill_chunk_size: Annotated[
        Optional[int],
        node_option("--prefill-chunk-size", min=1),
    ] = None,
    max_batch: Annotated[
        Optional[int],
        node_option("--max-batch", min=1),
    ] = None,
    prompt_cache_bytes: Annotated[
        Optional[int],
        node_option("--prompt-cache-bytes", min=0),
    ] = None,
    kv_cache_bytes: Annotated[
        Optional[int],
        node_option("--kv-cache-bytes", min=0),
    ] = None,
    micro_batches: Annotated[Optional[int], node_option("--micro-batches", min=0)] = None,
    cpu_weights: Annotated[
        Optional[str],
        node_option("--cpu-weights"),
    ] = None,
    max_moves: Annotated[
        Optional[int],
        node_option("--max-moves", min=0),
    ] = None,
    no_mdns: Annotated[
        bool,
        node_option("--no-mdns"),
    ] = False,
    offline: Annotated[bool, node_option("--offline")] = False,
    no_restore_size: Annotated[bool, node_option("--no-restore-size")] = False,
    no_relink: Annotated[bool, node_option("--no-relink")] = False,
    compact_every: Annotated[
        Optional[int],
        node_option("--compact-every", min=1),
    ] = None,
    api_key: Annotated[
        Optional[list[str]],
        node_option("--api-key"),
    ] = None,
    api_key_file: Annotated[
        Optional[Path],
        node_option("--api-key-file"),
    ] = None,
    cors_origins: Annotated[
        Optional[list[str]],
        node_option("--cors-origins"),
    ] = None,
    allowed_hosts: Annotated[
        Optional[list[str]],
        node_option("--allowed-hosts"),
    ] = None,
    routing: Annotated[Optional[str], node_option("--routing")] = None,
    no_metrics: Annotated[bool, node_option("--no-metrics")] = False,
    no_request_records: Annotated[bool, node_option("--no-request-records")] = False,
    metrics_loopback_open: Annotated[bool, node_option("--metrics-loopback-open")] = False,
    request_log_bytes: Annotated[Optional[int], node_option("--request-log-bytes", min=0)] = None,
    log_request_text: Annotated[bool, node_option("--log-request-text")] = False,
    join: Annotated[
        Optional[str],
        node_option("--join"),
    ] = None,
    fault_hook: Annotated[
        Optional[list[str]],
        node_option("--fault-hook"),
    ] = None,
) -> None:
    """Run a node on this machine until Ctrl-C.

    Every flag can also come from its EXO_P2P_... environment variable or from config.toml
    in the data dir (keys are the flag names, e.g. api-port = 52525); the command line wins,
    then the environment, then the file. Every setting: docs/configuration.md.
    """
    values = node_flag_values(ctx, fault_hook=fault_hook)
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
    for hook in fault_hook or []:
        key, sep, value = hook.partition("=")
        if not sep or not key:
            raise CliError(f"--fault-hook takes KEY=VALUE, got {hook!r}", 2)
        config.fault_hooks[key] = value
    code = run_node(config)
    if code:
        raise typer.Exit(code)


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


# -- listing --------------------------------------------------------------------------------


@app.command()
@handled
def nodes(ctx: typer.Context, api: ApiOpt = None, api_key: ApiKeyOpt = None, json: JsonOpt = False) -> None:
    """The cluster as the node sees it: peers, memory, master, addresses."""
    with _client(ctx, api, api_key) as client:
        listed = client.nodes()
        try:
            warnings = client.state().get("warnings") or []
        except (ApiError, AttributeError):
            warnings = []
    if json:
        click.echo(render.dumps(render.nodes_json(listed)))
    else:
        _stdout().print(render.nodes_table(listed))
        lines = render.address_lines(listed)
        if lines:
            click.echo("addresses (for --bootstrap):\n" + "\n".join(lines))
        links = render.link_lines(listed)
        if links:
            click.echo("links (measured; docs/links.md):\n" + "\n".join(links))
    names = {} if json else {str(n.get("node_id")): str(n["friendly_name"]) for n in listed if n.get("friendly_name")}
    for warning in warnings:
        click.echo(f"warning: {name_node_ids(str(warning), names)}", err=True)


@app.command()
@handled
def models(ctx: typer.Context, api: ApiOpt = None, api_key: ApiKeyOpt = None, json: JsonOpt = False) -> None:
    """Models this node can serve, with layers, size and where they were found; those it found
    but cannot serve, with the reason; then every model in the cluster with the nodes holding
    it (complete or part of it)."""
    with _client(ctx, api, api_key) as client:
        listed = client.models()
        try:
            cluster = client.request("GET", "/models/cluster")
        except ApiError:  # a node without models travelling between nodes (docs/models.md)
            cluster = None
        try:
            unsupported = client.request("GET", "/models/unsupported")  # docs/models.md#model-stores
        except ApiError:  # a node from before model stores
            unsupported = []
        names = {} if json or not cluster else _node_names(client)
    if json:
        click.echo(render.dumps(render.models_json(listed) + render.unsupported_json(unsupported)))
    else:
        _stdout().print(render.models_table(listed))
        if unsupported:
            _stdout().print(render.unsupported_table(unsupported))
        if cluster:
            _stdout().print(transfer_cmds.cluster_models_table(cluster, names))


@app.command()
@handled
def instances(ctx: typer.Context, api: ApiOpt = None, api_key: ApiKeyOpt = None, json: JsonOpt = False) -> None:
    """Placed models, their shards and status (loading progress)."""
    with _client(ctx, api, api_key) as client:
        listed = client.instances()
        listed = placed_view.with_placed(listed, _state_or_none(client)) if listed else listed  # "shrunk from N ranks"
        names = {} if json else _node_names(client)
    if json:
        click.echo(render.dumps(render.instances_json(listed)))
    elif not listed:
        _stderr().print("no instances; place one with `exo-p2p place MODEL`")
    else:
        _stdout().print(render.instances_table(named_reasons(listed, names), names))


@app.command()
@handled
def previews(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="Model id, e.g. smollm2-135m-instruct.")],
    nodes: NodesOpt = None,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
    json: JsonOpt = False,
) -> None:
    """The best placement of MODEL per sharding and size, memory per node, or why none."""
    with _client(ctx, api, api_key) as client:
        try:
            listed = client.previews(model, _split_nodes(nodes))
        except ApiError as e:
            if e.status != 404:
                raise
            known = sorted(str(m.get("model")) for m in client.models() if m.get("model"))
            if model in known:
                raise
            raise CliError(f"{e.message}; known models: {', '.join(known) or 'none'} (see `exo-p2p models`)") from None
        names = {} if json else _node_names(client)
    if json:
        click.echo(render.dumps(listed))
    else:
        shown = [{**p, "error": name_node_ids(p["error"], names)} if isinstance(p.get("error"), str) else p for p in listed]
        _stdout().print(render.previews_table(model, shown, names))


# -- placing --------------------------------------------------------------------------------


@app.command()
@handled
def place(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="Model id, e.g. smollm2-135m-instruct.")],
    min_nodes: Annotated[
        Optional[int],
        typer.Option(min=1, help="Use at least this many nodes (default: 1)."),
    ] = None,
    sharding: Annotated[
        Optional[Sharding],
        typer.Option(help="pipeline (layers per node) or tensor (default: pipeline)."),
    ] = None,
    nodes: NodesOpt = None,
    no_wait: Annotated[
        bool,
        typer.Option("--no-wait", help="Return once placed, without waiting for ready."),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(min=0, help="Seconds to wait for ready."),
    ] = PLACE_TIMEOUT,
    replica: Annotated[
        bool,
        typer.Option("--replica", help="Place it even when the model already has an instance (one more copy in memory)."),
    ] = False,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Place MODEL on the cluster and wait until it is ready to serve.

    With --min-nodes N it first waits up to 20 s for N nodes to be in the cluster (nodes
    that were just started). A model that already has an instance (one being re-placed
    counts) is not placed again: place says so and waits for that instance instead (exit 0);
    --replica adds another one (a replica, the same memory again).
    """
    console = _stderr()
    with _client(ctx, api, api_key) as client:
        from exo_p2p.cli.place_check import counted_instances, replica_notice

        # State first, then the list: a failed instance re-placed between the two reads is then
        # listed as its successor, and counts; the other order missed both (and doubled it)
        in_state = client.state().get("instances") or {}  # failed ones being re-placed count
        listed = client.instances()
        existing = counted_instances(model, listed, in_state)
        if existing and not replica:
            short = render.short_ids([str(i["instance_id"]) for i in existing])
            console.print(replica_notice(model, existing, short, in_state), highlight=False)
            _wait_for_existing(client, existing, timeout, console, no_wait)
            return
        if min_nodes and min_nodes > 1:
            _wait_for_nodes(client, min_nodes, console)
        inst = client.place(
            model,
            min_nodes=min_nodes,
            sharding=sharding.value if sharding else None,
            nodes=_split_nodes(nodes),
        )
        n_nodes = len(inst.get("shards") or [])
        click.echo(
            f"placed {inst.get('model', model)} as instance {inst['instance_id']} "
            f"({inst.get('sharding', 'pipeline')}, {n_nodes} node{'' if n_nodes == 1 else 's'})"
        )
        if no_wait:
            return
        try:
            wait_until_ready(client, inst, timeout=timeout, console=console)
        except KeyboardInterrupt:
            console.print(
                f"stopped waiting; instance {inst['instance_id']} stays placed and keeps loading "
                f"(see `exo-p2p instances`; remove it with `exo-p2p delete {inst['instance_id']}`)"
            )
            raise
    click.echo(f"instance {inst['instance_id']} is ready")


NODES_WAIT = 20.0
"""Seconds ``place --min-nodes N`` waits for N nodes to be in the cluster."""


def _wait_for_existing(client: NodeClient, existing: list, timeout: float, console: Console, no_wait: bool) -> None:
    """``place`` of a model that already has instances (``exo_p2p.cli.place_check``): wait for
    the first one that is not failed to be ready, as for a placement of its own; when all
    are being re-placed, say where to follow that (the API waits for it too)."""
    live = [i for i in existing if i.get("status") != "failed"]
    if not live:
        console.print("the master re-places it; `exo-p2p instances` shows its progress", highlight=False)
        return
    if no_wait:
        return
    ready = wait_until_ready(client, live[0], timeout=timeout, console=console)
    click.echo(f"instance {ready.get('instance_id', live[0]['instance_id'])} is ready")


def _wait_for_nodes(client: NodeClient, wanted: int, console: Console) -> None:
    """Return once the cluster lists ``wanted`` nodes, or after ``NODES_WAIT`` seconds (the
    placement then says what is missing)."""
    deadline = time.monotonic() + NODES_WAIT
    count = len(client.nodes())
    if count >= wanted:
        return
    with console.status(f"waiting up to {NODES_WAIT:.0f} s for {wanted} nodes (the cluster has {count})…"):
        while count < wanted and time.monotonic() < deadline:
            time.sleep(0.5)
            count = len(client.nodes())


@app.command()
@handled
def delete(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(metavar="ID", help="Instance id (or a unique prefix of it).")],
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Delete an instance: its runners stop and their memory is freed."""
    if not instance_id.strip() or "/" in instance_id:
        raise CliError(f"not an instance id: {instance_id!r} (see `exo-p2p instances`)", 2)
    with _client(ctx, api, api_key) as client:
        try:
            client.delete_instance(instance_id)
        except ApiError as e:
            if e.status != 404:
                raise
            listed = client.instances()
            full = [i["instance_id"] for i in listed if str(i.get("instance_id", "")).startswith(instance_id)]
            if len(full) > 1:
                raise CliError(f"instance prefix {instance_id!r} is ambiguous: it matches {', '.join(sorted(full))}", 1) from None
            if len(full) != 1:
                if any(i.get("model") == instance_id for i in listed):
                    raise CliError(
                        f"{instance_id} is a model, not an instance id: `exo-p2p stop {instance_id}` deletes its "
                        "instances; `exo-p2p instances` lists the ids"
                    ) from None
                raise CliError(f"{e.message} (`exo-p2p instances` lists the ids)") from None
            instance_id = full[0]
            client.delete_instance(instance_id)
    click.echo(f"deleted instance {instance_id}")


@app.command()
@handled
def stop(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="Model id whose instances to delete.")],
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Delete every instance of MODEL (by name; `delete ID` deletes one instance)."""
    with _client(ctx, api, api_key) as client:
        ids = [str(i["instance_id"]) for i in client.instances() if i.get("model") == model]
        if not ids:
            raise CliError(f"no instance of {model} is placed (see `exo-p2p instances`)")
        for instance_id in ids:
            try:
                client.delete_instance(instance_id)
            except ApiError as e:
                if e.status != 404:  # gone meanwhile (re-placed or deleted): nothing to stop
                    raise
            click.echo(f"deleted instance {instance_id} of {model}")


# the habits of ollama/docker users: `ps` and `ls` (never `rm`, which deletes files in ollama)
app.command("ps", help="Same as `instances`.")(instances)
app.command("ls", help="Same as `models`.")(models)


@app.command()
@handled
def doctor(
    ctx: typer.Context,
    mdns_seconds: Annotated[
        float,
        typer.Option("--mdns-seconds", min=0, metavar="SECONDS", help="How long to listen for mDNS announcements (0: skip)."),
    ] = 2.0,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
    json: JsonOpt = False,
) -> None:
    """Why machines do not see each other: this node's addresses and ports, mDNS, which
    peers are known, reachable or refused (another cluster secret), firewall hints."""
    from exo_p2p.cli import doctor as checks

    with _client(ctx, api, api_key) as client:
        state = client.state()
        listed = client.nodes()
    findings = checks.Findings(api_url=client.base_url, state=state, nodes=listed, mdns_seconds=mdns_seconds)
    for host, port in checks.addresses_to_probe(state, listed):
        findings.tcp[(host, port)] = checks.tcp_probe(host, port)
    if mdns_seconds > 0:
        with _stderr().status(f"listening for mDNS announcements for {mdns_seconds:g} s…"):
            findings.mdns_types = checks.mdns_service_types(mdns_seconds)
    lines = checks.diagnose(findings)
    if json:
        click.echo(render.dumps({
            "node_id": state.get("node_id"),
            "nodes": listed,
            "warnings": state.get("warnings") or [],
            "tcp": [{"host": h, "port": p, "result": r} for (h, p), r in findings.tcp.items()],
            "mdns_service_types": findings.mdns_types,
            "report": lines,
        }))
    else:
        click.echo("\n".join(lines))


def main() -> None:
    """The console script ``exo-p2p`` (and ``python -m exo_p2p``).

    ``exo-p2p node`` leaves with ``os._exit`` once it has stopped everything (runners reaped,
    logs flushed): the C++ static destructors of the libraries it loaded sometimes aborted a
    cleanly stopped node ("terminate called without an active exception", exit -6, after
    SIGTERM in 4 of 8 tries of an adversarial test)."""
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        code = 0
        try:
            app(prog_name="exo-p2p")  # standalone: prints errors, always raises SystemExit
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    app(prog_name="exo-p2p")


from exo_p2p.cli import chat_cmds, observe_cmds, top_cmd, transfer_cmds  # noqa: E402,F401  (register `chat`, `run`, `pull`, `rm`, `logs`, `top`)
