"""The bounds of an image request (docs/images.md#bounds, docs/security.md): sizes, steps,
``n`` and partial images, checked by the API node before a task is made and again by the
runner (``worker.image.engine``). Pure functions; ``ImageBoundError`` names the field.
"""

from __future__ import annotations

from exo_p2p.types.images import MAX_PARTIAL_IMAGES, ImageParams

SIDE_MULTIPLE = 16
"""Width and height are multiples of this many pixels (FLUX.2: 8× VAE downsampling, 2×2 patches)."""
MIN_SIDE = 16
"""The smallest width or height (pixels)."""
MAX_SIDE = 2048
"""The largest width or height (pixels)."""
MAX_PIXELS = 2048 * 1024
"""The most pixels one image may have (width × height): 2 MP, twice a 1024² FLUX image."""
MAX_STEPS = 50
"""The most denoising steps one image may take."""
MAX_N = 4
"""The most images one request may ask for (``n``)."""
MAX_PROMPT_BYTES = 32 * 1024
"""The longest prompt (UTF-8 bytes); the text encoder reads its first 512 tokens."""
DEFAULT_SIZE = (1024, 1024)
"""``size`` ``auto``: FLUX.2-klein's native size."""
QUALITY_STEPS = {"low": 2, "medium": 4, "high": 8, "auto": 4, "standard": 4, "hd": 8}
"""OpenAI's ``quality`` → denoising steps (4: the distilled klein models' default)."""


class ImageBoundError(ValueError):
    """A request over a bound; ``param`` is the request field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def parse_size(size: str | None) -> tuple[int, int]:
    """``"WxH"`` (or ``auto``/None: ``DEFAULT_SIZE``) as (width, height), checked by
    ``check_size``. Raises ``ImageBoundError`` for another form."""
    if size in (None, "", "auto"):
        return DEFAULT_SIZE
    width, sep, height = str(size).lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or len(width) > 5 or len(height) > 5:
        raise ImageBoundError(f"size {str(size)[:40]!r} is not WIDTHxHEIGHT (e.g. 1024x1024) or auto", "size")
    check_size(int(width), int(height))
    return int(width), int(height)


def check_size(width: int, height: int) -> None:
    """Raises ``ImageBoundError`` unless both sides are multiples of ``SIDE_MULTIPLE`` in
    ``[MIN_SIDE, MAX_SIDE]`` and the image has at most ``MAX_PIXELS``."""
    for side in (width, height):
        if not MIN_SIDE <= side <= MAX_SIDE or side % SIDE_MULTIPLE:
            raise ImageBoundError(f"size {width}x{height}: each side must be a multiple of {SIDE_MULTIPLE} "
                                  f"from {MIN_SIDE} to {MAX_SIDE} pixels", "size")
    if width * height > MAX_PIXELS:
        raise ImageBoundError(f"size {width}x{height} is over {MAX_PIXELS} pixels", "size")


def check_params(params: ImageParams) -> None:
    """Raises ``ImageBoundError`` for any field of ``params`` over its bound."""
    check_size(params.width, params.height)
    if not 1 <= params.steps <= MAX_STEPS:
        raise ImageBoundError(f"steps {params.steps} is outside 1..{MAX_STEPS}", "steps")
    if not 0 <= params.partial_images <= MAX_PARTIAL_IMAGES:
        raise ImageBoundError(f"partial_images {params.partial_images} is outside 0..{MAX_PARTIAL_IMAGES}",
                              "partial_images")
    if len(params.prompt.encode()) > MAX_PROMPT_BYTES or not params.prompt.strip():
        raise ImageBoundError(f"the prompt must be non-empty text of at most {MAX_PROMPT_BYTES} bytes", "prompt")
    if not 0 <= params.seed < 2**63:
        raise ImageBoundError("seed must be in 0..2**63-1", "seed")
