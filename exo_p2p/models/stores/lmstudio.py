"""The models of LM Studio's models dir, read-only (docs/models.md#model-stores).

LM Studio keeps a Hugging Face repo's layout: ``<root>/<publisher>/<model>/`` holds an
MLX-format model (``config.json``, ``model*.safetensors``, a tokenizer) or GGUF files. The
root is ``~/.lmstudio/models`` (LM Studio 0.3 and later), else ``~/.cache/lm-studio/models``
(older versions), when it exists (``default_root``).

Names: ``lmstudio:<publisher>/<model>``, as LM Studio lists the dir, for an MLX model and for
a dir with one GGUF file. A dir with several GGUF files (or MLX files and GGUF files) gives
one model per GGUF file, ``lmstudio:<publisher>/<model>@<variant>``: the variant is the file's
quantization suffix in lower case (``…-Q4_K_M.gguf`` -> ``q4_k_m``, as LM Studio writes
variants), or the file's stem in lower case when it has none or shares it with another file
(``gguf_variants``).

Left aside: hidden entries and ``mmproj*.gguf`` files (a vision projector, not a model).
Unsupported, with the reason: a split GGUF (``…-00001-of-00003.gguf``, one model in several
files), a dir with ``config.json`` that lacks weights or a tokenizer (an MLX download not
finished), a publisher or model dir whose name cannot be a model name. A dir holding nothing
of a model is not listed. ``scan_lmstudio`` never raises and never writes; it reads at most
:data:`MAX_MODEL_DIRS` model dirs.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from exo_p2p.models.stores.sources import ModelSource, Unsupported, mlx_dir_problem

PREFIX = "lmstudio:"
MAX_MODEL_DIRS = 4096
"""Model dirs (``<publisher>/<model>``) one scan reads at most."""

_PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
"""A publisher or model dir name usable in a model name (a Hugging Face repo id's characters)."""
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})$")
_QUANT_RE = re.compile(r"[-_.]((?:i?q\d[a-z0-9_]*)|bf16|f16|f32)$", re.IGNORECASE)


def default_root(home: Path | None = None) -> Path:
    """LM Studio's models dir: ``~/.lmstudio/models``, else ``~/.cache/lm-studio/models`` when
    only that one exists."""
    home = home or Path.home()
    new, old = home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"
    return old if old.is_dir() and not new.is_dir() else new


def gguf_variants(stems: list[str]) -> dict[str, str]:
    """File stem -> its variant in a model's name (rule: module docstring). Pure."""
    quant = {s: (m.group(1).lower() if (m := _QUANT_RE.search(s)) else None) for s in stems}
    counts = Counter(q for q in quant.values() if q)
    return {s: q if q and counts[q] == 1 else s.lower() for s, q in quant.items()}


def model_dirs(root: Path) -> Iterator[Path]:
    """The dirs ``<root>/<publisher>/<model>``, sorted, hidden ones left out; none when
    ``root`` is absent or unreadable."""
    for publisher in _subdirs(root):
        yield from _subdirs(publisher)


def _subdirs(path: Path) -> Iterator[Path]:
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(".") and entry.is_dir():
            yield Path(entry.path)


def scan_model_dir(model_dir: Path) -> tuple[list[ModelSource], list[Unsupported]]:
    """The models of one ``<publisher>/<model>`` dir (rules: module docstring)."""
    base = f"{PREFIX}{model_dir.parent.name}/{model_dir.name}"
    if not (_PART_RE.fullmatch(model_dir.parent.name) and _PART_RE.fullmatch(model_dir.name)):
        reason = "the dir's name cannot be a model name (letters, digits, '_', '.', '+', '-'; at most 128)"
        return [], [Unsupported(base[:300], "lmstudio", model_dir, reason)]
    try:
        files = sorted(p for p in model_dir.iterdir() if not p.name.startswith(".") and p.is_file())
    except OSError as e:
        return [], [Unsupported(base, "lmstudio", model_dir, f"cannot read the dir: {e.strerror or e}")]
    ggufs = [p for p in files if p.suffix.lower() == ".gguf" and not p.name.lower().startswith("mmproj")]
    whole = [p for p in ggufs if not _SPLIT_RE.search(p.stem)]
    found: list[ModelSource] = []
    bad: list[Unsupported] = []
    mlx = (model_dir / "config.json").is_file()
    if mlx:
        problem = mlx_dir_problem(model_dir)
        if problem is None:
            found.append(ModelSource(base, "mlx_dir", model_dir, "lmstudio"))
        elif not ggufs:
            bad.append(Unsupported(base, "lmstudio", model_dir, f"an incomplete MLX model: {problem}"))
    if len(whole) == 1 and not found:
        found.append(ModelSource(base, "gguf", whole[0], "lmstudio"))
    else:
        variants = gguf_variants([p.stem for p in whole])
        found.extend(ModelSource(f"{base}@{variants[p.stem]}", "gguf", p, "lmstudio") for p in whole)
    for p in ggufs:
        m = _SPLIT_RE.search(p.stem)
        if m and int(m.group(1)) == 1:
            name = base if not whole and not found else f"{base}@{p.stem[:m.start()].lower()}"
            bad.append(Unsupported(name, "lmstudio", p, f"a split GGUF ({m.group(2).lstrip('0')} files) is not "
                                   "supported; merge it into one file (llama.cpp's llama-gguf-split --merge)"))
    return found, bad


def scan_lmstudio(root: Path) -> tuple[list[ModelSource], list[Unsupported]]:
    """Every model of LM Studio's models dir ``root``: servable ones as sources, the rest with
    the reason (rules: module docstring). Never raises."""
    found: list[ModelSource] = []
    bad: list[Unsupported] = []
    for model_dir in islice(model_dirs(root), MAX_MODEL_DIRS):
        more, worse = scan_model_dir(model_dir)
        found += more
        bad += worse
    return found, bad
