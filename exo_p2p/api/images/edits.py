"""OpenAI ``POST /v1/images/edits`` bodies (docs/images.md#edits): ``multipart/form-data``
with one ``image`` file (``image[]`` with one file is the same), ``prompt`` and the
generation fields as form values (``n``, ``size``, ``quality``, ``response_format``,
``output_format``, ``output_compression``, ``stream``, ``partial_images``; extra: ``seed``,
``steps``). The image is bounded and re-encoded by ``exo_p2p.images.inputs``. ``size: auto``
is the image's own size, rounded down to multiples of 16 (1024x1024 when that is out of
bounds). A ``mask`` is refused: FLUX.2-klein edits the whole picture from the prompt and has
no inpainting mask.
"""

from __future__ import annotations

import msgspec
from starlette.datastructures import UploadFile
from starlette.requests import Request

from exo_p2p.api.errors import ApiError
from exo_p2p.api.images.request import GenerationBody, ImageRequest, checked
from exo_p2p.images.bounds import DEFAULT_SIZE, SIDE_MULTIPLE, ImageBoundError, check_size
from exo_p2p.images.inputs import MAX_UPLOAD_BYTES, reference_bytes

MAX_FIELDS = 32
"""Form fields an edit body may have at most."""


async def _form(raw: bytes, scope: dict):  # type: ignore[no-untyped-def]
    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    if not scope_type(scope).startswith("multipart/form-data"):
        raise ApiError(400, "an edit is multipart/form-data with an image file and a prompt")
    try:
        return await Request(scope, receive).form(max_files=2, max_fields=MAX_FIELDS, max_part_size=MAX_UPLOAD_BYTES)
    except Exception as exc:  # noqa: BLE001 - starlette's multipart errors are several types
        raise ApiError(400, f"the form could not be read: {str(exc)[:200]}") from None


def scope_type(scope: dict) -> str:
    """The request's content type (lower case)."""
    return next((v.decode("latin-1").lower() for k, v in scope.get("headers", []) if k == b"content-type"), "")


def _auto_size(reference: bytes) -> tuple[int, int]:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(reference)) as im:
        width, height = (im.width // SIDE_MULTIPLE) * SIDE_MULTIPLE, (im.height // SIDE_MULTIPLE) * SIDE_MULTIPLE
    try:
        check_size(width, height)
    except ImageBoundError:
        return DEFAULT_SIZE
    return width, height


async def parse_edit(raw: bytes, scope: dict) -> ImageRequest:
    """The checked edit request of a multipart body. Raises ``ApiError(400)`` naming the field."""
    form = await _form(raw, scope)
    files = [v for k in ("image", "image[]") for v in form.getlist(k) if isinstance(v, UploadFile)]
    if len(files) != 1:
        raise ApiError(400, "an edit takes exactly one image file", param="image")
    if form.get("mask") is not None:
        raise ApiError(400, "this model edits the whole image from the prompt; it takes no mask", param="mask")
    fields = {k: v for k, v in form.items() if isinstance(v, str) and k in GenerationBody.__struct_fields__}
    fields["stream"] = fields.get("stream", "false").lower() == "true"
    try:
        body = msgspec.convert(fields, GenerationBody, strict=False)
        reference = reference_bytes(await files[0].read(MAX_UPLOAD_BYTES + 1))
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"bad form field: {exc}") from None
    except ImageBoundError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    return checked(body, reference, _auto_size(reference))
