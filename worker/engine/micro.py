"""Micro-batches: a pipeline instance's decode batch split so its ranks compute at once.

On a pipeline of W ranks one decode step of a batch is W forward passes in a row: rank 0's
layers, then rank 1's, …; each rank idles while the others compute. With the batch's rows split
into M micro-batches (each a ``DecodeBatch`` with its own KV), one step queues on every rank
first this rank's part of every micro-batch's forward pass (``Stage.forward_last``), then every
micro-batch's draw (``Stage.sample``: the all-sum that hands every rank the tokens), so rank 1
computes micro-batch A while rank 0 computes B. Every rank queues its collectives in the same
order — the hidden states of A, of B, …, then the tokens of A, of B, … — so each ring link
carries its messages in one order on both ends. Per step, in units of one rank's pass over the
whole batch: W without micro-batches, (M + W − 1) ÷ M with them (M = W = 2: 1.5 instead of 2)
when the ranks have cores of their own; on one machine whose cores they share the ranks only
take turns, and each micro-batch pays MLX's per-op overhead again (docs/benchmarks.md,
"Pipeline at 16 requests, micro-batches"). The rows of a step end at the same step whatever the split, so greedy and seeded
output of every request is its output alone (tests/test_micro.py).

``MicroBatches`` has ``DecodeBatch``'s face (``rows``, ``join``, ``join_group``, ``decode``,
``extract``, ``drop``): ``rows`` is the micro-batches' rows in order, micro-batch 0 first, and
``extract``/``drop`` take indices into it. Each joining row goes to the micro-batch with the
fewest rows (the first of those), so the split stays even as requests come and go; a prefill
group spread over several has its KV copied into a share per micro-batch.

The count (``micro_batches``): ``EngineSettings.micro_batches`` when given (≥ 1), else
``auto_micro_batches``; on a multi-rank instance the ranks agree the smallest
(``builder.build_engine``), so all split alike.
"""

from __future__ import annotations

from typing import Any

from exo_p2p.types.engine import EngineSettings
from worker.engine.batch import DecodeBatch
from worker.engine.batch_memory import RowKV
from worker.engine.pipeline import Stage
from worker.engine.sequence import Sequence
from worker.engine.spec.verify import SpecDecoder

MAX_MICRO_BATCHES = 8
"""Micro-batches at most, whatever the setting: each pays the per-op cost of a forward pass."""


def auto_micro_batches(sharding: str | None, world_size: int, hosts: int) -> int:
    """The micro-batches of an instance when none is set: ``world_size`` for a pipeline whose
    ranks are on ``hosts`` = ``world_size`` distinct hosts (each rank's cores its own, so the
    ranks can compute at once), else 1 (one rank, tensor sharding, or ranks sharing a host's
    cores, which only take turns on them: docs/benchmarks.md, "Pipeline at 16 requests")."""
    if sharding != "pipeline" or world_size < 2 or hosts < world_size:
        return 1
    return min(world_size, MAX_MICRO_BATCHES)


def resolve_micro_batches(settings: EngineSettings, auto: int) -> int:
    """The micro-batches this rank proposes: the setting when given (> 0), else ``auto``;
    within ``[1, min(max_batch, MAX_MICRO_BATCHES)]``."""
    wanted = settings.micro_batches if settings.micro_batches > 0 else auto
    return max(1, min(wanted, settings.max_batch, MAX_MICRO_BATCHES))


def decode_batch(settings: EngineSettings) -> DecodeBatch | MicroBatches:
    """The engine's batch: a ``DecodeBatch`` of ``max_batch`` rows, or ``MicroBatches`` when
    ``settings.micro_batches`` > 1 (at most ``max_batch`` and ``MAX_MICRO_BATCHES``; 0, "not
    resolved", is one batch). One batch drafts when ``settings.speculative`` is ``ngram``
    (``engine/spec/verify.py``)."""
    count = min(settings.micro_batches, settings.max_batch, MAX_MICRO_BATCHES)
    if count > 1:
        return MicroBatches(settings.max_batch, count)
    batch = DecodeBatch(settings.max_batch)
    if settings.speculative == "ngram":
        batch.spec = SpecDecoder(settings.num_draft)
    return batch


class MicroBatches:
    """``count`` micro-batches holding ``max_rows`` rows at most together (see the module
    docstring). Raises ``ValueError`` for ``count`` < 2 or ``max_rows`` < ``count``, and from
    ``join``/``join_group`` beyond ``max_rows``."""

    def __init__(self, max_rows: int, count: int) -> None:
        if count < 2 or max_rows < count:
            raise ValueError(f"{count} micro-batches of {max_rows} rows: need 2 <= count <= max_rows")
        self.max_rows = max_rows
        self.parts = [DecodeBatch(max_rows) for _ in range(count)]

    @property
    def rows(self) -> list[Sequence]:
        return [row for part in self.parts for row in part.rows]

    @property
    def full(self) -> bool:
        return len(self.rows) >= self.max_rows

    @property
    def holds_kv(self) -> bool:
        return any(part.holds_kv for part in self.parts)

    def kv_rows(self) -> list[RowKV]:
        return [kv for part in self.parts for kv in part.kv_rows()]

    def _assign(self, n: int) -> list[int]:
        """The micro-batch each of ``n`` joining rows goes to, in turn the one with the fewest
        rows (the first of those); ``ValueError`` beyond ``max_rows``."""
        sizes = [len(part.rows) for part in self.parts]
        if sum(sizes) + n > self.max_rows:
            raise ValueError(f"the batch holds {sum(sizes)} rows already (at most {self.max_rows})")
        where = []
        for _ in range(n):
            where.append(sizes.index(min(sizes)))
            sizes[where[-1]] += 1
        return where

    def join(self, seq: Sequence) -> None:
        self.parts[self._assign(1)[0]].join(seq)

    def join_group(self, seqs: list[Sequence], cache: list[Any], first: Any) -> None:
        """``seqs`` (prefilled together: ``cache`` their batch KV, ``first`` ``[len(seqs)]``
        their first tokens) spread over the micro-batches by ``_assign``; a share of the
        group's KV is copied out of it (``extract``, then ``merge``) unless all go to one."""
        where = self._assign(len(seqs))
        if len(set(where)) == 1:
            self.parts[where[0]].join_group(seqs, cache, first)
            return
        import mlx.core as mx

        for p in sorted(set(where)):
            rows = [i for i, w in enumerate(where) if w == p]
            share = [type(layer).merge([layer.extract(i) for i in rows]) for layer in cache]
            self.parts[p].join_group([seqs[i] for i in rows], share, first[mx.array(rows, dtype=mx.int32)])

    def decode(self, stage: Stage, model: Any) -> list[int]:
        """One decode step of every micro-batch with rows: the forward passes queued first, in
        order, then the draws, in order (the same collectives in the same order on every
        rank); returns each row's token, in ``rows`` order."""
        live = [part for part in self.parts if part.rows]
        if len(live) == 1:
            return live[0].decode(stage, model)
        pending = [part.forward_step(stage, model) for part in live]
        return [token for part, p in zip(live, pending, strict=True) for token in part.sample_step(stage, p)]

    def _where(self, index: int) -> tuple[DecodeBatch, int]:
        for part in self.parts:
            if index < len(part.rows):
                return part, index
            index -= len(part.rows)
        raise IndexError(f"row {index} beyond the batch's {len(self.rows)}")

    def extract(self, index: int) -> list[Any]:
        part, i = self._where(index)
        return part.extract(i)

    def drop(self, indices: list[int]) -> list[Sequence]:
        """Rows ``indices`` (into ``rows``) leave and free their KV; returns them, in
        ``indices`` order."""
        rows = self.rows
        left = [rows[i] for i in indices]
        by_part: dict[int, list[int]] = {}
        for i in indices:
            part, local = self._where(i)
            by_part.setdefault(id(part), []).append(local)
        for part in self.parts:
            part.drop(by_part.get(id(part), []))
        return left
