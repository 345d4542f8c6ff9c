"""The commands that list what a node's API reports: ``nodes`` (the cluster), ``models``
(what can be served, here and in the cluster), ``instances`` (what is placed, with its
progress) and ``previews`` (where a model would go). Each prints a table, or with ``--json``
only JSON on stdout (``exo_p2p.cli.output.json_shapes``); ``ps`` and ``ls`` are registered as
their aliases in ``exo_p2p.cli.main``.
"""

from __future__ import annotations

from typing import Annotated

import click
import typer

from exo_p2p.cli.output import json_shapes
from exo_p2p.cli.output import placed_view
from exo_p2p.cli.output import render
from exo_p2p.cli.node_api.client import NodeClient
from exo_p2p.cli.common import (
    ApiKeyOpt,
    ApiOpt,
    JsonOpt,
    NodesOpt,
    app,
    client_for,
    handled,
    model_name,
    node_names,
    split_nodes,
    stderr_console,
    stdout_console,
)
from exo_p2p.cli.errors import ApiError, CliError
from exo_p2p.cli.output.fit import show
from exo_p2p.cli.messages import name_node_ids, named_reasons, unknown_model_message


def _state_or_none(client: NodeClient) -> dict | None:
    """``GET /state``, or None when the node does not answer it (tables then show less)."""
    try:
        return client.state()
    except CliError:
        return None


@app.command()
@handled
def nodes(ctx: typer.Context, api: ApiOpt = None, api_key: ApiKeyOpt = None, json: JsonOpt = False) -> None:
    """The cluster as the node sees it: peers, memory, master, addresses."""
    with client_for(ctx, api, api_key) as client:
        listed = client.nodes()
        try:
            warnings = client.state().get("warnings") or []
        except (ApiError, AttributeError):
            warnings = []
    if json:
        click.echo(json_shapes.dumps(json_shapes.nodes_json(listed)))
    else:
        show(stdout_console(), render.nodes_table(listed))
        lines = render.address_lines(listed)
        if lines:
            click.echo("addresses (for --bootstrap):\n" + "\n".join(lines))
        links = render.link_lines(listed)
        if links:
            click.echo("links (measured; docs/links.md):\n" + "\n".join(links))
        speeds = render.speed_lines(listed)
        if speeds:
            click.echo("speed (measured; docs/placement-speed.md):\n" + "\n".join(speeds))
    names = {} if json else {str(n.get("node_id")): str(n["friendly_name"]) for n in listed if n.get("friendly_name")}
    for warning in warnings:
        click.echo(f"warning: {name_node_ids(str(warning), names)}", err=True)


@app.command()
@handled
def models(ctx: typer.Context, api: ApiOpt = None, api_key: ApiKeyOpt = None, json: JsonOpt = False) -> None:
    """Models this node can serve, with layers, size and where they were found; those it found
    but cannot serve, with the reason; then every model in the cluster with the nodes holding
    it (complete or part of it)."""
    with client_for(ctx, api, api_key) as client:
        listed = client.models()
        try:
            cluster = client.request("GET", "/models/cluster")
        except ApiError:  # a node without models travelling between nodes (docs/models.md)
            cluster = None
        try:
            unsupported = client.request("GET", "/models/unsupported")  # docs/models.md#model-stores
        except ApiError:  # a node from before model stores
            unsupported = []
        names = {} if json or not cluster else node_names(client)
    if json:
        click.echo(json_shapes.dumps(json_shapes.models_json(listed) + json_shapes.unsupported_json(unsupported)))
    else:
        show(stdout_console(), render.models_table(listed))
        if unsupported:
            show(stdout_console(), render.unsupported_table(unsupported))
        if cluster:
            show(stdout_console(), render.cluster_models_table(cluster, names))


@app.command()
@handled
def instances(ctx: typer.Context, api: ApiOpt = None, api_key: ApiKeyOpt = None, json: JsonOpt = False) -> None:
    """Placed models, their shards and status (loading progress)."""
    with client_for(ctx, api, api_key) as client:
        listed = client.instances()
        listed = placed_view.with_placed(listed, _state_or_none(client)) if listed else listed  # "shrunk from N ranks"
        names = {} if json else node_names(client)
    if json:
        click.echo(json_shapes.dumps(json_shapes.instances_json(listed)))
    elif not listed:
        stderr_console().print("no instances; place one with `exo-p2p place MODEL`")
    else:
        show(stdout_console(), render.instances_table(named_reasons(listed, names), names))


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
    with client_for(ctx, api, api_key) as client:
        try:
            listed = client.previews(model, split_nodes(nodes))
        except ApiError as e:
            if e.status != 404:
                raise
            known = sorted(str(m.get("model")) for m in client.models() if m.get("model"))
            if model in known:
                raise
            raise CliError(unknown_model_message(model, known)) from None
        names = {} if json else node_names(client)
    if json:
        click.echo(json_shapes.dumps(listed))
    else:
        shown = [{**p, "error": name_node_ids(p["error"], names)} if isinstance(p.get("error"), str) else p for p in listed]
        show(stdout_console(), render.previews_table(model, shown, names))
