"""What the rows of a decode step do with their tokens (the engine's ``_decode``).

Each row of the batch consumes the token sampled for it (``Sequence.consume``: text, stop
strings, end of turn, its token budget), or, after a speculative step, its accepted tokens
in order (``engine/spec/verify.py``) until one ends it: a stop string, the end of turn, its
budget or a cancel land on the exact token, and the tokens after it are never consumed. A
row whose consumption raises fails alone and the others go on.
"""

from __future__ import annotations

from collections.abc import Callable

from exo_p2p.types.chunks import Chunk
from exo_p2p.types.common import TaskId
from worker.engine.sequence import Sequence


def consume_tokens(rows: list[Sequence], tokens: list[int | list[int]], now: float,
                   on_token: Callable[[TaskId, int], None] | None = None) -> tuple[list[Chunk], list[tuple[int, Exception | None]]]:
    """Row ``i`` consumes ``tokens[i]`` (a token, or a list of them in order) at ``now``
    (seconds of the engine's clock), each after ``on_token(task_id, token)``. Returns the
    chunks, in row order, and the rows that ended: ``(index, None)`` when done, ``(index,
    exception)`` when its consumption raised. Raises ``ValueError`` when ``rows`` and
    ``tokens`` differ in length."""
    out: list[Chunk] = []
    ended: list[tuple[int, Exception | None]] = []
    for i, (row, run) in enumerate(zip(rows, tokens, strict=True)):
        for j, token in enumerate(run if isinstance(run, list) else (run,)):
            if j > 0 and row.cancel_requested:
                break  # cancelled meanwhile: its end comes at the next step, after this token
            if on_token is not None:
                on_token(row.task_id, token)
            try:
                chunks, done = row.consume(token, now)
            except Exception as e:  # noqa: BLE001 - this row fails, the others go on
                ended.append((i, e))
                break
            out += chunks
            if done:
                ended.append((i, None))
                break
    return out, ended
