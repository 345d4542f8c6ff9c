"""The models of an Ollama install, read-only (docs/models.md#model-stores).

Ollama's layout under its models dir (``$OLLAMA_MODELS``, else ``~/.ollama/models``):

- ``manifests/<host>/<namespace>/<model>/<tag>``: a JSON manifest, OCI-like: ``{"schemaVersion":
  2, "config": {...}, "layers": [{"mediaType", "digest": "sha256:<hex>", "size"}, ...]}``;
- ``blobs/sha256-<hex>``: each layer's bytes, named by its digest.

A model's weights are its one layer of media type :data:`MODEL_MEDIA`: a GGUF file, imported
like any GGUF (``exo_p2p.models.gguf.importer``) into this node's own data dir on first use. The
other layers are Ollama's runtime settings (a Go template, parameters, a system prompt, a
license): the GGUF's own chat template serves instead. A projector layer (vision) is left
aside: the model is served as text only. A LoRA adapter layer makes the model unsupported (the
base weights alone would answer otherwise).

Names: ``ollama:`` and the name Ollama shows, with its tag always written
(``ollama_name``): ``ollama:llama3.2:3b``, ``ollama:someone/model:latest``,
``ollama:hf.co/org/repo:Q4_K_M``; the host and namespace are left out when they are Ollama's
defaults (``registry.ollama.ai``, ``library``). ``ollama:NAME`` means ``ollama:NAME:latest``
(``exo_p2p.models.names.canonical_model_name``).

``scan_ollama`` reads the manifests only (never a blob's bytes, never a write): each gives a
``ModelSource`` when its GGUF blob is there with the manifest's size, else an ``Unsupported``
naming what is wrong; it never raises. Bounded: at most :data:`MAX_MANIFESTS` manifests of at
most :data:`MAX_MANIFEST_BYTES` each.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from exo_p2p.models.stores.sources import ModelSource, Unsupported

PREFIX = "ollama:"
MODEL_MEDIA = "application/vnd.ollama.image.model"
ADAPTER_MEDIA = "application/vnd.ollama.image.adapter"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
MAX_MANIFESTS = 4096
"""Manifests one scan reads at most (an install holds one per model tag)."""
MAX_MANIFEST_BYTES = 1 << 20
"""Largest manifest read (bytes; Ollama's are under 2 KiB)."""

_PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
"""A name part as Ollama allows it (``types/model/name.go``: letters, digits, ``_ . -``, at most
128 characters), not starting with ``.`` or ``-`` (a hidden file, an option)."""
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Layer:
    """One layer of an Ollama manifest: its media type, ``sha256:<hex>`` digest and size (bytes)."""

    media_type: str
    digest: str
    size: int


def default_root(environ: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """Ollama's models dir as Ollama finds it: ``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    env = os.environ if environ is None else environ
    if env.get("OLLAMA_MODELS"):
        return Path(env["OLLAMA_MODELS"]).expanduser()
    return (home or Path.home()) / ".ollama" / "models"


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The model name of manifest ``manifests/<host>/<namespace>/<model>/<tag>`` (rule:
    module docstring). Raises ``ValueError`` for a part Ollama would not write (a namespace
    holds no ``.``; ``..`` nowhere)."""
    for what, part in (("host", host), ("namespace", namespace), ("model", model), ("tag", tag)):
        if not _PART_RE.fullmatch(part) or ".." in part or (what == "namespace" and "." in part):
            raise ValueError(f"manifest path part {part[:140]!r} is not an Ollama {what}")
    if host.lower() != DEFAULT_HOST:
        shown = f"{host}/{namespace}/{model}"
    elif namespace.lower() != DEFAULT_NAMESPACE:
        shown = f"{namespace}/{model}"
    else:
        shown = model
    return f"{PREFIX}{shown}:{tag}"


def read_layers(data: bytes) -> tuple[Layer, ...]:
    """The layers of a manifest's bytes. Raises ``ValueError`` naming what is wrong: not JSON,
    no ``layers`` list, a layer without a media type, a ``sha256:`` digest or a size."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"manifest is not JSON ({str(e)[:200]})") from None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list):
        raise ValueError("manifest has no list of layers")
    out = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict) or not isinstance(layer.get("mediaType"), str):
            raise ValueError(f"manifest layer {i} has no media type")
        media, digest, size = layer["mediaType"][:200], layer.get("digest"), layer.get("size")
        if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
            raise ValueError(f"manifest layer {i} ({media}) has no sha256 digest")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"manifest layer {i} ({media}) has no size")
        out.append(Layer(media, digest, size))
    return tuple(out)


def model_layer(layers: tuple[Layer, ...]) -> Layer:
    """The GGUF layer of a manifest. Raises ``ValueError`` when there is none or several, or
    when the manifest has an adapter layer (rule: module docstring)."""
    models = [layer for layer in layers if layer.media_type == MODEL_MEDIA]
    if not models:
        kinds = ", ".join(sorted({layer.media_type for layer in layers})) or "none"
        raise ValueError(f"manifest has no GGUF model layer ({MODEL_MEDIA}); its layers: {kinds}")
    if len(models) > 1:
        raise ValueError(f"manifest has {len(models)} model layers; one GGUF is supported")
    if any(layer.media_type == ADAPTER_MEDIA for layer in layers):
        raise ValueError(f"model has a LoRA adapter layer ({ADAPTER_MEDIA}); adapters are not supported")
    return models[0]


def blob_path(root: Path, digest: str) -> Path:
    """Where Ollama keeps the blob of ``digest``: ``blobs/sha256-<hex>``, or ``blobs/sha256:<hex>``
    where only that exists (the name Ollama gave blobs before it could run on Windows)."""
    blob = root / "blobs" / digest.replace(":", "-", 1)
    old = root / "blobs" / digest
    return old if not blob.exists() and old.exists() else blob


def model_blob(root: Path, manifest: Path) -> Path:
    """The GGUF blob of the manifest file ``manifest``, checked to exist with the manifest's
    size (a partial or interrupted download has another). Raises ``ValueError`` naming what
    is wrong (``read_layers``, ``model_layer``, a blob missing or of another size) and
    ``OSError`` for a manifest that cannot be read."""
    with open(manifest, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ValueError(f"manifest is more than {MAX_MANIFEST_BYTES} bytes")
    layer = model_layer(read_layers(data))
    blob = blob_path(root, layer.digest)
    try:
        found = blob.stat().st_size
    except OSError:
        raise ValueError(f"the model layer's blob {blob.name} is missing from {blob.parent}") from None
    if found != layer.size:
        raise ValueError(f"blob {blob.name} holds {found} bytes, the manifest says {layer.size} "
                         "(an interrupted or corrupt download; `ollama pull` it again)")
    return blob


def manifest_files(root: Path, limit: int = MAX_MANIFESTS) -> Iterator[Path]:
    """The files at ``manifests/*/*/*/*`` under ``root``, sorted, hidden ones left out, at
    most ``limit``; none when there is no such dir."""
    top = root / "manifests"

    def walk(path: Path, depth: int) -> Iterator[Path]:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:  # absent or unreadable: nothing to list
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if depth == 3:
                if entry.is_file():
                    yield Path(entry.path)
            elif entry.is_dir():
                yield from walk(Path(entry.path), depth + 1)

    return islice(walk(top, 0), limit)


def scan_ollama(root: Path) -> tuple[list[ModelSource], list[Unsupported]]:
    """Every model of the Ollama models dir ``root``: servable ones as GGUF sources, the rest
    with the reason (rules: module docstring). Never raises; reads manifests only."""
    found: list[ModelSource] = []
    bad: list[Unsupported] = []
    for manifest in manifest_files(root):
        parts = manifest.relative_to(root / "manifests").parts
        try:
            name = ollama_name(*parts)
        except ValueError as e:
            bad.append(Unsupported(PREFIX + "/".join(parts)[:300], "ollama", manifest, str(e)))
            continue
        try:
            found.append(ModelSource(name, "gguf", model_blob(root, manifest), "ollama"))
        except ValueError as e:
            bad.append(Unsupported(name, "ollama", manifest, str(e)))
        except OSError as e:
            bad.append(Unsupported(name, "ollama", manifest, f"cannot read the manifest: {e.strerror or e}"))
    return found, bad
