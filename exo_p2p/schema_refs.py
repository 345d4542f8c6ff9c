"""JSON schema references when a schema is nested inside another (a tool's ``parameters``
inside the schema of a call): a local ``$ref`` (``#/$defs/X``) points from the document's
root, so once the schema sits at ``#/properties/arguments`` it must point there instead.

Pure; used by the API's tool check (``exo_p2p.api.tools``) and the runner's tool grammar
(``worker/engine/tools.py``), which must compile the same schema.
"""

from __future__ import annotations

from typing import Any


def rebase_refs(schema: Any, base: str) -> Any:
    """A copy of ``schema`` with every local ``$ref`` (a string starting ``#``) moved under
    ``base`` (a JSON pointer fragment such as ``#/properties/arguments``); ``#`` itself
    becomes ``base``. Other values are kept as they are."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                out[key] = base + value[1:]
            else:
                out[key] = rebase_refs(value, base)
        return out
    if isinstance(schema, list):
        return [rebase_refs(item, base) for item in schema]
    return schema
