"""``exo-p2p logs requests``: the records of a node's finished requests (``GET /requests``),
one line each, or JSON lines; ``--follow`` polls for new ones until Ctrl-C (docs/operations.md).
``exo-p2p top`` is ``exo_p2p.cli.queries.top``."""

from __future__ import annotations

import json as jsonlib
import shutil
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


COLUMNS = (("time", 8, "<"), ("code", 4, ">"), ("family", 9, "<"), ("model", 24, "<"), ("instance", 8, "<"),
           ("in", 6, ">"), ("cached", 6, ">"), ("out", 6, ">"), ("ttft s", 7, ">"), ("tok/s", 6, ">"),
           ("end", 10, "<"), ("request", 8, "<"), ("route", 0, "<"))
"""The columns of ``logs requests``: heading, width, alignment. ``in``/``cached``/``out``:
prompt tokens, of them reused from the prompt cache, completion tokens; ``ttft s``: seconds
to the first token; ``tok/s``: decode speed after it; ``end``: the finish reason or outcome;
``request``: the request id's first 8 characters; ``route``: why the master chose the instance."""

DROP_ORDER = ("route", "request", "family", "cached", "in", "instance")
"""The columns left out, first to last, until a row fits the terminal (``shown_columns``):
at 80 columns (a pipe, a narrow terminal) a row is time, code, model, out, ttft s, tok/s
and end; ``--json`` (and a wider terminal) has the rest. No value is ever cut."""
ROUTE_WIDTH = len("only instance")
"""The width the ``route`` column (the last, of no fixed width) counts for when fitting."""


def shown_columns(width: int | None) -> tuple[str, ...]:
    """The headings of the columns a row of at most ``width`` characters shows (None: every
    column): ``COLUMNS`` in their order, without the first of ``DROP_ORDER`` while the row
    is wider than ``width``. A value longer than its column (a long model name) still
    widens its row rather than being cut."""
    names = [name for name, _, _ in COLUMNS]
    widths = {name: w or ROUTE_WIDTH for name, w, _ in COLUMNS}
    for drop in DROP_ORDER:
        if width is None or sum(widths[n] for n in names) + 2 * (len(names) - 1) <= width:
            break
        names.remove(drop)
    return tuple(names)


def _num(value: object, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def route_text(route: object) -> str:
    """Why the master chose the instance, in words: ``only`` → ``only instance``,
    ``prefix:120`` → ``cached prefix (120 chars)``, ``load`` → ``least loaded``,
    ``load:busy`` → ``least loaded (prefix holder busy)``; anything else as is."""
    text = str(route or "")
    if text == "only":
        return "only instance"
    if text.startswith("prefix:"):
        return f"cached prefix ({text.split(':', 1)[1]} chars)"
    return {"load": "least loaded", "load:busy": "least loaded (prefix holder busy)"}.get(text, text)


def _row(cells: list[str], width: int | None) -> str:
    shown = shown_columns(width)
    return "  ".join(format(c, f"{align}{w}") if w else c
                     for c, (name, w, align) in zip(cells, COLUMNS) if name in shown).rstrip()


def header_line(width: int | None = None) -> str:
    """The heading row printed above the records: the ``COLUMNS`` a row of ``width``
    characters shows (``shown_columns``; None: all)."""
    return _row([name for name, _, _ in COLUMNS], width)


def record_line(r: dict, width: int | None = None) -> str:
    """One record as a row of the ``COLUMNS`` that fit ``width`` (``shown_columns``; None:
    all); a value the record lacks (a refused request has no TTFT) is ``-``; moves after a
    failure follow the route (``moved 2x``)."""
    when = time.strftime("%H:%M:%S", time.localtime(float(r.get("started") or 0)))
    route = route_text(r.get("route")) or "-"
    if r.get("moves"):
        route += f", moved {r['moves']}x"
    return _row([when, str(r.get("status")), str(r.get("family")), str(r.get("model") or "-"),
                 str(r.get("instance") or "-")[:8], str(r.get("prompt_tokens", 0)), str(r.get("cached_tokens", 0)),
                 str(r.get("completion_tokens", 0)), _num(r.get("ttft"), ".3f"), _num(r.get("decode_tps"), ".1f"),
                 str(r.get("finish_reason") or r.get("outcome")), str(r.get("request_id"))[:8], route], width)


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
    """The records of the node's finished requests, one row each under a heading: time,
    status code, family, model, instance, tokens in / cached / out, seconds to the first
    token, decode tok/s, how it ended, request id, why the master chose the instance (the
    node keeps the last 1,024; its data dir holds requests.jsonl; --json for every field).
    Columns that do not fit the terminal (80 in a pipe; COLUMNS sets it) are left out:
    family, request and route first."""
    width = shutil.get_terminal_size().columns
    with client_for(ctx, api, api_key) as client:
        answer = client.request("GET", "/requests")
        records, after = answer.get("records", [])[-last:], int(answer.get("last", 0))
        if not json and (records or follow):
            click.echo(header_line(width))
        elif not json:
            click.echo("no finished requests recorded yet", err=True)
        _print(records, json, width)
        while follow:
            time.sleep(POLL_SECONDS)
            answer = client.request("GET", "/requests", params={"after": after})
            _print(answer.get("records", []), json, width)
            after = int(answer.get("last", after))


def _print(records: list[dict], json: bool, width: int) -> None:
    for r in records:
        click.echo(jsonlib.dumps(r) if json else record_line(r, width))
