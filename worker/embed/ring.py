"""A decoder split over the ranks of a ring as an embedding model
(docs/api.md#embeddings-and-reranking): an embedding is the pipeline's prefill, then a pool.

- **Pipeline** (``PipelineHidden``): the rows go through the ranks as a prefill does
  (``worker.engine.pipeline.PipelineStage``): rank 0 embeds the tokens and runs its layers,
  every rank receives the previous rank's hidden states ``[B, L, hidden]`` and sends its own
  on (in the stage's wire dtype), with no KV cache; the last rank applies the final norm
  (``LayerSpan.final_hidden``) and pools. Its pooled vectors ``[B, hidden]`` are then summed
  over the ring (every other rank adds zeros: exact), so rank 0, which answers for the
  instance, holds them too.
- **Tensor** (``RankedHidden`` over ``worker.embed.decoder.DecoderHidden``): every rank runs the
  whole sharded forward (the collectives are inside its layers) and holds the same states.

The ranks call these at the same points in the same order (the tasks were agreed by the
rounds and every rank plans the same batches); a failure raises ``StageFailed`` (the ranks can
no longer be assumed in step: the runner fails, as a failed generation step does).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from worker.embed.decoder import PAD_ID
from worker.engine.forward import generation_stream
from worker.engine.layer_span import LayerSpan
from worker.engine.pipeline import PipelineStage, StageFailed
from worker.engine.ring_wait import all_sum_length


def _failed(exc: Exception) -> StageFailed:
    return StageFailed(f"embedding forward on a split model: {type(exc).__name__}: {exc}")


class PipelineHidden:
    """``(token rows, lengths) -> [B, L, H]`` float32 of a pipeline rank (module docstring):
    the final hidden states on the last rank, zeros elsewhere (``share`` gives every rank the
    last rank's pooled vectors). ``span``: this rank's ``LayerSpan``; ``stage``: its
    ``PipelineStage`` (group, hidden size and dtypes, waits)."""

    causal = True

    def __init__(self, span: LayerSpan, stage: PipelineStage) -> None:
        self.span, self.stage = span, stage

    def __call__(self, rows: list[list[int]], lengths: list[int]) -> np.ndarray:
        width, stage = max(lengths), self.stage
        ids = np.full((len(rows), width), PAD_ID, dtype=np.int32)
        for i, (row, n) in enumerate(zip(rows, lengths)):
            ids[i, :n] = row[:n]
        try:
            with mx.stream(generation_stream):  # the stream the engine's forwards run on
                received = None
                if not stage.is_first:
                    stage.wait.from_left()  # asleep until rank - 1's hidden states come
                    like = mx.zeros((len(rows), width, stage.hidden_size), dtype=stage.hidden_dtype)
                    received = mx.distributed.recv_like(like, stage.rank - 1, group=stage.group)
                h = self.span.final_hidden(mx.array(ids), received)
                if stage.is_last:
                    h = h.astype(mx.float32)
                    mx.eval(h)
                    return np.array(h, copy=False)
                if stage.wire_dtype is not None:
                    h = h.astype(stage.wire_dtype)
                mx.eval(mx.distributed.send(h, stage.rank + 1, group=stage.group))
        except Exception as exc:
            raise _failed(exc) from exc
        return np.zeros((len(rows), width, stage.hidden_size), dtype=np.float32)

    def share(self, vecs: np.ndarray) -> np.ndarray:
        """The last rank's pooled ``vecs [B, H]`` on every rank: an all-sum where the other
        ranks add zeros (padded so every ring segment holds bytes, ``ring_wait.all_sum_length``)."""
        stage, flat = self.stage, np.ascontiguousarray(vecs, dtype=np.float32).reshape(-1)
        if not stage.is_last:
            flat = np.zeros_like(flat)
            stage.wait.from_either()  # asleep until the last rank's part of the sum comes
        padded = np.zeros(all_sum_length(flat.size, stage.world_size), dtype=np.float32)
        padded[: flat.size] = flat
        try:
            with mx.stream(generation_stream):
                summed = mx.distributed.all_sum(mx.array(padded), group=stage.group)
                mx.eval(summed)
        except Exception as exc:
            raise _failed(exc) from exc
        return np.array(summed[: flat.size]).reshape(vecs.shape)


class RankedHidden:
    """A tensor rank's ``hidden`` (``DecoderHidden`` of its sharded model): the same states on
    every rank, its failures ``StageFailed``."""

    causal = True

    def __init__(self, hidden: Any) -> None:
        self.hidden = hidden

    def __call__(self, rows: list[list[int]], lengths: list[int]) -> np.ndarray:
        try:
            return self.hidden(rows, lengths)
        except Exception as exc:
            raise _failed(exc) from exc

    def share(self, vecs: np.ndarray) -> np.ndarray:
        return vecs
