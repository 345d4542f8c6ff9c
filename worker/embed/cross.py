"""A BERT cross-encoder (``BertForSequenceClassification``): the relevance of a (query,
document) pair read together (docs/api.md#embeddings-and-reranking, ``meta.scoring``
``cross-encoder``).

The encoder is ``mlx_embeddings``' BERT (``worker.embed.encoder``), loaded here from the
checkpoint's own names (``bert.…``; the library's loader refuses the head's extra tensors);
the head is ours, as transformers' ``BertForSequenceClassification`` computes it: the
``[CLS]`` token's final hidden state → the pooler (``bert.pooler.dense``, tanh) → the
classifier (``classifier``, ``[num_labels, hidden]``). The score: with one label its logit
through sentence-transformers' activation (``config.json``'s
``sentence_transformers.activation_fn``; a sigmoid when none is named, as its ``CrossEncoder``
defaults), with several the softmax probability of the last label (the "relevant" class).

A pair is BERT's ``[CLS] query [SEP] document [SEP]`` with token types 0 up to the first
``[SEP]`` and 1 after it, made from the query's and the document's token rows as the API
node tokenized them (``pair_row``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from exo_p2p.models.model_json import model_json_file
from worker.embed.encoder import library

CROSS_TYPES = frozenset({"bert"})
"""``model_type`` values whose cross-encoders this module runs (their pairs are BERT's)."""


class CrossEncoderError(ValueError):
    """A cross-encoder this module cannot run (another family, quantized, or a head that
    does not match its config)."""


def pair_row(query: tuple[int, ...] | list[int], document: tuple[int, ...] | list[int]) -> list[int]:
    """``[CLS] q [SEP] d [SEP]`` from rows ``[CLS] q [SEP]`` and ``[CLS] d [SEP]`` (the
    document's leading ``[CLS]`` dropped when it starts as the query does)."""
    doc = list(document)
    return [*query, *(doc[1:] if doc and query and doc[0] == query[0] else doc)]


def activation(config: dict[str, Any], labels: int) -> str:
    """``"sigmoid"``, ``"identity"`` or ``"softmax"`` (several labels): how logits become
    scores (module docstring). Raises ``CrossEncoderError`` for another named activation."""
    if labels > 1:
        return "softmax"
    named = str((config.get("sentence_transformers") or {}).get("activation_fn") or "Sigmoid")
    for name in ("sigmoid", "identity"):
        if named.lower().endswith(name):
            return name
    raise CrossEncoderError(f"a cross-encoder's activation {named[:80]!r} is not Sigmoid or Identity")


class RelevanceHead:
    """``[B, hidden]`` CLS states → ``[B]`` float32 scores (module docstring); weights as
    float32 numpy: ``pooler_w [H, H]``, ``pooler_b [H]``, ``classifier_w [labels, H]``,
    ``classifier_b [labels]``."""

    def __init__(self, pooler_w: np.ndarray, pooler_b: np.ndarray, classifier_w: np.ndarray,
                 classifier_b: np.ndarray, kind: str) -> None:
        self.pooler_w, self.pooler_b = pooler_w, pooler_b
        self.classifier_w, self.classifier_b, self.kind = classifier_w, classifier_b, kind

    def __call__(self, cls: np.ndarray) -> np.ndarray:
        pooled = np.tanh(cls @ self.pooler_w.T + self.pooler_b)
        logits = (pooled @ self.classifier_w.T + self.classifier_b).astype(np.float64)
        if self.kind == "softmax":
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            return (e[:, -1] / e.sum(axis=1)).astype(np.float32)
        logit = logits[:, 0]
        return (logit if self.kind == "identity" else 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)


def _f32(weights: dict[str, mx.array], name: str, take: bool = False) -> np.ndarray:
    """Tensor ``name`` as float32 numpy (removed from ``weights`` when ``take``)."""
    if name not in weights:
        raise CrossEncoderError(f"the cross-encoder has no {name} tensor")
    return np.array((weights.pop(name) if take else weights[name]).astype(mx.float32))


def load_cross_encoder(model_dir: Path | str, arch: str) -> tuple[Any, RelevanceHead, dict[str, Any]]:
    """``(encoder, head, config)`` of the ``arch`` cross-encoder in ``model_dir``. Raises
    ``EncoderUnavailable`` without mlx-embeddings, ``CrossEncoderError`` for a family other
    than ``CROSS_TYPES``, quantized weights or a head that does not match, and the library's
    ``ValueError`` for encoder weights that do not match its config."""
    library()
    from mlx_embeddings.models import bert

    path = Path(model_dir)
    config = model_json_file(path / "config.json", f"{path.name}: config.json")
    if not isinstance(config, dict):
        raise CrossEncoderError(f"{arch}: config.json is not an object")
    model_type = str(config.get("model_type", ""))
    if model_type not in CROSS_TYPES or "quantization" in config:
        raise CrossEncoderError(f"{arch} ({model_type}{', quantized' if 'quantization' in config else ''}): only "
                                "unquantized BERT cross-encoders (BertForSequenceClassification) run here")
    weights: dict[str, mx.array] = {}
    for file in sorted(path.glob("model*.safetensors")):
        weights.update({k.removeprefix("bert."): v for k, v in mx.load(str(file)).items() if "position_ids" not in k})
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))
    classifier_w, classifier_b = _f32(weights, "classifier.weight", True), _f32(weights, "classifier.bias", True)
    if classifier_w.shape != (labels, int(config["hidden_size"])) or classifier_b.shape != (labels,):
        raise CrossEncoderError(f"classifier {classifier_w.shape} does not match {labels} labels of "
                                f"hidden size {config['hidden_size']}")
    model = bert.Model(bert.ModelArgs.from_dict(config))
    pooler_w, pooler_b = _f32(weights, "pooler.dense.weight"), _f32(weights, "pooler.dense.bias")
    model.load_weights(list(weights.items()))  # strict: the encoder's and pooler's tensors, no others
    model.eval()  # no dropout (an MLX module is built in training mode)
    mx.eval(model.parameters())
    head = RelevanceHead(pooler_w, pooler_b, classifier_w, classifier_b, activation(config, labels))
    return model, head, config


class PairHidden:
    """``(pair rows, lengths) -> [B, L, H]`` float32: the encoder's last hidden state of each
    pair with BERT's token types (0 up to the first ``sep_id``, 1 after) and the padding
    masked."""

    causal = False

    def __init__(self, model: Any, sep_id: int) -> None:
        self._model, self.sep_id = model, sep_id

    def __call__(self, rows: list[list[int]], lengths: list[int]) -> np.ndarray:
        width = max(lengths)
        ids = np.zeros((len(rows), width), dtype=np.int32)
        mask = np.zeros((len(rows), width), dtype=np.float32)
        types = np.zeros((len(rows), width), dtype=np.int32)
        for i, (row, n) in enumerate(zip(rows, lengths)):
            ids[i, :n], mask[i, :n] = row[:n], 1.0
            seps = [j for j, t in enumerate(row[:n]) if t == self.sep_id]
            if seps:
                types[i, seps[0] + 1 : n] = 1
        out = self._model(mx.array(ids), token_type_ids=mx.array(types), attention_mask=mx.array(mask))
        hidden = out.last_hidden_state.astype(mx.float32)
        mx.eval(hidden)
        return np.array(hidden, copy=False)

    def share(self, vecs: np.ndarray) -> np.ndarray:
        return vecs  # one rank holds the whole model
