"""``exo-p2p chat --image FILE``: image files as OpenAI chat ``image_url`` parts (data URLs).

Each file is read (at most ``MAX_IMAGE_BYTES``) and checked here as the node would check it
(``exo_p2p.vision.image.decode_image``: PNG, JPEG, WebP or GIF, within the pixel bounds, not
truncated), so a bad file is a CLI error naming it before anything is sent. The images go with
the first question (docs/cli.md, docs/api.md#images).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from exo_p2p.cli.errors import CliError

ImageOpt = Annotated[
    Optional[list[Path]],
    typer.Option("--image", metavar="FILE", help="An image to ask about (PNG, JPEG, WebP, GIF; repeatable), "
                 "sent with the first question; the model must take images ('vision' in `exo-p2p models`)."),
]


def image_parts(paths: list[Path] | None) -> list[dict[str, Any]]:
    """``image_url`` parts of ``paths`` in order. Raises ``CliError`` (exit 2) naming a file
    that cannot be read, is too large or is no image the node would take."""
    from exo_p2p.vision.image import MAX_IMAGE_BYTES, MAX_IMAGES_PER_REQUEST, ImageError, decode_image

    paths = paths or []
    if len(paths) > MAX_IMAGES_PER_REQUEST:
        raise CliError(f"{len(paths)} images: at most {MAX_IMAGES_PER_REQUEST} per question", 2)
    parts = []
    for path in paths:
        try:
            if path.stat().st_size > MAX_IMAGE_BYTES:
                raise CliError(f"{path}: {path.stat().st_size} bytes, over the limit of {MAX_IMAGE_BYTES}", 2)
            data = path.read_bytes()
            image = decode_image(data)
        except OSError as exc:
            raise CliError(f"{path}: cannot read it ({exc.strerror or exc})", 2) from None
        except ImageError as exc:
            raise CliError(f"{path}: {exc}", 2) from None
        url = f"data:{image.media_type};base64,{base64.b64encode(data).decode()}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def user_content(text: str, parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A user message's ``content``: ``text`` alone, or its text part then ``parts``."""
    return [{"type": "text", "text": text}, *parts] if parts else text
