"""A model pulled from a hub lands in the user's Hugging Face cache (docs/models.md#models-from-a-hub).

The layout is ``huggingface_hub``'s own (``file_download``), so ``hf``, ``scan_cache_dir``,
mlx-lm and every other tool reading the cache see the model, and this node lists and serves
it from there (``exo_p2p.models.stores.store.hf_cache_models``) without a second copy::

    <cache>/models--ORG--NAME/blobs/<id>                  the bytes of one file
    <cache>/models--ORG--NAME/snapshots/<commit>/<path>   a relative symlink to ../../blobs/<id>
    <cache>/models--ORG--NAME/refs/<revision>             the commit a branch or tag names

``<id>`` is the file's LFS SHA-256 for a weight file, else its git blob id (the hub's ETag
of a small file: SHA-1 of ``"blob <size>\\0" + bytes``). ``<cache>`` is ``HF_HUB_CACHE``,
else ``$HF_HOME/hub``, else ``huggingface_hub``'s default, read when called (a node started
with another ``HF_HOME`` than the process imported with). A node with a ``--models-dir``
puts its pulls there instead (``exo_p2p.models.depot.pulls``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

from exo_p2p.models.names import check_relative_path

DEFAULT_REVISION = "main"
"""The ref a pull without ``@REVISION`` records (the hub's default branch, as
``huggingface_hub`` names it)."""


def cache_dir() -> Path:
    """The Hugging Face hub cache of this process's environment (module docstring)."""
    from huggingface_hub import constants  # lazy: a ~0.2 s import, hub reads only

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(constants.HF_HUB_CACHE)


def git_blob_id(path: Path) -> str:
    """The git blob id of the file at ``path`` (what the hub gives a small file as ETag)."""
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def storage_dir(cache: Path, repo_id: str) -> Path:
    """``<cache>/models--ORG--NAME`` of model ``repo_id``."""
    from huggingface_hub.file_download import repo_folder_name  # lazy: a ~0.2 s import, hub reads only

    return cache / repo_folder_name(repo_id=repo_id, repo_type="model")


def _move(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst`` atomically; across file systems copy to a temporary name first."""
    try:
        os.replace(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        tmp = dst.with_name(f"{dst.name}.incomplete")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        src.unlink()


def land(root: Path, files: dict[str, str], repo_id: str, commit: str, revision: str | None,
         cache: Path) -> Path:
    """Move the complete files of a copy at ``root`` into ``cache`` as ``huggingface_hub``
    lays out ``repo_id`` at ``commit`` (module docstring); the snapshot dir.

    ``files``: path in the repo -> blob id (the LFS SHA-256 of a weight file; "" to compute
    the git blob id here). A blob already in the cache with the same size is kept (another
    tool downloaded it) and the copy's file dropped. ``revision`` (a branch or tag; None: the
    default branch) gets a ref to ``commit``; a commit names none. Leaves ``root`` holding
    only what is not a model file. Blocking. Raises ``OSError`` (the cache is not writable),
    ``ValueError`` (a revision that is no safe relative path)."""
    ref = check_relative_path(revision or DEFAULT_REVISION, "revision")  # it names a file under refs/
    storage = storage_dir(cache, repo_id)
    snapshot = storage / "snapshots" / commit
    for path, blob_id in sorted(files.items()):
        src = root / path
        blob = storage / "blobs" / (blob_id or git_blob_id(src))
        blob.parent.mkdir(parents=True, exist_ok=True)
        if blob.is_file() and blob.stat().st_size == src.stat().st_size:
            src.unlink()
        else:
            _move(src, blob)
        pointer = snapshot / path
        pointer.parent.mkdir(parents=True, exist_ok=True)
        if pointer.is_symlink() or pointer.exists():
            pointer.unlink()
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    if ref != commit:
        refs = storage / "refs" / ref
        refs.parent.mkdir(parents=True, exist_ok=True)
        tmp = refs.with_name(f"{refs.name}.tmp-{os.getpid()}")
        tmp.write_text(commit)
        os.replace(tmp, refs)
    return snapshot
