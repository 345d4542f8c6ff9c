"""Structured output from ``chat`` and ``run``: ``--json`` (any JSON object) and ``--schema
FILE`` (a JSON schema), sent as the OpenAI chat ``response_format`` (docs/cli.md).

The file is checked here (readable, JSON, an object, within the node's size bound) so a
mistake is one line and exit 2 before anything is sent; whether llguidance can enforce the
schema is the node's to say (a 400 naming the problem, exit 1).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from exo_p2p.cli.errors import CliError

MAX_SCHEMA_BYTES = 64 * 1024
"""The largest schema the node accepts (``exo_p2p.content.output_format.MAX_FORMAT_BYTES``)."""

JsonAnswerOpt = Annotated[
    bool,
    typer.Option("--json", help="Answer with a JSON object (any; constrained decoding on the node)."),
]
SchemaOpt = Annotated[
    Optional[Path],
    typer.Option("--schema", metavar="FILE", help="Answer with JSON that validates against the JSON schema in FILE."),
]


def schema_name(path: Path) -> str:
    """The ``json_schema.name`` OpenAI requires (``[A-Za-z0-9_-]{1,64}``), from the file's name."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)[:64]
    return name or "schema"


def read_schema(path: Path) -> dict[str, Any]:
    """The JSON schema in ``path``. Raises ``CliError`` (exit 2) naming the file and what is
    wrong: unreadable, too large, not JSON, not a JSON object."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CliError(f"cannot read the schema file {path}: {e.strerror or e}", 2) from None
    if len(data) > MAX_SCHEMA_BYTES:
        raise CliError(f"the schema file {path} is {len(data)} bytes; a node accepts at most {MAX_SCHEMA_BYTES}", 2)
    try:
        schema = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CliError(f"the schema file {path} is not valid JSON: {e}", 2) from None
    if not isinstance(schema, dict):
        raise CliError(f"the schema file {path} holds a JSON {_kind(schema)}; a JSON schema is an object", 2)
    return schema


def _kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def response_format(json_object: bool, schema: Path | None) -> dict[str, Any] | None:
    """The ``response_format`` of ``--json`` / ``--schema FILE``, or None for neither.
    Raises ``CliError`` (exit 2) for both at once or a bad schema file."""
    if json_object and schema is not None:
        raise CliError("give --json or --schema, not both (a schema already asks for JSON)", 2)
    if json_object:
        return {"type": "json_object"}
    if schema is None:
        return None
    return {"type": "json_schema",
            "json_schema": {"name": schema_name(schema), "schema": read_schema(schema), "strict": True}}
