"""An encoder embedding model (BERT, XLM-RoBERTa, ModernBERT, Qwen3 embedding families) run by
``mlx_embeddings``, the maintained MLX library for them (docs/models.md#embedding-models says
why it is an optional extra: it pulls mlx-vlm and ~800 MB of dependencies).

Rows are right-padded with attention mask 0 on the padding, so a row's states equal its
states alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

ENCODER_EXTRA = "pip install 'exo-p2p[embeddings]' (or bash scripts/install.sh --test)"
"""What to install for encoder models (the message of ``EncoderUnavailable``)."""


class EncoderUnavailable(RuntimeError):
    """``mlx_embeddings`` is not installed (it is an optional extra)."""


def library() -> Any:
    """The ``mlx_embeddings.utils`` module. Raises ``EncoderUnavailable`` when not installed."""
    try:
        import mlx_embeddings.utils as utils
    except ImportError as exc:
        raise EncoderUnavailable(f"encoder models need mlx-embeddings: {ENCODER_EXTRA} ({exc})") from None
    return utils


def load_encoder(model_dir: Path | str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the encoder in ``model_dir`` as ``mlx_embeddings.load``
    gives them (local files only). Raises ``EncoderUnavailable``, and the library's
    ``ValueError`` / ``FileNotFoundError`` for a model it cannot read."""
    utils = library()
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    return utils.load(str(path))


class EncoderHidden:
    """``(token rows, lengths) -> hidden [B, L, H]`` float32 numpy: the encoder's last
    hidden state with padding masked."""

    causal = False

    def __init__(self, model: Any) -> None:
        self._model = model

    def __call__(self, rows: list[list[int]], lengths: list[int]) -> np.ndarray:
        width = max(lengths)
        ids = np.zeros((len(rows), width), dtype=np.int32)
        mask = np.zeros((len(rows), width), dtype=np.float32)
        for i, (row, n) in enumerate(zip(rows, lengths)):
            ids[i, :n] = row[:n]
            mask[i, :n] = 1.0
        out = self._model(mx.array(ids), attention_mask=mx.array(mask))
        hidden = out.last_hidden_state.astype(mx.float32)
        mx.eval(hidden)
        return np.array(hidden, copy=False)

    def share(self, vecs: np.ndarray) -> np.ndarray:
        return vecs  # one rank holds the whole model
