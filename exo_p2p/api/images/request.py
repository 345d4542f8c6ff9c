"""An OpenAI image generation body, parsed and bounded (docs/images.md#api). The shapes are
the ``openai`` package's ``ImageGenerateParams``; fields this runtime does not use
(``background``, ``moderation``, ``style``, ``user``...) are accepted and ignored, as OpenAI's
own models ignore those they do not support. Extra: ``seed`` (int), ``steps`` (int, over
``quality``) and ``progress`` (bool, with ``stream``: an ``image_generation.progress`` event
after every denoising step, docs/images.md#progress).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

import msgspec

from exo_p2p.api.errors import ApiError, decode_json
from exo_p2p.images.bounds import MAX_N, MAX_STEPS, QUALITY_STEPS, ImageBoundError, check_params, parse_size
from exo_p2p.types.images import MAX_PARTIAL_IMAGES, ImageParams

OutputFormat = Literal["png", "jpeg", "webp"]


class GenerationBody(msgspec.Struct, frozen=True):
    """The fields of ``POST /v1/images/generations`` read here (others are ignored)."""

    prompt: str
    model: str | None = None
    n: int | None = None
    size: str | None = None
    quality: str | None = None
    response_format: Literal["b64_json", "url"] | None = None
    output_format: OutputFormat | None = None
    output_compression: int | None = None
    partial_images: int | None = None
    stream: bool | None = None
    seed: int | None = None
    steps: int | None = None
    progress: bool | None = None


@dataclass(frozen=True)
class ImageRequest:
    """A checked request: ``model`` (the name asked), ``params`` of its first image (image
    ``i`` uses ``seed + i``), ``n`` images, how they are answered."""

    model: str
    params: ImageParams
    n: int
    response_format: str
    output_format: OutputFormat
    compression: int
    stream: bool
    size: str
    quality: str


def _steps(body: GenerationBody) -> int:
    if body.steps is not None:
        if not 1 <= body.steps <= MAX_STEPS:
            raise ApiError(400, f"steps must be 1..{MAX_STEPS}", param="steps")
        return body.steps
    quality = body.quality or "auto"
    if quality not in QUALITY_STEPS:
        raise ApiError(400, f"quality must be one of {', '.join(QUALITY_STEPS)}", param="quality")
    return QUALITY_STEPS[quality]


def _check(body: GenerationBody) -> None:
    if body.n is not None and not 1 <= body.n <= MAX_N:
        raise ApiError(400, f"n must be 1..{MAX_N}", param="n")
    if body.output_compression is not None and not 0 <= body.output_compression <= 100:
        raise ApiError(400, "output_compression must be 0..100", param="output_compression")
    if body.partial_images is not None and not 0 <= body.partial_images <= MAX_PARTIAL_IMAGES:
        raise ApiError(400, f"partial_images must be 0..{MAX_PARTIAL_IMAGES}", param="partial_images")
    if body.partial_images and not body.stream:
        raise ApiError(400, "partial_images needs stream: true", param="partial_images")
    if body.progress and not body.stream:
        raise ApiError(400, "progress needs stream: true", param="progress")
    if body.stream and body.response_format == "url":
        raise ApiError(400, "a stream sends b64_json images; response_format url does not stream",
                       param="response_format")
    if not body.model:
        raise ApiError(400, "model is required: name an image model this cluster serves", param="model")


def parse_generation(raw: bytes) -> ImageRequest:
    """The checked request of a JSON body. Raises ``ApiError(400)`` naming the field for
    anything malformed or over a bound (``exo_p2p.images.bounds``)."""
    return checked(decode_json(raw, GenerationBody))


def checked(body: GenerationBody, reference: bytes | None = None,
            auto: tuple[int, int] | None = None) -> ImageRequest:
    """The checked request of ``body`` (an edit's: its ``reference`` bytes, ``auto`` the size
    ``size: auto`` means). Raises ``ApiError(400)`` as ``parse_generation``."""
    _check(body)
    try:
        width, height = auto if auto and body.size in (None, "", "auto") else parse_size(body.size)
        seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
        params = ImageParams(prompt=body.prompt, width=width, height=height, steps=_steps(body), seed=seed,
                             partial_images=body.partial_images or 0, image=reference, progress=bool(body.progress))
        check_params(params)
    except ImageBoundError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    return ImageRequest(model=str(body.model), params=params, n=body.n or 1,
                        response_format=body.response_format or "b64_json", output_format=body.output_format or "png",
                        compression=100 if body.output_compression is None else body.output_compression,
                        stream=bool(body.stream), size=f"{width}x{height}", quality=body.quality or "auto")
