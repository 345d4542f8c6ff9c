"""An edit's input image, from the client's upload to the bytes its task carries
(docs/images.md#edits, docs/security.md).

The upload is at most ``MAX_UPLOAD_BYTES``; it must be PNG, JPEG or WebP, and its declared size
is checked before any pixel is decoded (``MAX_INPUT_PIXELS``, ``MAX_INPUT_SIDE``): a
decompression bomb is refused from its header. Decoded, it is converted to RGB and re-encoded
— as PNG when that fits ``REFERENCE_BYTES`` (the pixels then reach the model unchanged), else
as JPEG (quality ``JPEG_QUALITY``), halved in size until it fits — because the task, and so
the reference, travels in the replicated log, whose commands are bounded
(``exo_p2p.api.bounds.MAX_COMMAND_BYTES``). mflux itself scales a reference down to about one
megapixel.
"""

from __future__ import annotations

import io

from exo_p2p.images.bounds import ImageBoundError

MAX_UPLOAD_BYTES = 16 * 1024 * 1024
"""The largest uploaded image file (bytes)."""
MAX_INPUT_PIXELS = 4096 * 4096
"""The most pixels an uploaded image may declare (width × height), checked before decoding."""
MAX_INPUT_SIDE = 8192
"""The longest side an uploaded image may declare (pixels)."""
FORMATS = ("PNG", "JPEG", "WEBP")
"""The image formats accepted (Pillow's names)."""
REFERENCE_BYTES = 96 * 1024
"""The most bytes a re-encoded reference may take in its task."""
JPEG_QUALITY = 90
"""The JPEG quality of a reference too large as PNG."""
MAX_HALVINGS = 6
"""Times a reference is halved at most to fit ``REFERENCE_BYTES``."""


def _encode(image, fmt: str) -> bytes:  # type: ignore[no-untyped-def]
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": JPEG_QUALITY} if fmt == "JPEG" else {}))
    return out.getvalue()


def reference_bytes(upload: bytes, param: str = "image") -> bytes:
    """The reference bytes of ``upload`` (module docstring). Raises ``ImageBoundError``
    naming ``param`` for a file over a bound, not an image, of another format, or one that
    cannot be made to fit."""
    from PIL import Image, UnidentifiedImageError

    if not upload or len(upload) > MAX_UPLOAD_BYTES:
        raise ImageBoundError(f"{param} must be an image file of 1..{MAX_UPLOAD_BYTES} bytes", param)
    try:
        with Image.open(io.BytesIO(upload), formats=FORMATS) as im:
            width, height = im.size
            if max(width, height) > MAX_INPUT_SIDE or width * height > MAX_INPUT_PIXELS or min(width, height) < 1:
                raise ImageBoundError(f"{param} is {width}x{height}: at most {MAX_INPUT_SIDE} pixels a side and "
                                      f"{MAX_INPUT_PIXELS} pixels in all", param)
            image = im.convert("RGB")  # decodes: after the size check
    except ImageBoundError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageBoundError(f"{param} is not a {', '.join(FORMATS)} image ({str(exc)[:120]})", param) from None
    data = _encode(image, "PNG")
    for _ in range(MAX_HALVINGS + 1):
        if len(data) <= REFERENCE_BYTES:
            return data
        data = _encode(image, "JPEG")
        if len(data) <= REFERENCE_BYTES:
            return data
        image = image.resize((max(16, image.width // 2), max(16, image.height // 2)), Image.LANCZOS)
    raise ImageBoundError(f"{param} does not fit {REFERENCE_BYTES} bytes even at {image.width}x{image.height}", param)
