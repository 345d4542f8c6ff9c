"""``exo-p2p doctor``: the command that asks the node, probes its addresses and listens for
mDNS, then prints the report (``exo_p2p.cli.queries.doctor_checks``: the probes and the pure ``diagnose``)."""

from __future__ import annotations

import shutil
from typing import Annotated

import click
import typer

from exo_p2p.cli.queries import doctor_checks as checks
from exo_p2p.cli.common import ApiKeyOpt, ApiOpt, JsonOpt, app, client_for, handled, stderr_console
from exo_p2p.cli.output.json_shapes import dumps
from exo_p2p.cli.output.readable import wrapped_lines


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
    with client_for(ctx, api, api_key) as client:
        state = client.state()
        listed = client.nodes()
    findings = checks.Findings(api_url=client.base_url, state=state, nodes=listed, mdns_seconds=mdns_seconds)
    for host, port in checks.addresses_to_probe(state, listed):
        findings.tcp[(host, port)] = checks.tcp_probe(host, port)
    if mdns_seconds > 0:
        with stderr_console().status(f"listening for mDNS announcements for {mdns_seconds:g} s…"):
            findings.mdns_types = checks.mdns_service_types(mdns_seconds)
    lines = checks.diagnose(findings)
    if json:
        click.echo(dumps({
            "node_id": state.get("node_id"),
            "nodes": listed,
            "warnings": state.get("warnings") or [],
            "tcp": [{"host": h, "port": p, "result": r} for (h, p), r in findings.tcp.items()],
            "mdns_service_types": findings.mdns_types,
            "report": lines,
        }))
    else:
        click.echo("\n".join(wrapped_lines(lines, shutil.get_terminal_size().columns)))
