"""The commands that make a cluster: ``node`` runs a node on this machine until Ctrl-C,
``cluster-secret`` makes the key of a private cluster, ``invite`` a join token for a new
machine (``exo_p2p.cli.cluster.invite``).

``node``'s flags are generated from the one table of node settings (``exo_p2p.cli.cluster.node_flags``);
the node itself is imported only when it runs (``node_cmd.run_node``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer

from exo_p2p.cli.cluster import invite as invite_cmd
from exo_p2p.cli.cluster import node_flags as flag
from exo_p2p.cli.common import app, handled
from exo_p2p.cli.errors import CliError
from exo_p2p.cli.cluster.node_config import run_node
from exo_p2p.cli.cluster.secret import new_cluster_secret, write_cluster_secret


@app.command(cls=flag.NodeCommand)
@handled
@flag.node_flags
def node(ctx: typer.Context, **flags: Any) -> None:
    """Run a node on this machine until Ctrl-C.

    Every flag can also come from its environment variable (EXO_P2P_ and the flag's name:
    --api-port is EXO_P2P_API_PORT) or from config.toml in the data dir (keys are the flag
    names: api-port = 52525); the command line wins, then the environment, then the file.
    --help-all shows the flags of every group; every setting: docs/configuration.md.
    """
    config = flag.node_config(flag.node_flag_values(ctx))
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
