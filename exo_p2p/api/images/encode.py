"""Generated images as OpenAI answers (docs/images.md#api): the file in the asked
``output_format`` (the runner sends PNG; JPEG and WebP are re-encoded here with
``output_compression`` as their quality) and the response and stream event shapes of the
``openai`` package's ``ImagesResponse``, ``ImageGenPartialImageEvent`` and
``ImageGenCompletedEvent``.
"""

from __future__ import annotations

import base64
import io

MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
"""The media type of each output format."""


def convert(png: bytes, output_format: str, compression: int) -> bytes:
    """``png`` in ``output_format`` (``png`` unchanged); ``compression`` 0–100 is JPEG's and
    WebP's quality. Raises ``ValueError`` for bytes that are not an image."""
    if output_format == "png":
        return png
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        out = io.BytesIO()
        image.convert("RGB").save(out, format=output_format.upper(), quality=max(1, compression))
        return out.getvalue()


def usage(prompt_tokens: int, images: int) -> dict:
    """OpenAI's image ``usage``: the prompt's tokens in, the images out (one output token per
    image: this runtime does not count image tokens)."""
    return {"input_tokens": prompt_tokens, "output_tokens": images, "total_tokens": prompt_tokens + images,
            "input_tokens_details": {"image_tokens": 0, "text_tokens": prompt_tokens}}


def response(created: int, data: list[dict], *, output_format: str, quality: str, size: str, usage_: dict) -> dict:
    """The body of a request that does not stream (``ImagesResponse``)."""
    return {"created": created, "data": data, "output_format": output_format, "size": size,
            "quality": quality if quality in ("low", "medium", "high") else "medium", "usage": usage_,
            "background": "opaque"}


def event(kind: str, created: int, image: bytes, *, output_format: str, quality: str, size: str,
          index: int | None = None, usage_: dict | None = None) -> dict:
    """A stream event: ``kind`` is ``image_generation.partial_image`` (with ``index``) or
    ``image_generation.completed`` (with ``usage_``), or the ``image_edit.`` ones."""
    out = {"type": kind, "b64_json": base64.b64encode(image).decode(), "created_at": created, "size": size,
           "quality": quality if quality in ("low", "medium", "high") else "auto", "background": "opaque",
           "output_format": output_format}
    if index is not None:
        out["partial_image_index"] = index
    if usage_ is not None:
        out["usage"] = usage_
    return out
