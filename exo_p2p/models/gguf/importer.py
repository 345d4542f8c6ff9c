"""Import a GGUF into an MLX-format model directory that ``mlx_lm.load`` loads.

The directory holds ``config.json`` (with a ``"quantization"`` entry when tensors stay
quantized), ``model.safetensors`` (tensors renamed to Hugging Face names, each stored as
:mod:`exo_p2p.models.gguf.tensors` says: exact MLX affine quantization where the GGML type
allows it, float16 where it does not), ``tokenizer.json``, ``tokenizer_config.json`` (with the
chat template), ``special_tokens_map.json``, ``generation_config.json`` and
:data:`IMPORT_MARKER`. Architectures: :mod:`exo_p2p.models.gguf.arch`; tokenizers:
:mod:`exo_p2p.models.gguf.tokenizer`. It is written into a temporary directory beside
``out_dir`` and renamed into place, so a crash never leaves a half-imported model under
``out_dir``.

:func:`import_gguf` (its signature) is the entry point other stores call (Ollama blobs,
LM Studio files).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from exo_p2p.models.gguf.layout import model_plan
from exo_p2p.models.gguf.reader import read_float_tensor, read_gguf_header
from exo_p2p.models.gguf.tensors import write_safetensors
from exo_p2p.models.gguf.tokenizer import (
    generation_config,
    special_tokens,
    tokenizer_config,
    tokenizer_json,
)

IMPORT_MARKER = ".exo-import.json"
"""Written last inside an imported directory: the source GGUF's path, size and mtime. A
directory without it is a torn import and must not be used."""

IMPORTER_VERSION = 2
"""Bumped when the import output changes, so stores re-import older directories."""


def source_stamp(gguf_path: Path) -> dict[str, Any]:
    """What :data:`IMPORT_MARKER` records about the source: path, size (bytes), mtime (ns)
    and :data:`IMPORTER_VERSION`. A store re-imports when the stamp no longer matches."""
    st = gguf_path.stat()
    return {"source": str(gguf_path.resolve()), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "importer_version": IMPORTER_VERSION}


def import_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Convert the GGUF at ``gguf_path`` into an MLX-format model directory at ``out_dir``.

    Returns ``out_dir``. An existing ``out_dir`` is replaced. Reads the GGUF tensor by
    tensor (memory: one chunk of a tensor's temporaries and its scales, not the model);
    writes the imported size to disk (docs/models.md#gguf says what each type costs).

    Raises:
        UnsupportedModelError: an architecture, tensor type, tensor or tokenizer kind the
            importer does not read (the message names it); nothing is written then.
        OSError: from reading or writing files; the temporary directory is removed.
    """
    header = read_gguf_header(gguf_path)
    config, plans = model_plan(header, functools.partial(read_float_tensor, gguf_path, header))
    files: dict[str, Any] = {
        "tokenizer.json": tokenizer_json(header.metadata),
        "tokenizer_config.json": tokenizer_config(header.metadata,
                                                  config["max_position_embeddings"]),
        "special_tokens_map.json": special_tokens(header.metadata),
        "generation_config.json": generation_config(header.metadata),
        "config.json": config,
    }

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write_safetensors(tmp / "model.safetensors", gguf_path, header.data_offset, plans)
        for name, content in files.items():
            indent = None if name == "tokenizer.json" else 2  # 1 s for a 50k vocabulary indented
            (tmp / name).write_text(json.dumps(content, indent=indent, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
        (tmp / IMPORT_MARKER).write_text(json.dumps(source_stamp(gguf_path)) + "\n")
        _fsync_tree(tmp)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_dir(new: Path, target: Path) -> None:
    """Rename ``new`` to ``target``; an existing ``target`` is moved aside first and removed."""
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        target.rename(old)
    new.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
