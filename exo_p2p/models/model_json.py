"""JSON read from a model source (a hub repo, a model directory, a safetensors header): a
model's files are as untrusted as a client's request (docs/security.md#model-sources)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exo_p2p.content.json_depth import json_depth
from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.hub_limits import MAX_CONFIG_BYTES

MAX_MODEL_JSON_DEPTH = 32
"""Arrays and objects nested in a model's ``config.json`` or a safetensors header at most (real
ones nest 2 to 5 deep: ``text_config.rope_scaling``, a header's ``shape`` lists)."""


def model_json(data: str | bytes, what: str) -> Any:
    """``data`` decoded as JSON. Raises ``UnsupportedModelError`` naming ``what`` (a file, e.g.
    ``"org/m: config.json"``) when it is not JSON or nests deeper than
    ``MAX_MODEL_JSON_DEPTH`` (measured without recursion; JSON deep enough to exhaust Python's
    recursion is refused the same way)."""
    try:
        value = json.loads(data)
    except RecursionError:
        value = None
        deep = True
    except ValueError as e:
        raise UnsupportedModelError(f"{what} is not JSON ({e})") from e
    else:
        deep = json_depth(value) > MAX_MODEL_JSON_DEPTH
    if deep:
        raise UnsupportedModelError(f"{what} nests arrays and objects deeper than {MAX_MODEL_JSON_DEPTH} levels")
    return value


def model_json_file(path: Path, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """The JSON in the model file at ``path`` (``config.json``, a pooling or modules file), read
    with at most ``max_bytes`` + 1 bytes (default ``MAX_CONFIG_BYTES``, 4 MiB: a real one is a
    few KB), then decoded by :func:`model_json`. Raises ``UnsupportedModelError`` naming
    ``what`` when the file is larger, is not UTF-8 JSON or nests too deep, and ``OSError``
    when it cannot be read (a missing file included: the caller decides whether that is an
    error)."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsupportedModelError(f"{what} is larger than {max_bytes} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnsupportedModelError(f"{what} is not UTF-8 ({e.reason})") from None
    return model_json(text, what)
