"""``exo-p2p embed MODEL TEXT…``: the embedding of each TEXT by MODEL through a node's
``POST /v1/embeddings`` (docs/cli.md). Prints each vector's dimension and first values, or
with ``--json`` the API's answer as it came.
"""

from __future__ import annotations

from typing import Annotated

import click
import typer

from exo_p2p.cli.common import ApiKeyOpt, ApiOpt, JsonOpt, app, client_for, handled, model_name
from exo_p2p.cli.errors import ApiError, CliError
from exo_p2p.cli.messages import reworded_unknown_model
from exo_p2p.cli.placement.commands import cluster_models

SHOWN_VALUES = 6
"""Values of each vector printed without ``--json``."""


def summary_lines(answer: dict, texts: list[str], shown: int = SHOWN_VALUES) -> list[str]:
    """One line per vector: ``[i] dim D: v0 v1 … (text)`` and a usage line. Raises
    ``CliError`` for an answer without its ``data`` (a node that does not embed)."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise CliError("the node's answer has no embeddings (is it older than embeddings?)")
    lines = []
    for item in data:
        vec = item.get("embedding") or []
        i = int(item.get("index", 0))
        head = " ".join(f"{v:+.4f}" for v in vec[:shown]) + (" …" if len(vec) > shown else "")
        text = texts[i] if 0 <= i < len(texts) else ""
        lines.append(f"[{i}] dim {len(vec)}: {head}  ({text[:40]}{'…' if len(text) > 40 else ''})")
    tokens = (answer.get("usage") or {}).get("prompt_tokens")
    if tokens is not None:
        lines.append(f"{tokens} tokens")
    return lines


@app.command()
@handled
def embed(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="An embedding-capable model (see `exo-p2p models`: tasks).")],
    texts: Annotated[list[str], typer.Argument(metavar="TEXT...", help="Texts to embed, one vector each.")],
    dimensions: Annotated[int | None, typer.Option("--dimensions", min=1, help="Matryoshka dimensions (models that list them).")] = None,
    truncate: Annotated[bool, typer.Option("--truncate", help="Cut a text over the model's context instead of refusing it.")] = False,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
    json: JsonOpt = False,
) -> None:
    """Embed each TEXT with MODEL: its vector's dimension and first values (--json: all)."""
    body: dict = {"model": model, "input": texts}
    if dimensions is not None:
        body["dimensions"] = dimensions
    if truncate:
        body["truncate"] = True
    with client_for(ctx, api, api_key) as client:
        try:
            answer = client.request("POST", "/v1/embeddings", json=body)
        except ApiError as e:  # the route names no known model: the cluster's list does
            if e.status != 404 or (known := cluster_models(client)) is None:
                raise
            raise CliError(reworded_unknown_model(e.message, sorted(known)) or e.message) from None
    if json:
        import json as json_module

        click.echo(json_module.dumps(answer))
        return
    for line in summary_lines(answer, texts):
        click.echo(line)
