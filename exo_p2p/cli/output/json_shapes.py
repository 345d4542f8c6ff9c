"""The ``--json`` shapes of the listing commands (``nodes``, ``instances``, ``models``).

Pure: each keeps every field the API sent and guarantees the fields scripts rely on
(docs/cli.md) are present (None when the node did not send one). Memory stays in bytes.
"""

from __future__ import annotations

import json
from typing import Any

NODE_FIELDS = ("node_id", "is_self", "is_master", "memory_total", "memory_available", "addrs")
INSTANCE_FIELDS = ("instance_id", "model", "status", "shards")
SHARD_FIELDS = ("node_id", "rank", "start_layer", "end_layer")
MODEL_FIELDS = ("model", "n_layers", "storage_size", "family", "quantization", "shardings", "tasks", "capabilities")


def _with_fields(item: dict, fields: tuple[str, ...]) -> dict:
    return {**{f: item.get(f) for f in fields}, **item}


def nodes_json(nodes: list[dict]) -> list[dict]:
    """``GET /nodes`` items with at least ``NODE_FIELDS``."""
    return [_with_fields(n, NODE_FIELDS) for n in nodes]


def instances_json(instances: list[dict]) -> list[dict]:
    """``GET /instances`` items with at least ``INSTANCE_FIELDS``, shards with ``SHARD_FIELDS``."""
    out = []
    for inst in instances:
        item = _with_fields(inst, INSTANCE_FIELDS)
        item["shards"] = [_with_fields(s, SHARD_FIELDS) for s in inst.get("shards") or []]
        out.append(item)
    return out


def models_json(models: list[dict]) -> list[dict]:
    """``GET /models`` items with at least ``MODEL_FIELDS``."""
    return [_with_fields(m, MODEL_FIELDS) for m in models]


def unsupported_json(problems: list[dict]) -> list[dict]:
    """``GET /models/unsupported`` items as ``models --json`` lists them after the servable
    models: ``MODEL_FIELDS`` (null), ``source``, ``path`` and ``unsupported`` (the reason)."""
    return [{**{f: None for f in MODEL_FIELDS}, "model": p.get("model"), "source": p.get("source"),
             "path": p.get("path"), "unsupported": p.get("reason")} for p in problems]


def dumps(value: Any) -> str:
    """The JSON text printed by ``--json`` (indented, keys in API order)."""
    return json.dumps(value, indent=2)
