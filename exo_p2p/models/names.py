"""Which model names and manifest file paths may become paths on this node's disk (docs/models.md).

A model name names a directory (``pulled/<name>``, what ``exo-p2p rm`` deletes) and a
manifest's file path names a file under a copy's directory; both can come from a user or
from a peer, so both are checked before any path is built from them. The rule
(``check_relative_path``): ``/``-separated parts, each non-empty, not ``.`` or ``..``, not
starting with ``.`` (hidden names: the copy's own journal and manifest, never a model file;
``exo_p2p.models.manifest.model_files`` skips them too), no backslash, no control character.
A model name has at most two parts (a Hugging Face repo id ``org/name``) and at most
``MAX_NAME_CHARS`` characters. Pure functions.
"""

from __future__ import annotations

import unicodedata

MAX_NAME_CHARS = 256
"""Longest model name accepted (characters)."""
MAX_NAME_PARTS = 2
"""A model name is a directory name or a Hugging Face repo id ``org/name``."""


def check_relative_path(path: str, what: str) -> str:
    """``path`` unchanged when it is a safe relative path (rule: module docstring).

    Raises:
        ValueError: naming ``what`` (e.g. ``"model name"``) and the offending part.
    """
    if not path:
        raise ValueError(f"{what} is empty")
    if any(unicodedata.category(c) == "Cc" for c in path):
        raise ValueError(f"{what} {path!r} has a control character")
    if "\\" in path:
        raise ValueError(f"{what} {path!r} has a backslash")
    for part in path.split("/"):
        if not part:
            raise ValueError(f"{what} {path!r} has an empty part (leading, trailing or double /)")
        if part.startswith("."):
            raise ValueError(f"{what} {path!r} has a part starting with '.' ({part!r})")
    return path


def check_model_name(name: str) -> str:
    """``name`` unchanged when it may name a model directory on this node (rule: module
    docstring).

    Raises:
        ValueError: the reason, in one line.
    """
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"model name is longer than {MAX_NAME_CHARS} characters")
    check_relative_path(name, "model name")
    if name.count("/") >= MAX_NAME_PARTS:
        raise ValueError(f"model name {name!r} has more than {MAX_NAME_PARTS} '/'-separated parts")
    return name


OLLAMA_PREFIX = "ollama:"
OLLAMA_DEFAULT_TAG = "latest"


def canonical_model_name(name: str) -> str:
    """``name`` as the store lists it: an Ollama model named without its tag
    (``ollama:llama3.2``, ``ollama:someone/model``) gets Ollama's default tag,
    ``ollama:llama3.2:latest`` (``exo_p2p.models.stores.ollama``); any other name is unchanged."""
    if name.startswith(OLLAMA_PREFIX) and len(name) > len(OLLAMA_PREFIX):
        last = name[len(OLLAMA_PREFIX):].rsplit("/", 1)[-1]
        if last and ":" not in last:
            return f"{name}:{OLLAMA_DEFAULT_TAG}"
    return name
