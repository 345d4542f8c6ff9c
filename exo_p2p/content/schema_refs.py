"""JSON schema references when a schema is nested inside another (a tool's ``parameters``
inside the schema of a call): a local ``$ref`` (``#/$defs/X``) points from the document's
root, so once the schema sits at ``#/properties/arguments`` it must point there instead.

Pure; used by the API's tool check (``exo_p2p.api.families.tool_calls``) and the runner's tool grammar
(``worker/engine/answer/tools.py``), which must compile the same schema.
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


def ref_cycle(schema: Any) -> str | None:
    """The first local ``$ref`` (a string starting ``#``) of ``schema`` whose chain of
    references comes back to itself without reaching a schema of its own (``{"$ref": "#"}``,
    ``a -> b -> a``): no value can match it. None when there is none. Iterative and linear in
    the size of ``schema``; a reference that does not resolve ends its chain."""
    done: set[int] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#") and id(node) not in done:
                found = _chain(schema, node, done)
                if found is not None:
                    return found
    return None


def _chain(root: Any, node: dict[str, Any], done: set[int]) -> str | None:
    seen: set[int] = set()
    while isinstance(node, dict) and isinstance(ref := node.get("$ref"), str) and ref.startswith("#"):
        if id(node) in done:
            break
        if id(node) in seen:
            return ref
        seen.add(id(node))
        node = _resolve(root, ref)
    done.update(seen)
    return None


def _resolve(root: Any, ref: str) -> Any:
    """The value local pointer ``ref`` names in ``root``, or None."""
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
