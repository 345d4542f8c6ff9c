"""The speculative decode step of a batch: drafts proposed, verified in one forward pass.

Each step, every row's current token ``c`` is known (the batch's ``next`` tokens). A row that
may draft (``drafts_allowed``) gets at most ``k`` proposals ``d`` (``ngram.NgramIndex``,
``k`` from its ``policy.DraftPolicy`` and never past its token budget). When no row has any,
the batch's ordinary step runs (nothing changes). Otherwise one forward pass feeds every row
``[c, d…, padding]`` (``[B, 1 + K]``, K the longest proposal) and:

- a drafting row (greedy with no logits processors) takes ``argmax`` at every position; it
  accepts its drafts while each equals the argmax before it (exact match, so its tokens are
  those of speculation off); its tokens this step are ``c`` and the accepted drafts, its next
  token the argmax after the last accepted one;
- every other row (sampled, penalised, constrained, with logprobs) draws from position 0 with
  its own sampler exactly as in an ordinary step (a constrained row's grammar advanced and
  its mask set first); its tokens are ``c`` alone;
- the KV cache drops, per row, every position past its last accepted token (``rollback``).

The step is evaluated before it returns (no overlap of this forward with the rows'
detokenizing, as an ordinary step has): the next proposals depend on its result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from worker.engine.forward import generation_stream
from worker.engine.sequence import Sequence
from worker.engine.spec.ngram import NgramIndex
from worker.engine.spec.policy import DraftPolicy
from worker.engine.spec.rollback import rollback, rollback_supported
from worker.engine.spec.stages import verifies, verify_tokens

MAX_NUM_DRAFT = 16
"""The most tokens a row may draft per step (``--num-draft`` is checked against it)."""
MAX_POSITIONS = 16
"""Positions a verification pass feeds at most (rows × (1 + the longest proposal)): proposals
are cut to fit, and a batch of 16 rows or more does not draft — a wide pass is compute bound
here, so it would cost the batch more than its accepted drafts save (docs/benchmarks.md)."""


def accepted_count(drafts: list[int], argmax: list[int]) -> int:
    """How many of ``drafts`` are accepted: the longest prefix with ``drafts[j] ==
    argmax[j]`` (``argmax[j]``: the greedy token after the row's current token and
    ``drafts[:j]``). ``argmax`` must be at least ``len(drafts)`` long."""
    n = 0
    while n < len(drafts) and drafts[n] == argmax[n]:
        n += 1
    return n


def drafts_allowed(row: Sequence) -> bool:
    """Whether ``row`` drafts: no logits processors, no output format, no logprobs, no
    forced tokens (``Sampler.plain_greedy``: accepted by exact match; ``plain_sampled``: by
    the rejection rule, ``rejection.py``), and not opted out by its request
    (``GenerationParams.speculative``)."""
    return (row.sampler.plain_greedy or row.sampler.plain_sampled) and row.params.speculative


@dataclass
class SpecStats:
    """Tokens proposed and accepted, in total and per task (the last ``PER_TASK_MAX``)."""

    proposed: int = 0
    accepted: int = 0
    steps: int = 0  # verification passes
    per_task: dict[str, list[int]] = field(default_factory=dict)  # task id -> [proposed, accepted]

    PER_TASK_MAX = 4096

    def add(self, task_id: str, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        entry = self.per_task.setdefault(task_id, [0, 0])
        entry[0] += proposed
        entry[1] += accepted
        while len(self.per_task) > self.PER_TASK_MAX:
            self.per_task.pop(next(iter(self.per_task)))


class SpecDecoder:
    """A batch's drafting state: per row an ``NgramIndex`` and a ``DraftPolicy`` (keyed by
    task id, forgotten when the row leaves); ``num_draft`` (1 … ``MAX_NUM_DRAFT``) the most
    tokens a row drafts per step. Raises ``ValueError`` for ``num_draft`` out of range."""

    def __init__(self, num_draft: int) -> None:
        if not 1 <= num_draft <= MAX_NUM_DRAFT:
            raise ValueError(f"num_draft must be in 1..{MAX_NUM_DRAFT}, not {num_draft}")
        self.num_draft = num_draft
        self.max_positions = MAX_POSITIONS
        self.stats = SpecStats()
        self._rows: dict[str, tuple[NgramIndex, DraftPolicy, int]] = {}  # task -> index, policy, fed seen

    def _wanted(self, row: Sequence) -> int:
        """How many drafts ``row`` may take this step (0: none), within its budget; 0 too when
        no token it could be fed next can start a match (``NgramIndex.may_propose``), so a
        step where no row can draft reads no token early (the ordinary step keeps its overlap)."""
        budget = row.max_new - row.completion_tokens - 1  # tokens after ``current`` it may still take
        if budget <= 0 or not drafts_allowed(row):
            return 0
        state = self._rows.get(row.task_id)
        if state is None:
            state = (NgramIndex(row.tokens()), DraftPolicy(self.num_draft), len(row.fed))
        index, policy, seen = state
        index.extend(row.fed[seen:])
        self._rows[row.task_id] = (index, policy, len(row.fed))
        k = min(policy.wanted(), budget)  # counts a paused step whatever comes next
        return k if k > 0 and index.may_propose() else 0

    def _proposal(self, row: Sequence, current: int, k: int) -> list[int]:
        """Row's at most ``k`` drafts after its ``current`` token (``[]``: none)."""
        if k <= 0:
            return []
        index = self._rows[row.task_id][0]
        index.extend([current])
        drafts = index.propose(k)
        index.history.pop()  # ``current`` is indexed again when it is fed (harmless repeat)
        if not drafts:  # the next tokens were read early for nothing: the policy counts a miss
            self._rows[row.task_id][1].miss()
        return drafts

    def step(self, batch: Any, stage: Any, model: Any) -> list[int | list[int]] | None:
        """One speculative step of ``batch`` (a ``DecodeBatch``): each row's tokens this step
        (an int, or the list of its current token and accepted drafts), fed and kept in the
        KV; None when speculation does not apply this step (a stage ``stages.verifies``
        refuses, a cache that cannot roll back, every row at its last token, or no
        proposals): run the ordinary step. Every rank of a multi-rank instance decides alike."""
        if not batch.feeds or not rollback_supported(batch.cache) or not verifies(stage, [r.sampler for r in batch.rows]):
            return None
        live = {row.task_id for row in batch.rows}
        for gone in [t for t in self._rows if t not in live]:
            del self._rows[gone]
        cap = self.max_positions // len(batch.rows) - 1
        if cap <= 0:
            return None
        wanted = [min(self._wanted(row), cap) for row in batch.rows]
        if not any(wanted):
            return None
        current = [int(t) for t in batch.next_tokens.tolist()]
        drafts = [self._proposal(row, c, k) for row, c, k in zip(batch.rows, current, wanted, strict=True)]
        width = max(len(d) for d in drafts)
        if width == 0:
            return None
        return self._verify(batch, stage, model, current, drafts, width)

    def _verify(self, batch: Any, stage: Any, model: Any, current: list[int],
                drafts: list[list[int]], width: int) -> list[int | list[int]]:
        rows = batch.rows
        fed = [[c, *d] + [c] * (width - len(d)) for c, d in zip(current, drafts, strict=True)]
        with mx.stream(generation_stream):
            if any(row.constraint is not None for row in rows):
                batch.advance_masks(stage, current)
            chosen = verify_tokens(stage, model, mx.array(fed, dtype=mx.uint32), batch.cache,
                                   [row.sampler for row in rows], drafts)
            mx.eval(chosen)
        argmax = chosen.tolist()
        sampled = [r[-1] for r in argmax]
        runs: list[int | list[int]] = []
        nexts, drop = [], []
        for i, row in enumerate(rows):
            d = drafts[i]
            if not d:
                runs.append(current[i])
                nexts.append(int(sampled[i]))
                drop.append(width)
                continue
            n = accepted_count(d, argmax[i])
            runs.append([current[i], *d[:n]])
            if row.sampler.plain_sampled:
                row.sampler.skip(n + 1)  # the draws at positions 0 … n (rejection.py)
            nexts.append(int(argmax[i][n]))
            drop.append(width - n)
            self._rows[row.task_id][1].record(len(d), n)
            self.stats.add(row.task_id, len(d), n)
            row.drafts = (row.drafts[0] + len(d), row.drafts[1] + n)
        self.stats.steps += 1
        rollback(batch.cache, drop)
        batch.set_next(mx.array(nexts, dtype=mx.uint32), runs)
        return runs
