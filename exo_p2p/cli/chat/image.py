"""``exo-p2p image MODEL PROMPT -o FILE``: one image of PROMPT by MODEL through a node's
``POST /v1/images/generations`` (docs/cli.md, docs/images.md), written to FILE (its format
from the extension: .png, .jpg/.jpeg, .webp). ``--edit IMAGE`` edits that picture instead
(``POST /v1/images/edits``). The request streams with the extra ``progress: true``, so a
progress bar on stderr moves at every denoising step (rich's, as the other commands' bars);
prints where it wrote and the request's figures, or with ``--json`` (no stream, no bar) the
API's answer without the image bytes.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Annotated

import click
import typer

from exo_p2p.cli.common import ApiKeyOpt, ApiOpt, JsonOpt, app, client_for, handled, model_name
from exo_p2p.cli.errors import CliError

IMAGE_TIMEOUT = 3600.0
"""Seconds the command waits for its image (a large image on a CPU takes minutes a step)."""
FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".webp": "webp"}
"""Output file extensions → ``output_format``."""


def output_format(path: Path) -> str:
    """The ``output_format`` of ``path``'s extension. Raises ``CliError`` for another one."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise CliError(f"{path.name}: the output file must end in {', '.join(FORMATS)}")
    return fmt


def image_body(model: str, prompt: str, fmt: str, size: str, steps: int | None, seed: int | None) -> dict:
    """The request fields of one image (``steps``/``seed`` when given)."""
    body: dict = {"model": model, "prompt": prompt, "size": size, "output_format": fmt, "n": 1}
    body.update({k: v for k, v in (("steps", steps), ("seed", seed)) if v is not None})
    return body


def _request(body: dict, edit: Path | None) -> tuple[str, dict]:
    """The path and httpx arguments of the request (an edit's as a multipart form)."""
    if edit is None:
        return "/v1/images/generations", {"json": body}
    if not edit.is_file():
        raise CliError(f"{edit}: no such file to edit")
    fields = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in body.items()}
    return "/v1/images/edits", {"data": fields,
                                "files": {"image": (edit.name, edit.read_bytes(), "application/octet-stream")}}


def _ask(ctx: typer.Context, api: str | None, api_key: str | None, body: dict, edit: Path | None) -> dict:
    path, kwargs = _request(body, edit)
    with client_for(ctx, api, api_key) as client:
        return client.request("POST", path, timeout=IMAGE_TIMEOUT, **kwargs)


def _streamed(ctx: typer.Context, api: str | None, api_key: str | None, body: dict, edit: Path | None) -> dict:
    """The image asked with ``stream`` and ``progress``, a progress bar per denoising step on
    stderr meanwhile; the answer as ``_ask``'s (``data``, ``size``, ``output_format``)."""
    from exo_p2p.cli.chat.image_progress import follow

    path, kwargs = _request({**body, "stream": True, "progress": True}, edit)
    with client_for(ctx, api, api_key) as client:
        return follow(client.sse_data(path, read_timeout=IMAGE_TIMEOUT, **kwargs), body.get("steps"))


@app.command()
@handled
def image(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="An image model (see `exo-p2p models`: tasks).")],
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="What the image shows (or, with --edit, what to change).")],
    out: Annotated[Path, typer.Option("-o", "--output", help="The file to write (.png, .jpg, .webp).")] = Path("image.png"),
    size: Annotated[str, typer.Option("--size", help="WIDTHxHEIGHT, multiples of 16, or auto.")] = "auto",
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Denoising steps (default: the model's 4).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0, help="The seed (the same seed gives the same image).")] = None,
    edit: Annotated[Path | None, typer.Option("--edit", metavar="IMAGE", help="Edit this picture instead.")] = None,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
    json: JsonOpt = False,
) -> None:
    """Make one image of PROMPT with MODEL (or edit one with --edit) and write it to -o FILE."""
    fmt = output_format(out)
    started = time.monotonic()
    body = image_body(model, prompt, fmt, size, steps, seed)
    answer = _ask(ctx, api, api_key, body, edit) if json else _streamed(ctx, api, api_key, body, edit)
    data = (answer or {}).get("data") or []
    if not data or not data[0].get("b64_json"):
        raise CliError("the node's answer holds no image (is it older than images?)")
    out.write_bytes(base64.b64decode(data[0]["b64_json"]))
    if json:
        import json as json_module

        click.echo(json_module.dumps({**answer, "data": [{"file": str(out)}]}))
        return
    click.echo(f"wrote {out} ({answer.get('size')}, {answer.get('output_format')}, "
               f"{time.monotonic() - started:.1f} s)")
