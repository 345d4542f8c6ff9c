"""The model store: the embedded model, GGUF import into the MLX format, model cards
(docs/architecture.md#wire-and-storage).

The names below are imported on first use: importing a light submodule such as
``exo_p2p.models.names`` (the CLI's model-name check) must not load numpy and MLX.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "card_from_gguf": "card.derive", "card_from_model_dir": "card.derive", "EMBEDDED_MODEL_ID": "stores.embedded",
    "find_embedded_gguf": "stores.embedded", "ModelNotFoundError": "errors", "UnsupportedModelError": "errors",
    "import_gguf": "gguf.importer", "ModelStore": "stores.store",
}


def __getattr__(name: str) -> Any:
    """The package-level names, from their submodules (``_HOMES``) on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value

__all__ = [
    "EMBEDDED_MODEL_ID",
    "ModelNotFoundError",
    "ModelStore",
    "UnsupportedModelError",
    "card_from_gguf",
    "card_from_model_dir",
    "find_embedded_gguf",
    "import_gguf",
]
