"""``exo-p2p logs requests``: the records of a node's finished requests (``GET /requests``),
one line each, or JSON lines; ``--follow`` polls for new ones until Ctrl-C (docs/operations.md).
``exo-p2p top`` is ``exo_p2p.cli.top_cmd``."""

from __future__ import annotations

import json as jsonlib
import time
from typing import Annotated

import click
import typer

from exo_p2p.cli.common import ApiKeyOpt, ApiOpt, JsonOpt, app, client_for, handled

POLL_SECONDS = 1.0
"""Seconds between two polls of ``--follow``."""

logs_app = typer.Typer(help="Records a node keeps: `logs requests` lists its finished requests.",
                       no_args_is_help=True)
app.add_typer(logs_app, name="logs")


def _num(value: object, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def record_line(r: dict) -> str:
    """One record as a line: time, status, family, model, instance, tokens
    (prompt/cached/completion), TTFT, decode tok/s, moves, route, request id."""
    when = time.strftime("%H:%M:%S", time.localtime(float(r.get("started") or 0)))
    tokens = f"{r.get('prompt_tokens', 0)}/{r.get('cached_tokens', 0)}/{r.get('completion_tokens', 0)}"
    parts = [when, str(r.get("status")), str(r.get("family")), str(r.get("model")), str(r.get("instance") or "-")[:8],
             f"tok p/c/o {tokens}", f"ttft {_num(r.get('ttft'), '.3f')}s", f"{_num(r.get('decode_tps'), '.1f')} tok/s",
             f"{r.get('finish_reason') or r.get('outcome')}"]
    if r.get("moves"):
        parts.append(f"moved {r['moves']}x")
    if r.get("route"):
        parts.append(f"route {r['route']}")
    parts.append(str(r.get("request_id")))
    return "  ".join(parts)


@logs_app.command("requests")
@handled
def requests_cmd(
    ctx: typer.Context,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new records until Ctrl-C.")] = False,
    last: Annotated[int, typer.Option("--last", "-n", min=1, max=1024, help="Records to show first (the newest).")] = 20,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
    json: JsonOpt = False,
) -> None:
    """The records of the node's finished requests: id, family, model, instance, tokens,
    TTFT, decode speed, finish reason, moves, route (the node keeps the last 1,024; its
    data dir holds requests.jsonl)."""
    with client_for(ctx, api, api_key) as client:
        answer = client.request("GET", "/requests")
        records, after = answer.get("records", [])[-last:], int(answer.get("last", 0))
        _print(records, json)
        while follow:
            time.sleep(POLL_SECONDS)
            answer = client.request("GET", "/requests", params={"after": after})
            _print(answer.get("records", []), json)
            after = int(answer.get("last", after))


def _print(records: list[dict], json: bool) -> None:
    for r in records:
        click.echo(jsonlib.dumps(r) if json else record_line(r))
