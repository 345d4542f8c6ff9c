"""One image a client sent, checked and bounded before anything else sees it.

``decode_image(data)`` reads the header first with Pillow (format, width, height), refuses a
format other than PNG, JPEG, WebP or GIF, more than ``MAX_IMAGE_PIXELS`` pixels or a side
over ``MAX_IMAGE_SIDE`` (decompression bombs: a 30000×30000 header, a GIF whose screen is
huge) before decoding a pixel, then decodes the first frame fully so a truncated or corrupt
file is refused here and never reaches a runner. Bounds and their reasons: docs/security.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import warnings

import msgspec

MAX_IMAGE_BYTES = 10 * 1024 * 1024
"""Encoded bytes of one image at most (OpenAI's limit is 20 MB, Anthropic's 5 MB; a photo from
a phone is 2–5 MB, a screenshot well under 1 MB)."""
MAX_IMAGE_PIXELS = 33_554_432
"""Pixels of one image at most (2^25, 8192×4096): a vision model's processor resizes to a few
megapixels anyway; a decoded RGBA image of this size is 128 MiB."""
MAX_IMAGE_SIDE = 16384
"""Pixels of one side at most (a 1×30,000,000 strip is under the pixel bound but no image)."""
MAX_IMAGES_PER_REQUEST = 16
"""Images of one request at most, counted over all its messages (and prior turns)."""
MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
"""Formats served (Pillow's name → media type); a GIF's first frame is the image."""


class ImageError(ValueError):
    """An image refused: its message says why, for a 400 in the family's shape."""


class ImagePart(msgspec.Struct, frozen=True):
    """One checked image: ``data`` its encoded bytes as sent, ``digest`` their sha256 (hex, the
    key of the prompt and feature caches), ``media_type`` the format found in the bytes (not
    the one the client declared), ``width``/``height`` in pixels (of the first frame)."""

    data: bytes
    digest: str
    media_type: str
    width: int
    height: int


def decode_base64(text: str) -> bytes:
    """Strict base64 (standard alphabet, padding required, whitespace not allowed) to bytes.
    Raises ``ImageError`` when invalid or longer than ``MAX_IMAGE_BYTES`` decoded (checked on
    the text's length first, so an oversized one is never decoded)."""
    if len(text) // 4 * 3 > MAX_IMAGE_BYTES + 3:
        raise ImageError(f"image is over {MAX_IMAGE_BYTES} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("image data is not valid base64") from None


def parse_data_url(url: str) -> tuple[str, bytes]:
    """``data:<media type>;base64,<data>`` → (declared media type, bytes). Raises
    ``ImageError`` for another shape, a non-image media type or bad base64."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise ImageError("a data URL must be 'data:image/<format>;base64,<data>'")
    declared = head[len("data:"):-len(";base64")].strip().lower()
    if not declared.startswith("image/"):
        raise ImageError(f"a data URL's media type must be image/*, got {declared[:64]!r}")
    return declared, decode_base64(payload)


def decode_image(data: bytes) -> ImagePart:
    """Check one image's bytes (see the module docstring) and return its ``ImagePart``.

    Raises ``ImageError``: empty or over ``MAX_IMAGE_BYTES``; not an image Pillow reads; a
    format outside ``MEDIA_TYPES``; over ``MAX_IMAGE_PIXELS`` or ``MAX_IMAGE_SIDE``;
    truncated or corrupt when its first frame is decoded."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ImageError("image is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image is {len(data)} bytes, over the limit of {MAX_IMAGE_BYTES}")
    try:
        with warnings.catch_warnings():  # the size is checked against our own bound below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))  # reads the header only
    except UnidentifiedImageError:
        raise ImageError("image is not a PNG, JPEG, WebP or GIF file (its bytes are no image format known)") from None
    except Image.DecompressionBombError as exc:  # Pillow's own bound (2 × its MAX_IMAGE_PIXELS) met first
        raise ImageError(f"image is over the limit of {MAX_IMAGE_PIXELS} pixels (a decompression bomb: {str(exc)[:120]})") from None
    except (OSError, ValueError) as exc:
        raise ImageError(f"image header is unreadable: {str(exc)[:200]}") from None
    with image:
        media_type = MEDIA_TYPES.get(str(image.format))
        if media_type is None:
            raise ImageError(f"image format {str(image.format)[:32]} is not served: send PNG, JPEG, WebP or GIF")
        width, height = image.size
        _check_size(width, height)
        _decode_first_frame(image)
    return ImagePart(data=data, digest=hashlib.sha256(data).hexdigest(), media_type=media_type, width=width, height=height)


def _check_size(width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise ImageError(f"image is {width}×{height} pixels: empty")
    if max(width, height) > MAX_IMAGE_SIDE:
        raise ImageError(f"image is {width}×{height} pixels: a side is over the limit of {MAX_IMAGE_SIDE}")
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(f"image is {width}×{height} pixels, over the limit of {MAX_IMAGE_PIXELS} pixels")


def _decode_first_frame(image) -> None:  # noqa: ANN001 - a PIL.Image.Image
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.seek(0)
            image.load()
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise ImageError(f"image is truncated or corrupt: {str(exc)[:200]}") from None
