"""Identifiers and small value types shared by every wire and state type.

All sizes are integers in bytes; all durations are float seconds. Identifiers are plain
strings on the wire (msgspec encodes them as msgpack str), named by the ``NewType`` aliases
below so signatures say which id they take.
"""

from __future__ import annotations

import uuid
from typing import Annotated, NewType

import msgspec

PROTOCOL_VERSION = 1
"""Version of every wire message; a message with another version is dropped and counted."""

NodeId = NewType("NodeId", str)
"""A node's libp2p peer id (base58 of its ed25519 public key)."""
InstanceId = NewType("InstanceId", str)
RunnerId = NewType("RunnerId", str)
TaskId = NewType("TaskId", str)
CommandId = NewType("CommandId", str)
ModelId = NewType("ModelId", str)

Bytes = Annotated[int, msgspec.Meta(ge=0)]
"""A size in bytes (never a float of GB)."""


def new_id() -> str:
    """A fresh random identifier (uuid4, 36 characters)."""
    return str(uuid.uuid4())


class ErrorInfo(msgspec.Struct, frozen=True):
    """An error a caller sees, shaped for OpenAI-style JSON.

    ``status`` is the HTTP status the API answers with (docs/architecture.md#instance-lifecycle), ``type`` the OpenAI
    error type (``invalid_request_error``, ``not_found_error``, ``server_error``, ...),
    ``param`` the offending request field when there is one. A prompt that does not fit
    (``code`` ``context_length_exceeded``) carries its ``prompt_tokens`` (exact, or a lower
    bound when it was refused by size) and the model's ``context_tokens``, from which each API
    family words the error as its vendor does (``exo_p2p.api.errors.overflow_message``).
    """

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    prompt_tokens: int | None = None
    context_tokens: int | None = None
