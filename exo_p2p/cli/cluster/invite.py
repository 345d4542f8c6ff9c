"""``exo-p2p invite``: print a join token for this member (``exo_p2p.cli.cluster.membership``).

The token holds the cluster secret kept in the member's data dir and the member's dialable
addresses, asked from its API (``GET /nodes``, its own entry). A new machine then joins with
``exo-p2p node --join TOKEN``. On an open cluster (no secret kept) it prints how to close
the cluster and exits 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import click
import typer

from exo_p2p.cli.node_api.client import NodeClient
from exo_p2p.cli.common import ApiKeyOpt, given_api
from exo_p2p.cli.node_api.endpoint import resolve_api_url
from exo_p2p.cli.errors import CliError
from exo_p2p.config import default_data_dir


def invite(
    ctx: typer.Context,
    api: Annotated[Optional[str], typer.Option("--api", help="URL of this member's API.", show_default=False)] = None,
    data_dir: Annotated[
        Optional[Path],
        typer.Option(help="The member's data dir, where its cluster secret is kept (default: as `exo-p2p node`)."),
    ] = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Print a join token for a new machine: `exo-p2p node --join TOKEN` there."""
    # here, not at import: the membership rules import py-libp2p (seconds), which the other
    # client commands never need
    from exo_p2p.cli.cluster.membership import MembershipError, make_invite, stored_secret_file

    directory = (data_dir or default_data_dir()).expanduser()
    if stored_secret_file(directory) is None:
        try:
            make_invite(directory, [])
        except MembershipError as e:
            raise CliError(str(e), 1) from None
    given_url, key = given_api(ctx, api, api_key)
    url = resolve_api_url(given_url)
    with NodeClient(url, api_key=key) as client:
        own = next((n for n in client.nodes() if n.get("is_self")), None)
    if own is None:
        raise CliError(f"the node at {url} does not list itself")
    try:
        token = make_invite(directory, list(own.get("addrs") or []))
    except MembershipError as e:
        raise CliError(str(e), 1) from None
    click.echo(token)
    click.echo("join with: exo-p2p node --join <the token above> (it holds the cluster secret: pass it like a password)", err=True)
