"""``exo-p2p pull`` and ``exo-p2p rm``, and the cluster-wide models table (docs/models.md).

``pull MODEL [--from NODE]`` asks this node (``POST /models/pull``) to copy a model another
node holds, then polls ``GET /models/pulls`` and draws a progress bar with speed until it is
done (exit 0) or failed (one-line reason, exit 1). ``rm MODEL`` removes this node's pulled and
fetched copies (``DELETE /models/MODEL``; refused while an instance on this node uses them).
"""

from __future__ import annotations

import time
from typing import Annotated
from urllib.parse import quote

import click
import typer

from exo_p2p.cli.common import ApiKeyOpt, ApiOpt, app, client_for, handled, model_name, node_names
from exo_p2p.cli.errors import CliError
from exo_p2p.cli.output.readable import source_split

POLL_SECONDS = 0.5
PULL_TIMEOUT = 24 * 3600.0
"""``pull`` gives up waiting after this many seconds (the node keeps pulling)."""


def _check_name(model: str) -> None:
    """A name the node would refuse (``check_model_name``) fails here, before an HTTP path
    built from it (``..`` segments) reaches another endpoint."""
    from exo_p2p.models.names import check_model_name  # here: the models package imports numpy

    try:
        check_model_name(model)
    except ValueError as exc:
        raise CliError(str(exc), 2) from None


@app.command()
@handled
def pull(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="Model name another node holds.")],
    from_node: Annotated[str | None, typer.Option("--from", help="Copy from this node (id, name or id prefix).")] = None,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Copy a whole model from the nodes that hold it onto this node (verified, resumable)."""
    if not model.strip():
        raise CliError("pull needs a model name (see `exo-p2p models`)", 2)
    _check_name(model)
    with client_for(ctx, api, api_key) as client:
        status = client.request("POST", "/models/pull", json={"model": model, "from": from_node})
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

        columns = (TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TimeRemainingColumn())
        deadline = time.monotonic() + PULL_TIMEOUT
        with Progress(*columns, transient=False) as bar:
            task = bar.add_task(f"pull {model}", total=status.get("bytes_total") or None)
            while status.get("state") == "running" and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
                pulls = {p["model"]: p for p in client.request("GET", "/models/pulls")}
                status = pulls.get(model, status)
                split = source_split(status.get("bytes_from_peers") or 0, status.get("bytes_from_hub") or 0)
                bar.update(task, completed=status.get("bytes_done", 0), total=status.get("bytes_total") or None,
                           description=f"pull {model}{split}")
        names = node_names(client) if status.get("bytes_by_peer") else {}
    if status.get("state") == "failed":
        raise CliError(f"pull of {model} failed: {status.get('error')}", 1)
    if status.get("state") != "done":
        raise CliError(f"pull of {model} still running after {PULL_TIMEOUT:.0f} s; see GET /models/pulls", 1)
    peers = ", ".join(f"{names.get(p, p[:12])}: {b / 1e6:.1f} MB" for p, b in sorted(status.get("bytes_by_peer", {}).items()))
    where = f" into {status['path']}" if status.get("path") else ""
    click.echo(f"pulled {model} ({status.get('bytes_total', 0) / 1e6:.1f} MB from {peers or 'cache'}){where}")


@app.command("rm")
@handled
def rm(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="Model whose pulled/fetched files to delete.")],
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Remove a model's pulled and fetched files from this node (refused while in use)."""
    _check_name(model)
    with client_for(ctx, api, api_key) as client:
        reply = client.request("DELETE", f"/models/{quote(model, safe='/')}")
    click.echo(f"removed {model} from this node ({len(reply.get('paths', []))} dirs)")
