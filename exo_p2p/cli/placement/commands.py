"""The commands that place and remove models: ``place`` (and wait until ready), ``delete``
one instance by id or unique prefix, ``stop`` every instance of a model.

``place`` of a model that already has an instance waits for that one instead
(``exo_p2p.cli.placement.replica_check``, unless ``--replica``); the wait with its progress is
``exo_p2p.cli.placement.waiting``.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Annotated, Optional

import click
import typer
from rich.console import Console

from exo_p2p.cli.node_api.client import NodeClient
from exo_p2p.cli.common import (
    PLACE_TIMEOUT,
    ApiKeyOpt,
    ApiOpt,
    NodesOpt,
    app,
    client_for,
    handled,
    model_name,
    split_nodes,
    stderr_console,
)
from exo_p2p.cli.errors import ApiError, CliError
from exo_p2p.cli.messages import unknown_model_message
from exo_p2p.cli.placement import unconfirmed
from exo_p2p.cli.placement.replica_check import counted_instances, replica_notice
from exo_p2p.cli.output.readable import short_ids

NODES_WAIT = 20.0
"""Seconds ``place --min-nodes N`` waits for N nodes to be in the cluster."""


class Sharding(str, Enum):
    pipeline = "pipeline"
    tensor = "tensor"


@app.command()
@handled
def place(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="Model id, e.g. smollm2-135m-instruct.")],
    min_nodes: Annotated[Optional[int], typer.Option(min=1, help="Use at least this many nodes (default: 1).")] = None,
    sharding: Annotated[
        Optional[Sharding], typer.Option(help="pipeline (layers per node) or tensor (default: pipeline).")
    ] = None,
    nodes: NodesOpt = None,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Return once placed, without waiting for ready.")] = False,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait for ready.")] = PLACE_TIMEOUT,
    replica: Annotated[
        bool,
        typer.Option("--replica", help="Place it even when the model already has an instance (one more copy in memory)."),
    ] = False,
    keep_alive: Annotated[Optional[str], typer.Option(help="Unload it once idle this long (5m, 1h, seconds; "
                                                      "default: kept until deleted).")] = None,
    pin: Annotated[bool, typer.Option("--pin", help="Never unload it to make room for another model.")] = False,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Place MODEL on the cluster and wait until it is ready to serve.

    With --min-nodes N it first waits up to 20 s for N nodes to be in the cluster (nodes
    that were just started), saying so, and fails naming how to add one. A model that already has an instance (one being re-placed
    counts) is not placed again: place says so and waits for that instance instead (exit 0);
    --replica adds another one (a replica, the same memory again).
    """
    console = stderr_console()
    with client_for(ctx, api, api_key) as client:
        # State first, then the list: a failed instance re-placed between the two reads is then
        # listed as its successor, and counts; the other order missed both (and doubled it)
        in_state = client.state().get("instances") or {}  # failed ones being re-placed count
        listed = client.instances()
        existing = counted_instances(model, listed, in_state)
        if existing and not replica:
            short = short_ids([str(i["instance_id"]) for i in existing])
            if (smaller := too_few_nodes(model, existing, short, min_nodes)) is not None:
                raise CliError(smaller)
            console.print(replica_notice(model, existing, short, in_state), highlight=False)
            _wait_for_existing(client, existing, timeout, console, no_wait)
            return
        if min_nodes and min_nodes > 1:
            _wait_for_nodes(client, min_nodes, console)
        before = {str(i.get("instance_id")) for i in listed}
        inst = _placed(client, model, before, min_nodes, sharding.value if sharding else None, split_nodes(nodes), console,
                       keep_alive=keep_alive, pin=pin)
        click.echo(placed_line(model, inst))
        if no_wait:
            return
        _wait_for_placed(client, inst, timeout, console)
    click.echo(f"instance {inst['instance_id']} is ready")


def _placed(client: NodeClient, model: str, before: set[str], min_nodes: int | None, sharding: str | None,
            nodes: list[str] | None, console: Console, keep_alive: str | None = None, pin: bool = False) -> dict:
    """``POST /instances``: the new instance, also when the cluster confirmed it late
    (``exo_p2p.cli.placement.unconfirmed``: one not among the ids ``before``); the API's
    errors in the CLI's words."""
    try:
        return client.place(model, min_nodes=min_nodes, sharding=sharding, nodes=nodes, keep_alive=keep_alive, pin=pin)
    except ApiError as e:  # a node left meanwhile: the API's words name its field
        if min_nodes and e.message.startswith(f"min_nodes={min_nodes} but the cluster has"):
            raise CliError(nodes_missing_message(min_nodes, len(client.nodes()), NODES_WAIT)) from None
        if e.status == 404 and e.message.startswith("unknown model"):
            raise CliError(unknown_model_message(model, sorted(cluster_models(client) or ()))) from None
        if not unconfirmed.is_unconfirmed(e):
            raise
        console.print(f"the cluster did not confirm the placement within 10 s (a busy host?); looking for it for "
                      f"up to {unconfirmed.LATE_WAIT:g} s…", highlight=False)
        return unconfirmed.late_instance(client, model, before, e)


def placed_line(model: str, inst: dict) -> str:
    """What ``place`` prints once the master placed ``inst`` (the ``POST /instances`` answer):
    ``"placed MODEL as instance ID (pipeline, 2 nodes)"``; the model and sharding the node
    sent, else ``model`` and pipeline; one node per shard."""
    n_nodes = len(inst.get("shards") or [])
    return (
        f"placed {inst.get('model', model)} as instance {inst['instance_id']} "
        f"({inst.get('sharding', 'pipeline')}, {n_nodes} node{'' if n_nodes == 1 else 's'})"
    )


def _wait_for_placed(client: NodeClient, inst: dict, timeout: float, console: Console) -> None:
    """Wait for the new instance ``inst`` to be ready (``wait_until_ready``); on Ctrl-C say
    that it stays placed and how to remove it, then let the interrupt through (exit 130)."""
    try:
        from exo_p2p.cli.placement.waiting import wait_until_ready  # rich.progress: only when waiting
        wait_until_ready(client, inst, timeout=timeout, console=console)
    except KeyboardInterrupt:
        console.print(
            f"stopped waiting; instance {inst['instance_id']} stays placed and keeps loading "
            f"(see `exo-p2p instances`; remove it with `exo-p2p delete {inst['instance_id']}`)"
        )
        raise


def _wait_for_existing(client: NodeClient, existing: list, timeout: float, console: Console, no_wait: bool) -> None:
    """``place`` of a model that already has instances (``exo_p2p.cli.placement.replica_check``): wait for
    the first one that is not failed to be ready, as for a placement of its own; when all
    are being re-placed, say where to follow that (the API waits for it too)."""
    live = [i for i in existing if i.get("status") != "failed"]
    if not live:
        console.print("the master re-places it; `exo-p2p instances` shows its progress", highlight=False)
        return
    if no_wait:
        return
    from exo_p2p.cli.placement.waiting import wait_until_ready  # rich.progress: only when waiting
    ready = wait_until_ready(client, live[0], timeout=timeout, console=console)
    click.echo(f"instance {ready.get('instance_id', live[0]['instance_id'])} is ready")


def cluster_models(client: NodeClient) -> set[str] | None:
    """The model ids the cluster knows (``GET /v1/models``: every node's models); None when
    the node does not say."""
    try:
        return {str(m.get("id")) for m in client.request("GET", "/v1/models").get("data") or []}
    except ApiError:
        return None


def too_few_nodes(model: str, existing: list, short: dict[str, str], min_nodes: int | None) -> str | None:
    """The error of ``place --min-nodes N`` when ``model`` already has instances (``existing``,
    named by ``short``) and none spans N nodes: placing would add none and waiting for one
    would ignore N. None when there is no N or one of them has N nodes or more."""
    if not min_nodes:
        return None
    spans = [len({s.get("node_id") for s in i.get("shards") or []}) for i in existing]
    if max(spans, default=0) >= min_nodes:
        return None
    ids = ", ".join(short.get(str(i["instance_id"]), str(i["instance_id"])) for i in existing)
    most = max(spans, default=0)
    return (f"{model} already has an instance ({ids}) on {most} node{'' if most == 1 else 's'}, fewer than "
            f"--min-nodes {min_nodes}: `exo-p2p stop {model}` first to place it again on {min_nodes}, "
            "or add --replica for another instance")


def nodes_missing_message(wanted: int, count: int, waited: float, mdns: bool = True) -> str:
    """What ``place --min-nodes`` says when the cluster still has fewer than ``wanted`` nodes
    after ``waited`` seconds, and how to add one: through mDNS, or (``mdns`` False: this node
    runs ``--no-mdns``, so it finds no node that way) only through ``--bootstrap``."""
    head = f"--min-nodes {wanted} needs {wanted} nodes, but the cluster has {count} after waiting {waited:.0f} s: "
    if not mdns:
        return (head + "mDNS is off on this node (--no-mdns), so start `exo-p2p node` on another machine with "
                "--bootstrap and an address `exo-p2p nodes` lists here")
    return (head + "start `exo-p2p node` on another machine of this network (mDNS finds it), or there pass "
            "--bootstrap with an address `exo-p2p nodes` lists here")


def _wait_for_nodes(client: NodeClient, wanted: int, console: Console) -> None:
    """Return once the cluster lists ``wanted`` nodes; says at once that it waits (a line, also
    in a pipe), and raises ``CliError`` (``nodes_missing_message``) after ``NODES_WAIT``
    seconds without them."""
    deadline = time.monotonic() + NODES_WAIT
    count = len(client.nodes())
    if count >= wanted:
        return
    console.print(f"the cluster has {count} node{'' if count == 1 else 's'}; waiting up to {NODES_WAIT:.0f} s "
                  f"for {wanted - count} more (--min-nodes {wanted})…", highlight=False)
    with console.status(f"waiting for {wanted} nodes…"):
        while count < wanted and time.monotonic() < deadline:
            time.sleep(0.5)
            count = len(client.nodes())
    if count < wanted:
        try:
            mdns = client.state().get("mdns") is not False  # a node from before the field: on
        except CliError:
            mdns = True
        raise CliError(nodes_missing_message(wanted, count, NODES_WAIT, mdns))


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
    with client_for(ctx, api, api_key) as client:
        try:
            client.delete_instance(instance_id)
        except ApiError as e:
            if e.status != 404:
                raise
            instance_id = full_instance_id(instance_id, client.instances(), e)
            client.delete_instance(instance_id)
    click.echo(f"deleted instance {instance_id}")


def full_instance_id(prefix: str, listed: list[dict], not_found: ApiError) -> str:
    """The one listed instance id (``GET /instances``) that starts with ``prefix``, after the
    node answered 404 (``not_found``) for ``prefix`` itself. Raises ``CliError`` when the
    prefix is ambiguous, names a model rather than an instance, or matches none."""
    full = [i["instance_id"] for i in listed if str(i.get("instance_id", "")).startswith(prefix)]
    if len(full) > 1:
        raise CliError(f"instance prefix {prefix!r} is ambiguous: it matches {', '.join(sorted(full))}", 1) from None
    if len(full) == 1:
        return full[0]
    if any(i.get("model") == prefix for i in listed):
        raise CliError(
            f"{prefix} is a model, not an instance id: `exo-p2p stop {prefix}` deletes its "
            "instances; `exo-p2p instances` lists the ids"
        ) from None
    raise CliError(f"{not_found.message} (`exo-p2p instances` lists the ids)") from None


@app.command()
@handled
def stop(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="Model id whose instances to delete.")],
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Delete every instance of MODEL (by name; `delete ID` deletes one instance)."""
    with client_for(ctx, api, api_key) as client:
        listed = client.instances()
        ids = [str(i["instance_id"]) for i in listed if i.get("model") == model]
        if not ids:
            known = cluster_models(client)
            if known is not None and model not in known:
                raise CliError(unknown_model_message(model, sorted(known | {str(i.get("model")) for i in listed})))
            raise CliError(f"no instance of {model} is placed (see `exo-p2p instances`)")
        for instance_id in ids:
            try:
                client.delete_instance(instance_id)
            except ApiError as e:
                if e.status != 404:  # gone meanwhile (re-placed or deleted): nothing to stop
                    raise
            click.echo(f"deleted instance {instance_id} of {model}")
