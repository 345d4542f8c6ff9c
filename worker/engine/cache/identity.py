"""What a disk-tier block must match to be loaded, and where a rank's tier lives.

The model's identity is a digest of what decides the KV a prompt produces: the model's
``config.json`` (as loaded), the weights' form (stored or float32), the tokenizer's
vocabulary size and the tensor split (a tensor rank holds its share of the heads). Its
directory name alone is not enough: two quantizations of one model share a name.

The tenant of a request (``tenant_of``) is the API key it presented when the node requires
keys (``GenerationParams.client`` ``key:<id>``, ``exo_p2p.api.generation.client_key``),
else "" (one tenant: without keys every caller may read every entry, as before). Entries and
blocks of one tenant are never reused for another (``worker.engine.prompt_cache``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def model_identity(loaded: Any, tensor_rank: int = 0, kv_bits: int = 0) -> str:
    """The identity (64 hex digits) of ``loaded`` (a ``LoadedModel``) on tensor rank
    ``tensor_rank`` (0 unless the instance is tensor-split) with its KV held at ``kv_bits``
    (0: full precision; a quantized cache's blocks are another identity, so a q8 block is never
    read into a full-precision cache, nor the reverse; the full-precision identity is the one
    blocks had before the KV could be quantized)."""
    parts = {
        "config": loaded.config,
        "weights": getattr(loaded, "weights_dtype", "stored"),
        "vocab": getattr(loaded.tokenizer, "vocab_size", None),
        "tensor": [int(getattr(loaded, "tensor_world_size", 1)), int(tensor_rank)],
    }
    if kv_bits:
        parts["kv_bits"] = int(kv_bits)
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=32).hexdigest()


def tenant_of(params: Any) -> str:
    """The tenant of a request's ``params`` (``GenerationParams`` or None; module docstring).
    A request with images adds the digest of its images' digests in order: an image's tokens
    are the same pad token whatever the image, so its KV is reused only by a request with the
    same images (docs/architecture.md#engine "Vision rows")."""
    client = getattr(params, "client", "") or ""
    tenant = client if client.startswith("key:") else ""
    digests = [ref.digest for m in getattr(params, "messages", ()) or () for ref in m.images]
    if digests:
        tenant += "|images:" + hashlib.blake2b(",".join(digests).encode(), digest_size=16).hexdigest()
    return tenant


def tier_directory(root: Path, identity: str, layers: tuple[int, int]) -> Path:
    """The directory of the tier of the rank holding ``layers`` of model ``identity`` under
    ``root`` (the node's ``<data dir>/prompt-cache``)."""
    return Path(root) / identity[:32] / f"layers-{int(layers[0])}-{int(layers[1])}"
