"""Import a llama-family GGUF into an MLX-format model directory that ``mlx_lm.load`` loads.

The directory holds ``config.json`` (with a ``"quantization"`` entry), ``model.safetensors``
(tensors renamed to Hugging Face names, quantization kept exactly as ``mx.load`` reads it:
Q4_0/Q4_1/Q4_K -> 4-bit affine group 32, Q8_0 -> 8-bit affine group 32), ``tokenizer.json``,
``tokenizer_config.json`` (with the chat template), ``special_tokens_map.json``,
``generation_config.json`` and :data:`IMPORT_MARKER`. It is written into a temporary
directory beside ``out_dir`` and renamed into place, so a crash never leaves a half-imported
model under ``out_dir``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import mlx.core as mx

from exo_p2p.models.gguf_layout import config_from_gguf, hf_tensor_name, quantization_from_shapes
from exo_p2p.models.gguf_reader import MLX_QUANTIZED_BITS, read_gguf_header
from exo_p2p.models.gguf_tokenizer import (
    generation_config,
    special_tokens,
    tokenizer_config,
    tokenizer_json,
)

IMPORT_MARKER = ".exo-import.json"
"""Written last inside an imported directory: the source GGUF's path, size and mtime. A
directory without it is a torn import and must not be used."""

IMPORTER_VERSION = 1
"""Bumped when the import output changes, so stores re-import older directories."""


def source_stamp(gguf_path: Path) -> dict[str, Any]:
    """What :data:`IMPORT_MARKER` records about the source: path, size (bytes), mtime (ns)
    and :data:`IMPORTER_VERSION`. A store re-imports when the stamp no longer matches."""
    st = gguf_path.stat()
    return {"source": str(gguf_path.resolve()), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "importer_version": IMPORTER_VERSION}


def import_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Convert the GGUF at ``gguf_path`` into an MLX-format model directory at ``out_dir``.

    Returns ``out_dir``. An existing ``out_dir`` is replaced. Reads the whole GGUF into
    memory once (its size in bytes, about); writes about the same to disk.

    Raises:
        UnsupportedModelError: not a llama-family GGUF with a byte-level BPE tokenizer (the
            message names what is unsupported); nothing is written then.
        OSError: from reading or writing files; the temporary directory is removed.
    """
    header = read_gguf_header(gguf_path)
    config = config_from_gguf(header.metadata, header.tensors)
    files: dict[str, Any] = {
        "tokenizer.json": tokenizer_json(header.metadata),
        "tokenizer_config.json": tokenizer_config(header.metadata,
                                                  config["max_position_embeddings"]),
        "special_tokens_map.json": special_tokens(header.metadata),
        "generation_config.json": generation_config(header.metadata),
    }
    in_features = {
        hf_tensor_name(t.name).removesuffix(".weight"): t.shape[-1]
        for t in header.tensors if t.ggml_type in MLX_QUANTIZED_BITS
    }
    loaded = mx.load(str(gguf_path), format="gguf")  # format: mx.load trusts only ".gguf"
    weights = {hf_tensor_name(name): array for name, array in loaded.items()}
    del loaded
    quantization = quantization_from_shapes(
        {name: tuple(a.shape) for name, a in weights.items()}, in_features)
    if quantization is not None:
        config["quantization"] = quantization
    files["config.json"] = config

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        del weights
        for name, content in files.items():
            (tmp / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n",
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
