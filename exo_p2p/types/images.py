"""The image kinds' wire types (docs/images.md): what an image task asks and what its runner
sends back, and ``ImageRef`` (an image of a chat message, the vision input). Pure data; the task structs themselves are in ``exo_p2p.types.tasks``
(``ImageGeneration``, ``ImageEdits``) and the chunk in ``exo_p2p.types.chunks`` (``ImageChunk``).
"""

from __future__ import annotations

import msgspec

MAX_PARTIAL_IMAGES = 3
"""Partial images one request may ask for (OpenAI's ``partial_images`` 0–3)."""


class ImageParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """One image to make: ``prompt`` (text), ``width`` × ``height`` pixels (multiples of 16,
    within the model's bounds: ``exo_p2p.images.bounds``), ``steps`` denoising steps, ``seed``
    (the same seed, prompt, size and steps give the same pixels), ``partial_images``: how many
    previews to send while denoising (0–``MAX_PARTIAL_IMAGES``, evenly spaced over the steps).
    An edit's ``image`` is its input picture as PNG bytes (decoded, bounded and re-encoded by
    the API node, ``exo_p2p.images.inputs``): the reference the model edits.
    ``client``: as ``GenerationParams.client``. ``progress``: the runner sends an
    ``ImageProgressChunk`` after every denoising step (docs/images.md#progress)."""

    prompt: str
    width: int
    height: int
    steps: int
    seed: int
    partial_images: int = 0
    image: bytes | None = None
    client: str | None = None
    progress: bool = False


def partial_steps(steps: int, partials: int) -> tuple[int, ...]:
    """The steps (1-based, < ``steps``) after which a partial image is sent: ``partials``
    evenly spaced ones, at most ``steps - 1`` (the last step's image is the final one)."""
    count = max(0, min(partials, steps - 1))
    return tuple(sorted({max(1, round(steps * (i + 1) / (count + 1))) for i in range(count)} - {steps}))


class ImageRef(msgspec.Struct, frozen=True):
    """An image of a chat message as the log carries it: its ``digest`` (sha256 of the bytes
    sent, hex), ``media_type``, ``width``/``height`` (pixels) and ``size`` (bytes). The bytes
    themselves never enter a command or the log (``exo_p2p.api.bounds.MAX_COMMAND_BYTES``);
    docs/api.md "Images"."""

    digest: str
    media_type: str
    width: int
    height: int
    size: int
