"""Whether a request's images may go to the model it names.

``check_images(card, model_id, messages)``: at most ``MAX_IMAGES_PER_REQUEST`` images over
all messages (400 ``too_many_images``); a model whose card does not list the ``vision``
capability (``exo_p2p.models.card.capabilities.model_capabilities``) asked about an image is a 400 naming the model
(``model_not_vision``) — never its text half answered silently; a vision model's runners
read the images (docs/models.md#vision-models). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from exo_p2p.api.errors import ApiError
from exo_p2p.types import ChatMessage, ModelCard
from exo_p2p.vision.image import MAX_IMAGES_PER_REQUEST

VISION = "vision"
"""The capability a card lists when its model takes images."""


def image_count(messages: Iterable[ChatMessage]) -> int:
    """Images over ``messages``."""
    return sum(len(m.images) for m in messages)


def check_count(count: int, param: str) -> None:
    """Raise ``ApiError(400, too_many_images)`` when a request holds more than
    ``MAX_IMAGES_PER_REQUEST`` image parts: each family counts its parts before decoding any
    (decoding is the work a flood of small images would make us spend)."""
    if count > MAX_IMAGES_PER_REQUEST:
        raise ApiError(400, f"{count} images in one request: at most {MAX_IMAGES_PER_REQUEST}", param=param, code="too_many_images")


def check_images(card: ModelCard | None, model_id: str, messages: Iterable[ChatMessage], param: str = "messages") -> None:
    """Raise ``ApiError(400)`` when ``messages`` hold more than ``MAX_IMAGES_PER_REQUEST``
    images, or any image while ``card`` (None: the model is unknown here, which the path
    answers itself) does not list ``vision``. ``param`` names the request's field."""
    count = image_count(messages)
    if count == 0:
        return
    check_count(count, param)
    if card is not None and VISION not in card.capabilities:
        raise ApiError(400, f"model {model_id[:200]!r} takes text only and cannot read images: ask a vision model "
                       "(its capabilities list 'vision' in /v1/models and /api/show)", param=param, code="model_not_vision")
