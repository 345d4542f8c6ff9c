"""The images a runner was sent for its tasks (``ImageData`` frames, ``worker.vision.delivery``),
kept by digest in an ``ImageStore`` of the same bounds as the API node's (entries, bytes,
seconds: ``exo_p2p.vision.store``) until the vision engine reads them at submit; a task whose
image is not here ends with ``missing_error`` (503 ``image_unavailable``), never a wait."""

from __future__ import annotations

from exo_p2p.types import ErrorChunk, ErrorInfo
from exo_p2p.vision.store import ImageStore

RUNNER_IMAGES = ImageStore()
"""This runner process's images by digest."""


def missing_error(task_id: str, digest: str) -> ErrorChunk:
    """The end of a task whose image ``digest`` did not reach its runner (expired on the API
    node, evicted, or its node unreachable)."""
    return ErrorChunk(task_id=task_id, error=ErrorInfo(
        503, f"image {digest[:12]} did not reach the model's runner (it expired or its node was unreachable): "
        "send the request again", param="messages", code="image_unavailable"))
