"""An image part of any family read into the ``ImageRef`` the log carries.

Each family reads its own shape (OpenAI ``image_url``, Responses ``input_image``, Anthropic
``image`` blocks, Ollama ``images``) and calls ``image_from_url`` or ``image_from_base64``
here; both check the image (``exo_p2p.vision.image.decode_image``: format, bytes, pixels, a
full decode of the first frame), keep the checked bytes in ``NODE_IMAGES`` for the runner, and raise ``ApiError(400, param=where)`` naming the part, so
each family answers in its own shape.
"""

from __future__ import annotations

from exo_p2p.api.errors import ApiError
from exo_p2p.types import ImageRef
from exo_p2p.vision.fetch import ImageUrlPolicy, fetch_image
from exo_p2p.vision.image import ImageError, ImagePart, decode_base64, decode_image, parse_data_url
from exo_p2p.vision.store import NODE_IMAGES

NO_URLS = ImageUrlPolicy()
"""The default: data URLs and base64 only (a node fetches URLs with ``--allow-image-urls``)."""


def image_ref(part: ImagePart) -> ImageRef:
    """The log's reference to ``part`` (digest, media type, size; not the bytes)."""
    return ImageRef(digest=part.digest, media_type=part.media_type, width=part.width, height=part.height, size=len(part.data))


def _checked(where: str, read) -> ImageRef:  # noqa: ANN001 - a callable returning the image's bytes
    """The checked image's reference; its bytes kept in the node's store for the runner that
    needs them (``exo_p2p.vision.store``: bounded, time-limited)."""
    try:
        part = decode_image(read())
        NODE_IMAGES.put(part.digest, part.data)
        return image_ref(part)
    except ImageError as exc:
        raise ApiError(400, f"{where}: {exc}", param=where, code="invalid_image") from None


def image_from_url(where: str, url: object, policy: ImageUrlPolicy) -> ImageRef:
    """An image given as a URL: a ``data:image/...;base64,`` URL, or an ``http(s)`` URL fetched
    under ``policy`` (``exo_p2p.vision.fetch``). 400 naming ``where`` otherwise."""
    if not isinstance(url, str) or not url:
        raise ApiError(400, f"{where} must be a non-empty URL string", param=where, code="invalid_image")
    if url.startswith("data:"):
        return _checked(where, lambda: parse_data_url(url)[1])
    return _checked(where, lambda: fetch_image(url, policy))


def image_from_base64(where: str, data: object) -> ImageRef:
    """An image given as base64 text (Anthropic's ``source.data``, Ollama's ``images``; a data
    URL is accepted too, as Ollama's clients sometimes send one). 400 naming ``where``."""
    if not isinstance(data, str) or not data:
        raise ApiError(400, f"{where} must be a non-empty base64 string", param=where, code="invalid_image")
    if data.startswith("data:"):
        return _checked(where, lambda: parse_data_url(data)[1])
    return _checked(where, lambda: decode_base64(data))


def image_from_source(where: str, source: object, policy: ImageUrlPolicy) -> ImageRef:
    """Anthropic's image ``source``: ``{"type": "base64", "media_type", "data"}`` or
    ``{"type": "url", "url"}`` (fetched under ``policy``). The declared ``media_type`` must be
    one Anthropic names (png, jpeg, webp, gif); the format served is the one found in the bytes."""
    if not isinstance(source, dict):
        raise ApiError(400, f"{where}.source must be an object", param=f"{where}.source", code="invalid_image")
    kind = source.get("type")
    if kind == "base64":
        declared = source.get("media_type")
        if declared not in ("image/png", "image/jpeg", "image/webp", "image/gif"):
            raise ApiError(400, f"{where}.source.media_type must be image/png, image/jpeg, image/webp or image/gif, "
                           f"got {str(declared)[:64]!r}", param=f"{where}.source.media_type", code="invalid_image")
        return image_from_base64(f"{where}.source.data", source.get("data"))
    if kind == "url":
        return image_from_url(f"{where}.source.url", source.get("url"), policy)
    raise ApiError(400, f"{where}.source.type must be 'base64' or 'url', got {str(kind)[:64]!r}", param=f"{where}.source.type",
                   code="invalid_image")
