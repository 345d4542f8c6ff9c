"""The model store: the embedded model, GGUF import into the MLX format, model cards
(docs/architecture.md#wire-and-storage)."""

from exo_p2p.models.card import card_from_gguf, card_from_model_dir
from exo_p2p.models.embedded import EMBEDDED_MODEL_ID, find_embedded_gguf
from exo_p2p.models.errors import ModelNotFoundError, UnsupportedModelError
from exo_p2p.models.gguf_import import import_gguf
from exo_p2p.models.store import ModelStore

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
